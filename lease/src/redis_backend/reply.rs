//! Reading the scripts' replies as domain answers. A reply this code cannot read is a backend
//! error naming it, never a likely-looking answer.

use poolgate_core::lease::{Denial, DenyReason, LostReason, Renewal, Resumption};
use poolgate_runtime::error::BackendError;

/// The acquire script's `{reason, retry_ms}`: `None` when granted, the denial otherwise.
pub(super) fn acquire_denial(reason: &str, retry_ms: u64) -> Result<Option<Denial>, BackendError> {
    let reason = match reason {
        "granted" => return Ok(None),
        "concurrency" => DenyReason::Concurrency,
        "cooling" => DenyReason::Cooling,
        "rpm" => DenyReason::Rpm,
        "session_window" => DenyReason::SessionWindow,
        "user_rpm" => DenyReason::UserRpm,
        unknown => {
            tracing::warn!(reply = unknown, "acquire script answered an unknown reply");
            return Err(BackendError::Failed(format!(
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

/// The renew script's state (see `RENEW` in `scripts.rs`).
pub(super) fn renewal(state: i64) -> Renewal {
    match state {
        1 => Renewal::Renewed,
        2 => Renewal::Restored,
        3 => Renewal::Lost(LostReason::Released),
        4 => Renewal::Lost(LostReason::NoRoom),
        _ => Renewal::Lost(LostReason::Expired),
    }
}

/// The resume script's holder epoch: > 0 resumed, 0 unknown or expired, < 0 released.
pub(super) fn resumption(epoch: i64) -> Resumption {
    match epoch {
        epoch if epoch > 0 => Resumption::Resumed {
            holder_epoch: epoch as u64,
        },
        0 => Resumption::Unknown,
        _ => Resumption::Released,
    }
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
                Err(BackendError::Failed(message)) => {
                    assert!(message.contains(&format!("{reply:?}")), "{message}")
                }
                other => panic!("{reply:?}: expected a backend error, got {other:?}"),
            }
        }
    }
}
