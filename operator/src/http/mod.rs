//! The standalone relay's admin HTTP endpoint, both ends: its routes over any
//! [`AdminEndpoint`] ([`routes::router`], which the relay serves over the engine's admin API) and
//! its client as an [`AdminEndpoint`] ([`HttpAdmin`]): the admin token as `Authorization:
//! Bearer`, JSON in the envelopes of [`crate::view`].

pub mod routes;

pub use routes::router;

use std::time::Duration;

use async_trait::async_trait;
use poolgate_core::account::SignIn;
use reqwest::{Method, Url};
use serde::de::DeserializeOwned;

use crate::view::SignInBody;
use crate::view::{
    AccountList, BlockList, ErrorBody, KeyChanged, KeyList, PriceChanged, Restored, StatusAnswer,
    UsageReport, WindowList,
};
use crate::{
    AccountRow, AdminEndpoint, BlockRow, KeyRow, OperatorError, PriceList, PriceRow, SignedInRow,
    StatusView, WindowRow,
};

/// A client of one relay's admin endpoint. Not `Debug`: it holds the admin token.
pub struct HttpAdmin {
    base: Url,
    /// `base` without user or password, for messages.
    shown: String,
    token: String,
    client: reqwest::Client,
}

impl HttpAdmin {
    /// A client of the endpoint at `url` (`http://127.0.0.1:9464`) sending `token`.
    pub fn new(url: &str, token: &str) -> Result<Self, OperatorError> {
        let base = Url::parse(url)
            .map_err(|error| OperatorError::Invalid(format!("admin url: {error}")))?;
        if base.cannot_be_a_base() {
            return Err(OperatorError::Invalid(
                "admin url: must be an http(s) URL".into(),
            ));
        }
        let mut shown = base.clone();
        let _ = shown.set_username("");
        let _ = shown.set_password(None);
        // reqwest is built without a bundled TLS provider; ring is the one in the tree already.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let client = reqwest::Client::builder()
            .timeout(Duration::from_secs(30))
            .build()
            .map_err(|error| OperatorError::Failed(format!("http client: {error}")))?;
        Ok(HttpAdmin {
            base,
            shown: shown.as_str().trim_end_matches('/').to_owned(),
            token: token.to_owned(),
            client,
        })
    }

    fn url(&self, segments: &[&str], query: &[(&str, String)]) -> Result<Url, OperatorError> {
        let mut url = self.base.clone();
        url.path_segments_mut()
            .map_err(|()| OperatorError::Invalid("admin url: must be an http(s) URL".into()))?
            .pop_if_empty()
            .extend(segments);
        if !query.is_empty() {
            url.query_pairs_mut()
                .extend_pairs(query.iter().map(|(k, v)| (k, v.as_str())));
        }
        Ok(url)
    }

    async fn call<T: DeserializeOwned>(
        &self,
        method: Method,
        url: Url,
    ) -> Result<T, OperatorError> {
        self.call_with(method, url, None).await
    }

    /// [`HttpAdmin::call`] with a JSON body.
    async fn call_with<T: DeserializeOwned>(
        &self,
        method: Method,
        url: Url,
        body: Option<Vec<u8>>,
    ) -> Result<T, OperatorError> {
        let mut request = self.client.request(method, url).bearer_auth(&self.token);
        if let Some(body) = body {
            request = request
                .header(reqwest::header::CONTENT_TYPE, "application/json")
                .body(body);
        }
        let response = request.send().await.map_err(|error| {
            OperatorError::Unreachable(format!("{}: {}", self.shown, error.without_url()))
        })?;
        let status = response.status();
        let body = response.bytes().await.map_err(|error| {
            OperatorError::Unreachable(format!("{}: {}", self.shown, error.without_url()))
        })?;
        if status.is_success() {
            return serde_json::from_slice(&body)
                .map_err(|error| OperatorError::Unreadable(format!("{status}: {error}")));
        }
        let message = serde_json::from_slice::<ErrorBody>(&body)
            .map(|answer| answer.error.message)
            .unwrap_or_else(|_| String::from_utf8_lossy(&body).chars().take(300).collect());
        let detail = format!("{status}: {message}");
        Err(match status.as_u16() {
            401 | 403 => OperatorError::Unauthenticated(detail),
            404 => OperatorError::NotFound(detail),
            400 | 422 => OperatorError::Invalid(detail),
            503 => OperatorError::Unavailable(detail),
            _ => OperatorError::Failed(detail),
        })
    }
}

#[async_trait]
impl AdminEndpoint for HttpAdmin {
    async fn accounts(&self, group: Option<&str>) -> Result<Vec<AccountRow>, OperatorError> {
        let query: Vec<_> = group.map(|g| ("group", g.to_owned())).into_iter().collect();
        let url = self.url(&["admin", "accounts"], &query)?;
        let list: AccountList = self.call(Method::GET, url).await?;
        Ok(list.accounts)
    }

    async fn blocks(&self) -> Result<Vec<BlockRow>, OperatorError> {
        let url = self.url(&["admin", "blocks"], &[])?;
        let list: BlockList = self.call(Method::GET, url).await?;
        Ok(list.blocks)
    }

    async fn windows(
        &self,
        account_id: Option<i64>,
        group: Option<&str>,
    ) -> Result<Vec<WindowRow>, OperatorError> {
        let mut query = Vec::new();
        if let Some(id) = account_id {
            query.push(("account_id", id.to_string()));
        }
        if let Some(group) = group {
            query.push(("group", group.to_owned()));
        }
        let url = self.url(&["admin", "windows"], &query)?;
        let list: WindowList = self.call(Method::GET, url).await?;
        Ok(list.windows)
    }

    async fn restore(&self, account_id: i64) -> Result<AccountRow, OperatorError> {
        let id = account_id.to_string();
        let url = self.url(&["admin", "accounts", &id, "restore"], &[])?;
        let restored: Restored = self.call(Method::POST, url).await?;
        Ok(restored.account)
    }

    async fn clear_block(&self, account_id: i64) -> Result<(), OperatorError> {
        let id = account_id.to_string();
        let url = self.url(&["admin", "accounts", &id, "clear-block"], &[])?;
        let _: serde_json::Value = self.call(Method::POST, url).await?;
        Ok(())
    }

    async fn usage(
        &self,
        from_ms: i64,
        to_ms: i64,
        api_key_id: Option<i64>,
    ) -> Result<UsageReport, OperatorError> {
        let mut query = vec![
            ("from_ms", from_ms.to_string()),
            ("to_ms", to_ms.to_string()),
        ];
        if let Some(id) = api_key_id {
            query.push(("api_key_id", id.to_string()));
        }
        let url = self.url(&["admin", "usage"], &query)?;
        self.call(Method::GET, url).await
    }

    async fn keys(&self) -> Result<Vec<KeyRow>, OperatorError> {
        let url = self.url(&["admin", "keys"], &[])?;
        let list: KeyList = self.call(Method::GET, url).await?;
        Ok(list.keys)
    }

    async fn set_key_disabled(
        &self,
        api_key_id: i64,
        disabled: bool,
    ) -> Result<KeyRow, OperatorError> {
        let id = api_key_id.to_string();
        let action = if disabled { "disable" } else { "enable" };
        let url = self.url(&["admin", "keys", &id, action], &[])?;
        let changed: KeyChanged = self.call(Method::POST, url).await?;
        Ok(changed.key)
    }

    async fn status(&self) -> Result<StatusView, OperatorError> {
        let url = self.url(&["admin", "status"], &[])?;
        let answer: StatusAnswer = self.call(Method::GET, url).await?;
        Ok(answer.status)
    }

    async fn sign_in(&self, sign_in: &SignIn) -> Result<SignedInRow, OperatorError> {
        let url = self.url(&["admin", "accounts", "sign-in"], &[])?;
        let body = serde_json::to_vec(&SignInBody::from(sign_in))
            .map_err(|error| OperatorError::Failed(format!("encoding the sign-in: {error}")))?;
        self.call_with(Method::POST, url, Some(body)).await
    }

    async fn prices(&self) -> Result<PriceList, OperatorError> {
        let url = self.url(&["admin", "prices"], &[])?;
        self.call(Method::GET, url).await
    }

    async fn set_price(
        &self,
        model: &str,
        price: poolgate_core::account::Price,
    ) -> Result<PriceRow, OperatorError> {
        // The model and the price travel in the query: a model name may hold `/`.
        let query = [
            ("model", model.to_owned()),
            ("input", price.input_per_mtok.to_string()),
            ("output", price.output_per_mtok.to_string()),
            ("cache_write", price.cache_write_per_mtok.to_string()),
            ("cache_read", price.cache_read_per_mtok.to_string()),
            ("search_unit", price.per_search_unit.to_string()),
        ];
        let url = self.url(&["admin", "prices", "set"], &query)?;
        let changed: PriceChanged = self.call(Method::POST, url).await?;
        Ok(changed.price)
    }

    async fn remove_price(&self, model: &str) -> Result<PriceRow, OperatorError> {
        let url = self.url(
            &["admin", "prices", "remove"],
            &[("model", model.to_owned())],
        )?;
        let changed: PriceChanged = self.call(Method::POST, url).await?;
        Ok(changed.price)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes_are_built_under_the_base_and_messages_never_show_its_password() {
        let admin = HttpAdmin::new("http://op:secret@127.0.0.1:9464/", "t").expect("client");
        assert_eq!(admin.shown, "http://127.0.0.1:9464");
        let url = admin
            .url(&["admin", "accounts", "7", "restore"], &[])
            .expect("url");
        assert_eq!(url.path(), "/admin/accounts/7/restore");
        let url = admin
            .url(&["admin", "accounts"], &[("group", "a b&c".into())])
            .expect("url");
        assert_eq!(url.query(), Some("group=a+b%26c"));
        let prefixed = HttpAdmin::new("http://127.0.0.1:9464/ops", "t").expect("client");
        let url = prefixed.url(&["admin", "blocks"], &[]).expect("url");
        assert_eq!(url.path(), "/ops/admin/blocks");
        assert!(matches!(
            HttpAdmin::new("not a url", "t"),
            Err(OperatorError::Invalid(_))
        ));
    }
}
