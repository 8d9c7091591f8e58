//! How the admin API, the overview and `/healthz` write the numbers they
//! compute (levels, rates, shares, durations): without float noise. A
//! sum of smoothed rates or a nanosecond count times 1e-9 is exact to
//! the last bit only by accident (`"seconds_ago": 3.1559234220000003`),
//! and people and scripts read these. Durations in seconds are written to
//! the microsecond (six decimal places), everything else to six
//! significant digits: far finer than any of them is accurate, and
//! exactly the decimal shown. Numbers an operator gave (limits, bursts)
//! are written as given.

use serde::Serializer;

use crate::core::{round_significant, round_to};

/// Decimal places of a duration in seconds: microseconds.
const SECONDS_PLACES: i32 = 6;
/// Significant digits of a level, rate or share.
const DIGITS: i32 = 6;

/// A duration in seconds, to the microsecond.
pub fn seconds<S: Serializer>(value: &f64, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64(round_to(*value, SECONDS_PLACES))
}

/// An optional duration in seconds, to the microsecond.
pub fn seconds_opt<S: Serializer>(value: &Option<f64>, s: S) -> Result<S::Ok, S::Error> {
    match value {
        Some(v) => seconds(v, s),
        None => s.serialize_none(),
    }
}

/// A level, rate or share, to six significant digits.
pub fn significant<S: Serializer>(value: &f64, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64(round_significant(*value, DIGITS))
}

/// An optional level, rate or share, to six significant digits.
pub fn significant_opt<S: Serializer>(value: &Option<f64>, s: S) -> Result<S::Ok, S::Error> {
    match value {
        Some(v) => significant(v, s),
        None => s.serialize_none(),
    }
}

#[cfg(test)]
mod tests {
    use serde::Serialize;

    #[derive(Serialize)]
    struct Sample {
        #[serde(serialize_with = "super::seconds")]
        seconds_ago: f64,
        #[serde(serialize_with = "super::seconds_opt")]
        round_trip_seconds: Option<f64>,
        #[serde(serialize_with = "super::significant")]
        fill_rate: f64,
        #[serde(serialize_with = "super::significant_opt")]
        per_second: Option<f64>,
    }

    /// The issue's case, and its kin.
    #[test]
    fn computed_numbers_are_written_without_float_noise() {
        let sample = Sample {
            seconds_ago: 3.155_923_422_000_000_3,
            round_trip_seconds: Some(0.000_312_456_7),
            fill_rate: 0.1 + 0.2,
            per_second: None,
        };
        assert_eq!(
            serde_json::to_string(&sample).unwrap(),
            r#"{"seconds_ago":3.155923,"round_trip_seconds":0.000312,"fill_rate":0.3,"per_second":null}"#
        );
    }
}
