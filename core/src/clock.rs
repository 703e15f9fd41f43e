//! The one clock: wall time (ms since the Unix epoch: upstream resets, budget calendars,
//! expiries) and monotonic time (TTLs, cool-downs, cache ages), read through a shared [`Clock`]
//! handle that every engine and backend is given instead of asking the system itself.
//!
//! Production passes [`Clock::system`]; a test passes a [`ManualClock`] and moves time with
//! [`ManualClock::advance`] instead of sleeping. Redis-backed decisions keep Redis `TIME`
//! (CODE_STYLE "State"): this clock is the process's own. Waiting itself (a wait's deadline, a
//! poll interval, a background task's period) stays on Tokio's timer: a clock tells the time, it
//! does not sleep, so a frozen manual clock can never leave a task waiting forever.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Where time comes from. Implemented by [`SystemClock`] and [`ManualClock`]; code takes the
/// [`Clock`] handle, not this trait.
pub trait TimeSource: Send + Sync {
    /// Wall time in ms since the Unix epoch.
    fn wall_ms(&self) -> i64;

    /// Monotonic time: never goes backwards, unrelated to the wall time.
    fn now(&self) -> Instant;

    /// Whether a test moves this clock by hand. A manual clock also stands in for Redis' clock
    /// where an engine reads Redis time outside a script (the lease engine's budget periods), so
    /// a test crosses a day or a DST change on every store.
    fn is_manual(&self) -> bool {
        false
    }
}

/// The shared handle to the process's clock: cheap to clone, every clone reads the same time.
#[derive(Clone)]
pub struct Clock(Arc<dyn TimeSource>);

impl Clock {
    /// The system's clocks: `SystemTime` and `Instant`.
    pub fn system() -> Self {
        Clock(Arc::new(SystemClock))
    }

    /// A handle on any time source.
    pub fn new(source: Arc<dyn TimeSource>) -> Self {
        Clock(source)
    }

    /// Wall time in ms since the Unix epoch.
    pub fn wall_ms(&self) -> i64 {
        self.0.wall_ms()
    }

    /// Monotonic time.
    pub fn now(&self) -> Instant {
        self.0.now()
    }

    /// Monotonic time passed since `earlier` (zero if `earlier` is later).
    pub fn since(&self, earlier: Instant) -> Duration {
        self.now().saturating_duration_since(earlier)
    }

    /// See [`TimeSource::is_manual`].
    pub fn is_manual(&self) -> bool {
        self.0.is_manual()
    }
}

impl Default for Clock {
    fn default() -> Self {
        Clock::system()
    }
}

impl fmt::Debug for Clock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.is_manual() {
            "Clock(manual)"
        } else {
            "Clock(system)"
        })
    }
}

/// The system's clocks.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl TimeSource for SystemClock {
    fn wall_ms(&self) -> i64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
            .unwrap_or(0)
    }

    fn now(&self) -> Instant {
        Instant::now()
    }
}

/// A clock for tests: it starts at a given wall instant and moves only when told. Clones share
/// the same time, so the test keeps one and hands [`ManualClock::clock`] to what it builds.
#[derive(Clone)]
pub struct ManualClock(Arc<ManualState>);

struct ManualState {
    /// The monotonic instant the clock was made at; `now()` is this plus `elapsed_ns`.
    origin: Instant,
    elapsed_ns: AtomicU64,
    wall_ms: AtomicI64,
}

impl ManualClock {
    /// A clock whose wall time is `wall_ms` (ms since the epoch) until it is moved.
    pub fn starting_at(wall_ms: i64) -> Self {
        ManualClock(Arc::new(ManualState {
            origin: Instant::now(),
            elapsed_ns: AtomicU64::new(0),
            wall_ms: AtomicI64::new(wall_ms),
        }))
    }

    /// A clock starting at the system's wall time now.
    pub fn starting_now() -> Self {
        Self::starting_at(SystemClock.wall_ms())
    }

    /// Moves wall and monotonic time forward by `by`.
    pub fn advance(&self, by: Duration) {
        let ns = u64::try_from(by.as_nanos()).unwrap_or(u64::MAX);
        self.0.elapsed_ns.fetch_add(ns, Ordering::SeqCst);
        let ms = i64::try_from(by.as_millis()).unwrap_or(i64::MAX);
        self.0.wall_ms.fetch_add(ms, Ordering::SeqCst);
    }

    /// Sets the wall time alone (a test jumping between calendar days, also backwards);
    /// monotonic time does not move.
    pub fn set_wall_ms(&self, wall_ms: i64) {
        self.0.wall_ms.store(wall_ms, Ordering::SeqCst);
    }

    /// The handle to give what the test builds.
    pub fn clock(&self) -> Clock {
        Clock(Arc::new(self.clone()))
    }
}

impl From<ManualClock> for Clock {
    fn from(manual: ManualClock) -> Self {
        Clock(Arc::new(manual))
    }
}

impl fmt::Debug for ManualClock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ManualClock")
            .field("wall_ms", &self.wall_ms())
            .field("elapsed", &self.now().duration_since(self.0.origin))
            .finish()
    }
}

impl TimeSource for ManualClock {
    fn wall_ms(&self) -> i64 {
        self.0.wall_ms.load(Ordering::SeqCst)
    }

    fn now(&self) -> Instant {
        self.0.origin + Duration::from_nanos(self.0.elapsed_ns.load(Ordering::SeqCst))
    }

    fn is_manual(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_manual_clock_moves_only_when_advanced_and_every_handle_sees_it() {
        let manual = ManualClock::starting_at(1_000);
        let clock = manual.clock();
        let other = clock.clone();
        let start = clock.now();
        assert_eq!(clock.wall_ms(), 1_000);
        assert_eq!(other.since(start), Duration::ZERO);
        manual.advance(Duration::from_millis(1_500));
        assert_eq!(other.wall_ms(), 2_500);
        assert_eq!(other.since(start), Duration::from_millis(1_500));
        manual.set_wall_ms(500);
        assert_eq!(clock.wall_ms(), 500);
        assert_eq!(clock.since(start), Duration::from_millis(1_500));
        assert!(clock.is_manual());
    }

    #[test]
    fn the_system_clock_reads_the_system_time() {
        let clock = Clock::system();
        let before = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis() as i64)
            .unwrap_or(0);
        let wall = clock.wall_ms();
        assert!((wall - before).abs() < 5_000, "{wall} vs {before}");
        assert!(!clock.is_manual());
        let start = clock.now();
        assert!(clock.now() >= start);
    }
}
