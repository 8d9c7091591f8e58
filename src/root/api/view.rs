//! A quota as the admin API shows it: its definition, its parent by name,
//! the live cluster level and fill rate this root sums, and (for single
//! reads) the limiters that recently sent weight for it. Listings, single
//! reads and the reply of a put all show quotas this way.

use serde::Serialize;

use crate::core::tier::PenaltyTime;
use crate::core::{Nanos, Quota, Terms, Window, SECS_PER_NANO};
use crate::root::ledger::LedgerView;

/// Rejection rates below this, one check in 100 seconds (the least the
/// console shows with two decimals), are shown as 0: a rate meter decays
/// towards zero without reaching it, and a quota that last rejected an
/// hour ago is not rejecting now.
pub const LEAST_REJECTED_RATE: f64 = 0.01;

/// A measured rejection rate as the admin API shows it (see
/// [`LEAST_REJECTED_RATE`]).
pub fn shown_rejected_rate(rate: f64) -> f64 {
    if rate >= LEAST_REJECTED_RATE {
        rate
    } else {
        0.0
    }
}

/// A quota as the admin API shows it.
#[derive(Clone, Debug, Serialize)]
pub struct QuotaView {
    /// Quota id (also its counter's).
    pub id: u64,
    /// Name.
    pub name: String,
    /// Parent's name.
    pub parent: Option<String>,
    /// Units per second (a leaky quota) or per window (a window quota).
    pub limit: f64,
    /// The limit in its own terms, with its unit and kind: `5 /s`,
    /// `1000 / day`, `10 / min sliding`, `15 /s per key` ([`Terms`]).
    pub terms: String,
    /// How it counts: `leaky`, `window` or `sliding` ([`Terms::kind`]).
    pub kind: &'static str,
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
    /// The penalty a rejection at the high burst starts (`"15m"`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub penalty: Option<PenaltyTime>,
    /// An in-flight quota: `limit` requests at once; `level` is the slots
    /// held.
    #[serde(skip_serializing_if = "crate::core::quota::is_false")]
    pub in_flight: bool,
    /// Epoch of the last change.
    pub epoch: u64,
    /// Cluster level now, as this root sums it (for a window quota, the
    /// current window's count; sliding: with the previous window's share).
    #[serde(serialize_with = "crate::root::api::round::significant")]
    pub level: f64,
    /// Units per second arriving at this root, smoothed.
    #[serde(serialize_with = "crate::root::api::round::significant")]
    pub fill_rate: f64,
    /// Checks per second the limiters syncing with this root reject,
    /// smoothed, 0 below [`LEAST_REJECTED_RATE`] (limiters older than this
    /// field report none); a per-key template's are every key's.
    #[serde(serialize_with = "crate::root::api::round::significant")]
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
    #[serde(serialize_with = "crate::root::api::round::seconds")]
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
        terms: Terms::of(quota).to_string(),
        kind: Terms::of(quota).kind(),
        low_burst: quota.low_burst,
        high_burst: quota.high_burst,
        per_key: quota.per_key,
        window: quota.window,
        sliding: quota.sliding,
        penalty: quota.penalty,
        in_flight: quota.in_flight,
        epoch: quota.epoch,
        level: counter.as_ref().map_or(0.0, |c| c.level),
        fill_rate: counter.as_ref().map_or(0.0, |c| c.fill_rate),
        rejected_rate: shown_rejected_rate(if quota.per_key {
            ledger.counters.template_rejected_rate(quota.id, now)
        } else {
            counter.as_ref().map_or(0.0, |c| c.rejected_rate)
        }),
        limiters,
    }
}
