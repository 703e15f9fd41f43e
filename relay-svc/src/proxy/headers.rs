//! The header rules both ways (docs/DESIGN.md §6, "Headers, both ways"): what passes from the
//! client to each upstream and what the relay sets itself (betas merged, the ChatGPT backend's
//! own headers), the query parameters that pass, the headers a response keeps on its way back,
//! and who the client says it is (`from_platform_cli`).

use http::HeaderMap;
use poolgate_core::account::CredentialKind;

use super::Inbound;
use crate::client_api::Api;

/// Where a request goes, for the header rules (docs/DESIGN.md §6, "Headers, both ways"): the
/// Anthropic API, the OpenAI API (and compatible bases), or the ChatGPT backend (a ChatGPT
/// subscription account), which gets what Codex sends it (docs/SUBSCRIPTIONS.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Upstream {
    Anthropic,
    OpenAi,
    ChatGpt,
    /// A rerank API in Cohere's format.
    Cohere,
}

impl Upstream {
    pub fn of(api: Api, kind: CredentialKind) -> Self {
        match (api, kind) {
            (_, CredentialKind::ChatGptOAuth) => Upstream::ChatGpt,
            (Api::Anthropic, _) => Upstream::Anthropic,
            (Api::OpenAi, _) => Upstream::OpenAi,
            (Api::Cohere, _) => Upstream::Cohere,
        }
    }
}

/// Request headers every upstream gets as the client sent them.
const COMMON_HEADERS: [&str; 3] = ["content-type", "accept", "user-agent"];

/// What the Stainless-generated SDKs (Anthropic's and OpenAI's; Claude Code is built on the
/// former) say about themselves and their retries: to the two APIs, not the ChatGPT backend.
const STAINLESS_HEADERS: [&str; 15] = [
    "x-stainless-arch",
    "x-stainless-async",
    "x-stainless-custom-poll-interval",
    "x-stainless-helper",
    "x-stainless-helper-method",
    "x-stainless-lang",
    "x-stainless-os",
    "x-stainless-package-version",
    "x-stainless-poll-helper",
    "x-stainless-read-timeout",
    "x-stainless-retry-count",
    "x-stainless-runtime",
    "x-stainless-runtime-version",
    "x-stainless-stream-helper",
    "x-stainless-timeout",
];

/// The Anthropic API's own (`anthropic-beta` is merged with the account's betas, not passed),
/// and Claude Code's. `x-claude-code-*` passes as a prefix: each Claude Code release adds some.
const ANTHROPIC_HEADERS: [&str; 6] = [
    "anthropic-version",
    "anthropic-dangerous-direct-browser-access",
    "x-app",
    "x-client-request-id",
    "x-claude-1p-request-class",
    "idempotency-key",
];
const ANTHROPIC_PREFIXES: [&str; 1] = ["x-claude-code-"];

/// Codex's (`x-codex-*` as a prefix, as Claude Code's above): to the OpenAI API and the ChatGPT
/// backend alike. Codex 0.171 signed in with ChatGPT sends these and `chatgpt-account-id`, which
/// the relay sets from the account's token; a client that names no session gets the relay's
/// session hash as `session-id` on the ChatGPT backend.
const CODEX_HEADERS: [&str; 7] = [
    "originator",
    "session-id",
    "session_id",
    "thread-id",
    "x-client-request-id",
    "x-openai-subagent",
    "x-openai-internal-codex-responses-lite",
];
const CODEX_PREFIXES: [&str; 1] = ["x-codex-"];

/// Cohere's SDK's own (`client_wrapper.py` of cohere-python 7.0.9): the client name it is
/// given, and the Fern generator's `x-fern-*` description of itself.
const COHERE_HEADERS: [&str; 1] = ["x-client-name"];
const COHERE_PREFIXES: [&str; 1] = ["x-fern-"];

/// The OpenAI API's own (never to the ChatGPT backend, which Codex sends neither).
const OPENAI_HEADERS: [&str; 2] = ["openai-beta", "idempotency-key"];

/// Query parameters passed upstream: Claude Code's `?beta=true` to Anthropic, nothing else.
const ANTHROPIC_QUERY: [&str; 1] = ["beta"];

/// Whether a client's request header goes to `upstream` as sent. Everything else —
/// credentials, cookies, hop-by-hop and encodings, `host`, forwarding headers, another
/// platform's headers, organisation or project selectors — is dropped or set by the relay.
pub fn passes_upstream(upstream: Upstream, name: &str) -> bool {
    let (names, prefixes): (&[&str], &[&str]) = match upstream {
        Upstream::Anthropic => (&ANTHROPIC_HEADERS, &ANTHROPIC_PREFIXES),
        Upstream::OpenAi | Upstream::ChatGpt => (&CODEX_HEADERS, &CODEX_PREFIXES),
        Upstream::Cohere => (&COHERE_HEADERS, &COHERE_PREFIXES),
    };
    let stainless = matches!(upstream, Upstream::Anthropic | Upstream::OpenAi);
    COMMON_HEADERS.contains(&name)
        || names.contains(&name)
        || (upstream == Upstream::OpenAi && OPENAI_HEADERS.contains(&name))
        || prefixes.iter().any(|p| name.starts_with(p))
        || (stainless && STAINLESS_HEADERS.contains(&name))
}

/// The header names the request's `Connection` header lists: hop-by-hop by the client's own
/// word, so never forwarded, whatever the allow-list says.
pub(super) fn connection_listed(headers: &HeaderMap) -> Vec<String> {
    headers
        .get_all(http::header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|name| name.trim().to_ascii_lowercase())
        .filter(|name| !name.is_empty())
        .collect()
}

/// Whether the client's header `name` goes to `upstream` as sent: allow-listed, and not named
/// by the request's `Connection` header (`listed`).
pub(super) fn forwarded(upstream: Upstream, listed: &[String], name: &str) -> bool {
    passes_upstream(upstream, name) && !listed.iter().any(|l| l == name)
}

/// The query string `upstream` gets: only the parameters it is known to take, in the client's
/// order and spelling; `None` when nothing is left.
pub(super) fn upstream_query(upstream: Upstream, query: &str) -> Option<String> {
    let known: &[&str] = match upstream {
        Upstream::Anthropic => &ANTHROPIC_QUERY,
        Upstream::OpenAi | Upstream::ChatGpt | Upstream::Cohere => &[],
    };
    let kept: Vec<&str> = query
        .split('&')
        .filter(|pair| {
            let name = pair.split_once('=').map_or(*pair, |(name, _)| name);
            known.contains(&name)
        })
        .collect();
    (!kept.is_empty()).then(|| kept.join("&"))
}

/// The `anthropic-beta` value sent upstream: the client's betas (every header line, comma
/// lists) and the account's own, each once, in order.
pub fn merged_betas(client: &HeaderMap, own: &[&str]) -> Option<String> {
    let mut betas: Vec<String> = Vec::new();
    let client_betas = client
        .get_all("anthropic-beta")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim);
    for beta in client_betas.chain(own.iter().copied()) {
        if !beta.is_empty() && !betas.iter().any(|b| b == beta) {
            betas.push(beta.to_owned());
        }
    }
    (!betas.is_empty()).then(|| betas.join(","))
}

/// Response headers the client gets, from every upstream: what the SDKs and CLIs read (the
/// content type; the upstream's request id; the retry advice Stainless SDKs follow). Never an
/// organisation or project id, a cookie, CORS headers or anything else of the upstream's. The
/// relay's own `x-request-id` is set apart (`request_id_header`).
const CLIENT_HEADERS: [&str; 6] = [
    "content-type",
    "cache-control",
    "request-id",
    "retry-after",
    "retry-after-ms",
    "x-should-retry",
];

/// The pooled account's own rate limits and usage windows (Anthropic's
/// `anthropic-ratelimit-*`, unified windows included; OpenAI's `x-ratelimit-*`; the ChatGPT
/// backend's `x-codex-*` windows): they describe the account the pool lent, not the client, so
/// they reach a client only where the pool is that client's alone.
const ACCOUNT_LIMIT_PREFIXES: [&str; 3] = ["anthropic-ratelimit-", "x-ratelimit-", "x-codex-"];

/// The headers a response keeps on its way to the client: the allow-listed ones, and the
/// account's usage-window headers when its group passes them on (`account_limits`).
pub(super) fn response_headers(upstream: &HeaderMap, account_limits: bool) -> HeaderMap {
    let mut headers = HeaderMap::new();
    for (name, value) in upstream {
        let name_str = name.as_str();
        let limits = account_limits
            && ACCOUNT_LIMIT_PREFIXES
                .iter()
                .any(|p| name_str.starts_with(p));
        if CLIENT_HEADERS.contains(&name_str) || limits {
            headers.append(name.clone(), value.clone());
        }
    }
    headers
}

/// Whether the request comes from its platform's own CLI, by the client's own word: Claude
/// Code's user agent (`claude-cli/<version> (…)`, Claude Code 2.1.332), Codex's `originator`
/// (`codex_exec`, `codex_cli_rs`, …). It only routes (a group's `subscriptions_cli_only`) and
/// changes nothing in the request; a client that claims to be the CLI is routed as one, and
/// what the upstream makes of the request is the upstream's call.
pub(super) fn from_platform_cli(inbound: &Inbound) -> bool {
    let header = |name: &str| {
        inbound
            .headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
    };
    match inbound.api {
        Api::Anthropic => header("user-agent").starts_with("claude-cli/"),
        Api::OpenAi => header("originator").starts_with("codex_"),
        Api::Cohere => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::{HeaderName, HeaderValue};

    /// What Claude Code 2.1 and the Anthropic SDKs send (besides the credential).
    const CLAUDE_CODE: [&str; 15] = [
        "accept",
        "content-type",
        "user-agent",
        "anthropic-version",
        "anthropic-dangerous-direct-browser-access",
        "x-app",
        "x-claude-code-session-id",
        "x-stainless-arch",
        "x-stainless-lang",
        "x-stainless-os",
        "x-stainless-package-version",
        "x-stainless-retry-count",
        "x-stainless-runtime",
        "x-stainless-runtime-version",
        "x-stainless-timeout",
    ];

    /// What Codex 0.171 sends (besides the credential), in API-key mode and signed in with
    /// ChatGPT (captured against a recording server).
    const CODEX: [&str; 10] = [
        "accept",
        "content-type",
        "user-agent",
        "originator",
        "session-id",
        "thread-id",
        "x-client-request-id",
        "x-codex-beta-features",
        "x-codex-window-id",
        "x-codex-turn-metadata",
    ];

    /// Never upstream, to any platform.
    const NEVER: [&str; 14] = [
        "authorization",
        "x-api-key",
        "cookie",
        "host",
        "content-length",
        "accept-encoding",
        "connection",
        "anthropic-beta",
        "x-forwarded-for",
        "openai-organization",
        "openai-project",
        "anthropic-workspace-id",
        "x-stainless-anything-new",
        "chatgpt-account-id",
    ];

    #[test]
    fn what_the_clis_send_goes_to_their_own_platform_and_credentials_nowhere() {
        for name in CLAUDE_CODE {
            assert!(passes_upstream(Upstream::Anthropic, name), "{name}");
        }
        for name in CODEX {
            assert!(passes_upstream(Upstream::OpenAi, name), "{name}");
            assert!(passes_upstream(Upstream::ChatGpt, name), "{name}");
        }
        for upstream in [Upstream::Anthropic, Upstream::OpenAi, Upstream::ChatGpt] {
            for name in NEVER {
                assert!(!passes_upstream(upstream, name), "{name} to {upstream:?}");
            }
        }
    }

    #[test]
    fn a_platforms_own_headers_never_reach_another() {
        for name in ["x-claude-code-session-id", "x-app", "anthropic-version"] {
            assert!(!passes_upstream(Upstream::OpenAi, name), "{name}");
            assert!(!passes_upstream(Upstream::ChatGpt, name), "{name}");
        }
        for name in [
            "x-codex-turn-metadata",
            "originator",
            "session_id",
            "openai-beta",
        ] {
            assert!(!passes_upstream(Upstream::Anthropic, name), "{name}");
        }
        assert!(passes_upstream(Upstream::OpenAi, "x-stainless-lang"));
        assert!(
            !passes_upstream(Upstream::ChatGpt, "x-stainless-lang"),
            "the ChatGPT backend gets what Codex sends"
        );
        assert!(
            !passes_upstream(Upstream::ChatGpt, "openai-beta"),
            "Codex sends the ChatGPT backend no OpenAI-Beta"
        );
    }

    #[test]
    fn headers_the_connection_header_names_are_dropped() {
        let mut headers = HeaderMap::new();
        headers.insert("connection", HeaderValue::from_static("keep-alive, X-App"));
        headers.append("connection", HeaderValue::from_static("x-stainless-os"));
        headers.insert("x-app", HeaderValue::from_static("cli"));
        headers.insert("x-stainless-os", HeaderValue::from_static("Linux"));
        headers.insert("anthropic-version", HeaderValue::from_static("2023-06-01"));
        let listed = connection_listed(&headers);
        let sent: Vec<&str> = headers
            .keys()
            .map(HeaderName::as_str)
            .filter(|name| forwarded(Upstream::Anthropic, &listed, name))
            .collect();
        assert_eq!(sent, ["anthropic-version"]);
    }

    #[test]
    fn only_known_query_parameters_go_upstream() {
        assert_eq!(
            upstream_query(Upstream::Anthropic, "beta=true").as_deref(),
            Some("beta=true")
        );
        assert_eq!(
            upstream_query(Upstream::Anthropic, "x=1&beta=true&api-version=2&beta").as_deref(),
            Some("beta=true&beta")
        );
        assert_eq!(upstream_query(Upstream::Anthropic, "betas=1&x=beta"), None);
        assert_eq!(upstream_query(Upstream::OpenAi, "beta=true"), None);
        assert_eq!(upstream_query(Upstream::ChatGpt, "beta=true"), None);
    }

    #[test]
    fn a_client_gets_what_sdks_read_and_nothing_of_the_account() {
        let mut upstream = HeaderMap::new();
        for (name, value) in [
            ("content-type", "text/event-stream"),
            ("cache-control", "no-cache"),
            ("request-id", "req_upstream"),
            ("x-request-id", "upstream-id"),
            ("retry-after", "3"),
            ("retry-after-ms", "2500"),
            ("x-should-retry", "true"),
            ("anthropic-organization-id", "org-1"),
            ("openai-organization", "org-2"),
            ("openai-project", "proj_1"),
            ("set-cookie", "__cf_bm=x"),
            ("access-control-allow-origin", "*"),
            ("anthropic-ratelimit-unified-status", "allowed"),
            ("anthropic-ratelimit-unified-5h-utilization", "0.4"),
            ("anthropic-ratelimit-requests-remaining", "49"),
            ("x-ratelimit-remaining-requests", "49"),
            ("x-codex-primary-used-percent", "40"),
            ("cf-ray", "abc"),
            ("server", "cloudflare"),
            ("content-length", "10"),
            ("transfer-encoding", "chunked"),
        ] {
            upstream.append(
                HeaderName::from_static(name),
                HeaderValue::from_static(value),
            );
        }
        let kept = |headers: &HeaderMap| -> Vec<String> {
            let mut names: Vec<String> = headers.keys().map(|n| n.to_string()).collect();
            names.sort();
            names
        };
        let sdk_reads = [
            "cache-control",
            "content-type",
            "request-id",
            "retry-after",
            "retry-after-ms",
            "x-should-retry",
        ];
        assert_eq!(kept(&response_headers(&upstream, false)), sdk_reads);
        let mut single_user = sdk_reads.to_vec();
        single_user.extend([
            "anthropic-ratelimit-requests-remaining",
            "anthropic-ratelimit-unified-5h-utilization",
            "anthropic-ratelimit-unified-status",
            "x-codex-primary-used-percent",
            "x-ratelimit-remaining-requests",
        ]);
        single_user.sort();
        assert_eq!(
            kept(&response_headers(&upstream, true)),
            single_user,
            "a pool that is one client's alone may pass the account's windows on"
        );
    }

    #[test]
    fn anthropic_beta_goes_once_with_the_accounts_own() {
        let mut headers = HeaderMap::new();
        headers.append(
            "anthropic-beta",
            HeaderValue::from_static("claude-code-20250219, oauth-2025-04-20"),
        );
        headers.append(
            "anthropic-beta",
            HeaderValue::from_static("interleaved-thinking-2025-05-14"),
        );
        assert_eq!(
            merged_betas(&headers, &["oauth-2025-04-20"]).as_deref(),
            Some("claude-code-20250219,oauth-2025-04-20,interleaved-thinking-2025-05-14")
        );
        assert_eq!(
            merged_betas(&HeaderMap::new(), &["oauth-2025-04-20"]).as_deref(),
            Some("oauth-2025-04-20")
        );
        assert_eq!(merged_betas(&HeaderMap::new(), &[]), None);
    }
}
