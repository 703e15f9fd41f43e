//! Cleaning up after a script that timed out: it may have committed, so what it may have
//! written is taken back once, detached and bounded, on the connection it ran on.
//!
//! The removal goes out on the *same* connection as the timed-out script: Redis answers one
//! connection's commands in order, so it cannot overtake the script it cleans up after (on
//! another connection it could run first and remove nothing).

use std::time::Duration;

use poolgate_core::lease::LeaseId;
use poolgate_runtime::redis::Conn;
use poolgate_runtime::redis_keys::AccountKeys;

/// How long the detached cleanup of an uncertain acquire may take.
const UNCERTAIN_CLEANUP_TIMEOUT: Duration = Duration::from_millis(500);

/// After an acquire that timed out, removes the lease and its RPM events (account, and user
/// when `user_rpm` is given; the key's slot when `key_leases` is given), so no ghost slot or
/// charge stays. Not retried.
pub(super) fn remove_uncertain_lease(
    lease_id: &LeaseId,
    user_rpm: Option<String>,
    key_leases: Option<String>,
    mut conn: Conn,
) {
    let keys = AccountKeys::new(lease_id.account_id());
    let member = lease_id.as_str().to_owned();
    tokio::spawn(async move {
        let mut cleanup = redis::pipe();
        cleanup
            .cmd("ZREM")
            .arg(&keys.leases)
            .arg(&member)
            .cmd("ZREM")
            .arg(&keys.rpm)
            .arg(&member);
        if let Some(user_rpm) = &user_rpm {
            cleanup.cmd("ZREM").arg(user_rpm).arg(&member);
        }
        if let Some(key_leases) = &key_leases {
            cleanup.cmd("ZREM").arg(key_leases).arg(&member);
        }
        let cleanup = cleanup.query_async::<Vec<i64>>(&mut conn);
        match tokio::time::timeout(UNCERTAIN_CLEANUP_TIMEOUT, cleanup).await {
            Ok(Ok(_)) => tracing::debug!(lease_id = %member, "uncertain acquire cleaned up"),
            _ => {
                tracing::warn!(lease_id = %member, "uncertain acquire cleanup failed; the lease expires at its ttl")
            }
        }
    });
}

/// After a user charge that timed out, takes the charge (`event_id` in the user's RPM key
/// `user_rpm`) back. Not retried: a charge left behind ages out within the RPM window.
pub(super) fn refund_uncertain_charge(user_rpm: String, event_id: &str, mut conn: Conn) {
    let member = event_id.to_owned();
    tokio::spawn(async move {
        let mut zrem = redis::cmd("ZREM");
        zrem.arg(&user_rpm).arg(&member);
        let refund = zrem.query_async::<i64>(&mut conn);
        if !matches!(
            tokio::time::timeout(UNCERTAIN_CLEANUP_TIMEOUT, refund).await,
            Ok(Ok(_))
        ) {
            tracing::warn!("uncertain user charge not refunded; it ages out within the rpm window");
        }
    });
}

/// After a key slot charge that timed out (Cluster), takes the slot back on the same connection.
pub(super) fn remove_uncertain_key_slot(key_leases: String, lease_id: &LeaseId, mut conn: Conn) {
    let member = lease_id.as_str().to_owned();
    tokio::spawn(async move {
        let mut zrem = redis::cmd("ZREM");
        zrem.arg(&key_leases).arg(&member);
        let refund = zrem.query_async::<i64>(&mut conn);
        if !matches!(
            tokio::time::timeout(UNCERTAIN_CLEANUP_TIMEOUT, refund).await,
            Ok(Ok(_))
        ) {
            tracing::warn!(lease_id = %member, "uncertain key slot not freed; it expires at the lease ttl");
        }
    });
}
