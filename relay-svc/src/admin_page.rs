//! The status page's view of a standalone relay: an [`AdminEndpoint`] over the same [`Operator`]
//! the admin endpoint serves (`admin.rs`), called in process, so the page on `--admin-listen`
//! reads exactly what `relay-svc admin` reads. It only reads: the page offers no write, and the
//! write verbs are refused here.

use std::sync::Arc;

use async_trait::async_trait;
use poolgate_operator::view::UsageReport;
use poolgate_operator::{
    AccountRow, AdminEndpoint, BlockRow, KeyRow, OperatorError, StatusView, WindowRow,
};

use crate::admin::{AdminError, Operator};

/// The standalone engines' operator verbs, called in process.
pub struct InProcessAdmin {
    operator: Arc<dyn Operator>,
}

impl InProcessAdmin {
    pub fn new(operator: Arc<dyn Operator>) -> Self {
        InProcessAdmin { operator }
    }
}

impl From<AdminError> for OperatorError {
    fn from(error: AdminError) -> Self {
        let detail = error.to_string();
        match error {
            AdminError::UnknownAccount(_) | AdminError::UnknownKey(_) => {
                OperatorError::NotFound(detail)
            }
            AdminError::Invalid { .. } => OperatorError::Invalid(detail),
            AdminError::Unavailable(_) => OperatorError::Unavailable(detail),
        }
    }
}

fn read_only() -> OperatorError {
    OperatorError::Invalid("the status page is read-only".into())
}

#[async_trait]
impl AdminEndpoint for InProcessAdmin {
    async fn accounts(&self, group: Option<&str>) -> Result<Vec<AccountRow>, OperatorError> {
        let mut accounts = self.operator.accounts().await;
        if let Some(group) = group {
            accounts.retain(|account| account.group == group);
        }
        Ok(accounts)
    }

    async fn blocks(&self) -> Result<Vec<BlockRow>, OperatorError> {
        Ok(self.operator.blocks().await?)
    }

    async fn windows(
        &self,
        account_id: Option<i64>,
        group: Option<&str>,
    ) -> Result<Vec<WindowRow>, OperatorError> {
        Ok(self.operator.windows(account_id, group).await?)
    }

    async fn restore(&self, _account_id: i64) -> Result<AccountRow, OperatorError> {
        Err(read_only())
    }

    async fn clear_block(&self, _account_id: i64) -> Result<(), OperatorError> {
        Err(read_only())
    }

    async fn usage(
        &self,
        from_ms: i64,
        to_ms: i64,
        api_key_id: Option<i64>,
    ) -> Result<UsageReport, OperatorError> {
        let mut keys = self.operator.usage(from_ms, to_ms).await?;
        if let Some(id) = api_key_id {
            keys.retain(|key| key.api_key_id == id);
        }
        Ok(UsageReport {
            from_ms,
            to_ms,
            keys,
        })
    }

    async fn keys(&self) -> Result<Vec<KeyRow>, OperatorError> {
        Ok(self.operator.keys().await?)
    }

    async fn set_key_disabled(
        &self,
        _api_key_id: i64,
        _disabled: bool,
    ) -> Result<KeyRow, OperatorError> {
        Err(read_only())
    }

    async fn status(&self) -> Result<StatusView, OperatorError> {
        Ok(self.operator.status().await?)
    }
}
