//! Ordering eligible accounts (DESIGN §5), as a pure function: the sticky account first (if
//! eligible and not soft-blocked), then priority tiers (lower first), within a tier a weighted
//! random order by `weight × headroom`, soft-blocked accounts last in their tier. No
//! per-process round-robin state: any replica gives equally good answers.

use std::sync::Arc;

use crate::AccountId;
use crate::account::Account;
use crate::health::AccountHealth;

/// An account that passed every eligibility check, with what the oracle knows of it.
#[derive(Debug, Clone)]
pub struct Candidate {
    pub account: Arc<Account>,
    /// `None`: unreadable (unknown load).
    pub health: Option<AccountHealth>,
}

impl Candidate {
    pub fn soft_blocked(&self) -> bool {
        self.health.is_some_and(|h| h.soft_block_ms > 0)
    }

    /// Free share of the account's concurrency, 0..=1; 1 for unlimited accounts, 0.5 when the
    /// load is unknown (neither preferred nor avoided).
    pub fn headroom(&self) -> f64 {
        let limit = self.account.concurrency_limit;
        match self.health.and_then(|h| h.inflight) {
            None => 0.5,
            Some(_) if limit <= 0 => 1.0,
            Some(inflight) => (f64::from(limit) - f64::from(inflight)).max(0.0) / f64::from(limit),
        }
    }
}

/// Orders candidates; returns them with whether the first is the sticky account.
pub fn order(
    mut candidates: Vec<Candidate>,
    sticky: Option<AccountId>,
    rng: &mut fastrand::Rng,
) -> (Vec<Candidate>, bool) {
    let mut ordered = Vec::with_capacity(candidates.len());
    let mut is_sticky = false;
    if let Some(sticky) = sticky
        && let Some(index) = candidates
            .iter()
            .position(|c| c.account.id == sticky && !c.soft_blocked())
    {
        ordered.push(candidates.swap_remove(index));
        is_sticky = true;
    }
    // Efraimidis–Spirakis: key = u^(1/w), descending, is a weighted draw without replacement.
    // A full account keeps a tiny weight, so it is still listed (the relay may wait on it).
    let mut keyed: Vec<(i32, bool, f64, Candidate)> = candidates
        .into_iter()
        .map(|candidate| {
            let weight =
                (f64::from(candidate.account.weight.max(1)) * candidate.headroom()).max(1e-6);
            let key = rng.f64().max(f64::MIN_POSITIVE).powf(1.0 / weight);
            (
                candidate.account.priority,
                candidate.soft_blocked(),
                key,
                candidate,
            )
        })
        .collect();
    keyed.sort_by(|a, b| {
        a.0.cmp(&b.0)
            .then(a.1.cmp(&b.1))
            .then(b.2.partial_cmp(&a.2).unwrap_or(std::cmp::Ordering::Equal))
    });
    ordered.extend(keyed.into_iter().map(|(_, _, _, candidate)| candidate));
    (ordered, is_sticky)
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;
    use crate::account::{AccountStatus, CredentialKind, Platform, Secret};
    use crate::health::Breaker;

    fn account(id: AccountId, priority: i32, weight: i32, limit: i32) -> Arc<Account> {
        Arc::new(Account {
            id,
            name: format!("a{id}"),
            group: "g".into(),
            platform: Platform::Anthropic,
            base_url: "http://127.0.0.1".into(),
            credential_kind: CredentialKind::ApiKey,
            credential: Secret::new("k"),
            oauth: None,
            status: AccountStatus::Active,
            status_reason: String::new(),
            priority,
            weight,
            concurrency_limit: limit,
            rpm_limit: 0,
            session_window_limit_usd: 0.0,
            allowed_models: vec![],
            model_mapping: HashMap::new(),
            proxy_url: None,
            probe_model: None,
            stream_usage: true,
        })
    }

    fn healthy(inflight: u32, soft: u64) -> Option<AccountHealth> {
        Some(AccountHealth {
            inflight: Some(inflight),
            hard_block_ms: 0,
            soft_block_ms: soft,
            breaker: Breaker::Closed,
            failures: 0,
        })
    }

    fn ids(candidates: &[Candidate]) -> Vec<AccountId> {
        candidates.iter().map(|c| c.account.id).collect()
    }

    #[test]
    fn tiers_then_soft_blocked_last_and_sticky_first() {
        let mut rng = fastrand::Rng::with_seed(7);
        let candidates = vec![
            Candidate {
                account: account(1, 1, 1, 0),
                health: healthy(0, 0),
            },
            Candidate {
                account: account(2, 0, 1, 0),
                health: healthy(0, 5_000),
            },
            Candidate {
                account: account(3, 0, 1, 0),
                health: healthy(0, 0),
            },
        ];
        let (ordered, sticky) = order(candidates.clone(), None, &mut rng);
        assert_eq!(ids(&ordered), vec![3, 2, 1]);
        assert!(!sticky);
        let (ordered, sticky) = order(candidates.clone(), Some(1), &mut rng);
        assert_eq!(ids(&ordered), vec![1, 3, 2]);
        assert!(sticky);
        // A soft-blocked sticky account is not put first.
        let (ordered, sticky) = order(candidates, Some(2), &mut rng);
        assert_eq!(ids(&ordered), vec![3, 2, 1]);
        assert!(!sticky);
    }

    #[test]
    fn full_accounts_are_listed_after_those_with_room() {
        let mut rng = fastrand::Rng::with_seed(1);
        for _ in 0..100 {
            let candidates = vec![
                Candidate {
                    account: account(1, 0, 10, 2),
                    health: healthy(2, 0),
                },
                Candidate {
                    account: account(2, 0, 1, 2),
                    health: healthy(1, 0),
                },
            ];
            let (ordered, _) = order(candidates, None, &mut rng);
            assert_eq!(ids(&ordered), vec![2, 1]);
        }
    }

    #[test]
    fn first_picks_follow_weights() {
        let mut rng = fastrand::Rng::with_seed(3);
        let mut firsts = HashMap::new();
        for _ in 0..20_000 {
            let candidates = vec![
                Candidate {
                    account: account(1, 0, 1, 0),
                    health: healthy(0, 0),
                },
                Candidate {
                    account: account(2, 0, 3, 0),
                    health: healthy(0, 0),
                },
            ];
            let (ordered, _) = order(candidates, None, &mut rng);
            *firsts.entry(ordered[0].account.id).or_insert(0u32) += 1;
        }
        let share = f64::from(firsts[&2]) / 20_000.0;
        assert!(
            (share - 0.75).abs() < 0.02,
            "weight 3 of 4 → 75 %, got {share}"
        );
    }
}
