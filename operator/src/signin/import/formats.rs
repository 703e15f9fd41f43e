//! The credential files `import` reads, each told apart by its content (the formats and where
//! each is defined: the module above, docs/SUBSCRIPTIONS.md "Imports"), read into entries.

use std::collections::HashMap;
use std::path::Path;

use poolgate_core::account::{
    AccountIdentity, CredentialKind, ImportedSettings, Platform, Secret, SignIn,
};
use serde_json::Value;

use super::super::{chatgpt, text};

/// Files larger than this are not credential files.
const MAX_FILE_BYTES: u64 = 16 << 20;

/// One account a file holds, before it is known who it is (Claude files may need the profile).
pub(super) struct Entry {
    /// `file`, `file: accounts[2]`.
    pub(super) position: String,
    pub(super) sign_in: SignIn,
    /// Claude: ask the profile who the account is (the file does not say).
    pub(super) needs_profile: bool,
}

pub(super) type Parsed = Vec<Result<Entry, (String, String)>>;

/// The entries of one file, or why it cannot be read (one refusal naming the file).
pub(super) fn read_file(path: &Path) -> Parsed {
    let name = path.display().to_string();
    let refuse = |why: String| vec![Err((name.clone(), why))];
    match std::fs::metadata(path) {
        Ok(meta) if meta.len() > MAX_FILE_BYTES => {
            return refuse(format!(
                "larger than {MAX_FILE_BYTES} bytes: not a credential file"
            ));
        }
        Ok(_) => {}
        Err(error) => return refuse(format!("cannot be read: {error}")),
    }
    let bytes = match std::fs::read(path) {
        Ok(bytes) => bytes,
        Err(error) => return refuse(format!("cannot be read: {error}")),
    };
    let value: Value = match serde_json::from_slice(&bytes) {
        Ok(value) => value,
        // serde's message may quote a value (a token): the position is enough.
        Err(error) => {
            return refuse(format!(
                "not JSON ({:?} error at line {} column {})",
                error.classify(),
                error.line(),
                error.column()
            ));
        }
    };
    parse(&name, &value)
}

/// The entries of a parsed file, by what it holds.
pub(super) fn parse(name: &str, value: &Value) -> Parsed {
    // sub2api answers its export inside `{code, message, data}`; its import takes `{data}`.
    let inner = value.get("data").filter(|d| d.get("accounts").is_some());
    let sub2api = inner.unwrap_or(value);
    if matches!(
        sub2api.get("type").and_then(Value::as_str),
        Some("sub2api-data" | "sub2api-bundle")
    ) {
        return sub2api_entries(name, sub2api);
    }
    if value.get("metadata").is_some() && value.pointer("/data/claudeAccounts").is_some() {
        return relay_service_entries(name, value);
    }
    if let Some(oauth) = value.get("claudeAiOauth") {
        return vec![claude_code_entry(name, oauth)];
    }
    if value.get("tokens").is_some() || value.get("OPENAI_API_KEY").is_some() {
        return vec![codex_entry(name, value)];
    }
    match value.get("type").and_then(Value::as_str) {
        Some("claude") => vec![cli_proxy_claude(name, value)],
        Some("codex") => vec![cli_proxy_codex(name, value)],
        Some(other) => vec![Err((
            name.to_owned(),
            format!(
                "a CLIProxyAPI `{}` account: only claude and codex are pooled",
                short(other)
            ),
        ))],
        None => vec![Err((
            name.to_owned(),
            "not a format import reads (Claude Code's .credentials.json, Codex's auth.json, \
             a CLIProxyAPI auth file, a sub2api or claude-relay-service export)"
                .into(),
        ))],
    }
}

/// A value quoted in a refusal: short, printable, never a token's length.
fn short(text: &str) -> String {
    text.chars().filter(|c| !c.is_control()).take(32).collect()
}

/// An instant as the formats write it: ms or s since the epoch (a number or a numeric string;
/// above 10^12 it is ms), or RFC 3339; 0 when absent or unreadable.
fn instant_ms(value: Option<&Value>) -> i64 {
    let Some(value) = value else { return 0 };
    let number = match value {
        Value::Number(n) => n.as_f64(),
        Value::String(s) => s.trim().parse::<f64>().ok(),
        _ => None,
    };
    if let Some(n) = number {
        return if n > 1e12 {
            n as i64
        } else {
            (n * 1000.0) as i64
        };
    }
    value
        .as_str()
        .and_then(|s| s.parse::<jiff::Timestamp>().ok())
        .map_or(0, |t| t.as_millisecond())
}

/// An API key's identity: there is no account id behind a key, so the key's own fingerprint
/// (the same key imported twice is one account).
fn key_identity(key: &str) -> AccountIdentity {
    AccountIdentity {
        upstream_id: format!("key:{}", poolgate_core::short_hash(key)),
        ..AccountIdentity::default()
    }
}

/// What a file says of a Claude subscription.
struct ClaudeFile<'a> {
    access: String,
    refresh: String,
    expires_at_ms: i64,
    user: &'a str,
    organisation: &'a str,
    email: String,
    plan: String,
}

fn claude_entry(position: String, file: ClaudeFile<'_>) -> Result<Entry, (String, String)> {
    let ClaudeFile {
        access,
        refresh,
        expires_at_ms,
        user,
        organisation,
        email,
        plan,
    } = file;
    if access.is_empty() {
        return Err((
            position,
            "no access token (a signed-out or dead login)".into(),
        ));
    }
    let mut sign_in = SignIn::new(Platform::Anthropic, CredentialKind::OAuth, access);
    sign_in.refresh_token = Secret::new(refresh);
    sign_in.expires_at_ms = expires_at_ms;
    let upstream_id = AccountIdentity::upstream_id(user, organisation);
    sign_in.identity = AccountIdentity {
        upstream_id: upstream_id.clone().unwrap_or_default(),
        email,
        plan,
    };
    Ok(Entry {
        position,
        sign_in,
        needs_profile: upstream_id.is_none(),
    })
}

fn claude_code_entry(name: &str, oauth: &Value) -> Result<Entry, (String, String)> {
    claude_entry(
        name.to_owned(),
        ClaudeFile {
            access: text(oauth, &["accessToken"]),
            refresh: text(oauth, &["refreshToken"]),
            expires_at_ms: instant_ms(oauth.get("expiresAt")),
            user: &text(oauth, &["accountUuid"]),
            organisation: &text(oauth, &["organizationUuid"]),
            email: String::new(),
            plan: text(oauth, &["subscriptionType"]),
        },
    )
}

fn chatgpt_entry(
    position: String,
    access: String,
    refresh: String,
    id_token: &str,
    expires_at_ms: i64,
) -> Result<Entry, (String, String)> {
    if access.is_empty() || refresh.is_empty() {
        return Err((position, "no access or refresh token".into()));
    }
    let Some(identity) = chatgpt::identity_of(id_token, &access) else {
        return Err((position, "its tokens name no ChatGPT account".into()));
    };
    let expires_at_ms = if expires_at_ms > 0 {
        expires_at_ms
    } else {
        super::super::jwt_expiry_ms(&access)
    };
    let mut sign_in = SignIn::new(Platform::OpenAi, CredentialKind::ChatGptOAuth, access);
    sign_in.refresh_token = Secret::new(refresh);
    sign_in.expires_at_ms = expires_at_ms;
    sign_in.identity = identity;
    Ok(Entry {
        position,
        sign_in,
        needs_profile: false,
    })
}

fn codex_entry(name: &str, value: &Value) -> Result<Entry, (String, String)> {
    if let Some(tokens) = value.get("tokens").filter(|t| t.is_object()) {
        return chatgpt_entry(
            name.to_owned(),
            text(tokens, &["access_token"]),
            text(tokens, &["refresh_token"]),
            &text(tokens, &["id_token"]),
            0,
        );
    }
    let key = text(value, &["OPENAI_API_KEY"]);
    if key.is_empty() {
        return Err((name.to_owned(), "neither tokens nor OPENAI_API_KEY".into()));
    }
    let identity = key_identity(&key);
    let mut sign_in = SignIn::new(Platform::OpenAi, CredentialKind::ApiKey, key);
    sign_in.identity = identity;
    Ok(Entry {
        position: name.to_owned(),
        sign_in,
        needs_profile: false,
    })
}

fn cli_proxy_claude(name: &str, value: &Value) -> Result<Entry, (String, String)> {
    claude_entry(
        name.to_owned(),
        ClaudeFile {
            access: text(value, &["access_token"]),
            refresh: text(value, &["refresh_token"]),
            expires_at_ms: instant_ms(value.get("expired")),
            user: &text(value, &["account_uuid"]),
            organisation: &text(value, &["organization_uuid"]),
            email: text(value, &["email"]),
            plan: String::new(),
        },
    )
}

fn cli_proxy_codex(name: &str, value: &Value) -> Result<Entry, (String, String)> {
    chatgpt_entry(
        name.to_owned(),
        text(value, &["access_token"]),
        text(value, &["refresh_token"]),
        &text(value, &["id_token"]),
        instant_ms(value.get("expired")),
    )
}

/// A proxy URL from sub2api's `protocol|host|port|username|password` key (or its entry).
fn sub2api_proxy(proxy: &Value) -> Option<String> {
    let protocol = text(proxy, &["protocol"]);
    let host = text(proxy, &["host"]);
    let port = proxy.get("port")?.as_u64()?;
    if !matches!(protocol.as_str(), "http" | "https" | "socks5" | "socks5h") || host.is_empty() {
        return None;
    }
    let user = text(proxy, &["username"]);
    let auth = if user.is_empty() {
        String::new()
    } else {
        let mut url = reqwest::Url::parse("http://x").ok()?;
        url.set_username(&user).ok()?;
        url.set_password(Some(&text(proxy, &["password"]))).ok()?;
        format!("{}:{}@", url.username(), url.password().unwrap_or_default())
    };
    Some(format!("{protocol}://{auth}{host}:{port}"))
}

fn sub2api_entries(name: &str, value: &Value) -> Parsed {
    let proxies: HashMap<String, String> = value
        .get("proxies")
        .and_then(Value::as_array)
        .map(|list| {
            list.iter()
                .filter_map(|p| Some((text(p, &["proxy_key"]), sub2api_proxy(p)?)))
                .collect()
        })
        .unwrap_or_default();
    let Some(accounts) = value.get("accounts").and_then(Value::as_array) else {
        return vec![Err((
            name.to_owned(),
            "a sub2api export without accounts".into(),
        ))];
    };
    accounts
        .iter()
        .enumerate()
        .map(|(index, account)| {
            let position = format!("{name}: accounts[{index}]");
            let credentials = account.get("credentials").cloned().unwrap_or(Value::Null);
            let platform = text(account, &["platform"]);
            let kind = text(account, &["type"]);
            let mut entry = match (platform.as_str(), kind.as_str()) {
                ("anthropic", "oauth" | "setup-token") => claude_entry(
                    position.clone(),
                    ClaudeFile {
                        access: text(&credentials, &["access_token"]),
                        refresh: if kind == "setup-token" {
                            String::new()
                        } else {
                            text(&credentials, &["refresh_token"])
                        },
                        expires_at_ms: instant_ms(credentials.get("expires_at")),
                        user: &text(&credentials, &["account_uuid"]),
                        organisation: &text(&credentials, &["org_uuid"]),
                        email: text(&credentials, &["email_address"]),
                        plan: String::new(),
                    },
                )?,
                ("openai", "oauth") => chatgpt_entry(
                    position.clone(),
                    text(&credentials, &["access_token"]),
                    text(&credentials, &["refresh_token"]),
                    &text(&credentials, &["id_token"]),
                    instant_ms(credentials.get("expires_at")),
                )?,
                ("anthropic" | "openai", "apikey") => {
                    let key = text(&credentials, &["api_key"]);
                    if key.is_empty() {
                        return Err((position, "an API-key account without api_key".into()));
                    }
                    let platform = Platform::parse(&platform).unwrap_or(Platform::OpenAi);
                    let identity = key_identity(&key);
                    let mut sign_in = SignIn::new(platform, CredentialKind::ApiKey, key);
                    sign_in.identity = identity;
                    sign_in.base_url =
                        Some(text(&credentials, &["base_url"])).filter(|u| !u.is_empty());
                    Entry {
                        position: position.clone(),
                        sign_in,
                        needs_profile: false,
                    }
                }
                _ => {
                    return Err((
                        position,
                        format!(
                            "a {} {} account: poolgate pools anthropic and openai oauth, \
                             setup-token and apikey accounts",
                            short(&platform),
                            short(&kind)
                        ),
                    ));
                }
            };
            let name_field = text(account, &["name"]);
            entry.sign_in.name = Some(name_field).filter(|n| !n.is_empty());
            let int = |key: &str| {
                account
                    .get(key)
                    .and_then(Value::as_i64)
                    .and_then(|v| i32::try_from(v).ok())
            };
            entry.sign_in.settings = ImportedSettings {
                priority: int("priority"),
                concurrency_limit: int("concurrency").filter(|c| *c >= 0),
                rpm_limit: None,
                proxy_url: account
                    .get("proxy_key")
                    .and_then(Value::as_str)
                    .and_then(|key| proxies.get(key).cloned()),
                model_mapping: credentials
                    .get("model_mapping")
                    .and_then(Value::as_object)
                    .map(|map| {
                        map.iter()
                            .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_owned())))
                            .collect()
                    }),
            };
            Ok(entry)
        })
        .collect()
}

fn relay_service_entries(name: &str, value: &Value) -> Parsed {
    let flag = |key: &str| {
        value
            .pointer(&format!("/metadata/{key}"))
            .is_some_and(|v| v == &Value::Bool(true) || v == "true")
    };
    if flag("sanitized") {
        return vec![Err((
            name.to_owned(),
            "a sanitized claude-relay-service export: its secrets are redacted".into(),
        ))];
    }
    let decrypted = flag("decrypted");
    let Some(accounts) = value
        .pointer("/data/claudeAccounts")
        .and_then(Value::as_array)
    else {
        return vec![Err((name.to_owned(), "no data.claudeAccounts list".into()))];
    };
    accounts
        .iter()
        .enumerate()
        .map(|(index, account)| {
            let position = format!("{name}: data.claudeAccounts[{index}]");
            if !decrypted {
                return Err((
                    position,
                    "encrypted: export with `data-transfer-enhanced.js export --decrypt=true`"
                        .into(),
                ));
            }
            // Every value of a Redis hash is a string; `claudeAiOauth` may be an object or one
            // as JSON text.
            let oauth = match account.get("claudeAiOauth") {
                Some(Value::String(json)) => serde_json::from_str(json).unwrap_or(Value::Null),
                Some(object) => object.clone(),
                None => Value::Null,
            };
            let pick = |object_key: &str, flat_key: &str| {
                let value = text(&oauth, &[object_key]);
                if value.is_empty() {
                    text(account, &[flat_key])
                } else {
                    value
                }
            };
            let expires = oauth.get("expiresAt").or_else(|| account.get("expiresAt"));
            let mut entry = claude_entry(
                position,
                ClaudeFile {
                    access: pick("accessToken", "accessToken"),
                    refresh: pick("refreshToken", "refreshToken"),
                    expires_at_ms: instant_ms(expires),
                    user: "",
                    organisation: "",
                    email: text(account, &["email"]),
                    plan: String::new(),
                },
            )?;
            entry.sign_in.name = Some(text(account, &["name"])).filter(|n| !n.is_empty());
            let proxy = match account.get("proxy") {
                Some(Value::String(json)) => serde_json::from_str(json).ok(),
                Some(object) if object.is_object() => Some(object.clone()),
                _ => None,
            };
            entry.sign_in.settings = ImportedSettings {
                priority: text(account, &["priority"]).parse().ok(),
                proxy_url: proxy.as_ref().and_then(|p| {
                    let mut p = p.clone();
                    p["protocol"] = p.get("type").cloned().unwrap_or(Value::Null);
                    if let Some(port) = p
                        .get("port")
                        .and_then(Value::as_str)
                        .and_then(|s| s.parse::<u64>().ok())
                    {
                        p["port"] = port.into();
                    }
                    sub2api_proxy(&p)
                }),
                ..ImportedSettings::default()
            };
            Ok(entry)
        })
        .collect()
}
