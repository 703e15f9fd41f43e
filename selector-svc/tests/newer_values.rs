//! What this release does with values a newer release wrote into the database it shares during a
//! rolling upgrade (docs/DESIGN.md §8, "Enum values across releases"): a platform, sign-in or
//! key status it does not know leaves that one row out, never the whole snapshot; an endpoint
//! list it reads only the names it knows of, and never reads a list as wider than it was. The
//! newer release is simulated as its migration would be: the CHECK widened, the value written.

use crate::support;

use poolgate_core::keys::{Endpoint, KeyAccess};
use support::api_account;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_a_newer_release_wrote_leave_out_only_themselves_and_never_widen_a_key() {
    let (_postgres, store) = support::migrated_store().await;
    let kept = store
        .upsert_account(&api_account("kept", "default"))
        .await
        .expect("account");
    let newer = store
        .upsert_account(&api_account("newer-platform", "default"))
        .await
        .expect("account");
    let messages_only = KeyAccess {
        allowed_endpoints: vec![Endpoint::Messages],
        ..KeyAccess::default()
    };
    let mut keys = Vec::new();
    for name in ["plain", "newer-status", "one-newer-endpoint", "only-newer"] {
        let (id, _) = store
            .create_api_key_with_access(name, "u", "default", 0, &messages_only)
            .await
            .expect("key");
        keys.push(id);
    }
    let newer_release = [
        "ALTER TABLE accounts DROP CONSTRAINT accounts_platform_check",
        "ALTER TABLE api_keys DROP CONSTRAINT api_keys_status_check",
        "ALTER TABLE api_keys DROP CONSTRAINT api_keys_allowed_endpoints_check",
    ];
    for statement in newer_release {
        sqlx::query(statement)
            .execute(store.pool())
            .await
            .expect(statement);
    }
    sqlx::query("UPDATE accounts SET platform = 'audio' WHERE id = $1")
        .bind(newer)
        .execute(store.pool())
        .await
        .expect("newer platform");
    sqlx::query("UPDATE api_keys SET status = 'suspended' WHERE id = $1")
        .bind(keys[1])
        .execute(store.pool())
        .await
        .expect("newer status");
    sqlx::query("UPDATE api_keys SET allowed_endpoints = ARRAY['messages', 'audio'] WHERE id = $1")
        .bind(keys[2])
        .execute(store.pool())
        .await
        .expect("a newer endpoint beside a known one");
    sqlx::query("UPDATE api_keys SET allowed_endpoints = ARRAY['audio', 'images'] WHERE id = $1")
        .bind(keys[3])
        .execute(store.pool())
        .await
        .expect("only newer endpoints");

    let snapshot = store
        .load_snapshot()
        .await
        .expect("the snapshot loads past rows it cannot read");
    assert!(
        snapshot.account(kept).is_some(),
        "the readable account is served"
    );
    assert!(
        snapshot.account(newer).is_none(),
        "an account of a platform this release does not know is left out"
    );
    let key = |id: i64| snapshot.api_keys().find(|record| record.id == id);
    let plain = key(keys[0]).expect("a readable key is served");
    assert_eq!(plain.access.allowed_endpoints, vec![Endpoint::Messages]);
    assert!(
        key(keys[1]).is_none(),
        "a key of a status this release does not know is left out (refused as unknown)"
    );
    let one_newer = key(keys[2]).expect("a key with one newer endpoint is served");
    assert_eq!(one_newer.access.allowed_endpoints, vec![Endpoint::Messages]);
    assert!(!one_newer.access.disabled);
    let only_newer = key(keys[3]).expect("a key of only newer endpoints is kept");
    assert!(
        only_newer.access.disabled,
        "a list of only newer endpoints must not read as no list (every endpoint): held disabled"
    );
}
