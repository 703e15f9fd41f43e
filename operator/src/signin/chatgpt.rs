//! The Codex CLI's sign-in to a ChatGPT subscription, as the pinned Codex runs it: the
//! authorization-code flow with PKCE whose redirect is Codex's local callback
//! (`http://localhost:1455/auth/callback`; the operator pastes the URL the browser was sent to,
//! which no server here answers), or the device-code flow (`--device`: a code to enter at the
//! verification page, then the CLI polls until it is approved). Both end with the token
//! exchange; who the account is comes from the id token's claims, as Codex reads them.

use std::time::Duration;

use poolgate_core::account::{
    AccountIdentity, CredentialKind, Platform, Secret, SignIn, default_oauth_client_id,
    default_oauth_token_url,
};

use super::{Pkce, Prompt, SignInError, call_json, jwt_claims, rebase, text};

/// Codex's authorization server.
pub const ISSUER: &str = "https://auth.openai.com";
pub const AUTHORIZE_URL: &str = "https://auth.openai.com/oauth/authorize";
/// Codex's local callback (it listens there; poolgate's CLI does not, the operator pastes).
pub const REDIRECT_URI: &str = "http://localhost:1455/auth/callback";
/// The scopes Codex 0.171.0 asks for.
pub const SCOPES: &str =
    "openid profile email offline_access api.connectors.read api.connectors.invoke";
/// The device-code flow: ask for a code, show it, poll for the approval.
pub const DEVICE_CODE_URL: &str = "https://auth.openai.com/api/accounts/deviceauth/usercode";
pub const DEVICE_TOKEN_URL: &str = "https://auth.openai.com/api/accounts/deviceauth/token";
/// Where the operator enters the code.
pub const DEVICE_VERIFY_URL: &str = "https://auth.openai.com/codex/device";
/// The redirect the device flow's code is exchanged with.
pub const DEVICE_REDIRECT_URI: &str = "https://auth.openai.com/deviceauth/callback";
/// Codex gives up on an unapproved device code after this long.
const DEVICE_TIMEOUT: Duration = Duration::from_secs(15 * 60);

/// The URL the operator opens.
pub fn authorize_url(pkce: &Pkce, base: Option<&str>) -> Result<String, SignInError> {
    let mut url = reqwest::Url::parse(&rebase(AUTHORIZE_URL, base)?)
        .map_err(|e| SignInError::Input(e.to_string()))?;
    url.query_pairs_mut()
        .append_pair("response_type", "code")
        .append_pair("client_id", default_oauth_client_id(Platform::OpenAi))
        .append_pair("redirect_uri", REDIRECT_URI)
        .append_pair("scope", SCOPES)
        .append_pair("code_challenge", &pkce.challenge)
        .append_pair("code_challenge_method", "S256")
        .append_pair("id_token_add_organizations", "true")
        .append_pair("codex_cli_simplified_flow", "true")
        .append_pair("state", &pkce.state);
    Ok(url.to_string())
}

/// The code of the callback URL the browser was sent to, once its state is this sign-in's.
pub fn read_redirect(pasted: &str, state: &str) -> Result<Secret, SignInError> {
    let url = reqwest::Url::parse(pasted.trim()).map_err(|_| {
        SignInError::Paste(
            "expected the whole address the browser was sent to \
             (http://localhost:1455/auth/callback?code=…&state=…)"
                .into(),
        )
    })?;
    let query: std::collections::HashMap<String, String> = url.query_pairs().into_owned().collect();
    if let Some(error) = query.get("error") {
        let word = if error.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
            error.as_str()
        } else {
            "an error"
        };
        return Err(SignInError::Paste(format!(
            "the sign-in page answered {word}"
        )));
    }
    if query.get("state").map(String::as_str) != Some(state) {
        return Err(SignInError::State);
    }
    match query.get("code") {
        Some(code) if !code.is_empty() && code.len() <= 4096 => Ok(Secret::new(code.clone())),
        _ => Err(SignInError::Paste("the address carries no code".into())),
    }
}

/// The browser flow: prints the URL, reads the callback address, exchanges the code.
pub async fn sign_in(
    http: &reqwest::Client,
    base: Option<&str>,
    prompt: &mut dyn Prompt,
) -> Result<SignIn, SignInError> {
    let pkce = Pkce::new();
    prompt.show(&format!(
        "Open this URL in a browser and sign in with the ChatGPT account to add. The browser \
         then goes to {REDIRECT_URI}, which shows an error here (nothing listens there): copy \
         that whole address from the address bar and paste it.\n\n{}\n",
        authorize_url(&pkce, base)?
    ));
    let pasted = prompt
        .read_line("Address: ")
        .ok_or_else(|| SignInError::Paste("nothing was pasted".into()))?;
    let code = read_redirect(&pasted, &pkce.state)?;
    exchange(http, base, &code, &pkce.verifier, REDIRECT_URI).await
}

/// The device-code flow: shows the code and the page, polls until approved, exchanges.
pub async fn sign_in_device(
    http: &reqwest::Client,
    base: Option<&str>,
    prompt: &mut dyn Prompt,
) -> Result<SignIn, SignInError> {
    let client_id = default_oauth_client_id(Platform::OpenAi);
    let answer = call_json(
        "asking for a device code",
        http.post(rebase(DEVICE_CODE_URL, base)?)
            .json(&serde_json::json!({ "client_id": client_id })),
    )
    .await?;
    let device_auth_id = text(&answer, &["device_auth_id"]);
    let user_code = match text(&answer, &["user_code"]) {
        code if code.is_empty() => text(&answer, &["usercode"]),
        code => code,
    };
    if device_auth_id.is_empty() || user_code.is_empty() {
        return Err(SignInError::Unreadable {
            step: "asking for a device code",
            detail: "no device_auth_id or user_code".into(),
        });
    }
    let interval = answer
        .get("interval")
        .and_then(|v| v.as_u64().or_else(|| v.as_str()?.parse().ok()))
        .unwrap_or(5)
        .clamp(1, 60);
    prompt.show(&format!(
        "Open {} in a browser, sign in with the ChatGPT account to add, and enter the code\n\n    \
         {user_code}\n\nWaiting for the approval…",
        rebase(DEVICE_VERIFY_URL, base)?
    ));
    let poll_url = rebase(DEVICE_TOKEN_URL, base)?;
    let deadline = tokio::time::Instant::now() + DEVICE_TIMEOUT;
    loop {
        tokio::time::sleep(Duration::from_secs(interval)).await;
        if tokio::time::Instant::now() >= deadline {
            return Err(SignInError::Expired);
        }
        let polled = call_json(
            "waiting for the approval",
            http.post(&poll_url).json(&serde_json::json!({
                "device_auth_id": device_auth_id,
                "user_code": user_code,
            })),
        )
        .await;
        match polled {
            Ok(approved) => {
                let code = text(&approved, &["authorization_code"]);
                let verifier = text(&approved, &["code_verifier"]);
                if code.is_empty() || verifier.is_empty() {
                    return Err(SignInError::Unreadable {
                        step: "waiting for the approval",
                        detail: "no authorization_code or code_verifier".into(),
                    });
                }
                return exchange(
                    http,
                    base,
                    &Secret::new(code),
                    &Secret::new(verifier),
                    DEVICE_REDIRECT_URI,
                )
                .await;
            }
            // Not approved yet: the server answers 403 or 404 until it is.
            Err(SignInError::Refused {
                status: 403 | 404, ..
            }) => continue,
            Err(other) => return Err(other),
        }
    }
}

/// The token exchange (form-encoded, as Codex sends it): the account as a [`SignIn`].
pub async fn exchange(
    http: &reqwest::Client,
    base: Option<&str>,
    code: &Secret,
    verifier: &Secret,
    redirect_uri: &str,
) -> Result<SignIn, SignInError> {
    let token_url = rebase(default_oauth_token_url(Platform::OpenAi), base)?;
    let answer = call_json(
        "the token exchange",
        http.post(&token_url).form(&[
            ("grant_type", "authorization_code"),
            ("code", code.expose()),
            ("redirect_uri", redirect_uri),
            ("client_id", default_oauth_client_id(Platform::OpenAi)),
            ("code_verifier", verifier.expose()),
        ]),
    )
    .await?;
    let access_token = text(&answer, &["access_token"]);
    let refresh_token = text(&answer, &["refresh_token"]);
    if access_token.is_empty() || refresh_token.is_empty() {
        return Err(SignInError::Unreadable {
            step: "the token exchange",
            detail: "no access_token or refresh_token".into(),
        });
    }
    let identity = identity_of(&text(&answer, &["id_token"]), &access_token).ok_or_else(|| {
        SignInError::Unreadable {
            step: "the token exchange",
            detail: "the id token names no ChatGPT account".into(),
        }
    })?;
    let expires_in = answer
        .get("expires_in")
        .and_then(serde_json::Value::as_i64)
        .unwrap_or(0);
    let expires_at_ms = if expires_in > 0 {
        super::expiry_in(expires_in)
    } else {
        super::jwt_expiry_ms(&access_token)
    };
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
        ..SignIn::new(Platform::OpenAi, CredentialKind::ChatGptOAuth, access_token)
    })
}

/// Who a ChatGPT sign-in is, from its id token's claims as Codex reads them (the email, and
/// under `https://api.openai.com/auth` the user, the workspace account and the plan), the
/// access token's claims filling what the id token lacks. `None` without an account id.
pub fn identity_of(id_token: &str, access_token: &str) -> Option<AccountIdentity> {
    let claims = [jwt_claims(id_token), jwt_claims(access_token)];
    let find = |path: &[&str]| {
        claims
            .iter()
            .flatten()
            .map(|claims| text(claims, path))
            .find(|value| !value.is_empty())
            .unwrap_or_default()
    };
    const AUTH: &str = "https://api.openai.com/auth";
    let account = find(&[AUTH, "chatgpt_account_id"]);
    if account.is_empty() {
        return None;
    }
    // Required: a Team workspace's account id is every member's.
    let user = [&[AUTH, "chatgpt_user_id"][..], &[AUTH, "user_id"], &["sub"]]
        .iter()
        .map(|path| find(path))
        .find(|user| !user.is_empty())
        .unwrap_or_default();
    let email = match find(&["email"]) {
        email if email.is_empty() => find(&["https://api.openai.com/profile", "email"]),
        email => email,
    };
    Some(AccountIdentity {
        upstream_id: AccountIdentity::upstream_id(&user, &account)?,
        email,
        plan: find(&[AUTH, "chatgpt_plan_type"]),
    })
}

#[cfg(test)]
mod tests {
    use base64::Engine;
    use base64::engine::general_purpose::URL_SAFE_NO_PAD;

    use super::*;

    fn jwt(claims: serde_json::Value) -> String {
        format!(
            "e30.{}.sig",
            URL_SAFE_NO_PAD.encode(serde_json::to_vec(&claims).expect("json"))
        )
    }

    #[test]
    fn the_callback_address_gives_its_code_only_with_this_sign_ins_state() {
        let code = read_redirect(
            "http://localhost:1455/auth/callback?code=ac_1&scope=openid&state=s1",
            "s1",
        )
        .expect("the code");
        assert_eq!(code.expose(), "ac_1");
        assert_eq!(
            read_redirect(
                "http://localhost:1455/auth/callback?code=ac_1&state=s2",
                "s1"
            ),
            Err(SignInError::State)
        );
        assert!(matches!(
            read_redirect("ac_1", "s1"),
            Err(SignInError::Paste(_))
        ));
        assert!(matches!(
            read_redirect(
                "http://localhost:1455/auth/callback?error=access_denied&state=s1",
                "s1"
            ),
            Err(SignInError::Paste(message)) if message.contains("access_denied")
        ));
    }

    #[test]
    fn the_identity_is_the_user_and_the_workspace_account_of_the_id_token() {
        let id_token = jwt(serde_json::json!({
            "email": "ada@example.com",
            "https://api.openai.com/auth": {
                "chatgpt_account_id": "acc-1",
                "chatgpt_user_id": "user-9",
                "chatgpt_plan_type": "pro"
            }
        }));
        let identity = identity_of(&id_token, "opaque").expect("an identity");
        assert_eq!(identity.upstream_id, "user-9/acc-1");
        assert_eq!(identity.email, "ada@example.com");
        assert_eq!(identity.plan, "pro");
        assert_eq!(identity_of("not-a-jwt", "opaque"), None);
    }
}
