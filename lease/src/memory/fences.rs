//! Release fences and billed marks of the memory backend: lease ids with an expiry, pruned from
//! the oldest.

use std::collections::{HashMap, VecDeque};

/// Lease ids with an expiry (ms), pruned from the oldest: each acquire and release touches only
/// the entries that expired since, never the whole set (a `retain` over every fence made a
/// standalone relay slower with every request it had served).
#[derive(Default)]
pub(super) struct Fences {
    until: HashMap<String, u64>,
    /// (expiry, lease id) in insertion order. An entry raised or removed later stays here until
    /// it is popped; popping removes the id only if its current expiry has passed too.
    order: VecDeque<(u64, String)>,
}

impl Fences {
    pub(super) fn contains(&self, lease_id: &str, now: u64) -> bool {
        self.until.get(lease_id).is_some_and(|until| *until >= now)
    }

    /// Fences `lease_id` until at least `until`.
    pub(super) fn raise(&mut self, lease_id: &str, until: u64) {
        let fence = self.until.entry(lease_id.to_owned()).or_default();
        if until > *fence {
            *fence = until;
            self.order.push_back((until, lease_id.to_owned()));
        }
    }

    pub(super) fn remove(&mut self, lease_id: &str) {
        self.until.remove(lease_id);
    }

    /// Drops what expired before `now`. Expiries are pushed nearly in order (now + a fixed
    /// fence), so this stops at the first live entry; one that expires earlier than an entry
    /// ahead of it waits for that one, and `contains` checks expiry itself meanwhile.
    pub(super) fn prune(&mut self, now: u64) {
        while let Some((until, _)) = self.order.front()
            && *until < now
        {
            let Some((until, lease_id)) = self.order.pop_front() else {
                break;
            };
            if self
                .until
                .get(&lease_id)
                .is_some_and(|current| *current <= until)
            {
                self.until.remove(&lease_id);
            }
        }
        if self.until.is_empty() {
            self.order.clear();
        }
    }

    pub(super) fn is_empty(&self) -> bool {
        self.until.is_empty()
    }

    #[cfg(test)]
    fn queued(&self) -> usize {
        self.order.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fence_holds_until_its_expiry_and_pruning_drops_only_what_expired() {
        let mut fences = Fences::default();
        for i in 0..10_000u64 {
            fences.raise(&format!("lease-{i}"), 1_000 + i);
        }
        assert!(fences.contains("lease-0", 1_000));
        assert!(!fences.contains("lease-0", 1_001));

        fences.prune(6_000);
        assert_eq!(fences.queued(), 5_000, "only the expired half is dropped");
        assert!(!fences.contains("lease-4999", 6_000));
        assert!(fences.contains("lease-5000", 6_000));

        fences.prune(20_000);
        assert!(fences.is_empty());
        assert_eq!(fences.queued(), 0);
    }

    #[test]
    fn a_raised_fence_outlives_its_first_expiry_and_a_removed_one_is_gone_at_once() {
        let mut fences = Fences::default();
        fences.raise("raised", 100);
        fences.raise("removed", 100);
        fences.raise("raised", 500);
        fences.raise("raised", 200); // lowering never shortens a fence
        fences.remove("removed");
        assert!(!fences.contains("removed", 50));

        fences.prune(300);
        assert!(fences.contains("raised", 300), "the later expiry wins");
        fences.prune(501);
        assert!(!fences.contains("raised", 501));
        assert!(fences.is_empty());
    }

    #[test]
    fn a_fence_removed_then_set_again_is_not_dropped_by_its_old_entry() {
        let mut fences = Fences::default();
        fences.raise("lease", 100);
        fences.remove("lease");
        fences.raise("lease", 400);
        fences.prune(200);
        assert!(fences.contains("lease", 200));
    }
}
