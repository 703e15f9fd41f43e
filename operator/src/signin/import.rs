//! `import`: accounts from the credential files teams already have, each put into the pool by
//! the one sign-in write ([`crate::AdminEndpoint::sign_in`]), so the same account imported twice
//! is updated by its identity, never duplicated. Formats (docs/SUBSCRIPTIONS.md, "Imports",
//! cites where each is defined):
//!
//! - Claude Code's `~/.claude/.credentials.json` (`claudeAiOauth`: `accessToken`,
//!   `refreshToken`, `expiresAt` in ms, `subscriptionType`; who the account is from its
//!   `accountUuid`/`organizationUuid` when present, else from the profile endpoint);
//! - Codex's `~/.codex/auth.json` (`tokens.{id_token, access_token, refresh_token}`, the identity
//!   from the id token; or `OPENAI_API_KEY`, an API-key account);
//! - CLIProxyAPI's auth files (one account per file, `type` `claude` or `codex`, `expired` in
//!   RFC 3339);
//! - a sub2api export (`type: sub2api-data`, its `accounts` with `credentials`, `concurrency`,
//!   `priority`, `proxy_key` into its `proxies`);
//! - a claude-relay-service export (`metadata` + `data.claudeAccounts`, every value a string;
//!   only a `--decrypt=true`, unsanitized export carries usable tokens).
//!
//! An entry that cannot be imported is reported by its position and reason, and the others go
//! in; `--dry-run` prints what would change (tokens masked) and changes nothing.

use std::collections::HashMap;
use std::path::PathBuf;

use poolgate_core::account::{AccountIdentity, SignIn};

use super::{VerbError, claude, http_client};
use crate::AdminEndpoint;
use formats::read_file;

#[derive(Debug, Clone, PartialEq, clap::Args)]
pub struct Import {
    /// The files to import (each of the formats above; told apart by their content).
    #[arg(required = true)]
    pub files: Vec<PathBuf>,
    /// Prints what would change (secrets masked) and changes nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// The group of new accounts (default: `default`); an existing account keeps its own.
    #[arg(long)]
    pub group: Option<String>,
    /// New accounts' base URL (default: the platform's).
    #[arg(long)]
    pub base_url: Option<String>,
    /// Moves every authorization endpoint (Anthropic's and OpenAI's: authorize, token, profile,
    /// device code) onto this origin, their paths kept: for tests against fake servers, or a
    /// proxy that forwards them.
    #[arg(long, env = "POOLGATE_OAUTH_BASE")]
    pub oauth_base: Option<String>,
}

/// Runs the import: every entry of every file, in order; the report's lines on success, or the
/// report printed and an error naming how many entries were refused.
pub async fn run(endpoint: &dyn AdminEndpoint, import: &Import) -> Result<String, VerbError> {
    let http = http_client()?;
    let base = import.oauth_base.as_deref();
    let mut lines = Vec::new();
    let mut refused = 0usize;
    // Who is already in the pool, for `--dry-run`'s "would update".
    let known: HashMap<(String, String), (i64, String)> = if import.dry_run {
        endpoint
            .accounts(None)
            .await?
            .into_iter()
            .filter(|a| !a.upstream_id.is_empty())
            .map(|a| ((a.platform, a.upstream_id), (a.id, a.name)))
            .collect()
    } else {
        HashMap::new()
    };
    for file in &import.files {
        for parsed in read_file(file) {
            let mut entry = match parsed {
                Ok(entry) => entry,
                Err((position, why)) => {
                    refused += 1;
                    lines.push(format!("refused\t{position}\t{why}"));
                    continue;
                }
            };
            if entry.needs_profile {
                match claude::profile_identity(&http, base, entry.sign_in.access_token.expose())
                    .await
                {
                    Ok(identity) => {
                        let plan = std::mem::take(&mut entry.sign_in.identity.plan);
                        entry.sign_in.identity = AccountIdentity {
                            plan: if identity.plan.is_empty() {
                                plan
                            } else {
                                identity.plan
                            },
                            ..identity
                        };
                    }
                    Err(error) => {
                        refused += 1;
                        lines.push(format!(
                            "refused\t{}\tthe file does not say who the account is, and {error}",
                            entry.position
                        ));
                        continue;
                    }
                }
            }
            let mut sign_in = entry.sign_in;
            sign_in.group = sign_in.group.or_else(|| import.group.clone());
            sign_in.base_url = sign_in.base_url.or_else(|| import.base_url.clone());
            if let Some((field, why)) = sign_in.problem() {
                refused += 1;
                lines.push(format!("refused\t{}\t{field}: {why}", entry.position));
                continue;
            }
            let described = describe(&sign_in);
            if import.dry_run {
                let key = (
                    sign_in.platform.as_str().to_owned(),
                    sign_in.identity.upstream_id.clone(),
                );
                lines.push(match known.get(&key) {
                    Some((id, name)) => format!(
                        "would update\t{}\taccount {id} {name}\t{described}",
                        entry.position
                    ),
                    None => format!(
                        "would create\t{}\t{}\t{described}",
                        entry.position,
                        sign_in
                            .name
                            .clone()
                            .unwrap_or_else(|| sign_in.default_name())
                    ),
                });
                continue;
            }
            match endpoint.sign_in(&sign_in).await {
                Ok(row) => lines.push(format!(
                    "{}\t{}\taccount {} {}\t{described}",
                    if row.created { "created" } else { "updated" },
                    entry.position,
                    row.account.id,
                    row.account.name
                )),
                Err(error) => {
                    refused += 1;
                    lines.push(format!("refused\t{}\t{}", entry.position, error.detail()));
                }
            }
        }
    }
    let report = lines.join("\n");
    if refused == 0 {
        return Ok(report);
    }
    println!("{report}");
    Err(VerbError::Partial(format!(
        "{refused} of {} entries not imported (listed above)",
        lines.len()
    )))
}

/// `platform kind email plan token=<masked> refresh=yes|no expires=<RFC 3339>`.
fn describe(sign_in: &SignIn) -> String {
    let mut text = format!(
        "platform={}\tkind={}\ttoken={}",
        sign_in.platform.as_str(),
        sign_in.kind.as_str(),
        sign_in.access_token.masked()
    );
    for (key, value) in [
        ("email", &sign_in.identity.email),
        ("plan", &sign_in.identity.plan),
    ] {
        if !value.is_empty() {
            text.push_str(&format!("\t{key}={value}"));
        }
    }
    if sign_in.kind.is_oauth() {
        text.push_str(if sign_in.refresh_token.is_empty() {
            "\trefresh=no"
        } else {
            "\trefresh=yes"
        });
    }
    text
}

mod formats;

#[cfg(test)]
mod tests;
