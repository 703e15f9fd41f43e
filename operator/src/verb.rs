//! The read and repair verbs as one clap subcommand enum, and how their answers print: one
//! tab-separated line per row (`text`, the default; `key=value` columns so scripts can grep), or
//! the admin endpoint's JSON envelope (`json`).

use poolgate_core::keys::rfc3339_utc;

use crate::OperatorError;
use crate::view::{
    AccountList, AccountRow, AccountStatusRow, BlockList, BlockRow, Cleared, KeyChanged, KeyList,
    KeyRow, ModelUsageRow, PriceChanged, PriceList, PriceRow, Restored, StatusAnswer, StatusView,
    UsageReport, UsageRow, WindowList, WindowRow,
};

/// The read and repair verbs, the same against a selector and against a standalone relay.
#[derive(Debug, Clone, PartialEq, clap::Subcommand)]
pub enum Verb {
    /// Accounts with their status (credentials masked).
    Accounts {
        /// Only this group's accounts.
        #[arg(long)]
        group: Option<String>,
        #[command(flatten)]
        format: Format,
    },
    /// Blocked accounts: kind (hard, soft, breaker), class, upstream status, reason, time left.
    Blocks {
        #[command(flatten)]
        format: Format,
    },
    /// Usage windows per account, as the upstreams last reported them: kind, scope, share used,
    /// status, time to reset (`passed`: reads as empty), how long ago it was reported.
    Windows {
        /// Only this account's windows.
        #[arg(long = "account", value_parser = clap::value_parser!(i64).range(1..))]
        account_id: Option<i64>,
        /// Only this group's accounts.
        #[arg(long)]
        group: Option<String>,
        #[command(flatten)]
        format: Format,
    },
    /// Puts a retired, errored or disabled account back to active and clears its blocks.
    Restore {
        #[arg(value_parser = clap::value_parser!(i64).range(1..))]
        account_id: i64,
        #[command(flatten)]
        format: Format,
    },
    /// Clears an account's blocks and breaker.
    ClearBlock {
        #[arg(value_parser = clap::value_parser!(i64).range(1..))]
        account_id: i64,
        #[command(flatten)]
        format: Format,
    },
    /// Usage per client key over the last hours: every key, or the one given.
    Usage {
        /// One client key's id (the full listing shows every key's; `selector-svc admin keys`
        /// lists the selector's).
        #[arg(value_parser = clap::value_parser!(i64).range(1..))]
        api_key_id: Option<i64>,
        /// How many hours back from now.
        #[arg(long, default_value_t = 24, value_parser = clap::value_parser!(u32).range(1..=87_600))]
        hours: u32,
        #[command(flatten)]
        format: Format,
    },
    /// Client keys: status, expiry, allowed models and endpoints (`*`: every one).
    Keys {
        #[command(flatten)]
        format: Format,
    },
    /// Disables a client key: refused until enabled again (a revoked key is gone for good).
    /// Takes effect within a second; a standalone relay keeps it across restarts.
    DisableKey {
        #[arg(value_parser = clap::value_parser!(i64).range(1..))]
        api_key_id: i64,
        #[command(flatten)]
        format: Format,
    },
    /// Enables a disabled client key again.
    EnableKey {
        #[arg(value_parser = clap::value_parser!(i64).range(1..))]
        api_key_id: i64,
        #[command(flatten)]
        format: Format,
    },
    /// The pool at a glance (what the status page shows): admission's failure policy and state,
    /// then each account's live status, leases, RPM and session spend against its limits, usage
    /// windows and block.
    Status {
        #[command(flatten)]
        format: Format,
    },
    /// Prices in USD per million tokens, one line per model: the operator's (`source=operator`,
    /// with the catalogue's price it overrides) and the shipped catalogue's (`source=catalogue`).
    /// A model in neither is charged its family's highest catalogue price, or refused to keys
    /// with a budget where the operator chose so (docs/DESIGN.md §6, "Prices").
    Prices {
        #[command(flatten)]
        format: Format,
    },
    /// Sets the operator's price of a model (overrides the catalogue's), in USD per million
    /// tokens; served at once, kept across restarts.
    SetPrice {
        /// The model as the upstream names it (after any account's model mapping).
        model: String,
        #[command(flatten)]
        price: PriceFlags,
        #[command(flatten)]
        format: Format,
    },
    /// Removes the operator's price of a model: the catalogue's applies again (or, for a model
    /// the catalogue lacks, the fallback).
    RemovePrice {
        model: String,
        #[command(flatten)]
        format: Format,
    },
}

/// A price's four columns, USD per million tokens (`--output` is the output format's flag,
/// hence the `-usd` names). Negative values parse, to be refused naming the flag rather than
/// read as flags.
#[derive(Debug, Clone, Copy, PartialEq, clap::Args)]
pub struct PriceFlags {
    /// Input tokens, USD per million.
    #[arg(long, allow_negative_numbers = true)]
    pub input_usd: f64,
    /// Output tokens, USD per million.
    #[arg(long, allow_negative_numbers = true)]
    pub output_usd: f64,
    /// Cache writes at the provider's default TTL (Anthropic 5 minutes, OpenAI 30 minutes), USD
    /// per million tokens.
    #[arg(long, allow_negative_numbers = true)]
    pub cache_write_usd: f64,
    /// Cache reads, USD per million tokens.
    #[arg(long, allow_negative_numbers = true)]
    pub cache_read_usd: f64,
    /// Rerank: USD per search unit (one query over up to 100 documents, as Cohere bills).
    #[arg(long, allow_negative_numbers = true, default_value_t = 0.0)]
    pub search_unit_usd: f64,
}

impl PriceFlags {
    pub fn price(&self) -> poolgate_core::account::Price {
        poolgate_core::account::Price {
            input_per_mtok: self.input_usd,
            output_per_mtok: self.output_usd,
            cache_write_per_mtok: self.cache_write_usd,
            cache_read_per_mtok: self.cache_read_usd,
            per_search_unit: self.search_unit_usd,
        }
    }
}

impl Verb {
    /// How the answer prints.
    pub fn output(&self) -> Output {
        match self {
            Verb::Accounts { format, .. }
            | Verb::Blocks { format }
            | Verb::Windows { format, .. }
            | Verb::Restore { format, .. }
            | Verb::ClearBlock { format, .. }
            | Verb::Usage { format, .. }
            | Verb::Keys { format }
            | Verb::DisableKey { format, .. }
            | Verb::EnableKey { format, .. }
            | Verb::Status { format }
            | Verb::Prices { format }
            | Verb::SetPrice { format, .. }
            | Verb::RemovePrice { format, .. } => format.output,
        }
    }
}

/// The `--output` flag every verb takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::Args)]
pub struct Format {
    /// `text`: one tab-separated line per row; `json`: the admin endpoint's JSON.
    #[arg(long, short = 'o', value_enum, default_value_t)]
    pub output: Output,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum Output {
    #[default]
    Text,
    Json,
}

/// A verb's answer, before it prints.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Answer {
    Accounts(AccountList),
    Blocks(BlockList),
    Windows(WindowList),
    Restored(Restored),
    Cleared(Cleared),
    Usage(UsageReport),
    Keys(KeyList),
    Key(KeyChanged),
    Status(StatusAnswer),
    Prices(PriceList),
    Price(PriceChanged),
}

impl Answer {
    pub(crate) fn render(&self, output: Output) -> Result<String, OperatorError> {
        match output {
            Output::Json => {
                let json = match self {
                    Answer::Accounts(list) => serde_json::to_string_pretty(list),
                    Answer::Blocks(list) => serde_json::to_string_pretty(list),
                    Answer::Windows(list) => serde_json::to_string_pretty(list),
                    Answer::Restored(restored) => serde_json::to_string_pretty(restored),
                    Answer::Cleared(cleared) => serde_json::to_string_pretty(cleared),
                    Answer::Usage(report) => serde_json::to_string_pretty(report),
                    Answer::Keys(list) => serde_json::to_string_pretty(list),
                    Answer::Key(changed) => serde_json::to_string_pretty(changed),
                    Answer::Status(status) => serde_json::to_string_pretty(status),
                    Answer::Prices(list) => serde_json::to_string_pretty(list),
                    Answer::Price(changed) => serde_json::to_string_pretty(changed),
                };
                json.map_err(|error| OperatorError::Failed(format!("cannot encode: {error}")))
            }
            Output::Text => Ok(match self {
                Answer::Accounts(list) => lines(list.accounts.iter().map(account_line)),
                Answer::Blocks(list) => lines(list.blocks.iter().map(block_line)),
                Answer::Windows(list) => lines(list.windows.iter().map(window_line)),
                Answer::Restored(restored) => account_line(&restored.account),
                Answer::Cleared(cleared) => format!("cleared {}", cleared.cleared),
                Answer::Usage(report) => lines(report.keys.iter().flat_map(|key| {
                    std::iter::once(format!(
                        "{}\t{}\trequests={}\tinput_tokens={}\toutput_tokens={}\tcost_usd={:.6}",
                        key.api_key_id,
                        key.user,
                        key.requests,
                        key.input_tokens,
                        key.output_tokens,
                        key.cost_usd
                    ))
                    .chain(key.models.iter().map(|model| model_usage_line(key, model)))
                })),
                Answer::Keys(list) => {
                    let now = poolgate_core::now_ms();
                    lines(list.keys.iter().map(|key| key_line(key, now)))
                }
                Answer::Key(changed) => key_line(&changed.key, poolgate_core::now_ms()),
                Answer::Status(answer) => status_lines(&answer.status),
                Answer::Prices(list) => lines(list.prices.iter().map(price_line)),
                Answer::Price(changed) => price_line(&changed.price),
            }),
        }
    }
}

/// `<key id>\t<user>\tmodel=…\tprice=<source>\trequests=…\tinput_tokens=…\toutput_tokens=…`
/// `\tcost_usd=…`: one per model and price source under its key's line (`price=fallback`: the
/// model had no price and was charged its family's highest catalogue price).
pub fn model_usage_line(key: &UsageRow, model: &ModelUsageRow) -> String {
    format!(
        "{}\t{}\tmodel={}\tprice={}\trequests={}\tinput_tokens={}\toutput_tokens={}\tcost_usd={:.6}",
        key.api_key_id,
        key.user,
        model.model,
        model.price_source,
        model.requests,
        model.input_tokens,
        model.output_tokens,
        model.cost_usd
    )
}

/// `<model>\tsource=<operator|catalogue|none>\tinput=…\toutput=…\tcache_write=…\tcache_read=…`
/// `[\tsearch_unit=…]` (a rerank price, USD per search unit, when it has one)
/// `[\tcatalogue=<input>/<output>/<cache_write>/<cache_read>]` (USD per million tokens; `-` for
/// no price; the catalogue's price an operator's overrides).
pub fn price_line(row: &PriceRow) -> String {
    let columns = match &row.price {
        Some(price) if price.search_unit > 0.0 => format!(
            "input={}\toutput={}\tcache_write={}\tcache_read={}\tsearch_unit={}",
            price.input, price.output, price.cache_write, price.cache_read, price.search_unit
        ),
        Some(price) => format!(
            "input={}\toutput={}\tcache_write={}\tcache_read={}",
            price.input, price.output, price.cache_write, price.cache_read
        ),
        None => "input=-\toutput=-\tcache_write=-\tcache_read=-".to_owned(),
    };
    let overridden = row
        .catalogue
        .map(|c| {
            format!(
                "\tcatalogue={}/{}/{}/{}",
                c.input, c.output, c.cache_write, c.cache_read
            )
        })
        .unwrap_or_default();
    format!(
        "{}\tsource={}\t{columns}{overridden}",
        row.model, row.source
    )
}

fn lines(rows: impl Iterator<Item = String>) -> String {
    rows.collect::<Vec<_>>().join("\n")
}

/// `<id>\t<name>\tgroup=…\tplatform=…\tkind=…\tstatus=…[ (reason)]\tpriority=…\tweight=…\t`
/// `concurrency=…\trpm=…\tsession_window_usd=…\tcredential=<masked>` (the limit columns named
/// as `selector-svc admin upsert-account`'s flags; 0: no limit).
pub fn account_line(account: &AccountRow) -> String {
    format!(
        "{}\t{}\tgroup={}\tplatform={}\tkind={}\tstatus={}{}\tpriority={}\tweight={}\t\
         concurrency={}\trpm={}\tsession_window_usd={}\tcredential={}",
        account.id,
        account.name,
        account.group,
        account.platform,
        account.credential_kind,
        account.status,
        if account.status_reason.is_empty() {
            String::new()
        } else {
            format!(" ({})", account.status_reason)
        },
        account.priority,
        account.weight,
        account.concurrency_limit,
        account.rpm_limit,
        account.session_window_limit_usd,
        account.credential_masked
    ) + &identity_columns(account)
}

/// `\temail=…\tplan=…\ttoken_expires=<RFC 3339>[ (no refresh: sign in again before)]`: who a
/// signed-in account is, and when a token without a refresh token must be replaced.
fn identity_columns(account: &AccountRow) -> String {
    let mut columns = String::new();
    for (key, value) in [("email", &account.email), ("plan", &account.plan)] {
        if !value.is_empty() {
            columns.push_str(&format!("\t{key}={value}"));
        }
    }
    if account.credential_kind != "api_key" && account.token_expires_at_ms > 0 {
        columns.push_str(&format!(
            "\ttoken_expires={}",
            rfc3339_utc(account.token_expires_at_ms as i64)
        ));
        if !account.refreshable {
            columns.push_str(" (no refresh token: sign in again before)");
        }
    }
    columns
}

/// `<id>\t<prefix>…\tname=…\tuser=…\tgroup=…\tuser_rpm=…\tstatus=…\texpires=<RFC 3339>|never`
/// `[ (passed)]\tmodels=<a,b>|*\tendpoints=<a,b>|*\tconcurrency=<n>|*\ttpm=<n>|*`
/// `\tbudgets_usd=<total:…,day:…,week:…,month:…>|*` (`*`: every one, no limit; `(passed)`:
/// expired at `now_ms`; only the budgets set are listed, each as `<spent>/<budget>`: the
/// period's spend so far in the deployment's budget calendar, `?` when the endpoint did not
/// report it).
pub fn key_line(key: &KeyRow, now_ms: i64) -> String {
    let list = |entries: &[String]| {
        if entries.is_empty() {
            "*".to_owned()
        } else {
            entries.join(",")
        }
    };
    let expires = match key.expires_at_ms {
        None => "never".to_owned(),
        Some(at) if at <= now_ms => format!("{} (passed)", rfc3339_utc(at)),
        Some(at) => rfc3339_utc(at),
    };
    let limit = |n: i64| if n > 0 { n.to_string() } else { "*".to_owned() };
    let budgets: Vec<String> = ["total", "day", "week", "month"]
        .into_iter()
        .map(|period| (period, key.budget_usd(period)))
        .filter(|(_, usd)| *usd > 0.0)
        .map(|(period, usd)| {
            let spent = key
                .usage_in(period)
                .map(|usage| format!("{:.2}", usage.cost_usd))
                .unwrap_or_else(|| "?".to_owned());
            format!("{period}:{spent}/{usd}")
        })
        .collect();
    format!(
        "{}\t{}…\tname={}\tuser={}\tgroup={}\tuser_rpm={}\tstatus={}\texpires={}\tmodels={}\t\
         endpoints={}\tconcurrency={}\ttpm={}\tbudgets_usd={}",
        key.id,
        key.prefix,
        key.name,
        key.user,
        key.group,
        key.user_rpm_limit,
        key.status,
        expires,
        list(&key.allowed_models),
        list(&key.allowed_endpoints),
        limit(i64::from(key.concurrency_limit)),
        limit(key.tpm_limit),
        list(&budgets)
    )
}

/// `<account id>\t<name>\t<kind>\tclass=…\tstatus=…\tleft=<s>s\t<reason>`.
pub fn block_line(block: &BlockRow) -> String {
    format!(
        "{}\t{}\t{}\tclass={}\tstatus={}\tleft={}s\t{}",
        block.account_id,
        block.account_name,
        block.kind,
        block.class,
        block.status,
        block.remaining_ms / 1000,
        block.reason
    )
}

/// `<account id>\t<name>\t<kind>\tscope=…\tused=<percent>|-\tstatus=…\t`
/// `reset=<time left>|passed\tobserved=<age> ago` (`-`: the upstream stated only a status).
pub fn window_line(window: &WindowRow) -> String {
    format!(
        "{}\t{}\t{}\tscope={}\tused={}\tstatus={}\treset={}\tobserved={} ago",
        window.account_id,
        window.account_name,
        window.kind,
        window.scope,
        window
            .utilization
            .map(|used| format!("{:.1}%", used * 100.0))
            .unwrap_or_else(|| "-".into()),
        window.status,
        if window.remaining_ms == 0 {
            "passed".to_owned()
        } else {
            // Rounded up: a window that has not reset never shows 0s.
            span(window.remaining_ms.div_ceil(1000))
        },
        span(window.age_ms / 1000)
    )
}

/// `status`: a first line `admission=<ok|degraded|unknown>\tfailure_policy=…\treplicas=<id:state,…>|-`,
/// then one [`account_status_line`] per account.
pub fn status_lines(status: &StatusView) -> String {
    let replicas: Vec<String> = status
        .admission_replicas
        .iter()
        .map(|replica| format!("{}:{}", replica.id, replica.state))
        .collect();
    let head = format!(
        "admission={}\tfailure_policy={}\treplicas={}",
        status.admission,
        status.failure_policy,
        if replicas.is_empty() {
            "-".to_owned()
        } else {
            replicas.join(",")
        }
    );
    lines(std::iter::once(head).chain(status.accounts.iter().map(account_status_line)))
}

/// `<id>\t<name>\tgroup=…\tplatform=…\tstatus=…[ (reason)]\tleases=<n>/<limit>\t`
/// `rpm=<used>/<limit>\tsession_usd=<spent>/<limit>\twindows=<kind[:scope]>=<used>,…|-\t`
/// `block=<reason> (<left>)|-`: a limit of 0 prints `*` (none), a count not known or not
/// counted `?`; a window's use as a percentage (`-`: the upstream stated only a status).
pub fn account_status_line(account: &AccountStatusRow) -> String {
    let limit = |n: String, set: bool| if set { n } else { "*".to_owned() };
    let known = |n: Option<String>| n.unwrap_or_else(|| "?".to_owned());
    let windows: Vec<String> = account
        .windows
        .iter()
        .map(|window| {
            let scope = if window.scope == "account" {
                String::new()
            } else {
                format!(":{}", window.scope)
            };
            let used = window
                .utilization
                .map(|used| format!("{:.0}%", used * 100.0))
                .unwrap_or_else(|| "-".into());
            format!("{}{scope}={used}", window.kind)
        })
        .collect();
    format!(
        "{}\t{}\tgroup={}\tplatform={}\tstatus={}{}\tleases={}/{}\trpm={}/{}\t\
         session_usd={}/{}\twindows={}\tblock={}",
        account.id,
        account.name,
        account.group,
        account.platform,
        account.status,
        if account.status_reason.is_empty() {
            String::new()
        } else {
            format!(" ({})", account.status_reason)
        },
        known(account.leases.map(|n| n.to_string())),
        limit(
            account.concurrency_limit.to_string(),
            account.concurrency_limit > 0
        ),
        known(account.rpm_used.map(|n| n.to_string())),
        limit(account.rpm_limit.to_string(), account.rpm_limit > 0),
        known(account.session_spend_usd.map(|usd| format!("{usd:.2}"))),
        limit(
            account.session_window_limit_usd.to_string(),
            account.session_window_limit_usd > 0.0
        ),
        if windows.is_empty() {
            "-".to_owned()
        } else {
            windows.join(",")
        },
        if account.block_reason.is_empty() {
            "-".to_owned()
        } else {
            format!(
                "{} ({})",
                account.block_reason,
                span(account.block_left_ms.div_ceil(1000))
            )
        }
    )
}

/// A span of seconds in its two largest units: `2d3h`, `3h12m`, `5m10s`, `42s`.
fn span(seconds: u64) -> String {
    let (days, hours, minutes) = (seconds / 86_400, seconds / 3_600 % 24, seconds / 60 % 60);
    if days > 0 {
        format!("{days}d{hours}h")
    } else if hours > 0 {
        format!("{hours}h{minutes}m")
    } else if minutes > 0 {
        format!("{minutes}m{}s", seconds % 60)
    } else {
        format!("{seconds}s")
    }
}

#[cfg(test)]
mod tests {
    use clap::{Parser, Subcommand};

    use super::*;
    use crate::view::UsageRow;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(subcommand)]
        verb: Verb,
    }

    fn parse(args: &[&str]) -> Result<Verb, clap::Error> {
        Cli::try_parse_from(std::iter::once("admin").chain(args.iter().copied())).map(|c| c.verb)
    }

    #[test]
    fn the_verbs_parse_with_their_output_flag_after_the_verb() {
        assert_eq!(
            parse(&["restore", "2", "--output", "json"]).expect("parses"),
            Verb::Restore {
                account_id: 2,
                format: Format {
                    output: Output::Json
                }
            }
        );
        assert_eq!(
            parse(&["windows", "--account", "3", "--group", "g"]).expect("parses"),
            Verb::Windows {
                account_id: Some(3),
                group: Some("g".into()),
                format: Format::default()
            }
        );
        assert_eq!(
            parse(&["usage"]).expect("parses"),
            Verb::Usage {
                api_key_id: None,
                hours: 24,
                format: Format::default()
            }
        );
        assert_eq!(
            parse(&["usage", "7", "--hours", "2", "-o", "json"])
                .expect("parses")
                .output(),
            Output::Json
        );
        for refused in [
            &["restore", "0"][..],
            &["clear-block", "x"],
            &["usage", "--hours", "0"],
            &["accounts", "--output", "yaml"],
            &["windows", "--account", "0"],
            &["windows", "3"],
            &["disable-key", "0"],
            &["enable-key"],
            // Every column of a price is required (a missing one is not a free one).
            &[
                "set-price",
                "m",
                "--input-usd",
                "1",
                "--output-usd",
                "1",
                "--cache-read-usd",
                "0",
            ],
            &["remove-price"],
        ] {
            assert!(parse(refused).is_err(), "{refused:?} is refused");
        }
        // The subcommand names operators type.
        let names: Vec<String> = <Verb as Subcommand>::augment_subcommands(clap::Command::new("x"))
            .get_subcommands()
            .map(|c| c.get_name().to_owned())
            .collect();
        assert_eq!(
            names,
            [
                "accounts",
                "blocks",
                "windows",
                "restore",
                "clear-block",
                "usage",
                "keys",
                "disable-key",
                "enable-key",
                "status",
                "prices",
                "set-price",
                "remove-price"
            ]
        );
        assert_eq!(
            parse(&["disable-key", "4"]).expect("parses"),
            Verb::DisableKey {
                api_key_id: 4,
                format: Format::default()
            }
        );
    }

    fn account() -> AccountRow {
        AccountRow {
            id: 3,
            name: "a".into(),
            group: "g".into(),
            platform: "anthropic".into(),
            credential_kind: "api_key".into(),
            credential_masked: "sk-a…wxyz".into(),
            status: "error".into(),
            status_reason: "3 unauthorized".into(),
            priority: 1,
            weight: 2,
            concurrency_limit: 3,
            rpm_limit: 60,
            session_window_limit_usd: 12.5,
            upstream_id: String::new(),
            email: String::new(),
            plan: String::new(),
            token_expires_at_ms: 0,
            refreshable: false,
            serves: Vec::new(),
        }
    }

    #[test]
    fn text_is_one_line_per_row_and_json_is_the_endpoints_envelope() {
        let accounts = Answer::Accounts(AccountList {
            accounts: vec![account()],
        });
        assert_eq!(
            accounts.render(Output::Text).expect("text"),
            "3\ta\tgroup=g\tplatform=anthropic\tkind=api_key\tstatus=error (3 unauthorized)\t\
             priority=1\tweight=2\tconcurrency=3\trpm=60\tsession_window_usd=12.5\t\
             credential=sk-a…wxyz"
        );
        let restored = Answer::Restored(Restored { account: account() });
        assert_eq!(
            restored.render(Output::Text).expect("text"),
            accounts.render(Output::Text).expect("text"),
            "restore prints the account as accounts does"
        );
        let json: serde_json::Value =
            serde_json::from_str(&accounts.render(Output::Json).expect("json")).expect("parses");
        assert_eq!(json["accounts"][0]["status"], "error");
        assert_eq!(
            (
                &json["accounts"][0]["priority"],
                &json["accounts"][0]["weight"],
                &json["accounts"][0]["concurrency_limit"],
                &json["accounts"][0]["rpm_limit"],
                &json["accounts"][0]["session_window_limit_usd"],
            ),
            (
                &serde_json::json!(1),
                &serde_json::json!(2),
                &serde_json::json!(3),
                &serde_json::json!(60),
                &serde_json::json!(12.5),
            )
        );
        // An answer from an endpoint older than the limit columns still reads (limits 0).
        let older: AccountList = serde_json::from_value(serde_json::json!({"accounts": [{
            "id": 3, "name": "a", "group": "g", "platform": "anthropic",
            "credential_kind": "api_key", "credential_masked": "…wxyz",
            "status": "active", "status_reason": ""
        }]}))
        .expect("reads");
        assert_eq!(older.accounts[0].weight, 0);
        let empty = Answer::Blocks(BlockList { blocks: vec![] });
        assert_eq!(empty.render(Output::Text).expect("text"), "");
        let usage = Answer::Usage(UsageReport {
            from_ms: 1,
            to_ms: 2,
            keys: vec![UsageRow {
                api_key_id: 1,
                user: "u".into(),
                requests: 2,
                input_tokens: 3,
                output_tokens: 4,
                cost_usd: 0.5,
                models: vec![crate::view::ModelUsageRow {
                    model: "claude-opus-6".into(),
                    price_source: "fallback".into(),
                    requests: 2,
                    input_tokens: 3,
                    output_tokens: 4,
                    cost_usd: 0.5,
                }],
            }],
        });
        assert_eq!(
            usage.render(Output::Text).expect("text"),
            "1\tu\trequests=2\tinput_tokens=3\toutput_tokens=4\tcost_usd=0.500000\n\
             1\tu\tmodel=claude-opus-6\tprice=fallback\trequests=2\tinput_tokens=3\toutput_tokens=4\tcost_usd=0.500000"
        );
    }

    #[test]
    fn a_price_line_names_its_source_and_the_catalogue_price_it_overrides() {
        let columns = |input, output| crate::view::PriceColumns {
            search_unit: 0.0,
            input,
            output,
            cache_write: 1.25,
            cache_read: 0.1,
        };
        let overridden = PriceRow {
            model: "claude-haiku-4-5".into(),
            source: "operator".into(),
            price: Some(columns(0.5, 2.5)),
            catalogue: Some(columns(1.0, 5.0)),
        };
        assert_eq!(
            price_line(&overridden),
            "claude-haiku-4-5\tsource=operator\tinput=0.5\toutput=2.5\tcache_write=1.25\tcache_read=0.1\tcatalogue=1/5/1.25/0.1"
        );
        let none = PriceRow {
            model: "m".into(),
            source: "none".into(),
            price: None,
            catalogue: None,
        };
        assert_eq!(
            price_line(&none),
            "m\tsource=none\tinput=-\toutput=-\tcache_write=-\tcache_read=-"
        );
        let rerank = PriceRow {
            model: "rerank-v3.5".into(),
            source: "catalogue".into(),
            price: Some(crate::view::PriceColumns {
                search_unit: 0.002,
                ..columns(0.0, 0.0)
            }),
            catalogue: None,
        };
        assert!(
            price_line(&rerank).ends_with("\tsearch_unit=0.002"),
            "{}",
            price_line(&rerank)
        );
    }

    #[test]
    fn a_negative_price_is_read_as_a_value_to_refuse_not_as_a_flag() {
        use clap::Parser;
        #[derive(clap::Parser)]
        struct Cli {
            #[command(subcommand)]
            verb: Verb,
        }
        let cli = Cli::try_parse_from([
            "x",
            "set-price",
            "m",
            "--input-usd",
            "-1",
            "--output-usd",
            "2",
            "--cache-write-usd",
            "0",
            "--cache-read-usd",
            "0",
        ])
        .expect("parses");
        let Verb::SetPrice { price, .. } = cli.verb else {
            panic!("set-price")
        };
        assert_eq!(price.input_usd, -1.0);
    }

    fn window(remaining_ms: u64, age_ms: u64, utilization: Option<f64>) -> WindowRow {
        WindowRow {
            account_id: 3,
            account_name: "a".into(),
            kind: "7d".into(),
            scope: "account".into(),
            utilization,
            status: "allowed_warning".into(),
            reset_at_ms: 0,
            remaining_ms,
            length_ms: None,
            observed_at_ms: 0,
            age_ms,
        }
    }

    #[test]
    fn a_window_shows_its_share_in_percent_its_reset_as_time_left_and_its_age() {
        let line = |remaining_ms, age_ms, utilization| {
            window_line(&window(remaining_ms, age_ms, utilization))
        };
        assert_eq!(
            line(((2 * 24 + 3) * 60 + 5) * 60_000, 42_999, Some(0.905)),
            "3\ta\t7d\tscope=account\tused=90.5%\tstatus=allowed_warning\treset=2d3h\t\
             observed=42s ago"
        );
        assert!(line((3 * 60 + 12) * 60_000 + 59_000, 0, None).contains("\tused=-\t"));
        assert!(line((3 * 60 + 12) * 60_000 + 59_000, 0, None).contains("\treset=3h12m\t"));
        assert!(line(310_000, 3_600_000, Some(0.0)).ends_with("\treset=5m10s\tobserved=1h0m ago"));
        // Not reset yet, however little is left: never `0s`, never `passed`.
        assert!(
            line(1, 0, Some(1.0)).contains("\tused=100.0%\tstatus=allowed_warning\treset=1s\t")
        );
        assert!(line(0, 0, Some(1.0)).contains("\treset=passed\t"));
    }

    #[test]
    fn a_key_shows_its_status_expiry_and_lists_with_a_star_for_no_limit() {
        let key = KeyRow {
            id: 4,
            name: "ci".into(),
            prefix: "pg-abc".into(),
            user: "alice".into(),
            group: "team".into(),
            user_rpm_limit: 30,
            status: "disabled".into(),
            expires_at_ms: Some(1_796_227_745_000),
            allowed_models: vec!["claude-*".into(), "gpt-4o".into()],
            allowed_endpoints: vec![],
            concurrency_limit: 0,
            tpm_limit: 0,
            budget_total_usd: 0.0,
            budget_day_usd: 0.0,
            budget_week_usd: 0.0,
            budget_month_usd: 0.0,
            usage: vec![],
        };
        assert_eq!(
            key_line(&key, 0),
            "4\tpg-abc…\tname=ci\tuser=alice\tgroup=team\tuser_rpm=30\tstatus=disabled\t\
             expires=2026-12-02T16:09:05Z\tmodels=claude-*,gpt-4o\tendpoints=*\tconcurrency=*\t\
             tpm=*\tbudgets_usd=*"
        );
        let limited = KeyRow {
            concurrency_limit: 2,
            tpm_limit: 50_000,
            budget_day_usd: 1.5,
            budget_month_usd: 20.0,
            // The month's spend not reported: `?`.
            usage: vec![crate::view::KeyUsageRow {
                period: "day".into(),
                from_ms: 0,
                requests: 3,
                input_tokens: 10,
                output_tokens: 5,
                cost_usd: 1.204,
                remaining_usd: Some(0.296),
            }],
            ..key.clone()
        };
        assert!(
            key_line(&limited, 0)
                .ends_with("\tconcurrency=2\ttpm=50000\tbudgets_usd=day:1.20/1.5,month:?/20"),
            "{}",
            key_line(&limited, 0)
        );
        assert!(
            key_line(&key, 1_796_227_745_000).contains("\texpires=2026-12-02T16:09:05Z (passed)\t")
        );
        let never = KeyRow {
            expires_at_ms: None,
            allowed_models: vec![],
            allowed_endpoints: vec!["messages".into(), "models".into()],
            ..key.clone()
        };
        assert!(
            key_line(&never, 0).contains("\texpires=never\tmodels=*\tendpoints=messages,models\t")
        );
        let changed = Answer::Key(KeyChanged { key: key.clone() });
        let json: serde_json::Value =
            serde_json::from_str(&changed.render(Output::Json).expect("json")).expect("parses");
        assert_eq!(json["key"]["status"], "disabled");
        assert_eq!(json["key"]["expires_at_ms"], 1_796_227_745_000_i64);
    }
}
