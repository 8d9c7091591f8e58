//! Tiers per key: overrides of a per-key template for one key, and
//! penalties.
//!
//! An **override** gives one key of a per-key template other numbers
//! (`limit`, `low_burst`, `high_burst`), lifts its limit (`allow`: never
//! limited by the template, still counted) or bars it (`deny`: always
//! rejected). The root stores overrides beside quotas, with epochs from
//! the same sequence, and limiters receive them through the sync like
//! quotas. Only the key's hash is stored or sent.
//!
//! A **penalty** (`"penalty": "15m"` on a quota) bars a quota, or one key
//! of a per-key template, for a while once a request was rejected because
//! its level reached `high_burst`. Its end is a max-register: "barred
//! until `t`" merges by `max` across limiters and roots, the same
//! argument as the grow-only counters, so every limiter converges on the
//! latest end any of them started.

use serde::{Deserialize, Serialize};

use super::key::{format_hash, parse_hash, KeyHash};
pub use super::quota::{format_seconds, parse_seconds, PenaltyTime, MAX_PENALTY_SECS};
use super::quota::{validate_numbers, validate_params, Kind, ValidationError, MAX_QUOTA_ID};
use super::window::{civil_from_days, days_from_civil};

/// Longest override note, in bytes.
pub const MAX_NOTE_LEN: usize = 1024;

/// Latest expiry an override may have: the year 9999 (milliseconds).
pub const MAX_EXPIRES_MS: i64 = 253_402_300_799_999;

/// What an override does to its key.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Rule {
    /// The key counts with these numbers instead of the template's.
    Limit {
        /// Leak rate (or units per window).
        limit: f64,
        /// Level up to which everything passes.
        low_burst: f64,
        /// Level from which everything is rejected.
        high_burst: f64,
    },
    /// The key is never limited by the template (its ancestors still
    /// apply); its weight is still counted.
    Allow,
    /// Every request of the key is rejected, uncounted.
    Deny,
}

impl Rule {
    /// Checks the rule's numbers as a quota of `kind` (its template's) has
    /// them checked: an override of an in-flight template's key gives it
    /// another whole number of slots, one of a window template's key keeps
    /// its band within its limit.
    pub fn validate_for(&self, kind: Kind) -> Result<(), ValidationError> {
        match *self {
            Self::Limit {
                limit,
                low_burst,
                high_burst,
            } => validate_numbers(kind, limit, low_burst, high_burst),
            Self::Allow | Self::Deny => Ok(()),
        }
    }

    /// The rule's word: `limit`, `allow` or `deny`.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Limit { .. } => "limit",
            Self::Allow => "allow",
            Self::Deny => "deny",
        }
    }
}

/// One override as the root stores it and the sync carries it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Override {
    /// The row's id at the root: with `epoch` the override's place in
    /// the change log limiters page through.
    pub id: u64,
    /// The per-key template's quota id.
    pub quota: u64,
    /// The key's hash.
    pub key: KeyHash,
    /// What it does (a tombstone's is [`Rule::Allow`] and means nothing).
    #[serde(flatten)]
    pub rule: Rule,
    /// When it stops applying, Unix milliseconds (UTC); `None`: never.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_ms: Option<i64>,
    /// Global change number of its last write (the quotas' sequence).
    pub epoch: u64,
    /// Tombstone: removed (or expired) at `epoch`.
    #[serde(default, skip_serializing_if = "super::quota::is_false")]
    pub deleted: bool,
}

impl Override {
    /// Checks the ids, the key and the rule's numbers.
    pub fn validate(&self) -> Result<(), ValidationError> {
        for (field, id) in [("id", self.id), ("quota", self.quota)] {
            if id == 0 || id > MAX_QUOTA_ID {
                return Err(ValidationError::new(
                    field,
                    format!("must be an id from 1 to {MAX_QUOTA_ID}"),
                ));
            }
        }
        check_key(self.key)?;
        if let Rule::Limit {
            limit,
            low_burst,
            high_burst,
        } = self.rule
        {
            validate_params(limit, low_burst, high_burst)?;
        }
        Ok(())
    }

    /// True when it has expired at `utc_ms` (Unix milliseconds).
    pub fn expired_at(&self, utc_ms: i64) -> bool {
        self.expires_ms.is_some_and(|at| at <= utc_ms)
    }
}

/// Checks a key hash an override names: not 0 and not `u64::MAX`, which
/// no key hashes to (see [`crate::core::key::KeySecret::hash`]).
pub fn check_key(key: KeyHash) -> Result<(), ValidationError> {
    if key == 0 || key == u64::MAX {
        return Err(ValidationError::new(
            "key_hash",
            format!("{} is no key's hash", format_hash(key)),
        ));
    }
    Ok(())
}

/// Parses a key hash as operators write it (16 hex digits).
pub fn parse_key_hash(text: &str) -> Result<KeyHash, ValidationError> {
    let key = parse_hash(text).ok_or_else(|| {
        ValidationError::new(
            "key_hash",
            format!("{text:?} is not a key hash: 16 hex digits, as `sluice quota key` prints"),
        )
    })?;
    check_key(key)?;
    Ok(key)
}

/// An override as a user writes it: the admin API's body, an entry of a
/// quota file's `"overrides"`. Exactly one of `limit` (with optional
/// bursts), `"allow": true` and `"deny": true`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OverrideSpec {
    /// The key's hash (16 hex digits); the admin API takes it from the
    /// path, where a body may repeat it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_hash: Option<String>,
    /// Leak rate (or units per window) for the key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<f64>,
    /// Level up to which everything passes (default: `limit`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub low_burst: Option<f64>,
    /// Level from which everything is rejected (default: `low_burst`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub high_burst: Option<f64>,
    /// Never limited by the template, still counted.
    #[serde(default, skip_serializing_if = "super::quota::is_false")]
    pub allow: bool,
    /// Always rejected.
    #[serde(default, skip_serializing_if = "super::quota::is_false")]
    pub deny: bool,
    /// Free text for operators (who asked, a ticket), at most
    /// [`MAX_NOTE_LEN`] bytes; stays at the roots.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    /// When it stops applying: an RFC 3339 UTC time
    /// (`2026-12-31T00:00:00Z`) or a duration from now (`24h`, `7d`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires: Option<String>,
}

impl OverrideSpec {
    /// The rule the spec asks for, its numbers checked.
    pub fn rule(&self) -> Result<Rule, ValidationError> {
        let numbers = self.limit.is_some() || self.low_burst.is_some() || self.high_burst.is_some();
        match (numbers, self.allow, self.deny) {
            (false, false, false) => Err(ValidationError::new(
                "limit",
                "an override needs \"limit\", \"allow\": true or \"deny\": true",
            )),
            (_, true, true) => Err(ValidationError::new(
                "allow",
                "\"allow\" and \"deny\" cannot both be true",
            )),
            (true, true, false) | (true, false, true) => Err(ValidationError::new(
                if self.allow { "allow" } else { "deny" },
                "takes no limit or bursts",
            )),
            (false, true, false) => Ok(Rule::Allow),
            (false, false, true) => Ok(Rule::Deny),
            (true, false, false) => {
                let Some(limit) = self.limit else {
                    return Err(ValidationError::new(
                        "limit",
                        "is needed with low_burst or high_burst",
                    ));
                };
                let low_burst = self.low_burst.unwrap_or(limit);
                let high_burst = self.high_burst.unwrap_or(low_burst);
                validate_params(limit, low_burst, high_burst)?;
                Ok(Rule::Limit {
                    limit,
                    low_burst,
                    high_burst,
                })
            }
        }
    }

    /// The note, checked.
    pub fn checked_note(&self) -> Result<Option<String>, ValidationError> {
        match &self.note {
            Some(note) if note.len() > MAX_NOTE_LEN => Err(ValidationError::new(
                "note",
                format!(
                    "is {} bytes long, at most {MAX_NOTE_LEN} allowed",
                    note.len()
                ),
            )),
            other => Ok(other.clone()),
        }
    }

    /// The expiry in Unix milliseconds, a duration counted from `now_ms`.
    pub fn expires_ms(&self, now_ms: i64) -> Result<Option<i64>, ValidationError> {
        self.expires
            .as_deref()
            .map(|text| parse_expiry(text, now_ms).map_err(|e| ValidationError::new("expires", e)))
            .transpose()
    }

    /// The spec of an override as stored, for listings and patches.
    pub fn of(rule: Rule, note: Option<String>, expires_ms: Option<i64>) -> Self {
        let base = Self {
            note,
            expires: expires_ms.map(format_utc_ms),
            ..Self::default()
        };
        match rule {
            Rule::Limit {
                limit,
                low_burst,
                high_burst,
            } => Self {
                limit: Some(limit),
                low_burst: Some(low_burst),
                high_burst: Some(high_burst),
                ..base
            },
            Rule::Allow => Self {
                allow: true,
                ..base
            },
            Rule::Deny => Self { deny: true, ..base },
        }
    }
}

/// Parses an expiry: an RFC 3339 UTC time (`2026-12-31T00:00:00Z`,
/// fractions of a second and a numeric offset allowed) or a duration from
/// `now_ms` (`24h`). Refuses a time already past.
pub fn parse_expiry(text: &str, now_ms: i64) -> Result<i64, String> {
    let at = if text.contains('T') || text.contains('-') {
        parse_rfc3339_ms(text)?
    } else {
        let secs = parse_seconds(text)
            .map_err(|e| format!("{e}; or an RFC 3339 time like 2026-12-31T00:00:00Z"))?;
        now_ms.saturating_add(secs as i64 * 1000)
    };
    if at <= now_ms {
        return Err(format!("{text:?} is in the past"));
    }
    if at > MAX_EXPIRES_MS {
        return Err(format!("{text:?} is after the year 9999"));
    }
    Ok(at)
}

/// Parses `YYYY-MM-DDTHH:MM:SS[.fff](Z|±HH:MM)` into Unix milliseconds.
pub fn parse_rfc3339_ms(text: &str) -> Result<i64, String> {
    let bad = || format!("{text:?} is not an RFC 3339 time like 2026-12-31T00:00:00Z");
    let b = text.as_bytes();
    if b.len() < 20 || b[4] != b'-' || b[7] != b'-' || !matches!(b[10], b'T' | b't' | b' ') {
        return Err(bad());
    }
    if b[13] != b':' || b[16] != b':' {
        return Err(bad());
    }
    let num = |range: std::ops::Range<usize>| -> Result<i64, String> {
        let part = &text[range];
        if part.bytes().all(|c| c.is_ascii_digit()) {
            part.parse().map_err(|_| bad())
        } else {
            Err(bad())
        }
    };
    let (year, month, day) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (hour, minute, second) = (num(11..13)?, num(14..16)?, num(17..19)?);
    if !(1..=12).contains(&month) || !(1..=31).contains(&day) || hour > 23 || minute > 59 {
        return Err(bad());
    }
    if second > 60 {
        return Err(bad());
    }
    let mut rest = &text[19..];
    let mut millis = 0;
    if let Some(fraction) = rest.strip_prefix('.') {
        let digits = fraction.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 {
            return Err(bad());
        }
        let first3 = format!("{:0<3}", &fraction[..digits.min(3)]);
        millis = first3.parse::<i64>().map_err(|_| bad())?;
        rest = &fraction[digits..];
    }
    let offset_secs = match rest {
        "Z" | "z" => 0,
        _ if rest.len() == 6 && matches!(rest.as_bytes()[0], b'+' | b'-') && &rest[3..4] == ":" => {
            let sign = if rest.starts_with('-') { -1 } else { 1 };
            let hours = rest[1..3].parse::<i64>().map_err(|_| bad())?;
            let minutes = rest[4..6].parse::<i64>().map_err(|_| bad())?;
            sign * (hours * 3600 + minutes * 60)
        }
        _ => return Err(bad()),
    };
    let days = days_from_civil(year, month as u32, day as u32);
    if civil_from_days(days) != (year, month as u32, day as u32) {
        return Err(bad());
    }
    let secs = days * 86_400 + hour * 3600 + minute * 60 + second - offset_secs;
    Ok(secs * 1000 + millis)
}

/// Unix milliseconds as an RFC 3339 UTC time (`2026-12-31T00:00:00Z`,
/// with milliseconds only when there are some).
pub fn format_utc_ms(ms: i64) -> String {
    let secs = ms.div_euclid(1000);
    let millis = ms.rem_euclid(1000);
    let (year, month, day) = civil_from_days(secs.div_euclid(86_400));
    let of_day = secs.rem_euclid(86_400);
    let time = format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}",
        of_day / 3600,
        of_day / 60 % 60,
        of_day % 60
    );
    if millis == 0 {
        format!("{time}Z")
    } else {
        format!("{time}.{millis:03}Z")
    }
}

/// A penalty as the sync carries it, `[quota id, key hash, until]`: the
/// quota (for a key, its template) and key (0 for the quota itself) are
/// barred until `until`, UTC nanoseconds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Penalty(
    /// The quota id.
    pub u64,
    /// The key's hash; 0 for the quota itself.
    pub KeyHash,
    /// End of the penalty, UTC nanoseconds.
    pub i64,
);

impl Penalty {
    /// The quota id.
    pub fn quota(&self) -> u64 {
        self.0
    }

    /// The key's hash (0: the quota itself).
    pub fn key(&self) -> KeyHash {
        self.1
    }

    /// End of the penalty, UTC nanoseconds.
    pub fn until(&self) -> i64 {
        self.2
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_override_rule_follows_its_templates_kind() {
        let rule = |limit, low_burst, high_burst| Rule::Limit {
            limit,
            low_burst,
            high_burst,
        };
        let band = rule(2.0, 2.0, 9.0);
        assert!(band.validate_for(Kind::Leaky).is_ok());
        assert_eq!(
            band.validate_for(Kind::InFlight).unwrap_err().field,
            "high_burst"
        );
        let window = Kind::Window(super::super::window::Window::Day);
        assert_eq!(band.validate_for(window).unwrap_err().field, "high_burst");
        assert!(rule(5.0, 5.0, 5.0).validate_for(Kind::InFlight).is_ok());
        assert_eq!(
            rule(2.5, 2.5, 2.5)
                .validate_for(Kind::InFlight)
                .unwrap_err()
                .field,
            "limit"
        );
        assert!(Rule::Deny.validate_for(Kind::InFlight).is_ok());
        // A quota file's overrides are checked so too.
        let file = r#"[{"name": "k", "limit": 2, "per_key": true, "in_flight": true,
            "overrides": [{"key_hash": "00000000000000aa", "limit": 2, "high_burst": 9}]}]"#;
        let error = super::super::spec::QuotaSet::from_json(file).unwrap_err();
        assert!(error.to_string().contains("overrides"), "{error}");
    }

    #[test]
    fn penalties_read_durations_and_seconds_and_print_the_shortest_form() {
        let p: PenaltyTime = serde_json::from_str("\"15m\"").unwrap();
        assert_eq!(p.secs(), 900);
        assert_eq!(serde_json::to_string(&p).unwrap(), "\"15m\"");
        let p: PenaltyTime = serde_json::from_str("90").unwrap();
        assert_eq!(p.to_string(), "90s");
        assert_eq!(PenaltyTime::parse("2h").unwrap().to_string(), "2h");
        for bad in ["\"0s\"", "\"31d\"", "\"15x\"", "\"-1m\"", "\"1.5m\"", "0"] {
            assert!(serde_json::from_str::<PenaltyTime>(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_spec_asks_for_exactly_one_rule_and_names_the_field_when_not() {
        let spec = |json: &str| serde_json::from_str::<OverrideSpec>(json).unwrap();
        assert_eq!(
            spec(r#"{"limit": 100}"#).rule().unwrap(),
            Rule::Limit {
                limit: 100.0,
                low_burst: 100.0,
                high_burst: 100.0
            }
        );
        assert_eq!(spec(r#"{"allow": true}"#).rule().unwrap(), Rule::Allow);
        assert_eq!(spec(r#"{"deny": true}"#).rule().unwrap(), Rule::Deny);
        let field = |json: &str| spec(json).rule().unwrap_err().field;
        assert_eq!(field(r#"{"allow": true, "deny": true}"#), "allow");
        assert_eq!(field(r#"{"limit": -1}"#), "limit");
        assert_eq!(
            field(r#"{"limit": 5, "low_burst": 9, "high_burst": 2}"#),
            "low_burst"
        );
        assert_eq!(field(r#"{"deny": true, "limit": 3}"#), "deny");
        assert_eq!(field(r#"{"high_burst": 3}"#), "limit");
        assert_eq!(field(r#"{}"#), "limit");
        assert!(serde_json::from_str::<OverrideSpec>(r#"{"limt": 3}"#).is_err());
    }

    #[test]
    fn key_hashes_are_sixteen_hex_digits_of_a_possible_hash() {
        assert_eq!(parse_key_hash("00000000000000ff").unwrap(), 255);
        for bad in [
            "",
            "ff",
            "0000000000000000",
            "ffffffffffffffff",
            "zz00000000000000",
        ] {
            assert_eq!(parse_key_hash(bad).unwrap_err().field, "key_hash", "{bad}");
        }
    }

    #[test]
    fn expiries_are_rfc3339_times_or_durations_from_now_and_never_past() {
        let now = parse_rfc3339_ms("2026-01-01T00:00:00Z").unwrap();
        assert_eq!(now, 1_767_225_600_000);
        assert_eq!(parse_expiry("24h", now).unwrap(), now + 86_400_000);
        assert_eq!(
            parse_expiry("2026-01-01T01:00:00+01:00", now - 1),
            Ok(now),
            "an offset is taken off"
        );
        assert_eq!(
            parse_rfc3339_ms("2026-01-01T00:00:00.25Z").unwrap(),
            now + 250
        );
        assert!(parse_expiry("2025-12-31T23:59:59Z", now).is_err());
        assert!(parse_expiry("2026-02-30T00:00:00Z", now).is_err());
        assert!(parse_expiry("tomorrow", now).is_err());
        assert_eq!(format_utc_ms(now), "2026-01-01T00:00:00Z");
        assert_eq!(format_utc_ms(now + 5), "2026-01-01T00:00:00.005Z");
    }

    #[test]
    fn overrides_travel_as_flat_json_objects() {
        let o = Override {
            id: 3,
            quota: 7,
            key: 0xabc,
            rule: Rule::Limit {
                limit: 100.0,
                low_burst: 100.0,
                high_burst: 200.0,
            },
            expires_ms: None,
            epoch: 9,
            deleted: false,
        };
        let json = serde_json::to_string(&o).unwrap();
        assert_eq!(
            json,
            r#"{"id":3,"quota":7,"key":2748,"kind":"limit","limit":100.0,"low_burst":100.0,"high_burst":200.0,"epoch":9}"#
        );
        assert_eq!(serde_json::from_str::<Override>(&json).unwrap(), o);
        let deny: Override =
            serde_json::from_str(r#"{"id":1,"quota":7,"key":5,"kind":"deny","epoch":2}"#).unwrap();
        assert_eq!(deny.rule, Rule::Deny);
        assert!(o.validate().is_ok());
        assert_eq!(
            Override { key: 0, ..o }.validate().unwrap_err().field,
            "key_hash"
        );
    }
}
