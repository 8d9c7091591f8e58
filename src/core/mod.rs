//! Pure limiter logic: quotas, counters, the decision, the estimate.
//!
//! Nothing here reads a clock, does IO or uses `unsafe`; time is always a
//! parameter in nanoseconds of some monotonic clock chosen by the caller.
//! The nginx module, the C ABI, the root and the simulator all call these
//! functions, so the semantics exist once.

#![forbid(unsafe_code)]

pub mod counter;
pub mod decision;
pub mod estimate;
pub mod key;
pub mod quota;
pub mod rng;
pub mod snapshot;
pub mod spec;
pub mod terms;
pub mod window;

pub use counter::{Counting, Level, Tally};
pub use decision::{
    check_chain, decide, grantable, reserve_wait, tightest, ChainVerdict, Never, Room, Verdict,
    Wait,
};
pub use estimate::{Estimator, Extrapolation};
pub use quota::{Quota, ValidationError};
pub use snapshot::QuotaSnapshot;
pub use terms::Terms;
pub use window::{Window, WindowLevel, WindowRule};

/// Nanoseconds on a monotonic clock; the unit of every time in the core.
pub type Nanos = u64;

/// Seconds per nanosecond: rate arithmetic multiplies by it (a float
/// multiply is a few cycles; a divide by 1e9 would be the slowest step of a
/// check).
pub const SECS_PER_NANO: f64 = 1e-9;
