//! The quota model and its validation.
//!
//! A quota is a leaky bucket with a name, an optional parent and three
//! numbers: `limit` (leak rate, units per second), `low_burst` (level up to
//! which everything passes) and `high_burst` (level from which everything is
//! rejected). Validation lives here once; the root, the quota file loader and
//! the C ABI all call it.

use serde::{Deserialize, Serialize};

use super::counter::Counting;
use super::window::{Window, WindowRule};

/// Longest quota name, in bytes.
pub const MAX_NAME_LEN: usize = 255;
/// Longest parent chain, counting the quota itself.
pub const MAX_DEPTH: usize = 8;
/// Largest weight a single check may carry; larger weights are clamped.
///
/// 2^40 units (1 TiB when a unit is a byte) keeps every sum the table makes
/// far from `u64` overflow and exactly representable as `f64`.
pub const MAX_WEIGHT: u64 = 1 << 40;

/// `weight` capped at [`MAX_WEIGHT`], as the `f64` a decision takes:
/// through `i64` (exact below the cap), one instruction, where `u64` to
/// `f64` takes six without AVX-512.
#[inline(always)]
pub fn weight_f64(weight: u64) -> f64 {
    weight.min(MAX_WEIGHT) as i64 as f64
}
/// Largest accepted `limit`, units per second (1e15: 1000× the design's
/// 1e12 requirement, still leaving `limit * 100 years` finite and exact
/// enough in `f64`).
pub const MAX_LIMIT: f64 = 1e15;
/// Largest accepted burst: 2^53, the last integer `f64` holds exactly.
pub const MAX_BURST: f64 = 9_007_199_254_740_992.0;

/// Largest quota id: ids are positive `i64`s in the root's database, and
/// the table marks free slots with the bit above them.
pub const MAX_QUOTA_ID: u64 = i64::MAX as u64;

/// One quota as the root stores it and the sync protocol carries it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Quota {
    /// Stable numeric id; it also names the quota's counter.
    pub id: u64,
    /// Unique name, e.g. `s3_photos_read` (see [`validate_name`]).
    pub name: String,
    /// Id of the parent quota, if any.
    #[serde(default)]
    pub parent: Option<u64>,
    /// Leak rate in units per second.
    pub limit: f64,
    /// Level up to which every request passes.
    pub low_burst: f64,
    /// Level from which every request is rejected.
    pub high_burst: f64,
    /// Global change number of the last write to this quota.
    pub epoch: u64,
    /// Tombstone: the quota was deleted at `epoch`.
    #[serde(default)]
    pub deleted: bool,
    /// A per-key template: every distinct key checked against it gets a
    /// counter of its own with these numbers, chained to `parent`; the
    /// quota itself counts nothing. A template cannot be a parent.
    #[serde(default, skip_serializing_if = "is_false")]
    pub per_key: bool,
    /// A window quota: counts `limit` units per UTC-aligned window instead
    /// of leaking (see [`super::window`]); `None`: a leaky bucket.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window: Option<Window>,
    /// A window quota that also counts the previous window, weighted by
    /// how much of it is still inside a window-long span ending now.
    #[serde(default, skip_serializing_if = "is_false")]
    pub sliding: bool,
    /// A request rejected because the level reached `high_burst` bars the
    /// quota (for a per-key template: the key) for this long, fleet-wide
    /// (see [`super::tier`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub penalty: Option<PenaltyTime>,
    /// An in-flight quota: at most `limit` requests at once, each holding
    /// a slot from its start to its end (see docs/DESIGN.md, "In-flight
    /// quotas"). Its counter never leaks ([`Quota::leak`] is 0) and its
    /// bursts are its limit.
    #[serde(default, skip_serializing_if = "is_false")]
    pub in_flight: bool,
}

/// For `skip_serializing_if`: a `false` flag is left out of the JSON.
pub fn is_false(flag: &bool) -> bool {
    !*flag
}

/// Why a quota (or a set of quotas) is not acceptable, naming the field.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct ValidationError {
    /// The offending field: `name`, `limit`, `low_burst`, `high_burst`,
    /// `parent`, or `quotas` for set-wide problems.
    pub field: &'static str,
    /// What is wrong, for a human.
    pub message: String,
}

impl ValidationError {
    /// Builds an error for `field`.
    pub fn new(field: &'static str, message: impl Into<String>) -> Self {
        Self {
            field,
            message: message.into(),
        }
    }
}

/// True for the bytes a quota name may contain: `[A-Za-z0-9_.:-]`.
pub fn is_name_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b':' | b'-')
}

/// Checks a quota name: 1..=255 bytes of `[A-Za-z0-9_.:-]`, and not `.`
/// or `..` (the admin API takes names from URL paths, where those two
/// are dot segments that clients and proxies resolve away).
pub fn validate_name(name: &str) -> Result<(), ValidationError> {
    if name.is_empty() {
        return Err(ValidationError::new("name", "must not be empty"));
    }
    if name == "." || name == ".." {
        return Err(ValidationError::new(
            "name",
            format!("{name:?} is not a quota name: it is a path segment in the admin API's URLs"),
        ));
    }
    validate_name_prefix(name)
}

/// Checks the start of a quota name (a listing's `prefix`): at most 255
/// bytes of `[A-Za-z0-9_.:-]`, possibly empty, `.` and `..` allowed.
pub fn validate_name_prefix(name: &str) -> Result<(), ValidationError> {
    if name.len() > MAX_NAME_LEN {
        return Err(ValidationError::new(
            "name",
            format!(
                "is {} bytes long, at most {MAX_NAME_LEN} allowed",
                name.len()
            ),
        ));
    }
    if let Some(pos) = name.bytes().position(|b| !is_name_byte(b)) {
        return Err(ValidationError::new(
            "name",
            format!("byte {pos} is not one of [A-Za-z0-9_.:-]"),
        ));
    }
    Ok(())
}

fn validate_number(field: &'static str, value: f64, max: f64) -> Result<(), ValidationError> {
    if !value.is_finite() {
        return Err(ValidationError::new(field, "must be a finite number"));
    }
    if value < 0.0 {
        return Err(ValidationError::new(field, "must not be negative"));
    }
    if value > max {
        return Err(ValidationError::new(
            field,
            format!("must be at most {max}"),
        ));
    }
    Ok(())
}

/// Checks the three numbers of a quota: finite, non-negative, bounded, and
/// `low_burst <= high_burst`.
pub fn validate_params(limit: f64, low_burst: f64, high_burst: f64) -> Result<(), ValidationError> {
    validate_number("limit", limit, MAX_LIMIT)?;
    validate_number("low_burst", low_burst, MAX_BURST)?;
    validate_number("high_burst", high_burst, MAX_BURST)?;
    if low_burst > high_burst {
        return Err(ValidationError::new(
            "low_burst",
            format!("{low_burst} is greater than high_burst {high_burst}"),
        ));
    }
    Ok(())
}

impl Quota {
    /// A live top-level quota at epoch 1. [`Quota::with_parent`] and
    /// [`Quota::at_epoch`] set the rest; every place that builds a quota
    /// starts here, so a new field needs one default, not one per caller.
    pub fn new(
        id: u64,
        name: impl Into<String>,
        limit: f64,
        low_burst: f64,
        high_burst: f64,
    ) -> Self {
        Self {
            id,
            name: name.into(),
            parent: None,
            limit,
            low_burst,
            high_burst,
            epoch: 1,
            deleted: false,
            per_key: false,
            window: None,
            sliding: false,
            penalty: None,
            in_flight: false,
        }
    }

    /// The tombstone that deletes quota `id` (named `name`) at `epoch`.
    pub fn tombstone(id: u64, name: impl Into<String>, epoch: u64) -> Self {
        Self {
            deleted: true,
            ..Self::new(id, name, 0.0, 0.0, 0.0).at_epoch(epoch)
        }
    }

    /// The same quota under `parent` (`None`: top level).
    pub fn with_parent(self, parent: Option<u64>) -> Self {
        Self { parent, ..self }
    }

    /// The same quota at `epoch`.
    pub fn at_epoch(self, epoch: u64) -> Self {
        Self { epoch, ..self }
    }

    /// The same quota as a per-key template.
    pub fn keyed(self) -> Self {
        self.keyed_if(true)
    }

    /// The same quota, a per-key template if `per_key`.
    pub fn keyed_if(self, per_key: bool) -> Self {
        Self { per_key, ..self }
    }

    /// The same quota with a penalty (`None`: without).
    pub fn penalized(self, penalty: Option<PenaltyTime>) -> Self {
        Self { penalty, ..self }
    }

    /// The same quota counting in `window`s (sliding if `sliding`).
    pub fn windowed(self, window: Window, sliding: bool) -> Self {
        Self {
            window: Some(window),
            sliding,
            ..self
        }
    }

    /// The same quota counting in a window when `window` gives one
    /// (`(window, sliding)`); unchanged otherwise.
    pub fn windowed_if(self, window: Option<(Window, bool)>) -> Self {
        match window {
            Some((window, sliding)) => self.windowed(window, sliding),
            None => self,
        }
    }

    /// The same quota as an in-flight quota when `in_flight`.
    pub fn in_flight_if(self, in_flight: bool) -> Self {
        Self { in_flight, ..self }
    }

    /// Units per second its counter leaks: `limit` for a leaky bucket, 0
    /// for an in-flight quota (a slot is held until it is given back).
    /// Every place that builds a [`Counting`] goes through
    /// [`Quota::counting`], which uses it.
    pub fn leak(&self) -> f64 {
        if self.in_flight {
            0.0
        } else {
            self.limit
        }
    }

    /// How the quota's counters move with time, with `utc_offset` turning
    /// the caller's clock into UTC.
    pub fn counting(&self, utc_offset: i64) -> Counting {
        Counting::of(self.leak(), self.window_rule(utc_offset))
    }

    /// How the quota counts when it is a window quota, with `utc_offset`
    /// turning the caller's clock into UTC.
    pub fn window_rule(&self, utc_offset: i64) -> Option<WindowRule> {
        self.window.map(|window| WindowRule {
            window,
            sliding: self.sliding,
            utc_offset,
        })
    }

    /// Checks ids, name and numbers; a tombstone only needs valid ids and
    /// a valid name.
    pub fn validate(&self) -> Result<(), ValidationError> {
        for (field, id) in [("id", Some(self.id)), ("parent", self.parent)] {
            if id.is_some_and(|id| id == 0 || id > MAX_QUOTA_ID) {
                return Err(ValidationError::new(
                    field,
                    format!("must be an id from 1 to {MAX_QUOTA_ID}"),
                ));
            }
        }
        validate_name(&self.name)?;
        if self.deleted {
            return Ok(());
        }
        if self.parent == Some(self.id) {
            return Err(ValidationError::new(
                "parent",
                "a quota cannot be its own parent",
            ));
        }
        let numbers = [self.limit, self.low_burst, self.high_burst];
        validate_kind(
            self.window,
            self.sliding,
            self.in_flight,
            self.parent.is_some(),
            numbers,
        )
    }

    /// How the quota counts (what its numbers may be).
    pub fn kind(&self) -> Kind {
        Kind::of(self.window, self.in_flight)
    }
}

/// How a quota counts, as far as its numbers go: the rules on `limit`,
/// `low_burst` and `high_burst` differ by it ([`validate_numbers`]), and
/// the override of a key of a per-key template follows its template's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A leaky bucket: any band.
    Leaky,
    /// Counts `limit` units per window: the band lies within the limit.
    Window(Window),
    /// At most `limit` requests at once: whole slots, no band.
    InFlight,
}

impl Kind {
    /// The kind of a quota with these settings (an in-flight quota with a
    /// window is refused by [`validate_kind`]; its numbers are an
    /// in-flight quota's).
    pub fn of(window: Option<Window>, in_flight: bool) -> Self {
        match window {
            _ if in_flight => Self::InFlight,
            Some(window) => Self::Window(window),
            None => Self::Leaky,
        }
    }
}

/// Largest `limit` of an in-flight quota: a count of requests at once,
/// far above any fleet's (and exact in every level and allowance).
pub const MAX_IN_FLIGHT: f64 = 1e12;

/// Checks the three numbers of a quota of kind `kind`, or of an override
/// of one of its keys: the one rule both follow. Every kind takes
/// [`validate_params`]; a window quota's band lies within its limit (units
/// per window: a level above it could never be reached); an in-flight
/// quota's limit is a whole number of slots, 1 to [`MAX_IN_FLIGHT`], and
/// its bursts are its limit (a slot is free or not: no band).
pub fn validate_numbers(
    kind: Kind,
    limit: f64,
    low_burst: f64,
    high_burst: f64,
) -> Result<(), ValidationError> {
    validate_params(limit, low_burst, high_burst)?;
    match kind {
        Kind::Leaky => Ok(()),
        Kind::Window(window) if high_burst > limit => Err(ValidationError::new(
            "high_burst",
            format!(
                "{high_burst} is above the limit {limit}: a {} window quota counts at most \
                 its limit per window, so its burst band must lie within it",
                window.name()
            ),
        )),
        Kind::Window(_) => Ok(()),
        Kind::InFlight => validate_slots(limit, low_burst, high_burst),
    }
}

/// The numbers of an in-flight quota: whole slots, bursts at the limit.
fn validate_slots(limit: f64, low_burst: f64, high_burst: f64) -> Result<(), ValidationError> {
    if limit < 1.0 || limit.fract() != 0.0 || limit > MAX_IN_FLIGHT {
        return Err(ValidationError::new(
            "limit",
            format!(
                "{limit} is not a number of slots: an in-flight quota's limit is a whole \
                 number of requests at once, 1 to {MAX_IN_FLIGHT}"
            ),
        ));
    }
    for (field, burst) in [("low_burst", low_burst), ("high_burst", high_burst)] {
        if burst != limit {
            return Err(ValidationError::new(
                field,
                format!(
                    "{burst} differs from the limit {limit}: an in-flight quota's bursts are \
                     its limit (leave them out)"
                ),
            ));
        }
    }
    Ok(())
}

/// Checks that a quota's settings make one kind, and that its numbers
/// (`[limit, low_burst, high_burst]`) are ones its kind may have
/// ([`validate_numbers`]): `sliding` needs a window; an in-flight quota
/// has no window and no parent (a slot given back must not return rate
/// units to a leaky ancestor). What a quota and a quota file's entry
/// both follow.
pub fn validate_kind(
    window: Option<Window>,
    sliding: bool,
    in_flight: bool,
    has_parent: bool,
    [limit, low_burst, high_burst]: [f64; 3],
) -> Result<(), ValidationError> {
    if sliding && window.is_none() {
        return Err(ValidationError::new(
            "sliding",
            "needs a window (\"window\": \"1m\", ...)",
        ));
    }
    if in_flight && window.is_some() {
        return Err(ValidationError::new(
            "in_flight",
            "an in-flight quota counts requests at once, not in a window: drop \"window\"",
        ));
    }
    if in_flight && has_parent {
        return Err(ValidationError::new(
            "in_flight",
            "an in-flight quota stands alone: it cannot have a parent",
        ));
    }
    let kind = Kind::of(window, in_flight);
    validate_numbers(kind, limit, low_burst, high_burst)
}

/// The error for a quota placed under an in-flight quota.
pub fn in_flight_as_parent(parent: &str) -> ValidationError {
    ValidationError::new(
        "parent",
        format!("{parent:?} is an in-flight quota, which cannot be a parent"),
    )
}

/// Checks that following `parent_of` from `start` ends within
/// [`MAX_DEPTH`] quotas (counting `start`) without revisiting one.
///
/// `parent_of` answers the parent of a key, `None` for a top-level quota.
/// Works for names or ids, so the root (which sees the database) and the
/// file loader (which sees a set) share it.
pub fn validate_chain<K, F>(start: &K, mut parent_of: F) -> Result<usize, ValidationError>
where
    K: PartialEq + Clone + std::fmt::Debug,
    F: FnMut(&K) -> Option<K>,
{
    let mut seen: Vec<K> = vec![start.clone()];
    let mut cur = start.clone();
    while let Some(parent) = parent_of(&cur) {
        if seen.contains(&parent) {
            return Err(ValidationError::new(
                "parent",
                format!("parent chain of {start:?} loops back to {parent:?}"),
            ));
        }
        seen.push(parent.clone());
        if seen.len() > MAX_DEPTH {
            return Err(ValidationError::new(
                "parent",
                format!("parent chain of {start:?} is deeper than {MAX_DEPTH}"),
            ));
        }
        cur = parent;
    }
    Ok(seen.len())
}

/// Longest penalty: 30 days.
pub const MAX_PENALTY_SECS: u32 = 30 * 86_400;

/// How long a penalty bars a quota or key: whole seconds, written as a
/// duration (`"90s"`, `"15m"`, `"1h"`, `"1d"`), read from such a text or
/// a number of seconds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct PenaltyTime(u32);

impl PenaltyTime {
    /// A penalty of `secs` seconds (1 to [`MAX_PENALTY_SECS`]).
    pub fn from_secs(secs: u64) -> Result<Self, ValidationError> {
        if secs == 0 || secs > u64::from(MAX_PENALTY_SECS) {
            return Err(ValidationError::new(
                "penalty",
                format!("must be from 1s to 30d, not {secs}s"),
            ));
        }
        Ok(Self(secs as u32))
    }

    /// Parses `"15m"` and the like (see [`parse_seconds`]).
    pub fn parse(text: &str) -> Result<Self, ValidationError> {
        let secs = parse_seconds(text).map_err(|e| ValidationError::new("penalty", e))?;
        Self::from_secs(secs)
    }

    /// The length in seconds.
    pub fn secs(self) -> u32 {
        self.0
    }

    /// The length in nanoseconds.
    pub fn nanos(self) -> u64 {
        u64::from(self.0) * 1_000_000_000
    }
}

impl std::fmt::Display for PenaltyTime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&format_seconds(u64::from(self.0)))
    }
}

impl Serialize for PenaltyTime {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for PenaltyTime {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Given {
            Secs(u64),
            Text(String),
        }
        let made = match Given::deserialize(d)? {
            Given::Secs(secs) => Self::from_secs(secs),
            Given::Text(text) => Self::parse(&text),
        };
        made.map_err(|e| serde::de::Error::custom(e.message))
    }
}

/// Parses a whole number of seconds written with a unit: `s`, `m`, `h`
/// or `d` (`"90s"`, `"15m"`, `"24h"`, `"7d"`); a bare number is seconds.
pub fn parse_seconds(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let value: u64 = number
        .parse()
        .map_err(|_| format!("{text:?} is not a duration like 15m"))?;
    let scale = match unit {
        "" | "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86_400,
        other => {
            return Err(format!(
                "unknown unit {other:?} in {text:?} (use s, m, h or d)"
            ))
        }
    };
    value
        .checked_mul(scale)
        .filter(|&s| s <= 100 * 365 * 86_400)
        .ok_or_else(|| format!("{text:?} is out of range"))
}

/// The shortest of `"1d"`, `"15m"`, `"90s"` that says `secs` exactly.
pub fn format_seconds(secs: u64) -> String {
    for (unit, scale) in [("d", 86_400), ("h", 3600), ("m", 60)] {
        if secs >= scale && secs % scale == 0 {
            return format!("{}{unit}", secs / scale);
        }
    }
    format!("{secs}s")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    #[test]
    fn names_accept_the_documented_charset() {
        assert!(validate_name("s3_photos-2024.read:v1").is_ok());
        assert!(validate_name(&"a".repeat(255)).is_ok());
    }

    #[test]
    fn names_reject_empty_long_and_foreign_bytes() {
        assert_eq!(validate_name("").unwrap_err().field, "name");
        assert!(validate_name(&"a".repeat(256)).is_err());
        for bad in ["a b", "a/b", "é", "a\0", "a*"] {
            assert!(validate_name(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn dot_segments_are_not_names_but_other_dots_are() {
        for bad in [".", ".."] {
            let error = validate_name(bad).unwrap_err();
            assert_eq!(error.field, "name");
            assert!(error.message.contains("path segment"), "{error}");
        }
        for good in ["...", ".a", "a.", "a..b"] {
            assert!(validate_name(good).is_ok(), "{good:?} refused");
        }
    }

    #[test]
    fn params_reject_nan_infinite_negative_and_inverted_band() {
        assert!(validate_params(10.0, 5.0, 10.0).is_ok());
        assert!(validate_params(0.0, 0.0, 0.0).is_ok());
        assert_eq!(
            validate_params(f64::NAN, 1.0, 1.0).unwrap_err().field,
            "limit"
        );
        assert_eq!(
            validate_params(f64::INFINITY, 1.0, 1.0).unwrap_err().field,
            "limit"
        );
        assert_eq!(validate_params(-1.0, 1.0, 1.0).unwrap_err().field, "limit");
        assert_eq!(
            validate_params(1.0, -1.0, 1.0).unwrap_err().field,
            "low_burst"
        );
        assert_eq!(
            validate_params(1.0, 1.0, f64::NAN).unwrap_err().field,
            "high_burst"
        );
        assert_eq!(
            validate_params(1.0, 2.0, 1.0).unwrap_err().field,
            "low_burst"
        );
        assert_eq!(
            validate_params(MAX_LIMIT * 2.0, 1.0, 1.0)
                .unwrap_err()
                .field,
            "limit"
        );
    }

    #[test]
    fn ids_are_positive_and_fit_an_i64() {
        let mut q = Quota::new(MAX_QUOTA_ID, "q", 1.0, 1.0, 1.0).with_parent(Some(1));
        assert!(q.validate().is_ok());
        for (id, parent, field) in [
            (0, Some(1), "id"),
            (MAX_QUOTA_ID + 1, Some(1), "id"),
            (u64::MAX, None, "id"),
            (5, Some(0), "parent"),
            (5, Some(MAX_QUOTA_ID + 1), "parent"),
        ] {
            (q.id, q.parent) = (id, parent);
            assert_eq!(q.validate().unwrap_err().field, field, "{id} {parent:?}");
            q.deleted = true;
            assert_eq!(q.validate().unwrap_err().field, field, "tombstone {id}");
            q.deleted = false;
        }
    }

    #[test]
    fn window_settings_are_checked() {
        let q = Quota::new(1, "day", 1000.0, 900.0, 1000.0).windowed(Window::Day, false);
        assert!(q.validate().is_ok());
        assert!(q.clone().windowed(Window::Minute, true).validate().is_ok());
        let wide = Quota::new(1, "day", 1000.0, 1000.0, 1500.0).windowed(Window::Day, false);
        assert_eq!(wide.validate().unwrap_err().field, "high_burst");
        let lone = Quota {
            sliding: true,
            ..Quota::new(1, "q", 1.0, 1.0, 1.0)
        };
        assert_eq!(lone.validate().unwrap_err().field, "sliding");
        let keyed = q.keyed().windowed(Window::Hour, true);
        assert!(keyed.validate().is_ok());
        assert!(keyed.windowed(Window::Hour, false).validate().is_ok());
        // A leaky quota's band may exceed its limit (a burst of seconds).
        assert!(Quota::new(1, "q", 1.0, 5.0, 10.0).validate().is_ok());
    }

    #[test]
    fn window_fields_are_left_out_of_the_json_of_a_leaky_quota() {
        let q = Quota::new(1, "q", 1.0, 1.0, 1.0);
        let json = serde_json::to_value(&q).unwrap();
        assert!(json.get("window").is_none() && json.get("sliding").is_none());
        let w = q.windowed(Window::Month, false);
        let json = serde_json::to_value(&w).unwrap();
        assert_eq!(json["window"], "month");
        let back: Quota = serde_json::from_value(json).unwrap();
        assert_eq!(back, w);
    }

    #[test]
    fn tombstones_need_only_valid_ids_and_a_name() {
        let q = Quota {
            limit: f64::NAN,
            ..Quota::tombstone(1, "gone", 3)
        };
        assert!(q.validate().is_ok());
    }

    #[test]
    fn chains_report_depth_and_reject_loops_and_depth_nine() {
        let parents: HashMap<u32, u32> = (1..=8).map(|i| (i, i - 1)).collect();
        // 8 -> 7 -> ... -> 0 is nine quotas deep.
        let parent_of = |k: &u32| parents.get(k).copied();
        assert_eq!(validate_chain(&7, parent_of).unwrap(), 8);
        assert!(validate_chain(&8, parent_of).is_err());

        let looped: HashMap<u32, u32> = [(1, 2), (2, 3), (3, 1)].into_iter().collect();
        let err = validate_chain(&1, |k| looped.get(k).copied()).unwrap_err();
        assert_eq!(err.field, "parent");
        assert!(err.message.contains("loops"));
    }
}
