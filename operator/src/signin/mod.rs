//! Signing subscription accounts in, as the official CLIs do, from the one operator CLI in both
//! modes (docs/DESIGN.md §5, "Signing accounts in"): `login claude` (Claude Code's
//! authorization-code flow with PKCE, and `--setup-token`, its year-long inference-only token),
//! `login chatgpt` (the Codex CLI's flow, and `--device`, its device-code flow), and `import` of
//! the credential files teams already have. The flows run in the CLI's process; what they end
//! with — the tokens and who the upstream says the account is ([`SignIn`]) — goes to the admin
//! endpoint's one write ([`crate::AdminEndpoint::sign_in`]).
//!
//! The endpoints, client ids, redirect URIs and scopes are the pinned CLIs' ([`claude`],
//! [`chatgpt`]); `selector-svc/tests/token_endpoints.rs` reads them in the binaries.
//! Nothing secret is printed or logged: not the PKCE verifier, not the code, not a token
//! ([`SignInError`] names the step and the upstream's status and error code, never a body).

pub mod chatgpt;
pub mod claude;
pub mod import;

use std::io::BufRead;
use std::process::ExitCode;
use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use poolgate_core::account::{Secret, SignIn};
use poolgate_select::crypto::Keyring;
use sha2_hmac::{Digest, Sha256};

use crate::{AdminEndpoint, OperatorError, SignedInRow};

/// Why a sign-in stopped; nothing was changed. Each names its step.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SignInError {
    /// What the operator pasted is not what the flow expects.
    #[error("the pasted answer: {0}")]
    Paste(String),
    /// The `state` that came back is not the one this sign-in sent (another sign-in's answer,
    /// or a forged one).
    #[error("the pasted answer's state is not this sign-in's; start again")]
    State,
    /// The upstream refused a step (its status and, when it gave one, its error code).
    #[error("{step} refused: {status}{}", code.as_deref().map(|c| format!(" ({c})")).unwrap_or_default())]
    Refused {
        step: &'static str,
        status: u16,
        code: Option<String>,
    },
    #[error("{step}: the upstream is unreachable: {detail}")]
    Unreachable { step: &'static str, detail: String },
    #[error("{step}: the upstream's answer is unreadable: {detail}")]
    Unreadable { step: &'static str, detail: String },
    /// The device code expired before the operator approved it.
    #[error("the device code expired before it was approved; start again")]
    Expired,
    #[error("{0}")]
    Input(String),
}

/// The PKCE pair and the `state` of one authorization-code sign-in (RFC 7636, S256): the
/// verifier never leaves this process except in the token exchange.
pub struct Pkce {
    pub verifier: Secret,
    pub challenge: String,
    pub state: String,
}

impl Pkce {
    pub fn new() -> Self {
        let verifier = URL_SAFE_NO_PAD.encode(Keyring::random_bytes::<32>());
        let challenge = URL_SAFE_NO_PAD.encode(Sha256::digest(verifier.as_bytes()));
        let state = URL_SAFE_NO_PAD.encode(Keyring::random_bytes::<32>());
        Pkce {
            verifier: Secret::new(verifier),
            challenge,
            state,
        }
    }
}

impl Default for Pkce {
    fn default() -> Self {
        Pkce::new()
    }
}

/// An endpoint moved onto `base` (scheme, host and port; the path kept): the hidden
/// `--oauth-base` the tests point at their fake servers. `None`: the endpoint as it is.
pub fn rebase(url: &str, base: Option<&str>) -> Result<String, SignInError> {
    let Some(base) = base else {
        return Ok(url.to_owned());
    };
    let base =
        reqwest::Url::parse(base).map_err(|e| SignInError::Input(format!("--oauth-base: {e}")))?;
    let mut moved =
        reqwest::Url::parse(url).map_err(|e| SignInError::Input(format!("{url}: {e}")))?;
    moved
        .set_scheme(base.scheme())
        .map_err(|()| SignInError::Input("--oauth-base: must be http(s)".into()))?;
    moved
        .set_host(base.host_str())
        .map_err(|e| SignInError::Input(format!("--oauth-base: {e}")))?;
    moved
        .set_port(base.port())
        .map_err(|()| SignInError::Input("--oauth-base: no port here".into()))?;
    Ok(moved.to_string())
}

/// The HTTP client of the flows: bounded, no redirects followed (an authorization server that
/// redirects a token exchange is refusing it).
pub fn http_client() -> Result<reqwest::Client, SignInError> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::builder()
        // poolgate's own name: it signs in with the CLIs' client ids (the only ones the
        // authorization servers accept for subscriptions) but never claims to be the CLI.
        .user_agent(concat!("poolgate/", env!("CARGO_PKG_VERSION")))
        .timeout(Duration::from_secs(30))
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .map_err(|e| SignInError::Input(format!("http client: {e}")))
}

/// The upstream's error code of a refused step, from an OAuth error body (`{"error":
/// "invalid_grant"}`) or an API error (`{"error": {"type": …}}`); only a short token-like word,
/// never free text (which could echo what was sent).
pub(crate) fn error_code(body: &[u8]) -> Option<String> {
    let value: serde_json::Value = serde_json::from_slice(body).ok()?;
    let code = match value.get("error")? {
        serde_json::Value::String(code) => code.clone(),
        serde_json::Value::Object(error) => error
            .get("type")
            .or_else(|| error.get("code"))?
            .as_str()?
            .to_owned(),
        _ => return None,
    };
    let word = code.len() <= 64
        && code
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'));
    word.then_some(code)
}

/// Sends a step's request; its JSON answer, or the step refused with the status and code.
pub(crate) async fn call_json(
    step: &'static str,
    request: reqwest::RequestBuilder,
) -> Result<serde_json::Value, SignInError> {
    let response = request.send().await.map_err(|e| SignInError::Unreachable {
        step,
        detail: e.without_url().to_string(),
    })?;
    let status = response.status();
    let body = response
        .bytes()
        .await
        .map_err(|e| SignInError::Unreachable {
            step,
            detail: e.without_url().to_string(),
        })?;
    if !status.is_success() {
        return Err(SignInError::Refused {
            step,
            status: status.as_u16(),
            code: error_code(&body),
        });
    }
    serde_json::from_slice(&body).map_err(|e| SignInError::Unreadable {
        step,
        detail: format!("{:?} error at column {}", e.classify(), e.column()),
    })
}

/// A string field of an answer; empty when absent.
pub(crate) fn text(value: &serde_json::Value, path: &[&str]) -> String {
    let mut at = value;
    for key in path {
        match at.get(key) {
            Some(next) => at = next,
            None => return String::new(),
        }
    }
    at.as_str().unwrap_or_default().to_owned()
}

/// The claims of a JWT (its middle part), unverified: what the CLIs read of their own id token.
pub(crate) fn jwt_claims(token: &str) -> Option<serde_json::Value> {
    let payload = token.split('.').nth(1)?;
    let bytes = URL_SAFE_NO_PAD.decode(payload.trim_end_matches('=')).ok()?;
    serde_json::from_slice(&bytes).ok()
}

/// The instant `seconds` from now, ms since the epoch (0 for none); saturating, whatever an
/// answer or a file says.
pub(crate) fn expiry_in(seconds: i64) -> i64 {
    if seconds <= 0 {
        return 0;
    }
    poolgate_core::now_ms().saturating_add(seconds.saturating_mul(1000))
}

/// A JWT's `exp` in ms since the epoch; 0 without one.
pub(crate) fn jwt_expiry_ms(token: &str) -> i64 {
    jwt_claims(token)
        .and_then(|claims| claims.get("exp")?.as_i64())
        .filter(|exp| *exp > 0)
        .map_or(0, |exp| exp.saturating_mul(1000))
}

/// Where an operator's answers come from: the terminal, or a test's pipe.
pub trait Prompt {
    /// Shows `text` (instructions, the URL to open) to the operator.
    fn show(&mut self, text: &str);
    /// The next line the operator enters, trimmed; `None` at end of input.
    fn read_line(&mut self, question: &str) -> Option<String>;
}

/// The terminal: instructions on stderr (stdout stays the answer), answers from stdin.
pub struct Terminal;

impl Prompt for Terminal {
    fn show(&mut self, text: &str) {
        eprintln!("{text}");
    }

    fn read_line(&mut self, question: &str) -> Option<String> {
        eprint!("{question}");
        let mut line = String::new();
        match std::io::stdin().lock().read_line(&mut line) {
            Ok(0) | Err(_) => None,
            Ok(_) => Some(line.trim().to_owned()),
        }
    }
}

/// The sign-in and import verbs, the same against a selector and against a standalone relay.
#[derive(Debug, Clone, PartialEq, clap::Subcommand)]
pub enum SignInVerb {
    /// Signs a Claude or ChatGPT subscription account in, as the official CLI does, and puts it
    /// in the pool (or, with --account, signs that account in again).
    Login(Login),
    /// Imports accounts from credential files: Claude Code's `.credentials.json`, Codex's
    /// `auth.json`, CLIProxyAPI's auth files, a sub2api or claude-relay-service export.
    Import(import::Import),
}

/// Which subscription `login` signs in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Subscription {
    /// A Claude subscription (Pro, Max, Team, Enterprise), as Claude Code signs in.
    Claude,
    /// A ChatGPT subscription (Plus, Pro, Team, …), as the Codex CLI signs in.
    Chatgpt,
}

#[derive(Debug, Clone, PartialEq, clap::Args)]
pub struct Login {
    #[arg(value_enum)]
    pub subscription: Subscription,
    /// Claude: the long-lived inference-only token of Claude Code's `setup-token` (a year, no
    /// refresh token: sign the account in again before it expires).
    #[arg(long)]
    pub setup_token: bool,
    /// ChatGPT: the device-code flow, for a machine without a browser.
    #[arg(long)]
    pub device: bool,
    /// Sign this account in again (its tokens replaced; id, limits, group and history kept).
    #[arg(long = "account", value_parser = clap::value_parser!(i64).range(1..))]
    pub account_id: Option<i64>,
    /// A new account's name (default: `claude-<email>`, `chatgpt-<email>`).
    #[arg(long)]
    pub name: Option<String>,
    /// A new account's group (default: `default`).
    #[arg(long)]
    pub group: Option<String>,
    /// A new account's base URL (default: the platform's: `https://api.anthropic.com`,
    /// `https://chatgpt.com/backend-api`).
    #[arg(long)]
    pub base_url: Option<String>,
    /// Moves every authorization endpoint (Anthropic's and OpenAI's: authorize, token, profile,
    /// device code) onto this origin, their paths kept: for tests against fake servers, or a
    /// proxy that forwards them.
    #[arg(long, env = "POOLGATE_OAUTH_BASE")]
    pub oauth_base: Option<String>,
}

impl Login {
    fn target(&self, mut sign_in: SignIn) -> SignIn {
        sign_in.account_id = self.account_id;
        sign_in.name = self.name.clone();
        sign_in.group = self.group.clone();
        sign_in.base_url = self.base_url.clone();
        sign_in
    }
}

/// The one line a sign-in's result prints: what happened, the account's id, name, identity.
pub fn signed_in_line(row: &SignedInRow) -> String {
    let what = match (row.created, row.reactivated) {
        (true, _) => "created",
        (false, true) => "signed in again (active again)",
        (false, false) => "signed in again",
    };
    let account = &row.account;
    let mut line = format!(
        "{what}\t{}\t{}\tgroup={}\tkind={}",
        account.id, account.name, account.group, account.credential_kind
    );
    for (key, value) in [
        ("email", &account.email),
        ("plan", &account.plan),
        ("upstream_id", &account.upstream_id),
    ] {
        if !value.is_empty() {
            line.push_str(&format!("\t{key}={value}"));
        }
    }
    line
}

/// Runs a sign-in verb and prints its result (stdout) or its error (stderr, exit 2 for the
/// operator's input or a refused step, 1 for an outage).
pub async fn run(
    program: &str,
    endpoint: &dyn AdminEndpoint,
    verb: &SignInVerb,
    prompt: &mut dyn Prompt,
) -> ExitCode {
    let result = match verb {
        SignInVerb::Login(login) => login_and_store(endpoint, login, prompt)
            .await
            .map(|row| signed_in_line(&row)),
        SignInVerb::Import(import) => import::run(endpoint, import).await,
    };
    match result {
        Ok(text) => {
            if !text.is_empty() {
                println!("{text}");
            }
            ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("{program}: {error}");
            ExitCode::from(error.exit_code())
        }
    }
}

/// Why a sign-in verb did not finish.
#[derive(Debug, thiserror::Error)]
pub enum VerbError {
    #[error("sign-in: {0}")]
    SignIn(#[from] SignInError),
    #[error(transparent)]
    Endpoint(#[from] OperatorError),
    /// An import that put some entries in and refused others (each reported).
    #[error("{0}")]
    Partial(String),
}

impl VerbError {
    pub fn exit_code(&self) -> u8 {
        match self {
            VerbError::SignIn(SignInError::Unreachable { .. }) => 1,
            VerbError::SignIn(_) | VerbError::Partial(_) => 2,
            VerbError::Endpoint(error) => error.exit_code(),
        }
    }
}

/// Runs `login`'s flow, then puts the account into the pool.
pub async fn login_and_store(
    endpoint: &dyn AdminEndpoint,
    login: &Login,
    prompt: &mut dyn Prompt,
) -> Result<SignedInRow, VerbError> {
    let http = http_client()?;
    let base = login.oauth_base.as_deref();
    let sign_in = match (login.subscription, login.setup_token, login.device) {
        (Subscription::Claude, setup_token, false) => {
            claude::sign_in(&http, base, setup_token, prompt).await?
        }
        (Subscription::Claude, _, true) => {
            return Err(SignInError::Input(
                "--device is the ChatGPT device-code flow; Claude Code signs in with a pasted code"
                    .into(),
            )
            .into());
        }
        (Subscription::Chatgpt, true, _) => {
            return Err(SignInError::Input(
                "--setup-token is Claude Code's; not for ChatGPT".into(),
            )
            .into());
        }
        (Subscription::Chatgpt, false, false) => chatgpt::sign_in(&http, base, prompt).await?,
        (Subscription::Chatgpt, false, true) => {
            chatgpt::sign_in_device(&http, base, prompt).await?
        }
    };
    Ok(endpoint.sign_in(&login.target(sign_in)).await?)
}
