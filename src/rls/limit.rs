//! One `rate_limit` block of envoyproxy/ratelimit's configuration: its
//! unit, its numbers and sluice's extensions, as plain data. `config.rs`
//! reads them from YAML; `quotas.rs` turns them into quotas.

/// The unit of a limit, as envoyproxy/ratelimit names them (any case in
/// a file).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Unit {
    /// One second.
    Second,
    /// One minute.
    Minute,
    /// One hour.
    Hour,
    /// One day.
    Day,
    /// One week.
    Week,
    /// One month.
    Month,
    /// One year.
    Year,
}

impl Unit {
    /// The unit named `name`, in any case (`UNKNOWN` is none).
    pub fn parse(name: &str) -> Option<Unit> {
        Some(match name.to_ascii_uppercase().as_str() {
            "SECOND" => Unit::Second,
            "MINUTE" => Unit::Minute,
            "HOUR" => Unit::Hour,
            "DAY" => Unit::Day,
            "WEEK" => Unit::Week,
            "MONTH" => Unit::Month,
            "YEAR" => Unit::Year,
            _ => return None,
        })
    }

    /// The name RLS v3 gives it.
    pub fn name(self) -> &'static str {
        match self {
            Unit::Second => "SECOND",
            Unit::Minute => "MINUTE",
            Unit::Hour => "HOUR",
            Unit::Day => "DAY",
            Unit::Week => "WEEK",
            Unit::Month => "MONTH",
            Unit::Year => "YEAR",
        }
    }

    /// Seconds in one unit, as envoyproxy/ratelimit counts them (a month
    /// is 30 days, a year 365).
    pub fn seconds(self) -> u64 {
        match self {
            Unit::Second => 1,
            Unit::Minute => 60,
            Unit::Hour => 3600,
            Unit::Day => 86_400,
            Unit::Week => 604_800,
            Unit::Month => 2_592_000,
            Unit::Year => 31_536_000,
        }
    }
}

/// How a limit counts beyond envoyproxy/ratelimit's fixed window: sluice's
/// extensions.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Extension {
    /// `sliding: true`: a sliding window of the unit.
    pub sliding: bool,
    /// `units: N`: `requests_per_unit` per N units (1: the plain unit).
    pub units: u32,
    /// `leaky: true`: a leaky bucket draining `requests_per_unit` per
    /// `units` units, with its band.
    pub leaky: bool,
    /// The leaky bucket's `low_burst` (requests; default the limit).
    pub low_burst: Option<f64>,
    /// The leaky bucket's `high_burst` (requests; default `low_burst`).
    pub high_burst: Option<f64>,
}

/// One `rate_limit` block.
#[derive(Clone, Debug, PartialEq)]
pub struct Limit {
    /// Requests per unit (0: every request is over).
    pub requests_per_unit: u32,
    /// The unit (`None` only when `unlimited`).
    pub unit: Option<Unit>,
    /// Never limits: answers OK with 2^32-1 remaining.
    pub unlimited: bool,
    /// The limit's `name`, which `replaces` of other limits refer to.
    pub name: String,
    /// Names of limits this one replaces when both match one request.
    pub replaces: Vec<String>,
    /// sluice's extensions.
    pub extension: Extension,
}
