//! A quota as a check reads it: its numbers and its counter's state at
//! check time, what the decision (`decision.rs`) and the estimate
//! (`estimate.rs`) both take.

use super::window::WindowRule;
use super::Level;

/// One quota as a check read it: everything the decision needs to know
/// about it at check time (its numbers and its counter's state).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct QuotaSnapshot {
    /// Leak rate, units per second.
    pub limit: f64,
    /// Level up to which everything passes.
    pub low_burst: f64,
    /// Level from which everything is rejected.
    pub high_burst: f64,
    /// The cluster level at the last merge, in local time.
    pub known: Level,
    /// Measured fill rate of the other hosts, units per second (used by the
    /// adaptive extrapolation).
    pub fill_rate: f64,
    /// Weight this host admitted that `known` does not include yet (pending
    /// plus sent-but-unacknowledged), less weight it gave back that `known`
    /// still includes: below zero when it gave back more than it admitted
    /// since (estimates are clamped at zero).
    pub own_recent: f64,
    /// For a window quota, how it counts: `known.level` is then the count
    /// of the window holding `known.at`, and `prev` the count of the window
    /// before it (see [`super::window`]). `None`: a leaky bucket.
    pub window: Option<WindowRule>,
    /// A window quota's previous window's count as of `known.at`.
    pub prev: f64,
}
