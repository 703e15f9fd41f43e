//! The operator's read of the usage windows (`ListWindows`): the query (which accounts) and the
//! answer (each account's stored readings and the selector's clock they are read against). The
//! readings themselves convert as `RecordWindows` reads them (`selection.rs`), just as strictly.

use poolgate_core::windows::WindowReading;
use poolgate_core::{AccountId, MAX_NAME_BYTES};

use super::{ConvertError, account_id};
use crate::selector::v1 as spb;

/// One account's stored readings, as a `ListWindows` answer carries them.
#[derive(Debug, Clone, PartialEq)]
pub struct AccountReadings {
    pub account_id: AccountId,
    pub account_name: String,
    pub readings: Vec<WindowReading>,
}

/// A `ListWindows` answer: every listed account's readings and the clock (ms since the epoch)
/// time to reset and age are measured against.
#[derive(Debug, Clone, PartialEq)]
pub struct WindowsAnswer {
    pub now_ms: i64,
    pub accounts: Vec<AccountReadings>,
}

/// A `ListWindows` request: only `account`'s readings, only `group`'s accounts, when given.
pub fn windows_query(account: Option<AccountId>, group: Option<&str>) -> spb::ListWindowsRequest {
    spb::ListWindowsRequest {
        account_id: account.unwrap_or(0),
        group: group.unwrap_or_default().to_owned(),
    }
}

/// A `ListWindows` request read strictly: `account_id` 0 (every account) or positive, `group`
/// empty (every group) or at most [`MAX_NAME_BYTES`].
pub fn read_windows_query(
    request: spb::ListWindowsRequest,
) -> Result<(Option<AccountId>, Option<String>), ConvertError> {
    let account = match request.account_id {
        0 => None,
        id => Some(account_id("account_id", id)?),
    };
    if request.group.len() > MAX_NAME_BYTES {
        return Err(ConvertError::new(
            "group",
            format!(
                "must be at most {MAX_NAME_BYTES} bytes, got {}",
                request.group.len()
            ),
        ));
    }
    let group = Some(request.group).filter(|group| !group.is_empty());
    Ok((account, group))
}

/// A `ListWindows` answer for these accounts' readings, read at `now_ms`.
pub fn windows_answer(answer: WindowsAnswer) -> spb::ListWindowsResponse {
    spb::ListWindowsResponse {
        accounts: answer
            .accounts
            .into_iter()
            .map(|account| spb::AccountWindowsView {
                account_id: account.account_id,
                account_name: account.account_name,
                readings: account
                    .readings
                    .iter()
                    .map(spb::WindowReading::from)
                    .collect(),
            })
            .collect(),
        now_ms: answer.now_ms,
    }
}

/// A `ListWindows` answer read strictly: the clock set, every account id positive, every reading
/// readable. The error names the field with its path (`accounts.readings.status`).
pub fn read_windows_answer(
    answer: spb::ListWindowsResponse,
) -> Result<WindowsAnswer, ConvertError> {
    if answer.now_ms <= 0 {
        return Err(ConvertError::new(
            "now_ms",
            format!("must be a time since the epoch, got {}", answer.now_ms),
        ));
    }
    let accounts = answer
        .accounts
        .into_iter()
        .map(|account| {
            let account_id = account_id("account_id", account.account_id)
                .map_err(|error| error.within("accounts"))?;
            let readings = account
                .readings
                .into_iter()
                .map(|reading| {
                    WindowReading::try_from(reading)
                        .map_err(|error| error.within("accounts.readings"))
                })
                .collect::<Result<Vec<_>, _>>()?;
            Ok(AccountReadings {
                account_id,
                account_name: account.account_name,
                readings,
            })
        })
        .collect::<Result<Vec<_>, ConvertError>>()?;
    Ok(WindowsAnswer {
        now_ms: answer.now_ms,
        accounts,
    })
}

#[cfg(test)]
mod tests {
    use poolgate_core::windows::{Scope, WindowKind, WindowStatus};

    use super::*;

    fn reading() -> WindowReading {
        WindowReading {
            kind: WindowKind::SevenDayModel,
            scope: Scope::Models("opus".into()),
            utilization: Some(0.25),
            reset_at_ms: 2_000_000,
            length_ms: Some(7 * 24 * 3_600_000),
            status: WindowStatus::AllowedWarning,
            observed_at_ms: 1_000_000,
        }
    }

    #[test]
    fn the_query_and_the_answer_come_back_as_they_were_sent() {
        for (account, group) in [(None, None), (Some(7), Some("team"))] {
            assert_eq!(
                read_windows_query(windows_query(account, group)).expect("readable"),
                (account, group.map(str::to_owned))
            );
        }
        let answer = WindowsAnswer {
            now_ms: 1_500_000,
            accounts: vec![AccountReadings {
                account_id: 3,
                account_name: "a".into(),
                readings: vec![
                    reading(),
                    WindowReading {
                        kind: WindowKind::FiveHour,
                        scope: Scope::Account,
                        utilization: None,
                        ..reading()
                    },
                ],
            }],
        };
        assert_eq!(
            read_windows_answer(windows_answer(answer.clone())).expect("readable"),
            answer
        );
    }

    #[test]
    fn what_cannot_be_read_names_its_field() {
        fn field<T: std::fmt::Debug>(result: Result<T, ConvertError>) -> String {
            result.expect_err("refused").field.into_owned()
        }
        assert_eq!(
            field(read_windows_query(spb::ListWindowsRequest {
                account_id: -1,
                group: String::new(),
            })),
            "account_id"
        );
        assert_eq!(
            field(read_windows_query(spb::ListWindowsRequest {
                account_id: 0,
                group: "g".repeat(MAX_NAME_BYTES + 1),
            })),
            "group"
        );
        let good = windows_answer(WindowsAnswer {
            now_ms: 1_500_000,
            accounts: vec![AccountReadings {
                account_id: 3,
                account_name: "a".into(),
                readings: vec![reading()],
            }],
        });
        assert_eq!(
            field(read_windows_answer(spb::ListWindowsResponse {
                now_ms: 0,
                ..good.clone()
            })),
            "now_ms"
        );
        let mut bad = good.clone();
        bad.accounts[0].account_id = 0;
        assert_eq!(field(read_windows_answer(bad)), "accounts.account_id");
        let mut bad = good;
        bad.accounts[0].readings[0].status = spb::WindowStatus::Unspecified as i32;
        assert_eq!(field(read_windows_answer(bad)), "accounts.readings.status");
    }
}
