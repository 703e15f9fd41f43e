//! Service identity on the gRPC ports (admission and selector): a caller proves who it is with the
//! service token in the `x-poolgate-service-token` metadata key, or with a client certificate
//! when the server requires mutual TLS. `grpc.health.v1` stays open (the kubelet's gRPC probes
//! carry no credential). The server half is a tower layer in front of every service; the client
//! half adds the token to every request.

use std::sync::Arc;
use std::task::{Context, Poll};

use futures_util::future::{Either, Ready, ready};

/// The metadata key that carries the service token.
pub const SERVICE_TOKEN_HEADER: &str = "x-poolgate-service-token";

/// What the health service's paths start with (always open).
const HEALTH_PREFIX: &str = "/grpc.health.v1.Health/";

/// How a server knows its callers.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum CallerCheck {
    /// Every call but health checks carries this token.
    Token(String),
    /// The TLS handshake verified a client certificate against the configured CA: every
    /// connection is a known caller.
    MutualTls,
    /// Anyone who reaches the port (`--insecure-dev` only).
    #[default]
    Open,
}

impl CallerCheck {
    /// From the flags: a token, else mutual TLS, else open only when `insecure_dev` says so.
    /// The error names the flags, for the operator who started the server without either.
    pub fn from_flags(
        token: Option<&str>,
        mutual_tls: bool,
        insecure_dev: bool,
    ) -> Result<Self, String> {
        match token.map(str::trim).filter(|t| !t.is_empty()) {
            Some(token) => Ok(CallerCheck::Token(token.to_owned())),
            None if mutual_tls => Ok(CallerCheck::MutualTls),
            None if insecure_dev => Ok(CallerCheck::Open),
            None => Err(format!(
                "no service credential: callers must prove who they are. Set --service-token \
                 (env POOLGATE_SERVICE_TOKEN; callers send it in the `{SERVICE_TOKEN_HEADER}` \
                 metadata key), or require client certificates with --tls-client-ca, or pass \
                 --insecure-dev to accept anyone who can reach the port"
            )),
        }
    }

    pub fn layer(&self) -> ServiceAuthLayer {
        ServiceAuthLayer {
            token: match self {
                CallerCheck::Token(token) => Some(Arc::from(token.as_str())),
                CallerCheck::MutualTls | CallerCheck::Open => None,
            },
        }
    }
}

/// Compares in time that depends only on the lengths, never on where the bytes differ.
pub fn constant_time_eq(given: &[u8], expected: &[u8]) -> bool {
    given.len() == expected.len()
        && given
            .iter()
            .zip(expected)
            .fold(0u8, |acc, (a, b)| acc | (a ^ b))
            == 0
}

/// Server side: refuses a request without the service token with `UNAUTHENTICATED`.
#[derive(Clone, Default)]
pub struct ServiceAuthLayer {
    /// `None`: nothing to check here (mutual TLS, or open).
    token: Option<Arc<str>>,
}

impl<S> tower::Layer<S> for ServiceAuthLayer {
    type Service = ServiceAuth<S>;

    fn layer(&self, inner: S) -> Self::Service {
        ServiceAuth {
            inner,
            token: self.token.clone(),
        }
    }
}

#[derive(Clone)]
pub struct ServiceAuth<S> {
    inner: S,
    token: Option<Arc<str>>,
}

impl<S, B, R> tower::Service<http::Request<B>> for ServiceAuth<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<R>>,
    R: Default,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Either<Ready<Result<S::Response, S::Error>>, S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let Some(token) = &self.token else {
            return Either::Right(self.inner.call(request));
        };
        if request.uri().path().starts_with(HEALTH_PREFIX) {
            return Either::Right(self.inner.call(request));
        }
        let given = request
            .headers()
            .get(SERVICE_TOKEN_HEADER)
            .map(|v| v.as_bytes())
            .unwrap_or_default();
        if constant_time_eq(given, token.as_bytes()) {
            return Either::Right(self.inner.call(request));
        }
        let status = tonic::Status::unauthenticated(if given.is_empty() {
            "missing service token: send it in the x-poolgate-service-token metadata key"
        } else {
            "wrong service token (x-poolgate-service-token)"
        });
        Either::Left(ready(Ok(status.into_http())))
    }
}

/// Client side: adds the service token to every request (nothing when there is none).
#[derive(Clone)]
pub struct WithToken<S> {
    inner: S,
    token: Option<http::HeaderValue>,
}

impl<S> WithToken<S> {
    /// A token that cannot be a header value is not sent (the server then refuses the calls,
    /// and says why).
    pub fn new(inner: S, token: Option<&str>) -> Self {
        WithToken {
            inner,
            token: token
                .filter(|t| !t.is_empty())
                .and_then(|t| http::HeaderValue::from_str(t).ok())
                .map(|mut value| {
                    value.set_sensitive(true);
                    value
                }),
        }
    }
}

impl<S, B> tower::Service<http::Request<B>> for WithToken<S>
where
    S: tower::Service<http::Request<B>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: http::Request<B>) -> Self::Future {
        if let Some(token) = &self.token {
            request
                .headers_mut()
                .insert(SERVICE_TOKEN_HEADER, token.clone());
        }
        self.inner.call(request)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_server_without_a_credential_needs_insecure_dev() {
        let error = CallerCheck::from_flags(None, false, false).expect_err("refused");
        assert!(error.contains("--service-token") && error.contains("--insecure-dev"));
        assert!(error.contains(SERVICE_TOKEN_HEADER));
        assert_eq!(
            CallerCheck::from_flags(Some("  "), false, true),
            Ok(CallerCheck::Open)
        );
        assert_eq!(
            CallerCheck::from_flags(None, true, false),
            Ok(CallerCheck::MutualTls)
        );
        assert_eq!(
            CallerCheck::from_flags(Some("t"), true, true),
            Ok(CallerCheck::Token("t".into()))
        );
    }

    #[test]
    fn tokens_compare_whole() {
        assert!(constant_time_eq(b"secret", b"secret"));
        assert!(!constant_time_eq(b"secreT", b"secret"));
        assert!(!constant_time_eq(b"secret-longer", b"secret"));
        assert!(!constant_time_eq(b"", b"secret"));
    }
}
