//! Where and how requests reach each upstream dialect: URLs under an account's base, the
//! identity subscription tokens need. Shared by the relay's requests and the selector's probe.

/// The upstream URL for a path such as `/v1/messages`, whether or not the base ends in `/v1`.
pub fn upstream_url(base: &str, path: &str) -> String {
    let base = base.trim_end_matches('/');
    if base.ends_with("/v1") {
        format!("{base}{}", path.trim_start_matches("/v1"))
    } else {
        format!("{base}{path}")
    }
}

/// The ChatGPT backend's Codex endpoint under an account's base URL (the default base is
/// `https://chatgpt.com/backend-api`).
pub fn chatgpt_responses_url(base: &str) -> String {
    format!("{}/codex/responses", base.trim_end_matches('/'))
}

/// Claude Code's identity line: Anthropic accepts subscription (OAuth) tokens only on requests
/// that open with it.
pub const CLAUDE_CODE_IDENTITY: &str = "You are Claude Code, Anthropic's official CLI for Claude.";
