//! A quota as the admin API shows it: its definition, its parent by name,
//! the live cluster level and fill rate this root sums, and (for single
//! reads) the limiters that recently sent weight for it. Listings, single
//! reads and the reply of a put all show quotas this way.

use serde::Serialize;

use crate::core::{Nanos, Quota, Window, SECS_PER_NANO};
use crate::root::ledger::LedgerView;

/// A quota as the admin API shows it.
#[derive(Clone, Debug, Serialize)]
pub struct QuotaView {
    /// Quota id (also its counter's).
    pub id: u64,
    /// Name.
    pub name: String,
    /// Parent's name.
    pub parent: Option<String>,
    /// Leak rate, units per second.
    pub limit: f64,
    /// Level up to which everything passes.
    pub low_burst: f64,
    /// Level from which everything is rejected.
    pub high_burst: f64,
    /// A per-key template: every key gets a counter of its own.
    pub per_key: bool,
    /// The window of a window quota (`1s` ... `month`); absent for a
    /// leaky bucket.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub window: Option<Window>,
    /// A sliding window quota.
    #[serde(skip_serializing_if = "crate::core::quota::is_false")]
    pub sliding: bool,
    /// Epoch of the last change.
    pub epoch: u64,
    /// Cluster level now, as this root sums it (for a window quota, the
    /// current window's count; sliding: with the previous window's share).
    pub level: f64,
    /// Units per second arriving at this root, smoothed.
    pub fill_rate: f64,
    /// Checks per second the limiters syncing with this root reject,
    /// smoothed (limiters older than this field report none).
    pub rejected_rate: f64,
    /// Limiters that recently sent weight for this quota (single-quota
    /// reads only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub limiters: Option<Vec<LimiterSeen>>,
}

/// A limiter that recently sent weight for a quota.
#[derive(Clone, Debug, Serialize)]
pub struct LimiterSeen {
    /// The limiter's id.
    pub limiter: String,
    /// Seconds since its last delta for the quota.
    pub seconds_ago: f64,
}

/// The view of `quota` at `now`; with `with_limiters`, the recent
/// limiters too.
pub fn view(ledger: &LedgerView, quota: &Quota, now: Nanos, with_limiters: bool) -> QuotaView {
    let counter = ledger.counters.view(quota.id, now);
    let limiters = with_limiters.then(|| {
        let seen = counter
            .as_ref()
            .map(|c| c.seen.as_slice())
            .unwrap_or_default();
        seen.iter()
            .filter_map(|s| {
                let limiter = ledger.limiters.seen(s.limiter, s.at)?;
                let seconds_ago = now.saturating_sub(s.at) as f64 * SECS_PER_NANO;
                Some(LimiterSeen {
                    limiter: limiter.name.to_string(),
                    seconds_ago,
                })
            })
            .collect()
    });
    QuotaView {
        id: quota.id,
        name: quota.name.clone(),
        parent: quota
            .parent
            .and_then(|p| ledger.quotas.name_of(p))
            .map(str::to_string),
        limit: quota.limit,
        low_burst: quota.low_burst,
        high_burst: quota.high_burst,
        per_key: quota.per_key,
        window: quota.window,
        sliding: quota.sliding,
        epoch: quota.epoch,
        level: counter.as_ref().map_or(0.0, |c| c.level),
        fill_rate: counter.as_ref().map_or(0.0, |c| c.fill_rate),
        rejected_rate: counter.as_ref().map_or(0.0, |c| c.rejected_rate),
        limiters,
    }
}
