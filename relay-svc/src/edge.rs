//! The client edge's bounds on memory and time (docs/SECURITY.md, "The HTTP front"): request
//! bodies are read only after the key checked out, against one byte budget shared by every
//! connection, with an idle timeout between chunks and a minimum average rate.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::body::Body;
use bytes::{Bytes, BytesMut};
use futures_util::StreamExt;
use tokio::time::Instant;

use crate::proxy::EdgeSettings;

/// Request body bytes held across all connections.
#[derive(Clone, Default)]
pub struct BufferBudget {
    held: Arc<AtomicUsize>,
    limit: usize,
}

impl BufferBudget {
    pub fn new(limit: usize) -> Self {
        BufferBudget {
            held: Arc::default(),
            limit,
        }
    }

    /// Bytes held now.
    pub fn held(&self) -> usize {
        self.held.load(Ordering::Relaxed)
    }

    /// An empty hold on the budget, grown as bytes arrive.
    pub fn hold(&self) -> Hold {
        Hold {
            budget: self.clone(),
            bytes: 0,
        }
    }
}

/// Part of the budget, given back when dropped (with the body it was taken for).
pub struct Hold {
    budget: BufferBudget,
    bytes: usize,
}

impl Hold {
    /// Takes `more` bytes of the budget: `false` (nothing taken) when that would pass it.
    fn grow(&mut self, more: usize) -> bool {
        let limit = self.budget.limit;
        let taken = self
            .budget
            .held
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |held| {
                held.checked_add(more).filter(|total| *total <= limit)
            })
            .is_ok();
        if taken {
            self.bytes += more;
        }
        taken
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        self.budget.held.fetch_sub(self.bytes, Ordering::AcqRel);
    }
}

/// Why a body was not read whole.
#[derive(Debug, PartialEq, Eq)]
pub enum BodyError {
    /// Larger than the per-request limit.
    TooLarge,
    /// The relay holds as many body bytes as it will across all connections.
    Saturated,
    /// No chunk within the idle timeout, or slower than the minimum rate.
    TooSlow,
    /// The connection broke off.
    Broken,
}

/// Reads a request body of at most `limit` bytes (announced or sent) within the edge's bounds.
/// An oversized body that keeps coming is read on and dropped (bounded) before the 413, so a
/// client still writing it gets the answer instead of a broken pipe; every other refusal closes
/// the connection without reading further.
pub async fn read_body(
    body: Body,
    announced: Option<usize>,
    limit: usize,
    budget: &BufferBudget,
    edge: &EdgeSettings,
) -> Result<(Bytes, Hold), BodyError> {
    let mut hold = budget.hold();
    if let Some(length) = announced {
        if length > limit {
            drain(body, limit).await;
            return Err(BodyError::TooLarge);
        }
        if !hold.grow(length) {
            return Err(BodyError::Saturated);
        }
    }
    let mut chunks = body.into_data_stream();
    let mut collected = BytesMut::with_capacity(announced.unwrap_or(0));
    let started = Instant::now();
    loop {
        let next = tokio::time::timeout(edge.body_idle_timeout, chunks.next()).await;
        let chunk = match next {
            Err(_) => return Err(BodyError::TooSlow),
            Ok(None) => break,
            Ok(Some(Err(_))) => return Err(BodyError::Broken),
            Ok(Some(Ok(chunk))) => chunk,
        };
        if collected.len() + chunk.len() > limit {
            drain_rest(&mut chunks, collected.len() + chunk.len(), limit).await;
            return Err(BodyError::TooLarge);
        }
        let beyond_announced = (collected.len() + chunk.len()).saturating_sub(hold.bytes);
        if beyond_announced > 0 && !hold.grow(beyond_announced) {
            return Err(BodyError::Saturated);
        }
        collected.extend_from_slice(&chunk);
        let elapsed = started.elapsed();
        if elapsed > edge.body_rate_grace
            && (collected.len() as f64) < edge.body_min_rate as f64 * elapsed.as_secs_f64()
        {
            return Err(BodyError::TooSlow);
        }
    }
    Ok((collected.freeze(), hold))
}

/// Past the limit, the rest of an oversized body is read and dropped (up to this much more, for
/// at most `DRAIN_TIME`).
const DRAIN_BYTES: usize = 64 << 20;
const DRAIN_TIME: Duration = Duration::from_secs(10);

async fn drain(body: Body, limit: usize) {
    let mut chunks = body.into_data_stream();
    drain_rest(&mut chunks, 0, limit).await;
}

async fn drain_rest(
    chunks: &mut (impl futures_util::Stream<Item = Result<Bytes, axum::Error>> + Unpin),
    mut drained: usize,
    limit: usize,
) {
    let _ = tokio::time::timeout(DRAIN_TIME, async {
        while drained <= limit.saturating_add(DRAIN_BYTES) {
            match chunks.next().await {
                Some(Ok(chunk)) => drained += chunk.len(),
                _ => break,
            }
        }
    })
    .await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holds_share_one_budget_and_give_it_back_when_dropped() {
        let budget = BufferBudget::new(100);
        let mut first = budget.hold();
        assert!(first.grow(60));
        let mut second = budget.hold();
        assert!(!second.grow(41), "past the budget: nothing taken");
        assert!(second.grow(40));
        assert_eq!(budget.held(), 100);
        drop(first);
        assert_eq!(budget.held(), 40);
        drop(second);
        assert_eq!(budget.held(), 0);
    }
}
