//! A quota's limit in its own terms: the one way every surface (the CLI,
//! the console, `sluice top`, nginx's log lines, the simulator's plots)
//! writes what a quota allows.
//!
//! A leaky quota's `limit` is units per second; a window quota's is units
//! per window, so "1000" alone means a thousand a second to a reader and
//! a thousand a day to the quota. [`Terms`] writes the unit and the kind
//! with the number:
//!
//! | quota | terms |
//! |---|---|
//! | leaky, limit 5 | `5 /s` |
//! | window `1d`, limit 1000 | `1000 / day` |
//! | window `1m`, sliding, limit 10 | `10 / min sliding` |
//! | window `1s`, limit 5 | `5 / 1s window` |
//! | leaky, per key, limit 15 | `15 /s per key` |
//! | in-flight, limit 100 | `100 at once` |
//!
//! A leaky rate is written `/s` with no space and the windows name their
//! span, so a 1-second window (`5 / 1s window`) never reads as a leak of
//! 5 a second (`5 /s`).
//!
//! A leaky rate is also written as people give it ([`Rate`]): `10/m`,
//! `100/h`, `5/s` (nginx's `rate=10r/m`, the `r` optional) in quota files
//! and the CLI. The quota keeps units per second, not the unit it was
//! given in, so a slow leak is shown per minute or per hour when that
//! makes it a whole number (`10 /m`, not `0.166667 /s`): a rate given in
//! whole units of a minute or an hour reads back as it was written.

use std::fmt;

use super::quota::Quota;
use super::window::Window;

/// What a quota allows, as people read it (see the module doc).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Terms {
    /// Units per second (leaky) or per window.
    pub limit: f64,
    /// The window of a window quota; `None`: a leaky bucket.
    pub window: Option<Window>,
    /// The window slides.
    pub sliding: bool,
    /// A per-key template: the limit holds for each key.
    pub per_key: bool,
    /// An in-flight quota: `limit` requests at once.
    pub in_flight: bool,
}

impl Terms {
    /// The terms of `quota`.
    pub fn of(quota: &Quota) -> Self {
        Self {
            limit: quota.limit,
            window: quota.window,
            sliding: quota.sliding,
            per_key: quota.per_key,
            in_flight: quota.in_flight,
        }
    }

    /// How the quota counts: `leaky`, `window` (fixed), `sliding` or
    /// `in_flight`.
    pub fn kind(&self) -> &'static str {
        if self.in_flight {
            return "in_flight";
        }
        match (self.window, self.sliding) {
            (None, _) => "leaky",
            (Some(_), false) => "window",
            (Some(_), true) => "sliding",
        }
    }

    /// The span the limit is counted over, as the terms name it: `s` for
    /// a leak, `at_once` for an in-flight quota, else the window (`1s`,
    /// `10s`, `min`, `hour`, `day`, `week`, `month`, `epoch_week`, `30d`,
    /// `365d`).
    pub fn per(&self) -> &'static str {
        match self.window {
            None if self.in_flight => "at_once",
            None => "s",
            Some(window) => span(window),
        }
    }
}

/// A window's span in words.
fn span(window: Window) -> &'static str {
    match window {
        Window::Second => "1s",
        Window::TenSeconds => "10s",
        Window::Minute => "min",
        Window::Hour => "hour",
        Window::Day => "day",
        Window::Week => "week",
        Window::Month => "month",
        // envoyproxy/ratelimit's week, month and year: by their names, so
        // none reads as a calendar one.
        Window::EpochWeek => "epoch_week",
        Window::Days30 => "30d",
        Window::Days365 => "365d",
    }
}

/// A leaky rate's unit as people write it: `/s`, `/m` or `/h`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RateUnit {
    /// Per second.
    Second,
    /// Per minute.
    Minute,
    /// Per hour.
    Hour,
}

impl RateUnit {
    /// Seconds in one of it.
    pub fn seconds(self) -> f64 {
        match self {
            RateUnit::Second => 1.0,
            RateUnit::Minute => 60.0,
            RateUnit::Hour => 3600.0,
        }
    }

    /// As written after the slash: `s`, `m` or `h`.
    pub fn letter(self) -> &'static str {
        match self {
            RateUnit::Second => "s",
            RateUnit::Minute => "m",
            RateUnit::Hour => "h",
        }
    }

    /// The unit a leak of `per_second` reads best in: per second from 1
    /// a second up or when it is a short decimal (`0.5`, `0.001`), else
    /// per minute or per hour when that makes it a whole number (what
    /// `10/m` or `3/h` became: `0.1666...` a second), else per second.
    pub fn for_leak(per_second: f64) -> Self {
        let whole = |n: f64| (n - n.round()).abs() <= 1e-9 * n.max(1.0);
        if per_second >= 1.0
            || per_second <= 0.0
            || !per_second.is_finite()
            || whole(per_second * 1000.0)
        {
            return RateUnit::Second;
        }
        [RateUnit::Minute, RateUnit::Hour]
            .into_iter()
            .find(|unit| whole(per_second * unit.seconds()))
            .unwrap_or(RateUnit::Second)
    }
}

/// A limit as written: a number, or a leaky rate with its unit (`10/m`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Rate {
    /// Units per second (for a bare number: the number).
    pub per_second: f64,
    /// The unit it was written with; `None` for a bare number.
    pub unit: Option<RateUnit>,
}

/// What [`parse_rate`] accepts, for messages.
pub const RATE_FORMS: &str = "a number, or a rate such as 10/m, 100/h or 5/s (10r/m as nginx \
                              writes it)";

/// Parses a limit as people write it: `10/m`, `100/h`, `5/s` (the `r` of
/// nginx's `10r/m` optional), or a bare number. The number is finite and
/// not negative; the range is checked with the quota.
pub fn parse_rate(text: &str) -> Result<Rate, String> {
    let text = text.trim();
    let invalid = || format!("invalid rate \"{text}\": expected {RATE_FORMS}");
    let (number, unit) = match text.split_once('/') {
        None => (text, None),
        Some((number, unit)) => {
            let unit = match unit {
                "s" | "sec" => RateUnit::Second,
                "m" | "min" => RateUnit::Minute,
                "h" | "hour" => RateUnit::Hour,
                _ => return Err(invalid()),
            };
            (number.strip_suffix('r').unwrap_or(number), Some(unit))
        }
    };
    // Only digits and a point: no sign, exponent, "inf" or "NaN".
    if number.is_empty() || !number.bytes().all(|b| b.is_ascii_digit() || b == b'.') {
        return Err(invalid());
    }
    let n: f64 = number.parse().map_err(|_| invalid())?;
    Ok(Rate {
        per_second: n / unit.map_or(1.0, RateUnit::seconds),
        unit,
    })
}

impl fmt::Display for Terms {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let limit = self.limit;
        match self.window {
            None if self.in_flight => write!(f, "{limit} at once")?,
            None => {
                let unit = RateUnit::for_leak(limit);
                let n = limit * unit.seconds();
                // Whole units of a minute or an hour read as written.
                let n = if unit == RateUnit::Second {
                    n
                } else {
                    n.round()
                };
                write!(f, "{n} /{}", unit.letter())?;
            }
            Some(window) => {
                write!(f, "{limit} / {}", span(window))?;
                if self.sliding {
                    f.write_str(" sliding")?;
                } else if matches!(window, Window::Second | Window::TenSeconds) {
                    // "5 / 1s" would read as the leak "5 /s".
                    f.write_str(" window")?;
                }
            }
        }
        if self.per_key {
            f.write_str(" per key")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn terms(limit: f64, window: Option<Window>, sliding: bool, per_key: bool) -> String {
        Terms {
            limit,
            window,
            sliding,
            per_key,
            in_flight: false,
        }
        .to_string()
    }

    #[test]
    fn an_in_flight_quota_reads_at_once() {
        let q = Quota::new(1, "uploads", 100.0, 100.0, 100.0).in_flight_if(true);
        assert_eq!(Terms::of(&q).to_string(), "100 at once");
        assert_eq!(
            Terms::of(&q.clone().keyed()).to_string(),
            "100 at once per key"
        );
        assert_eq!(Terms::of(&q).kind(), "in_flight");
    }

    #[test]
    fn rates_parse_with_their_unit_as_nginx_writes_them() {
        let rate = |t: &str| parse_rate(t).map(|r| (r.per_second, r.unit));
        assert_eq!(rate("5/s"), Ok((5.0, Some(RateUnit::Second))));
        assert_eq!(rate("10/m"), Ok((10.0 / 60.0, Some(RateUnit::Minute))));
        assert_eq!(rate("10r/m"), Ok((10.0 / 60.0, Some(RateUnit::Minute))));
        assert_eq!(rate("100/h"), Ok((100.0 / 3600.0, Some(RateUnit::Hour))));
        assert_eq!(rate("2.5"), Ok((2.5, None)));
        assert_eq!(rate(" 7/min "), Ok((7.0 / 60.0, Some(RateUnit::Minute))));
        for bad in [
            "", "/m", "10/d", "10/", "-1/s", "1e3/s", "inf", "NaN/s", "10 /m", "x/m", "10rr/m",
        ] {
            let error = parse_rate(bad).unwrap_err();
            assert!(error.contains("10/m"), "{bad:?}: {error}");
        }
    }

    #[test]
    fn a_slow_leak_reads_in_the_unit_it_was_given_in() {
        let leak = |t: &str| terms(parse_rate(t).unwrap().per_second, None, false, false);
        assert_eq!(leak("10/m"), "10 /m");
        assert_eq!(leak("100/h"), "100 /h");
        assert_eq!(leak("5/s"), "5 /s");
        assert_eq!(leak("1/m"), "1 /m");
        assert_eq!(leak("7/h"), "7 /h");
        // Only a slow leak that is no short decimal a second changes unit:
        // 120/m is 2 a second, 30/m half of one.
        assert_eq!(leak("120/m"), "2 /s");
        assert_eq!(leak("30/m"), "0.5 /s");
        assert_eq!(leak("36/h"), "0.01 /s");
        // Not a whole number of any unit: per second, as stored.
        assert_eq!(terms(0.3337, None, false, false), "0.3337 /s");
        assert_eq!(terms(0.0, None, false, false), "0 /s");
        assert_eq!(
            terms(10.0 / 60.0, None, false, true),
            "10 /m per key",
            "the issue's 0.16667 /s per key"
        );
    }

    #[test]
    fn a_leaky_quota_reads_per_second() {
        assert_eq!(terms(5.0, None, false, false), "5 /s");
        assert_eq!(terms(0.5, None, false, false), "0.5 /s");
        assert_eq!(terms(15.0, None, false, true), "15 /s per key");
    }

    #[test]
    fn a_window_quota_reads_per_window() {
        let cases = [
            (Window::Second, "5 / 1s window"),
            (Window::TenSeconds, "5 / 10s window"),
            (Window::Minute, "5 / min"),
            (Window::Hour, "5 / hour"),
            (Window::Day, "5 / day"),
            (Window::Week, "5 / week"),
            (Window::Month, "5 / month"),
            (Window::EpochWeek, "5 / epoch_week"),
            (Window::Days30, "5 / 30d"),
            (Window::Days365, "5 / 365d"),
        ];
        for (window, expected) in cases {
            assert_eq!(terms(5.0, Some(window), false, false), expected);
        }
        assert_eq!(terms(1000.0, Some(Window::Day), false, false), "1000 / day");
    }

    #[test]
    fn a_sliding_window_says_so() {
        assert_eq!(
            terms(10.0, Some(Window::Minute), true, false),
            "10 / min sliding"
        );
        assert_eq!(
            terms(5.0, Some(Window::Second), true, false),
            "5 / 1s sliding"
        );
        assert_eq!(
            terms(60.0, Some(Window::Minute), true, true),
            "60 / min sliding per key"
        );
    }

    #[test]
    fn no_window_reads_like_a_leak() {
        // Every window's terms differ from every leak's, whatever the limit.
        for window in Window::ALL {
            for sliding in [false, true] {
                let text = terms(5.0, Some(window), sliding, false);
                assert!(!text.contains("/s"), "{text}");
                assert_ne!(text, terms(5.0, None, false, false));
            }
        }
    }

    #[test]
    fn the_kind_and_span_name_how_it_counts() {
        let of = |window, sliding| Terms {
            limit: 1.0,
            window,
            sliding,
            per_key: false,
            in_flight: false,
        };
        assert_eq!(
            (of(None, false).kind(), of(None, false).per()),
            ("leaky", "s")
        );
        let day = of(Some(Window::Day), false);
        assert_eq!((day.kind(), day.per()), ("window", "day"));
        assert_eq!(of(Some(Window::Minute), true).kind(), "sliding");
    }

    #[test]
    fn terms_come_from_the_quota() {
        let quota = Quota::new(1, "plan", 100.0, 100.0, 100.0)
            .windowed(Window::Hour, true)
            .keyed();
        assert_eq!(Terms::of(&quota).to_string(), "100 / hour sliding per key");
    }
}
