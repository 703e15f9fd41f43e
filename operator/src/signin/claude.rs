//! Claude Code's sign-in, as the pinned Claude Code runs it for a subscription: the
//! authorization-code flow with PKCE (S256) whose redirect is Anthropic's own code page (the
//! page shows `code#state`, which the operator pastes back), the token exchange at the token
//! endpoint, then the profile for the plan. `--setup-token` is the same flow with the one scope
//! `user:inference` and a year-long token without a refresh token, as `claude setup-token` asks.
//! The constants are the binary's (`selector-svc/tests/token_endpoints.rs` reads them there).

use poolgate_core::account::{
    AccountIdentity, CredentialKind, Platform, Secret, SignIn, default_oauth_client_id,
    default_oauth_token_url,
};

use super::{Pkce, Prompt, SignInError, call_json, rebase, text};

/// Where Claude Code sends the browser to sign in with a Claude subscription.
pub const AUTHORIZE_URL: &str = "https://claude.com/cai/oauth/authorize";
/// The redirect of the manual flow: Anthropic's page that shows the code to paste.
pub const REDIRECT_URI: &str = "https://platform.claude.com/oauth/code/callback";
/// The scopes Claude Code 2.1.332 asks for, in its order.
pub const SCOPES: &str = "org:create_api_key user:profile user:inference user:sessions:claude_code \
                          user:mcp_servers user:file_upload user:plugins user:privacy_consents:write";
/// `claude setup-token`'s one scope: inference only.
pub const SETUP_TOKEN_SCOPES: &str = "user:inference";
/// How long `claude setup-token` asks its token to live: a year.
pub const SETUP_TOKEN_SECONDS: u64 = 365 * 24 * 3600;
/// Who the signed-in user is and which subscription their organisation has.
pub const PROFILE_URL: &str = "https://api.anthropic.com/api/oauth/profile";

/// The URL the operator opens.
pub fn authorize_url(pkce: &Pkce, scopes: &str, base: Option<&str>) -> Result<String, SignInError> {
    let mut url = reqwest::Url::parse(&rebase(AUTHORIZE_URL, base)?)
        .map_err(|e| SignInError::Input(e.to_string()))?;
    url.query_pairs_mut()
        .append_pair("code", "true")
        .append_pair("client_id", default_oauth_client_id(Platform::Anthropic))
        .append_pair("response_type", "code")
        .append_pair("redirect_uri", REDIRECT_URI)
        .append_pair("scope", scopes)
        .append_pair("code_challenge", &pkce.challenge)
        .append_pair("code_challenge_method", "S256")
        .append_pair("state", &pkce.state);
    Ok(url.to_string())
}

/// The code of what the page showed (`code#state`), once its state is this sign-in's.
pub fn read_paste(pasted: &str, state: &str) -> Result<Secret, SignInError> {
    let pasted = pasted.trim();
    let (code, returned) = pasted.split_once('#').ok_or_else(|| {
        SignInError::Paste("expected what the page shows, `<code>#<state>`".into())
    })?;
    if code.is_empty() || code.len() > 4096 || code.chars().any(char::is_whitespace) {
        return Err(SignInError::Paste(
            "the code part is empty or malformed".into(),
        ));
    }
    if returned != state {
        return Err(SignInError::State);
    }
    Ok(Secret::new(code))
}

/// Runs the flow: prints the URL, reads the pasted answer, exchanges it, reads the profile.
pub async fn sign_in(
    http: &reqwest::Client,
    base: Option<&str>,
    setup_token: bool,
    prompt: &mut dyn Prompt,
) -> Result<SignIn, SignInError> {
    let pkce = Pkce::new();
    let scopes = if setup_token {
        SETUP_TOKEN_SCOPES
    } else {
        SCOPES
    };
    prompt.show(&format!(
        "Open this URL in a browser, sign in with the Claude account to add, and paste the \
         code the page shows:\n\n{}\n",
        authorize_url(&pkce, scopes, base)?
    ));
    let pasted = prompt
        .read_line("Code: ")
        .ok_or_else(|| SignInError::Paste("nothing was pasted".into()))?;
    let code = read_paste(&pasted, &pkce.state)?;
    exchange(http, base, &code, &pkce, setup_token).await
}

/// The token exchange (and, for a full sign-in, the profile): the account as a [`SignIn`].
pub async fn exchange(
    http: &reqwest::Client,
    base: Option<&str>,
    code: &Secret,
    pkce: &Pkce,
    setup_token: bool,
) -> Result<SignIn, SignInError> {
    let token_url = rebase(default_oauth_token_url(Platform::Anthropic), base)?;
    let mut body = serde_json::json!({
        "grant_type": "authorization_code",
        "code": code.expose(),
        "redirect_uri": REDIRECT_URI,
        "client_id": default_oauth_client_id(Platform::Anthropic),
        "code_verifier": pkce.verifier.expose(),
        "state": pkce.state,
    });
    if setup_token {
        body["expires_in"] = SETUP_TOKEN_SECONDS.into();
    }
    let answer = call_json("the token exchange", http.post(&token_url).json(&body)).await?;
    let access_token = text(&answer, &["access_token"]);
    if access_token.is_empty() {
        return Err(SignInError::Unreadable {
            step: "the token exchange",
            detail: "no access_token".into(),
        });
    }
    let refresh_token = if setup_token {
        String::new()
    } else {
        text(&answer, &["refresh_token"])
    };
    let expires_in = answer
        .get("expires_in")
        .and_then(serde_json::Value::as_i64)
        .unwrap_or(0);
    let expires_at_ms = super::expiry_in(expires_in);
    let user = text(&answer, &["account", "uuid"]);
    let organisation = text(&answer, &["organization", "uuid"]);
    let mut identity = AccountIdentity {
        upstream_id: AccountIdentity::upstream_id(&user, &organisation).unwrap_or_default(),
        email: text(&answer, &["account", "email_address"]),
        plan: String::new(),
    };
    if !setup_token {
        // The plan is shown, not relied on: a profile that cannot be read leaves it unknown.
        let profile = call_json(
            "reading the profile",
            http.get(rebase(PROFILE_URL, base)?)
                .bearer_auth(&access_token),
        )
        .await;
        if let Ok(profile) = profile {
            identity.plan = plan_of(&profile);
            if identity.email.is_empty() {
                identity.email = text(&profile, &["account", "email"]);
            }
            if identity.upstream_id.is_empty() {
                identity.upstream_id = AccountIdentity::upstream_id(
                    &text(&profile, &["account", "uuid"]),
                    &text(&profile, &["organization", "uuid"]),
                )
                .unwrap_or_default();
            }
        }
    }
    if identity.upstream_id.is_empty() {
        return Err(SignInError::Unreadable {
            step: "the token exchange",
            detail: "the answer names no account or organization".into(),
        });
    }
    Ok(SignIn {
        refresh_token: Secret::new(refresh_token),
        expires_at_ms,
        // The endpoint the tokens were issued at, when it is not the default.
        token_url: if base.is_some() {
            token_url
        } else {
            String::new()
        },
        identity,
        ..SignIn::new(Platform::Anthropic, CredentialKind::OAuth, access_token)
    })
}

/// Who an access token's account is, from the profile (an import whose file names no account:
/// Claude Code's `.credentials.json` keeps only the tokens). Needs the `user:profile` scope.
pub async fn profile_identity(
    http: &reqwest::Client,
    base: Option<&str>,
    access_token: &str,
) -> Result<AccountIdentity, SignInError> {
    let profile = call_json(
        "reading the profile",
        http.get(rebase(PROFILE_URL, base)?)
            .bearer_auth(access_token),
    )
    .await?;
    let upstream_id = AccountIdentity::upstream_id(
        &text(&profile, &["account", "uuid"]),
        &text(&profile, &["organization", "uuid"]),
    )
    .ok_or(SignInError::Unreadable {
        step: "reading the profile",
        detail: "it names no account or organization".into(),
    })?;
    Ok(AccountIdentity {
        upstream_id,
        email: text(&profile, &["account", "email"]),
        plan: plan_of(&profile),
    })
}

/// The subscription a profile names: its organisation's type without the `claude_` prefix
/// (`claude_max` → `max`), else what the account flags say.
pub fn plan_of(profile: &serde_json::Value) -> String {
    let kind = text(profile, &["organization", "organization_type"]);
    if !kind.is_empty() {
        return kind.trim_start_matches("claude_").to_owned();
    }
    let flag = |name: &str| {
        profile
            .get("account")
            .and_then(|a| a.get(name))
            .and_then(serde_json::Value::as_bool)
            .unwrap_or(false)
    };
    if flag("has_claude_max") {
        "max".into()
    } else if flag("has_claude_pro") {
        "pro".into()
    } else {
        String::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_authorize_url_carries_claude_codes_client_redirect_scopes_and_the_challenge() {
        let pkce = Pkce::new();
        let url =
            reqwest::Url::parse(&authorize_url(&pkce, SCOPES, None).expect("url")).expect("parses");
        assert_eq!(url.host_str(), Some("claude.com"));
        let query: std::collections::HashMap<_, _> = url.query_pairs().into_owned().collect();
        assert_eq!(
            query["client_id"],
            default_oauth_client_id(Platform::Anthropic)
        );
        assert_eq!(query["redirect_uri"], REDIRECT_URI);
        assert_eq!(query["scope"], SCOPES);
        assert_eq!(query["code_challenge_method"], "S256");
        assert_eq!(query["code_challenge"], pkce.challenge);
        assert_eq!(query["state"], pkce.state);
        assert!(
            !url.as_str().contains(pkce.verifier.expose()),
            "the verifier never leaves but in the exchange"
        );
    }

    #[test]
    fn a_paste_gives_its_code_only_with_this_sign_ins_state() {
        let code = read_paste(" abc123#st4te \n", "st4te").expect("the code");
        assert_eq!(code.expose(), "abc123");
        assert_eq!(read_paste("abc123#other", "st4te"), Err(SignInError::State));
        assert!(matches!(
            read_paste("abc123", "st4te"),
            Err(SignInError::Paste(_))
        ));
        assert!(matches!(
            read_paste("#st4te", "st4te"),
            Err(SignInError::Paste(_))
        ));
    }

    #[test]
    fn the_plan_is_the_organisations_type_else_the_accounts_flags() {
        let profile = serde_json::json!({"organization": {"organization_type": "claude_max"}});
        assert_eq!(plan_of(&profile), "max");
        let profile = serde_json::json!({"account": {"has_claude_pro": true}});
        assert_eq!(plan_of(&profile), "pro");
        assert_eq!(plan_of(&serde_json::json!({})), "");
    }
}
