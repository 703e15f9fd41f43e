//! Reading the scripts' replies as domain answers. A reply this code cannot read is a backend
//! error naming it, never a likely-looking answer.

use poolgate_core::lease::{Denial, DenyReason, LostReason, Renewal, Resumption};
use poolgate_runtime::error::StateError;

/// The acquire script's `{reason, retry_ms}`: `None` when granted, the denial otherwise.
pub(super) fn acquire_denial(reason: &str, retry_ms: u64) -> Result<Option<Denial>, StateError> {
    let reason = match reason {
        "granted" => return Ok(None),
        // Redis lost the account's state and the holders are putting their leases back: the
        // account is full until they have (its retry is when the recount ends).
        "concurrency" | "wiped" | "recounting" => DenyReason::Concurrency,
        "cooling" => DenyReason::Cooling,
        "rpm" => DenyReason::Rpm,
        "session_window" => DenyReason::SessionWindow,
        "user_rpm" => DenyReason::UserRpm,
        "key_concurrency" => DenyReason::KeyConcurrency,
        "key_tpm" => DenyReason::KeyTpm,
        "key_budget" => DenyReason::KeyBudget,
        unknown => {
            tracing::warn!(reply = unknown, "acquire script answered an unknown reply");
            return Err(StateError::Failed(format!(
                "unknown acquire reply {unknown:?}"
            )));
        }
    };
    Ok(Some(Denial::new(reason, retry_ms)))
}

/// The charge script's `{charged (1/0), retry_ms}`: `None` when charged, a denial for `reason`
/// otherwise.
pub(super) fn charge_denial(charged: i64, retry_ms: u64, reason: DenyReason) -> Option<Denial> {
    (charged == 0).then(|| Denial::new(reason, retry_ms))
}

/// The renew script's state (see `scripts/renew.lua`): 1 renewed, 2 restored, 3 released
/// (fenced), 4 no room to restore, 5 gone and not to be restored, 6 restored and Redis lost the
/// account's state, 7 restored while the account recounts. 8 (not restored, mode '2') is read
/// by the restore pass alone.
pub(super) fn renewal(state: i64) -> Result<Renewal, StateError> {
    Ok(match state {
        1 => Renewal::Renewed,
        2 | 6 | 7 => Renewal::Restored,
        3 => Renewal::Lost(LostReason::Released),
        4 => Renewal::Lost(LostReason::NoRoom),
        5 => Renewal::Lost(LostReason::Expired),
        unknown => {
            tracing::warn!(reply = unknown, "renew script answered an unknown state");
            return Err(StateError::Failed(format!("unknown renew reply {unknown}")));
        }
    })
}

/// The resume script's holder epoch (see `scripts/resume.lua`): > 0 resumed, 0 unknown or
/// expired, -1 released (fenced).
pub(super) fn resumption(epoch: i64) -> Result<Resumption, StateError> {
    Ok(match epoch {
        epoch if epoch > 0 => Resumption::Resumed {
            holder_epoch: epoch.unsigned_abs(),
        },
        0 => Resumption::Unknown,
        -1 => Resumption::Released,
        unknown => {
            tracing::warn!(reply = unknown, "resume script answered an unknown epoch");
            return Err(StateError::Failed(format!(
                "unknown resume reply {unknown}"
            )));
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_known_acquire_reply_reads_as_its_answer() {
        assert!(matches!(acquire_denial("granted", 0), Ok(None)));
        for (reply, reason) in [
            ("concurrency", DenyReason::Concurrency),
            ("cooling", DenyReason::Cooling),
            ("rpm", DenyReason::Rpm),
            ("session_window", DenyReason::SessionWindow),
            ("user_rpm", DenyReason::UserRpm),
            ("key_concurrency", DenyReason::KeyConcurrency),
            ("key_tpm", DenyReason::KeyTpm),
            ("key_budget", DenyReason::KeyBudget),
        ] {
            match acquire_denial(reply, 1500) {
                Ok(Some(denial)) => assert_eq!(denial, Denial::new(reason, 1500), "{reply}"),
                other => panic!("{reply}: expected a denial, got {other:?}"),
            }
        }
    }

    #[test]
    fn an_unknown_acquire_reply_is_a_backend_error_not_a_guess() {
        for reply in ["queue_full", "Granted", ""] {
            match acquire_denial(reply, 0) {
                Err(StateError::Failed(message)) => {
                    assert!(message.contains(&format!("{reply:?}")), "{message}")
                }
                other => panic!("{reply:?}: expected a backend error, got {other:?}"),
            }
        }
    }

    #[test]
    fn renew_and_resume_replies_read_strictly() {
        assert!(matches!(renewal(1), Ok(Renewal::Renewed)));
        assert!(matches!(renewal(2), Ok(Renewal::Restored)));
        assert!(matches!(
            renewal(3),
            Ok(Renewal::Lost(LostReason::Released))
        ));
        assert!(matches!(renewal(4), Ok(Renewal::Lost(LostReason::NoRoom))));
        assert!(matches!(renewal(5), Ok(Renewal::Lost(LostReason::Expired))));
        // Put back after Redis lost the account's state, and while the account recounts.
        assert!(matches!(renewal(6), Ok(Renewal::Restored)));
        assert!(matches!(renewal(7), Ok(Renewal::Restored)));
        // 8 (not restored) is the restore pass's alone: a heartbeat never reads it.
        for unknown in [0, 8, 9, -1] {
            assert!(renewal(unknown).is_err(), "renew state {unknown}");
        }
        assert!(matches!(
            resumption(7),
            Ok(Resumption::Resumed { holder_epoch: 7 })
        ));
        assert!(matches!(resumption(0), Ok(Resumption::Unknown)));
        assert!(matches!(resumption(-1), Ok(Resumption::Released)));
        assert!(resumption(-2).is_err());
    }
}
