//! The relay's answer caches as one type: a bounded map of answers by client key, each read for a
//! time after it was written (the selector's key checks, a key holder's description). Bounded so
//! a flood of distinct keys cannot grow it: at its bound the expired entries go, and if that is
//! not enough, all of them (each costs one more selector call, never memory).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

pub(crate) struct TtlCache<V> {
    entries: Mutex<HashMap<String, (V, Instant)>>,
    ttl: Duration,
    max_entries: usize,
}

impl<V: Clone> TtlCache<V> {
    pub(crate) fn new(ttl: Duration, max_entries: usize) -> Self {
        TtlCache {
            entries: Mutex::new(HashMap::new()),
            ttl,
            max_entries,
        }
    }

    /// The answer kept for `key`, while it is younger than the ttl.
    pub(crate) fn get(&self, key: &str) -> Option<V> {
        let entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        entries
            .get(key)
            .filter(|(_, at)| at.elapsed() < self.ttl)
            .map(|(value, _)| value.clone())
    }

    pub(crate) fn insert(&self, key: &str, value: V) {
        let mut entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        if entries.len() >= self.max_entries && !entries.contains_key(key) {
            let ttl = self.ttl;
            entries.retain(|_, (_, at)| at.elapsed() < ttl);
            if entries.len() >= self.max_entries {
                entries.clear();
            }
        }
        entries.insert(key.to_owned(), (value, Instant::now()));
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.entries.lock().unwrap_or_else(|p| p.into_inner()).len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn an_answer_is_read_until_its_ttl_and_not_after() {
        let cache = TtlCache::new(Duration::from_millis(500), 10);
        cache.insert("k", 1);
        tokio::time::advance(Duration::from_millis(499)).await;
        assert_eq!(cache.get("k"), Some(1));
        tokio::time::advance(Duration::from_millis(1)).await;
        assert_eq!(cache.get("k"), None);
        assert_eq!(cache.get("other"), None);
    }

    #[tokio::test(start_paused = true)]
    async fn a_flood_of_keys_never_grows_it_past_its_bound() {
        let cache = TtlCache::new(Duration::from_secs(2), 100);
        for n in 0..1_000 {
            cache.insert(&format!("key-{n}"), n);
            assert!(cache.len() <= 100);
        }
        // Expired entries make room first; fresh ones are kept while there is room.
        tokio::time::advance(Duration::from_secs(3)).await;
        cache.insert("fresh", 1);
        assert_eq!(cache.len(), 1);
        assert_eq!(cache.get("fresh"), Some(1));
    }
}
