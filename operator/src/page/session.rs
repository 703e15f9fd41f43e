//! The status page's session cookie: `v1.<expires_ms>.<mac>`, where `mac` is HMAC-SHA256 over
//! `v1.<expires_ms>` under a key derived from the admin token (HMAC(admin token, "poolgate status
//! page session v1")). Nothing is stored server-side: every selector replica with the same token
//! accepts the cookie, and rotating the token invalidates every session at once. The expiry is
//! inside the signed value, so a browser that keeps the cookie past its `Max-Age` gains nothing.

use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use hmac::{Hmac, KeyInit, Mac};
use sha2_hmac::Sha256;

type HmacSha256 = Hmac<Sha256>;

/// The cookie's name.
pub const COOKIE: &str = "poolgate_session";

/// How long a session lasts.
pub const SESSION_TTL: Duration = Duration::from_secs(12 * 3600);

/// What the key derivation binds the key to: a change of format changes every key.
const KEY_LABEL: &[u8] = b"poolgate status page session v1";

const VERSION: &str = "v1";

/// Signs and checks session cookies under the key derived from one admin token. Not `Debug`:
/// it holds key material.
#[derive(Clone)]
pub struct Sessions {
    key: [u8; 32],
    ttl: Duration,
    /// `Secure` on the cookie: set when the page is served over TLS.
    secure: bool,
}

impl Sessions {
    pub fn new(admin_token: &str, secure: bool) -> Self {
        Sessions::with_ttl(admin_token, secure, SESSION_TTL)
    }

    pub fn with_ttl(admin_token: &str, secure: bool, ttl: Duration) -> Self {
        let key = mac(admin_token.as_bytes(), KEY_LABEL);
        Sessions { key, ttl, secure }
    }

    /// A session's cookie value expiring at `expires_ms` (ms since the epoch).
    pub fn value(&self, expires_ms: i64) -> String {
        let signed = format!("{VERSION}.{expires_ms}");
        let tag = URL_SAFE_NO_PAD.encode(mac(&self.key, signed.as_bytes()));
        format!("{signed}.{tag}")
    }

    /// Whether `value` is a session this key signed that has not expired at `now_ms`.
    pub fn valid(&self, value: &str, now_ms: i64) -> bool {
        let Some((signed, tag)) = value.rsplit_once('.') else {
            return false;
        };
        let Some(expires_ms) = signed
            .strip_prefix(VERSION)
            .and_then(|rest| rest.strip_prefix('.'))
            .and_then(|ms| ms.parse::<i64>().ok())
        else {
            return false;
        };
        let Ok(tag) = URL_SAFE_NO_PAD.decode(tag) else {
            return false;
        };
        let Ok(mut check) = HmacSha256::new_from_slice(&self.key) else {
            return false;
        };
        check.update(signed.as_bytes());
        // The tag first, in constant time; the expiry only means something once it is ours.
        check.verify_slice(&tag).is_ok() && expires_ms > now_ms
    }

    /// The `Set-Cookie` of a new session starting at `now_ms`.
    pub fn set_cookie(&self, now_ms: i64) -> String {
        let expires_ms = now_ms.saturating_add(self.ttl.as_millis() as i64);
        format!(
            "{COOKIE}={}; Max-Age={}; {}",
            self.value(expires_ms),
            self.ttl.as_secs(),
            self.attributes()
        )
    }

    /// The `Set-Cookie` that ends the session in the browser.
    pub fn clear_cookie(&self) -> String {
        format!("{COOKIE}=; Max-Age=0; {}", self.attributes())
    }

    fn attributes(&self) -> &'static str {
        if self.secure {
            "Path=/; HttpOnly; SameSite=Strict; Secure"
        } else {
            "Path=/; HttpOnly; SameSite=Strict"
        }
    }

    /// Whether the request's `Cookie` headers carry a valid session at `now_ms`.
    pub fn in_headers(&self, headers: &http::HeaderMap, now_ms: i64) -> bool {
        headers
            .get_all(http::header::COOKIE)
            .iter()
            .filter_map(|value| value.to_str().ok())
            .flat_map(|value| value.split(';'))
            .filter_map(|pair| pair.trim().split_once('='))
            .any(|(name, value)| name == COOKIE && self.valid(value, now_ms))
    }
}

fn mac(key: &[u8], message: &[u8]) -> [u8; 32] {
    // HMAC takes a key of any length: `new_from_slice` cannot fail for it.
    let mut mac = match HmacSha256::new_from_slice(key) {
        Ok(mac) => mac,
        Err(_) => unreachable!("HMAC accepts keys of any length"),
    };
    mac.update(message);
    mac.finalize().into_bytes().into()
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: i64 = 1_800_000_000_000;

    #[test]
    fn a_session_is_valid_until_its_signed_expiry_and_only_under_its_token() {
        let sessions = Sessions::new("admin-token", false);
        let value = sessions.value(NOW + 1_000);
        assert!(sessions.valid(&value, NOW));
        assert!(!sessions.valid(&value, NOW + 1_000), "expired");
        let rotated = Sessions::new("rotated-token", false);
        assert!(!rotated.valid(&value, NOW), "another token's session");
        // Every replica with the same token accepts it.
        assert!(Sessions::new("admin-token", true).valid(&value, NOW));
    }

    #[test]
    fn a_changed_expiry_or_a_forged_tag_is_refused() {
        let sessions = Sessions::new("admin-token", false);
        let value = sessions.value(NOW + 1_000);
        let tag = value.rsplit_once('.').map(|(_, tag)| tag).unwrap_or("");
        let extended = format!("v1.{}.{tag}", NOW + 10_000_000);
        assert!(!sessions.valid(&extended, NOW + 5_000));
        for forged in [
            "",
            "v1",
            "v1.x.y",
            "v2.1.AAAA",
            &format!("v1.{}.", NOW + 1_000),
            &format!("v1.{}.AAAA", NOW + 1_000),
        ] {
            assert!(!sessions.valid(forged, NOW), "{forged:?}");
        }
    }

    #[test]
    fn the_cookie_is_http_only_strict_rooted_and_secure_only_over_tls() {
        let plain = Sessions::new("t", false).set_cookie(NOW);
        assert!(plain.starts_with("poolgate_session=v1."), "{plain}");
        assert!(plain.contains("; HttpOnly") && plain.contains("; SameSite=Strict"));
        assert!(plain.contains("; Path=/") && plain.contains("Max-Age=43200"));
        assert!(!plain.contains("Secure"));
        assert!(
            Sessions::new("t", true)
                .set_cookie(NOW)
                .ends_with("; Secure")
        );
        assert!(
            Sessions::new("t", false)
                .clear_cookie()
                .contains("Max-Age=0")
        );
    }

    #[test]
    fn the_session_is_read_from_any_cookie_header() {
        let sessions = Sessions::new("t", false);
        let mut headers = http::HeaderMap::new();
        headers.append(http::header::COOKIE, "a=b".parse().expect("header"));
        assert!(!sessions.in_headers(&headers, NOW));
        let cookie = format!("x=1; {COOKIE}={}", sessions.value(NOW + 1));
        headers.append(http::header::COOKIE, cookie.parse().expect("header"));
        assert!(sessions.in_headers(&headers, NOW));
    }
}
