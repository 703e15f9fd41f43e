//! Client authentication: the selector's answer for a key, reused for `auth_cache_ttl` so a
//! revoked key is refused within a second and a key in steady use costs one call per ttl, not
//! one per request.

use std::time::Instant;

use super::Relay;
use crate::api::{Api, ErrorKind, RelayError};
use crate::backends::Caller;

impl Relay {
    /// Authenticates a client key, reusing answers for `auth_cache_ttl` (so a revoked key is
    /// refused within a second of the change).
    pub async fn authenticate(&self, api: Api, key: Option<&str>) -> Result<Caller, RelayError> {
        let Some(key) = key.filter(|k| !k.is_empty() && k.len() <= 256) else {
            return Err(RelayError::new(
                api,
                ErrorKind::Authentication,
                "missing or malformed API key (x-api-key or Authorization: Bearer)",
            ));
        };
        {
            let cache = self.auth_cache.lock().unwrap_or_else(|p| p.into_inner());
            if let Some((answer, at)) = cache.get(key)
                && at.elapsed() < self.settings.auth_cache_ttl
            {
                return answer.clone().ok_or_else(|| {
                    RelayError::new(api, ErrorKind::Authentication, "invalid API key")
                });
            }
        }
        let answer = self.selection.authenticate(key).await.map_err(|_| {
            RelayError::new(
                api,
                ErrorKind::Overloaded,
                "authentication is unavailable; try again",
            )
            .retry_after_ms(1000)
        })?;
        {
            let mut cache = self.auth_cache.lock().unwrap_or_else(|p| p.into_inner());
            if cache.len() > 100_000 {
                let ttl = self.settings.auth_cache_ttl;
                cache.retain(|_, (_, at)| at.elapsed() < ttl);
            }
            cache.insert(key.to_owned(), (answer.clone(), Instant::now()));
        }
        answer.ok_or_else(|| RelayError::new(api, ErrorKind::Authentication, "invalid API key"))
    }
}
