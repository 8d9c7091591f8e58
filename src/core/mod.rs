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
pub mod object;
pub mod quota;
pub mod rng;
pub mod snapshot;
pub mod spec;
pub mod terms;
pub mod tier;
pub mod window;

#[cfg(test)]
mod in_flight_tests;

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

/// `value` rounded to `places` decimal places, for JSON read by people: a
/// duration of `3.1559234220000003` s to the microsecond is `3.155923`.
/// Non-finite values, and values too large to carry that many places in
/// an `f64`, are returned as they are.
pub fn round_to(value: f64, places: i32) -> f64 {
    /// From 2^52 on an `f64` holds no fraction.
    const WHOLE: f64 = 4_503_599_627_370_496.0;
    if places >= 0 {
        let scale = 10f64.powi(places);
        let scaled = value * scale;
        if !scaled.is_finite() || scaled.abs() >= WHOLE {
            return value;
        }
        // Dividing a whole number by a power of ten gives the double
        // nearest the decimal: it prints as the decimal.
        scaled.round() / scale
    } else {
        let scale = 10f64.powi(-places);
        let scaled = value / scale;
        if !scaled.is_finite() {
            return value;
        }
        scaled.round() * scale
    }
}

/// `value` rounded to `digits` significant digits (at least 1), for JSON
/// read by people: levels, rates and shares whose last digits are float
/// noise (`12.000000000000002` to 6 digits is `12`).
pub fn round_significant(value: f64, digits: i32) -> f64 {
    if value == 0.0 || !value.is_finite() {
        return value;
    }
    let magnitude = value.abs().log10().floor() as i32;
    round_to(value, digits.max(1) - 1 - magnitude)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounding_removes_float_noise_and_keeps_what_matters() {
        assert_eq!(round_to(3.155_923_422_000_000_3, 6), 3.155923);
        assert_eq!(round_to(3.155_923_422_000_000_3, 6).to_string(), "3.155923");
        assert_eq!(round_to(0.000_312_4, 6), 0.000312);
        assert_eq!(round_to(-1.5e-7, 6), -0.0);
        assert_eq!(round_to(1e300, 6), 1e300);
        assert!(round_to(f64::NAN, 3).is_nan());
        assert_eq!(round_to(1_234_567.0, -2), 1_234_600.0);
        assert_eq!(round_significant(12.000_000_000_000_002, 6), 12.0);
        assert_eq!(round_significant(0.000_123_456_78, 6), 0.000_123_457);
        assert_eq!(round_significant(1_234_567.8, 6), 1_234_570.0);
        assert_eq!(round_significant(-2.5e-12, 6), -2.5e-12);
        assert_eq!(round_significant(0.1 + 0.2, 6).to_string(), "0.3");
        assert_eq!(round_significant(f64::INFINITY, 6), f64::INFINITY);
        assert_eq!(round_significant(0.0, 6), 0.0);
    }
}
