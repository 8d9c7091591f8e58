//! Window quotas: `limit` units per UTC-aligned window instead of a leak.
//!
//! A window quota's counter is the count of its current window and of the
//! one before (for the sliding estimate), with a time inside the current
//! window ([`WindowLevel`]). It is still a grow-only CRDT: within one
//! window counts only grow and two views merge by `max`; a later window
//! replaces an earlier one (carrying the earlier count as the later one's
//! `prev` when they are neighbours). So roots, limiters, max-merging,
//! fail-open and the estimate between syncs work as for leaky quotas.
//!
//! Windows are aligned to UTC so every host and root agrees on the window
//! index: `1s`, `10s`, `1m`, `1h` and `1d` from the Unix epoch, `7d` from
//! Monday 00:00 UTC, `month` on calendar months; and, as
//! envoyproxy/ratelimit counts its week, month and year, `epoch_week`,
//! `30d` and `365d`: 604,800 s, 30 days and 365 days from the epoch (a
//! Thursday; leap days are not skipped, so `365d` drifts from the
//! calendar year by a day every four years). Times in the core are a
//! monotonic clock's nanoseconds; a caller turns them into UTC with an
//! offset (`utc = now + utc_offset`) that the sync thread measures against
//! the roots' clocks, so hosts whose own clocks are off still agree.
//!
//! A sliding window counts `prev * (1 - elapsed) + current`, `elapsed`
//! being the fraction of the current window gone: the sliding-window
//! counter Cloudflare measured at 0.003% wrong decisions. Sliding logs are
//! not offered: they keep one entry per request.

use serde::{Deserialize, Serialize};

use super::Nanos;

/// Nanoseconds per second.
const SEC: i64 = 1_000_000_000;
/// Nanoseconds per day.
const DAY: i64 = 86_400 * SEC;

/// The length of a window quota's windows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Window {
    /// One second.
    #[serde(rename = "1s")]
    Second,
    /// Ten seconds.
    #[serde(rename = "10s")]
    TenSeconds,
    /// One minute.
    #[serde(rename = "1m")]
    Minute,
    /// One hour.
    #[serde(rename = "1h")]
    Hour,
    /// One UTC day.
    #[serde(rename = "1d")]
    Day,
    /// One week, Monday 00:00 UTC to Monday.
    #[serde(rename = "7d")]
    Week,
    /// One calendar month (UTC).
    #[serde(rename = "month")]
    Month,
    /// 604,800 seconds from the epoch: a week starting Thursday 00:00
    /// UTC, envoyproxy/ratelimit's week.
    #[serde(rename = "epoch_week")]
    EpochWeek,
    /// 30 days from the epoch, envoyproxy/ratelimit's month.
    #[serde(rename = "30d")]
    Days30,
    /// 365 days from the epoch, envoyproxy/ratelimit's year.
    #[serde(rename = "365d")]
    Days365,
}

impl Window {
    /// Every window, in order of length (the Monday week before the epoch
    /// week, calendar months around `30d`).
    pub const ALL: [Window; 10] = [
        Window::Second,
        Window::TenSeconds,
        Window::Minute,
        Window::Hour,
        Window::Day,
        Window::Week,
        Window::EpochWeek,
        Window::Days30,
        Window::Month,
        Window::Days365,
    ];

    /// The name in quota files: `1s`, `10s`, `1m`, `1h`, `1d`, `7d`,
    /// `epoch_week`, `30d`, `month`, `365d`.
    pub fn name(self) -> &'static str {
        match self {
            Window::Second => "1s",
            Window::TenSeconds => "10s",
            Window::Minute => "1m",
            Window::Hour => "1h",
            Window::Day => "1d",
            Window::Week => "7d",
            Window::Month => "month",
            Window::EpochWeek => "epoch_week",
            Window::Days30 => "30d",
            Window::Days365 => "365d",
        }
    }

    /// The window named `name`.
    pub fn parse(name: &str) -> Option<Window> {
        Window::ALL.into_iter().find(|w| w.name() == name)
    }

    /// A small number naming the window (1..=10), for a table slot's
    /// flags. Fixed per window, not its place in [`Window::ALL`]: the
    /// windows added later took the next numbers.
    pub fn code(self) -> u16 {
        match self {
            Window::Second => 1,
            Window::TenSeconds => 2,
            Window::Minute => 3,
            Window::Hour => 4,
            Window::Day => 5,
            Window::Week => 6,
            Window::Month => 7,
            Window::EpochWeek => 8,
            Window::Days30 => 9,
            Window::Days365 => 10,
        }
    }

    /// The window of [`Window::code`] `code` (0, or a code no window has:
    /// none).
    pub fn from_code(code: u16) -> Option<Window> {
        Window::ALL.into_iter().find(|w| w.code() == code)
    }

    /// Length of a fixed-length window, nanoseconds (`None` for months).
    fn fixed(self) -> Option<i64> {
        match self {
            Window::Second => Some(SEC),
            Window::TenSeconds => Some(10 * SEC),
            Window::Minute => Some(60 * SEC),
            Window::Hour => Some(3600 * SEC),
            Window::Day => Some(DAY),
            Window::Week | Window::EpochWeek => Some(7 * DAY),
            Window::Days30 => Some(30 * DAY),
            Window::Days365 => Some(365 * DAY),
            Window::Month => None,
        }
    }

    /// Index of the window holding UTC time `utc` (nanoseconds since the
    /// Unix epoch, may be negative): consecutive windows have consecutive
    /// indices.
    // Every arm divides by a constant, which compiles to a multiply: a
    // window check costs about what a leaky one does (`benches/kinds_ratio.rs`).
    #[inline]
    pub fn index(self, utc: i64) -> i64 {
        match self {
            Window::Second => utc.div_euclid(SEC),
            Window::TenSeconds => utc.div_euclid(10 * SEC),
            Window::Minute => utc.div_euclid(60 * SEC),
            Window::Hour => utc.div_euclid(3600 * SEC),
            Window::Day => utc.div_euclid(DAY),
            // The epoch was a Thursday: weeks start three days later.
            Window::Week => (utc + 3 * DAY).div_euclid(7 * DAY),
            Window::EpochWeek => utc.div_euclid(7 * DAY),
            Window::Days30 => utc.div_euclid(30 * DAY),
            Window::Days365 => utc.div_euclid(365 * DAY),
            Window::Month => month_of_day(utc.div_euclid(DAY)),
        }
    }

    /// UTC start of window `index`, nanoseconds since the epoch.
    #[inline]
    pub fn start(self, index: i64) -> i64 {
        match self {
            Window::Week => index * 7 * DAY - 3 * DAY,
            Window::Month => first_day_of_month(index) * DAY,
            w => index * w.fixed().unwrap_or(SEC),
        }
    }

    /// `1 / length` for a window of `length` nanoseconds of this kind.
    #[inline]
    fn per_ns(self, length: i64) -> f64 {
        match self {
            Window::Second => 1.0 / SEC as f64,
            Window::TenSeconds => 1.0 / (10 * SEC) as f64,
            Window::Minute => 1.0 / (60 * SEC) as f64,
            Window::Hour => 1.0 / (3600 * SEC) as f64,
            Window::Day => 1.0 / DAY as f64,
            Window::Week | Window::EpochWeek => 1.0 / (7 * DAY) as f64,
            Window::Days30 => 1.0 / (30 * DAY) as f64,
            Window::Days365 => 1.0 / (365 * DAY) as f64,
            Window::Month => 1.0 / length as f64,
        }
    }

    /// Length of window `index`, nanoseconds.
    pub fn length(self, index: i64) -> i64 {
        self.start(index + 1) - self.start(index)
    }
}

/// Months in [`MONTH_FIRST_DAYS`]: January 1970 to December 2262, every
/// month after the epoch that UTC nanoseconds in an `i64` reach (they end
/// in April 2262); earlier or later months are computed.
const TABLED_MONTHS: usize = (2263 - 1970) * 12;

/// The first day (days since 1970-01-01) of each tabled month, and of the
/// month after the last. Calendar arithmetic takes a dozen divisions;
/// with this table, computed at compile time, a month window costs a
/// multiply and a lookup, and the core keeps no state.
static MONTH_FIRST_DAYS: [i32; TABLED_MONTHS + 1] = {
    let mut firsts = [0; TABLED_MONTHS + 1];
    let mut month = 0;
    while month <= TABLED_MONTHS {
        firsts[month] = month_first_day(month as i64) as i32;
        month += 1;
    }
    firsts
};

/// The month index (months since January 1970) of day `day`.
fn month_of_day(day: i64) -> i64 {
    let last = MONTH_FIRST_DAYS[TABLED_MONTHS] as i64;
    if !(0..last).contains(&day) {
        let (year, m, _) = civil_from_days(day);
        return (year - 1970) * 12 + m as i64 - 1;
    }
    // A month averages 146097 / 4800 days (400 Gregorian years): the
    // guess is the month or one of its neighbours.
    let mut month = (day * 4800 / 146_097) as usize;
    if MONTH_FIRST_DAYS[month] as i64 > day {
        month -= 1;
    } else if MONTH_FIRST_DAYS[month + 1] as i64 <= day {
        month += 1;
    }
    month as i64
}

/// The first day (days since 1970-01-01) of month index `month`.
fn first_day_of_month(month: i64) -> i64 {
    match usize::try_from(month) {
        Ok(m) if m <= TABLED_MONTHS => MONTH_FIRST_DAYS[m] as i64,
        _ => month_first_day(month),
    }
}

/// [`first_day_of_month`] by the calendar.
const fn month_first_day(month: i64) -> i64 {
    days_from_civil(
        1970 + month.div_euclid(12),
        month.rem_euclid(12) as u32 + 1,
        1,
    )
}

/// Days since 1970-01-01 of a proleptic Gregorian date.
pub const fn days_from_civil(year: i64, month: u32, day: u32) -> i64 {
    // Years start in March, so the leap day ends a year.
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let year_of_era = y - era * 400;
    let m = month as i64;
    let day_of_year = (153 * (m + if m > 2 { -3 } else { 9 }) + 2) / 5 + day as i64 - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    era * 146_097 + day_of_era - 719_468
}

/// The proleptic Gregorian date `(year, month, day)` of `days` since
/// 1970-01-01.
pub fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let day_of_era = z - era * 146_097;
    let year_of_era =
        (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let mp = (5 * day_of_year + 2) / 153;
    let day = (day_of_year - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

/// How a window quota counts: its window, sliding or fixed, and the offset
/// that turns the caller's monotonic times into UTC.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WindowRule {
    /// The window length.
    pub window: Window,
    /// Count the previous window too, weighted by how much of it is still
    /// inside a window-long span ending now.
    pub sliding: bool,
    /// UTC nanoseconds minus the caller's clock.
    pub utc_offset: i64,
}

impl WindowRule {
    /// Index of the window holding time `at` of the caller's clock.
    #[inline]
    pub fn index_at(&self, at: Nanos) -> i64 {
        self.window.index(at as i64 + self.utc_offset)
    }

    /// The caller's time at which the window holding `at` ends.
    pub fn end_of(&self, at: Nanos) -> Nanos {
        let next = self.window.start(self.index_at(at) + 1) - self.utc_offset;
        next.max(0) as Nanos
    }

    /// The caller's time at which the window holding `at` started.
    pub fn start_of(&self, at: Nanos) -> Nanos {
        let start = self.window.start(self.index_at(at)) - self.utc_offset;
        start.max(0) as Nanos
    }

    /// The window holding `now`: its index, and how far into it `now` is
    /// and how long it is, nanoseconds (one index computation; a check
    /// needs all three).
    // Always inlined: returned through memory, its fields were read back
    // as one wider load that missed store forwarding (a tenth of a
    // sliding check, in perf annotate).
    #[inline(always)]
    pub fn locate(&self, now: Nanos) -> Located {
        let utc = now as i64 + self.utc_offset;
        let index = self.window.index(utc);
        let start = self.window.start(index);
        let length = self.window.start(index + 1) - start;
        Located {
            index,
            elapsed: utc - start,
            length,
            per_ns: self.window.per_ns(length),
        }
    }

    /// The share of the previous window a sliding count takes at `now`: 1
    /// at the start of a window, 0 at its end.
    pub fn prev_weight(&self, now: Nanos) -> f64 {
        self.locate(now).prev_weight()
    }

    /// The window a weight found at `now` is counted in: the one holding
    /// `now - ATTRIBUTION_GRACE`. Weight collected just after a boundary
    /// was admitted before it (the sync thread wakes for it at the
    /// boundary), so it belongs to the window that just ended.
    pub fn attributed_index(&self, now: Nanos) -> i64 {
        self.index_at(now.saturating_sub(ATTRIBUTION_GRACE))
    }
}

/// How long after a window boundary collected weight still counts in the
/// window before it (see [`WindowRule::attributed_index`]): the sync thread
/// wakes a few milliseconds after each boundary to collect, so weight it
/// finds then was admitted before the boundary, or in those milliseconds.
pub const ATTRIBUTION_GRACE: Nanos = 10_000_000;

/// Where a time falls in its window (see [`WindowRule::locate`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Located {
    /// The window's index.
    pub index: i64,
    /// Nanoseconds since the window started.
    pub elapsed: i64,
    /// The window's length, nanoseconds.
    pub length: i64,
    /// `1 / length`: a fixed window's is a constant, so the sliding share
    /// costs a multiply, not a division (which was a third of a sliding
    /// check's time).
    pub per_ns: f64,
}

impl Located {
    /// The share of the previous window a sliding count takes: 1 at the
    /// window's start, 0 at its end.
    #[inline]
    pub fn prev_weight(&self) -> f64 {
        (1.0 - self.elapsed as f64 * self.per_ns).clamp(0.0, 1.0)
    }

    /// Nanoseconds until the window ends.
    pub fn to_end(&self) -> i64 {
        self.length - self.elapsed
    }
}

/// A window quota's counter: the count of the window holding `at`, and of
/// the window before it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct WindowLevel {
    /// Units counted in the window holding `at`.
    pub count: f64,
    /// Units counted in the window before it.
    pub prev: f64,
    /// A time inside the counted window, nanoseconds of the owner's clock.
    pub at: Nanos,
}

impl WindowLevel {
    /// `(count, prev)` as seen from `now`: the current window's count and
    /// the previous window's.
    pub fn counts_at(&self, rule: &WindowRule, now: Nanos) -> (f64, f64) {
        self.counts_in(rule, rule.index_at(now))
    }

    /// `(count, prev)` as seen from window `current`.
    #[inline]
    pub fn counts_in(&self, rule: &WindowRule, current: i64) -> (f64, f64) {
        let mine = rule.index_at(self.at);
        if mine >= current {
            // The same window (or, with a clock that stepped back, a
            // later one: keep it).
            (self.count, self.prev)
        } else if mine + 1 == current {
            (0.0, self.count)
        } else {
            (0.0, 0.0)
        }
    }

    /// The level a check compares with the quota's bursts at `now`: the
    /// current window's count, plus the weighted previous one when
    /// sliding.
    pub fn level_at(&self, rule: &WindowRule, now: Nanos) -> f64 {
        let (count, prev) = self.counts_at(rule, now);
        if rule.sliding {
            count + prev * rule.prev_weight(now)
        } else {
            count
        }
    }

    /// Adds `weight` at `now`: to this window's count, or to a fresh
    /// window's (the old count becoming `prev` if it was the one before).
    pub fn add(self, rule: &WindowRule, now: Nanos, weight: f64) -> Self {
        let (count, prev) = self.counts_at(rule, now);
        Self {
            count: count + weight,
            prev,
            at: now.max(self.at),
        }
    }

    /// Adds `weight` that belongs to window `index` (a delta's window, see
    /// [`WindowRule::attributed_index`]) at `now`: to the current count,
    /// or, for the window before `now`'s, to the previous one. A later
    /// index than `now`'s (a sender whose clock runs ahead) counts now;
    /// weight for windows older than the previous one no longer matters
    /// to any decision: `None`.
    pub fn add_in(self, rule: &WindowRule, index: i64, now: Nanos, weight: f64) -> Option<Self> {
        let current = rule.index_at(now);
        if index >= current {
            return Some(self.add(rule, now, weight));
        }
        if index + 1 < current {
            return None;
        }
        let mine = rule.index_at(self.at);
        Some(if mine == current {
            Self {
                prev: self.prev + weight,
                ..self
            }
        } else if mine == index {
            Self {
                count: self.count + weight,
                ..self
            }
        } else {
            // The counter is older still: the delta's window starts over,
            // after the one the counter holds if they are neighbours.
            let start = rule.window.start(index) - rule.utc_offset;
            Self {
                count: weight,
                prev: if mine + 1 == index { self.count } else { 0.0 },
                at: start.max(0) as Nanos,
            }
        })
    }

    /// The larger of two views of one counter: in the same window the
    /// larger counts, else the later window's, which takes the earlier
    /// window's count as its `prev` when they are neighbours.
    pub fn merge(self, other: Self, rule: &WindowRule) -> Self {
        let (a, b) = (rule.index_at(self.at), rule.index_at(other.at));
        if a == b {
            return Self {
                count: self.count.max(other.count),
                prev: self.prev.max(other.prev),
                at: self.at.max(other.at),
            };
        }
        let (later, earlier, gap) = if a > b {
            (self, other, a - b)
        } else {
            (other, self, b - a)
        };
        Self {
            prev: if gap == 1 {
                later.prev.max(earlier.count)
            } else {
                later.prev
            },
            ..later
        }
    }

    /// True for finite, non-negative counts.
    pub fn is_valid(&self) -> bool {
        self.count.is_finite() && self.count >= 0.0 && self.prev.is_finite() && self.prev >= 0.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The tabled months agree with the calendar, whatever order days
    /// come in (neighbours, far apart, before 1970).
    #[test]
    fn month_windows_through_the_table_match_the_calendar() {
        let mut x = 12_345u64;
        let mut days: Vec<i64> = (-800..30_000).collect();
        for i in (1..days.len()).rev() {
            x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
            days.swap(i, (x >> 33) as usize % (i + 1));
        }
        // Runs of neighbouring days, as a clock reads them.
        days.extend(17_000..17_400);
        for day in days {
            let (year, month, _) = civil_from_days(day);
            let index = (year - 1970) * 12 + i64::from(month) - 1;
            let utc = day * DAY + 7 * SEC;
            assert_eq!(Window::Month.index(utc), index, "day {day}");
            let first = days_from_civil(year, month, 1);
            assert_eq!(Window::Month.start(index), first * DAY, "day {day}");
            let (ny, nm) = if month == 12 {
                (year + 1, 1)
            } else {
                (year, month + 1)
            };
            assert_eq!(
                Window::Month.start(index + 1),
                days_from_civil(ny, nm, 1) * DAY
            );
        }
    }

    /// Every day of the table, its last month and the days after it are
    /// in the month the calendar says.
    #[test]
    fn every_tabled_day_and_the_days_past_the_table_find_their_month() {
        let last = MONTH_FIRST_DAYS[TABLED_MONTHS] as i64;
        for day in 0..last + 400 {
            let (year, month, _) = civil_from_days(day);
            let index = (year - 1970) * 12 + i64::from(month) - 1;
            assert_eq!(month_of_day(day), index, "day {day}");
            assert_eq!(first_day_of_month(index), days_from_civil(year, month, 1));
        }
        assert_eq!(civil_from_days(last), (2263, 1, 1));
    }

    /// UTC nanoseconds of a date and time.
    fn utc(y: i64, mo: u32, d: u32, h: i64, mi: i64, s: i64) -> i64 {
        days_from_civil(y, mo, d) * DAY + (h * 3600 + mi * 60 + s) * SEC
    }

    #[test]
    fn calendar_days_round_trip_over_four_centuries() {
        for days in (-200_000..200_000).step_by(7) {
            let (y, m, d) = civil_from_days(days);
            assert_eq!(days_from_civil(y, m, d), days, "{y}-{m}-{d}");
        }
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(
            days_from_civil(2000, 3, 1) - days_from_civil(2000, 2, 1),
            29
        );
        assert_eq!(
            days_from_civil(2100, 3, 1) - days_from_civil(2100, 2, 1),
            28
        );
        assert_eq!(
            civil_from_days(days_from_civil(2026, 11, 23)),
            (2026, 11, 23)
        );
    }

    #[test]
    fn windows_are_aligned_to_utc() {
        let t = utc(2026, 11, 23, 13, 45, 30) + 123;
        for w in [
            Window::Second,
            Window::TenSeconds,
            Window::Minute,
            Window::Hour,
            Window::Day,
        ] {
            let i = w.index(t);
            assert!(w.start(i) <= t && t < w.start(i + 1), "{w:?}");
        }
        assert_eq!(
            Window::Minute.start(Window::Minute.index(t)),
            utc(2026, 11, 23, 13, 45, 0)
        );
        assert_eq!(
            Window::Day.start(Window::Day.index(t)),
            utc(2026, 11, 23, 0, 0, 0)
        );
        // 2026-11-23 is a Monday: the week starts that day.
        assert_eq!(
            Window::Week.start(Window::Week.index(t)),
            utc(2026, 11, 23, 0, 0, 0)
        );
        assert_eq!(
            Window::Week.start(Window::Week.index(utc(2026, 11, 22, 23, 59, 59))),
            utc(2026, 11, 16, 0, 0, 0)
        );
    }

    #[test]
    fn months_are_calendar_months() {
        let i = Window::Month.index(utc(2024, 2, 29, 23, 59, 59));
        assert_eq!(Window::Month.start(i), utc(2024, 2, 1, 0, 0, 0));
        assert_eq!(Window::Month.start(i + 1), utc(2024, 3, 1, 0, 0, 0));
        assert_eq!(Window::Month.length(i), 29 * DAY);
        assert_eq!(Window::Month.index(utc(2024, 3, 1, 0, 0, 0)), i + 1);
        // Across a year boundary, and before the epoch.
        let dec = Window::Month.index(utc(2025, 12, 31, 12, 0, 0));
        assert_eq!(Window::Month.index(utc(2026, 1, 1, 0, 0, 0)), dec + 1);
        assert_eq!(Window::Month.index(utc(1969, 12, 15, 0, 0, 0)), -1);
    }

    #[test]
    fn names_and_codes_round_trip() {
        for w in Window::ALL {
            assert_eq!(Window::parse(w.name()), Some(w));
            assert_eq!(Window::from_code(w.code()), Some(w));
        }
        assert_eq!(Window::parse("2m"), None);
        assert_eq!(Window::from_code(0), None);
        assert_eq!(Window::from_code(11), None);
    }

    /// The codes of the first seven windows are in tables and shared
    /// memory already formatted: they never move.
    #[test]
    fn the_first_windows_keep_their_codes() {
        let kept = [
            (Window::Second, 1),
            (Window::TenSeconds, 2),
            (Window::Minute, 3),
            (Window::Hour, 4),
            (Window::Day, 5),
            (Window::Week, 6),
            (Window::Month, 7),
        ];
        for (w, code) in kept {
            assert_eq!(w.code(), code, "{w:?}");
        }
        let mut codes: Vec<u16> = Window::ALL.iter().map(|w| w.code()).collect();
        codes.sort();
        assert_eq!(codes, (1..=10).collect::<Vec<u16>>());
    }

    /// envoyproxy/ratelimit's units: the epoch week, 30 days, 365 days.
    const EPOCH_ALIGNED: [(Window, i64); 3] = [
        (Window::EpochWeek, 604_800),
        (Window::Days30, 2_592_000),
        (Window::Days365, 31_536_000),
    ];

    #[test]
    fn epoch_aligned_windows_start_at_the_epoch_and_have_one_length() {
        for (w, secs) in EPOCH_ALIGNED {
            let len = secs * SEC;
            assert_eq!(w.index(0), 0, "{w:?}");
            assert_eq!(w.start(0), 0, "{w:?}");
            assert_eq!(w.index(len - 1), 0, "{w:?}");
            assert_eq!(w.index(len), 1, "{w:?}");
            assert_eq!(w.start(1), len, "{w:?}");
            // Before the epoch: the window ending at it is -1.
            assert_eq!(w.index(-1), -1, "{w:?}");
            assert_eq!(w.start(-1), -len, "{w:?}");
            assert_eq!(w.index(-len), -1, "{w:?}");
            assert_eq!(w.index(-len - 1), -2, "{w:?}");
            // Up to about 270 years from the epoch (the i64 range is 292).
            for i in [-3, -1, 0, 1, 29, 100_000 * 86_400 / secs] {
                assert_eq!(w.length(i), len, "{w:?} {i}");
            }
        }
    }

    /// The epoch week starts on Thursdays, three days before the Monday
    /// week's start; `30d` and `365d` are not calendar months and years.
    #[test]
    fn epoch_aligned_windows_are_not_the_calendars() {
        // 2026-11-19 is a Thursday.
        let t = utc(2026, 11, 21, 8, 0, 0);
        let w = Window::EpochWeek;
        assert_eq!(w.start(w.index(t)), utc(2026, 11, 19, 0, 0, 0));
        assert_eq!(
            Window::Week.start(Window::Week.index(t)),
            utc(2026, 11, 16, 0, 0, 0)
        );
        // 1970-01-31 is in the first 30 days' window's successor.
        assert_eq!(Window::Days30.index(utc(1970, 1, 31, 0, 0, 0)), 1);
        assert_eq!(Window::Month.index(utc(1970, 1, 31, 0, 0, 0)), 0);
        // 1972 was a leap year: its 31 December starts 1973's 365 days.
        assert_eq!(
            Window::Days365.start(Window::Days365.index(utc(1973, 1, 1, 0, 0, 0))),
            utc(1972, 12, 31, 0, 0, 0)
        );
    }

    /// Each epoch-aligned window is plain division by its length,
    /// wherever the time falls (random times across the i64 range,
    /// negative ones too, and the times around each boundary).
    #[test]
    fn epoch_aligned_windows_agree_with_division_by_their_length() {
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let mut times = vec![0, 1, -1, i64::MIN + 1, i64::MAX - 1];
        for _ in 0..20_000 {
            x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
            // Half over the whole range, half within ±100 years.
            let t = x as i64;
            times.push(if x >> 63 == 0 {
                t
            } else {
                t % (100 * 365 * DAY)
            });
        }
        for (w, secs) in EPOCH_ALIGNED {
            let len = secs * SEC;
            let mut all = times.clone();
            for k in -5..5 {
                all.extend([k * len - 1, k * len, k * len + 1]);
            }
            for t in all {
                let i = t.div_euclid(len);
                assert_eq!(w.index(t), i, "{w:?} at {t}");
                if let Some(start) = i.checked_mul(len) {
                    assert_eq!(w.start(i), start, "{w:?} at {t}");
                    assert!(w.start(i) <= t, "{w:?} at {t}");
                }
                let rule = WindowRule {
                    window: w,
                    sliding: false,
                    utc_offset: 0,
                };
                if t >= 0 && t < i64::MAX - len {
                    let l = rule.locate(t as Nanos);
                    assert_eq!((l.index, l.elapsed, l.length), (i, t.rem_euclid(len), len));
                    assert_eq!(l.to_end(), len - t.rem_euclid(len));
                }
            }
        }
    }

    /// envoyproxy/ratelimit's reset: at epoch second 604,800 × k + 1,000
    /// the week has 603,800 s left; likewise the 30 and 365 days.
    #[test]
    fn an_epoch_aligned_window_resets_when_the_epoch_divides_by_its_length() {
        for (w, secs) in EPOCH_ALIGNED {
            let rule = WindowRule {
                window: w,
                sliding: true,
                utc_offset: 0,
            };
            for k in [1, 7, 2_000 / (secs / 86_400) + 3] {
                let now = ((secs * k + 1_000) * SEC) as Nanos;
                let l = rule.locate(now);
                assert_eq!(l.to_end(), (secs - 1_000) * SEC, "{w:?} k={k}");
                assert_eq!(rule.end_of(now), ((k + 1) * secs * SEC) as Nanos);
                // A sliding count weighs the previous window by what is
                // left of it.
                let weight = 1.0 - 1_000.0 / secs as f64;
                assert!((l.prev_weight() - weight).abs() < 1e-9, "{w:?}");
            }
        }
    }

    const RULE: WindowRule = WindowRule {
        window: Window::TenSeconds,
        sliding: false,
        utc_offset: 0,
    };

    fn at(secs: f64) -> Nanos {
        (secs * 1e9) as Nanos
    }

    #[test]
    fn counts_grow_within_a_window_and_start_over_in_the_next() {
        let mut l = WindowLevel::default();
        l = l.add(&RULE, at(1.0), 3.0);
        l = l.add(&RULE, at(9.9), 4.0);
        assert_eq!(l.level_at(&RULE, at(9.99)), 7.0);
        assert_eq!(l.level_at(&RULE, at(10.0)), 0.0);
        l = l.add(&RULE, at(12.0), 1.0);
        assert_eq!((l.count, l.prev), (1.0, 7.0));
        // Two windows later both are gone.
        assert_eq!(l.counts_at(&RULE, at(31.0)), (0.0, 0.0));
    }

    #[test]
    fn a_sliding_count_weighs_the_previous_window_by_what_is_left_of_it() {
        let rule = WindowRule {
            sliding: true,
            ..RULE
        };
        let l = WindowLevel {
            count: 2.0,
            prev: 10.0,
            at: at(11.0),
        };
        // A quarter into the window: 3/4 of the previous one still counts.
        assert!((l.level_at(&rule, at(12.5)) - 9.5).abs() < 1e-9);
        // In the next window this window is the previous one.
        assert!((l.level_at(&rule, at(25.0)) - 1.0).abs() < 1e-9);
    }

    #[test]
    fn merging_is_max_within_a_window_and_the_later_window_wins() {
        let a = WindowLevel {
            count: 5.0,
            prev: 1.0,
            at: at(3.0),
        };
        let b = WindowLevel {
            count: 7.0,
            prev: 0.0,
            at: at(4.0),
        };
        assert_eq!(
            a.merge(b, &RULE),
            WindowLevel {
                count: 7.0,
                prev: 1.0,
                at: at(4.0)
            }
        );
        let next = WindowLevel {
            count: 2.0,
            prev: 3.0,
            at: at(12.0),
        };
        let merged = a.merge(next, &RULE);
        assert_eq!(
            merged,
            WindowLevel {
                count: 2.0,
                prev: 5.0,
                at: at(12.0)
            }
        );
        assert_eq!(next.merge(a, &RULE), merged);
        let far = WindowLevel {
            count: 1.0,
            prev: 0.0,
            at: at(33.0),
        };
        assert_eq!(a.merge(far, &RULE), far);
    }

    #[test]
    fn merge_is_commutative_associative_and_idempotent() {
        let xs = [
            WindowLevel {
                count: 5.0,
                prev: 1.0,
                at: at(3.0),
            },
            WindowLevel {
                count: 7.0,
                prev: 0.0,
                at: at(8.0),
            },
            WindowLevel {
                count: 2.0,
                prev: 3.0,
                at: at(12.0),
            },
            WindowLevel {
                count: 1.0,
                prev: 9.0,
                at: at(25.0),
            },
        ];
        for a in xs {
            assert_eq!(a.merge(a, &RULE), a);
            for b in xs {
                assert_eq!(a.merge(b, &RULE), b.merge(a, &RULE));
                for c in xs {
                    assert_eq!(
                        a.merge(b, &RULE).merge(c, &RULE),
                        a.merge(b.merge(c, &RULE), &RULE)
                    );
                }
            }
        }
    }

    #[test]
    fn a_delta_counts_in_its_own_window() {
        let l = WindowLevel {
            count: 4.0,
            prev: 1.0,
            at: at(11.0),
        };
        // The current window, a sender running ahead, the previous window.
        assert_eq!(l.add_in(&RULE, 1, at(12.0), 2.0).unwrap().count, 6.0);
        assert_eq!(l.add_in(&RULE, 2, at(12.0), 2.0).unwrap().count, 6.0);
        let late = l.add_in(&RULE, 0, at(12.0), 2.0).unwrap();
        assert_eq!((late.count, late.prev), (4.0, 3.0));
        // Two windows back: it matters to nothing any more.
        assert_eq!(l.add_in(&RULE, 0, at(21.0), 2.0), None);
        // The counter still in the delta's window, now over.
        let held = l.add_in(&RULE, 1, at(21.0), 2.0).unwrap();
        assert_eq!((held.count, held.prev, held.at), (6.0, 1.0, at(11.0)));
        assert_eq!(held.counts_at(&RULE, at(21.0)), (0.0, 6.0));
        // A counter older than the delta's window.
        let old = l.add_in(&RULE, 2, at(31.0), 3.0).unwrap();
        assert_eq!((old.count, old.prev, old.at), (3.0, 4.0, at(20.0)));
    }

    #[test]
    fn weight_found_just_after_a_boundary_belongs_to_the_window_before() {
        assert_eq!(RULE.attributed_index(at(10.005)), 0);
        assert_eq!(RULE.attributed_index(at(10.02)), 1);
        assert_eq!(RULE.attributed_index(at(5.0)), 0);
        let l = RULE.locate(at(12.5));
        assert_eq!(
            (l.index, l.elapsed, l.length),
            (1, at(2.5) as i64, at(10.0) as i64)
        );
        assert_eq!(l.to_end(), at(7.5) as i64);
        assert!((l.prev_weight() - 0.75).abs() < 1e-12);
    }

    #[test]
    fn a_utc_offset_moves_the_boundaries() {
        let rule = WindowRule {
            utc_offset: 5 * SEC,
            ..RULE
        };
        // Local 4 s is UTC 9 s, local 6 s is UTC 11 s: another window.
        assert_ne!(rule.index_at(at(4.0)), rule.index_at(at(6.0)));
        assert_eq!(rule.end_of(at(4.0)), at(5.0));
        assert_eq!(rule.start_of(at(6.0)), at(5.0));
    }
}
