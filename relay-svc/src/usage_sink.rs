//! Usage records on their way to the selector, in batches, never dropped silently: a batch the
//! selector could not take (unavailable, timed out) is kept and sent again; a full queue spills
//! into an overflow list instead of dropping; whatever still cannot be kept (past a bound that
//! protects the relay's memory through a long outage, or a batch the selector refuses as
//! invalid) is counted in `relay_usage_records_lost_total` and logged, at most once per period.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use prometheus::IntCounter;
use tokio::sync::mpsc;

use poolgate_core::api::ApiError;

use crate::ports::{SelectionApi, UsageRecord};

/// Why a batch was not written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriteError {
    /// The selector could not take it now: keep the records and send them again.
    Retry,
    /// The selector refused the records themselves: sending them again changes nothing.
    Refused,
}

/// Where batches go (the selector's `RecordUsage`).
#[async_trait]
pub trait UsageWriter: Send + Sync + 'static {
    async fn write(&self, records: Vec<UsageRecord>) -> Result<(), WriteError>;
}

/// The selection API's usage intake as the writer, whichever implementation is behind it.
pub struct ApiUsage(pub Arc<dyn SelectionApi>);

#[async_trait]
impl UsageWriter for ApiUsage {
    async fn write(&self, records: Vec<UsageRecord>) -> Result<(), WriteError> {
        match self.0.record_usage(records).await {
            Ok(()) => Ok(()),
            Err(error @ ApiError::Invalid { .. }) => {
                tracing::warn!(%error, "the selector refused a usage batch");
                Err(WriteError::Refused)
            }
            Err(_) => Err(WriteError::Retry),
        }
    }
}

#[derive(Debug, Clone)]
pub struct SinkSettings {
    pub flush_every: Duration,
    pub batch: usize,
    /// Records kept for sending (queued, spilled, waiting for a retry) at most.
    pub max_pending: usize,
}

impl Default for SinkSettings {
    fn default() -> Self {
        SinkSettings {
            flush_every: Duration::from_secs(1),
            batch: 500,
            max_pending: 200_000,
        }
    }
}

/// The relay's end of the usage path.
pub struct UsageSink {
    sender: mpsc::Sender<UsageRecord>,
    overflow: Arc<Mutex<VecDeque<UsageRecord>>>,
    lost: Lost,
    max_pending: usize,
}

/// Counts lost records and logs them at most once per period.
#[derive(Clone)]
struct Lost {
    counter: IntCounter,
    last_log: Arc<Mutex<Option<tokio::time::Instant>>>,
}

impl Lost {
    fn add(&self, count: usize, why: &str) {
        if count == 0 {
            return;
        }
        self.counter.inc_by(count as u64);
        let mut last = self.last_log.lock().unwrap_or_else(|p| p.into_inner());
        let now = tokio::time::Instant::now();
        if last.is_none_or(|at| now.duration_since(at) >= Duration::from_secs(10)) {
            *last = Some(now);
            tracing::warn!(
                lost = count,
                lost_total = self.counter.get(),
                why,
                "usage records lost (counted in relay_usage_records_lost_total)"
            );
        }
    }
}

impl UsageSink {
    /// Starts the flusher; it ends when the sink is dropped, after a last flush.
    pub fn start(writer: impl UsageWriter, lost: IntCounter, settings: SinkSettings) -> Self {
        let (sender, receiver) = mpsc::channel(10_000);
        let overflow = Arc::new(Mutex::new(VecDeque::new()));
        let lost = Lost {
            counter: lost,
            last_log: Arc::new(Mutex::new(None)),
        };
        tokio::spawn(flush(
            writer,
            receiver,
            overflow.clone(),
            lost.clone(),
            settings.clone(),
        ));
        UsageSink {
            sender,
            overflow,
            lost,
            max_pending: settings.max_pending,
        }
    }

    /// Queues a record; a full queue spills into the overflow list.
    pub fn record(&self, record: UsageRecord) {
        let Err(error) = self.sender.try_send(record) else {
            return;
        };
        let record = match error {
            mpsc::error::TrySendError::Full(record) | mpsc::error::TrySendError::Closed(record) => {
                record
            }
        };
        let mut overflow = self.overflow.lock().unwrap_or_else(|p| p.into_inner());
        if overflow.len() < self.max_pending {
            overflow.push_back(record);
        } else {
            drop(overflow);
            self.lost
                .add(1, "the usage queue and its overflow are full");
        }
    }
}

async fn flush(
    writer: impl UsageWriter,
    mut receiver: mpsc::Receiver<UsageRecord>,
    overflow: Arc<Mutex<VecDeque<UsageRecord>>>,
    lost: Lost,
    settings: SinkSettings,
) {
    let mut pending: VecDeque<UsageRecord> = VecDeque::new();
    // After a failed write, the next try waits for the tick (no call per incoming record).
    let mut backing_off = false;
    let mut tick = tokio::time::interval(settings.flush_every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let (closed, ticked) = tokio::select! {
            record = receiver.recv() => match record {
                Some(record) => {
                    pending.push_back(record);
                    (false, false)
                }
                None => (true, false),
            },
            _ = tick.tick() => (false, true),
        };
        pending.extend(std::mem::take(
            &mut *overflow.lock().unwrap_or_else(|p| p.into_inner()),
        ));
        if pending.len() > settings.max_pending {
            let excess = pending.len() - settings.max_pending;
            pending.drain(..excess);
            lost.add(excess, "the selector has been unreachable for too long");
        }
        if !(closed || ticked || (!backing_off && pending.len() >= settings.batch)) {
            continue;
        }
        while !pending.is_empty() {
            let size = pending.len().min(settings.batch);
            let batch: Vec<UsageRecord> = pending.iter().take(size).cloned().collect();
            match writer.write(batch).await {
                Ok(()) => {
                    pending.drain(..size);
                    backing_off = false;
                }
                Err(WriteError::Refused) => {
                    pending.drain(..size);
                    lost.add(size, "the selector refused the batch");
                }
                // Kept; sent again at the next tick.
                Err(WriteError::Retry) => {
                    backing_off = true;
                    break;
                }
            }
            if !closed && !ticked {
                break;
            }
        }
        if closed {
            lost.add(
                pending.len(),
                "the relay stopped before the selector took them",
            );
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    struct Flaky {
        failures_left: AtomicUsize,
        refuse: bool,
        written: Arc<Mutex<Vec<UsageRecord>>>,
    }

    #[async_trait]
    impl UsageWriter for Flaky {
        async fn write(&self, records: Vec<UsageRecord>) -> Result<(), WriteError> {
            if self.refuse {
                return Err(WriteError::Refused);
            }
            if self
                .failures_left
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
                .is_ok()
            {
                return Err(WriteError::Retry);
            }
            self.written.lock().expect("written").extend(records);
            Ok(())
        }
    }

    fn record(n: u64) -> UsageRecord {
        UsageRecord {
            api_key_id: 1,
            user: "u".into(),
            account_id: 1,
            model: "m".into(),
            input_tokens: n,
            output_tokens: 0,
            cache_write_tokens: 0,
            cache_read_tokens: 0,
            cost_usd: 0.0,
            price_source: None,
            status: 200,
            latency_ms: 1,
            at_ms: 1,
        }
    }

    fn settings(max_pending: usize) -> SinkSettings {
        SinkSettings {
            flush_every: Duration::from_millis(20),
            batch: 7,
            max_pending,
        }
    }

    async fn until(check: impl Fn() -> bool) {
        for _ in 0..200 {
            if check() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("condition not met within 2 s");
    }

    #[tokio::test]
    async fn batches_the_selector_could_not_take_are_sent_again() {
        let written = Arc::new(Mutex::new(Vec::new()));
        let lost = IntCounter::new("lost", "lost").expect("counter");
        let sink = UsageSink::start(
            Flaky {
                failures_left: AtomicUsize::new(3),
                refuse: false,
                written: written.clone(),
            },
            lost.clone(),
            settings(1000),
        );
        for n in 0..30 {
            sink.record(record(n));
        }
        until(|| written.lock().expect("written").len() == 30).await;
        let tokens: Vec<u64> = written
            .lock()
            .expect("written")
            .iter()
            .map(|r| r.input_tokens)
            .collect();
        assert_eq!(tokens, (0..30).collect::<Vec<_>>(), "all, once, in order");
        assert_eq!(lost.get(), 0);
    }

    #[tokio::test]
    async fn a_full_queue_spills_and_what_cannot_be_kept_is_counted() {
        let written = Arc::new(Mutex::new(Vec::new()));
        let lost = IntCounter::new("lost", "lost").expect("counter");
        let sink = UsageSink::start(
            Flaky {
                failures_left: AtomicUsize::new(usize::MAX),
                refuse: false,
                written: written.clone(),
            },
            lost.clone(),
            settings(15_000),
        );
        // More than the queue (10 000) holds at once: the rest spills, nothing is lost yet.
        for n in 0..12_000 {
            sink.record(record(n));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(lost.get(), 0, "spilled, kept for sending");
        // Past the bound the oldest go, and are counted.
        for n in 0..5_000 {
            sink.record(record(n));
        }
        until(|| lost.get() == 2_000).await;
        assert!(written.lock().expect("written").is_empty());
    }

    #[tokio::test]
    async fn a_refused_batch_is_counted_as_lost() {
        let lost = IntCounter::new("lost", "lost").expect("counter");
        let sink = UsageSink::start(
            Flaky {
                failures_left: AtomicUsize::new(0),
                refuse: true,
                written: Arc::default(),
            },
            lost.clone(),
            settings(1000),
        );
        for n in 0..10 {
            sink.record(record(n));
        }
        until(|| lost.get() == 10).await;
    }
}
