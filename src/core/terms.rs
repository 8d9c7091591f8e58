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
    /// a leak, `at_once` for an in-flight quota, else the window (`1s`, `10s`, `min`, `hour`, `day`, `week`,
    /// `month`).
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
    }
}

impl fmt::Display for Terms {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let limit = self.limit;
        match self.window {
            None if self.in_flight => write!(f, "{limit} at once")?,
            None => write!(f, "{limit} /s")?,
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
