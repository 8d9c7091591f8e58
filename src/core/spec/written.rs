//! One quota as a user writes it ([`QuotaSpec`]), a change to some of its
//! fields ([`QuotaPatch`]), and the rates written with their unit.

use serde::de::{self, Deserializer, Visitor};
use serde::{Deserialize, Serialize};

use crate::core::key::KeyHash;
use crate::core::quota::{validate_kind, validate_name, Kind, ValidationError};
use crate::core::terms::{parse_rate, Rate, RATE_FORMS};
use crate::core::tier::{parse_key_hash, OverrideSpec, PenaltyTime, Rule};
use crate::core::window::Window;

/// One quota by name, as a user writes it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QuotaSpec {
    /// Unique quota name. The admin API's `PUT /v1/quotas/{name}` takes it
    /// from the path, so its body may leave it out (empty here, which
    /// [`QuotaSpec::validate`] refuses anywhere else).
    #[serde(default)]
    pub name: String,
    /// Name of the parent quota, if any.
    #[serde(default)]
    pub parent: Option<String>,
    /// Leak rate, units per second: a number, or a rate with its unit
    /// (`"10/m"`, `"100/h"`, `"5/s"`; see [`parse_rate`]). A window
    /// quota's is units per window, an in-flight quota's slots.
    #[serde(deserialize_with = "written_rate")]
    pub limit: f64,
    /// Level up to which everything passes (default: `limit`).
    #[serde(default)]
    pub low_burst: Option<f64>,
    /// Level from which everything is rejected (default: `low_burst`).
    #[serde(default)]
    pub high_burst: Option<f64>,
    /// A per-key template (see [`crate::core::Quota::per_key`]).
    #[serde(default, skip_serializing_if = "crate::core::quota::is_false")]
    pub per_key: bool,
    /// Count `limit` units per window of this length instead of leaking
    /// (see [`crate::core::Quota::window`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window: Option<Window>,
    /// A sliding window (see [`crate::core::Quota::sliding`]).
    #[serde(default, skip_serializing_if = "crate::core::quota::is_false")]
    pub sliding: bool,
    /// A penalty (see [`crate::core::Quota::penalty`]): `"15m"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub penalty: Option<PenaltyTime>,
    /// Overrides of a per-key template's numbers for some keys (see
    /// [`crate::core::tier`]); a quota file's only (the admin API keeps them
    /// at `/v1/quotas/{name}/overrides`).
    #[serde(
        default,
        deserialize_with = "crate::core::object::objects",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub overrides: Vec<OverrideSpec>,
    /// At most `limit` requests at once (see
    /// [`crate::core::Quota::in_flight`]).
    #[serde(default, skip_serializing_if = "crate::core::quota::is_false")]
    pub in_flight: bool,
}

impl QuotaSpec {
    /// A top-level quota named `name` leaking at `limit`, with the default
    /// bursts; set the other fields with struct update syntax.
    pub fn new(name: impl Into<String>, limit: f64) -> Self {
        Self {
            name: name.into(),
            parent: None,
            limit,
            low_burst: None,
            high_burst: None,
            per_key: false,
            window: None,
            sliding: false,
            penalty: None,
            overrides: Vec::new(),
            in_flight: false,
        }
    }

    /// `low_burst` with its default applied.
    pub fn low(&self) -> f64 {
        self.low_burst.unwrap_or(self.limit)
    }

    /// `high_burst` with its default applied.
    pub fn high(&self) -> f64 {
        self.high_burst.unwrap_or_else(|| self.low())
    }

    /// Checks the name and the numbers (not the parent, which needs the
    /// other quotas).
    pub fn validate(&self) -> Result<(), ValidationError> {
        validate_name(&self.name)?;
        if let Some(parent) = &self.parent {
            validate_name(parent).map_err(|e| ValidationError::new("parent", e.message))?;
            if parent == &self.name {
                return Err(ValidationError::new(
                    "parent",
                    "a quota cannot be its own parent",
                ));
            }
        }
        let numbers = [self.limit, self.low(), self.high()];
        validate_kind(
            self.window,
            self.sliding,
            self.in_flight,
            self.parent.is_some(),
            numbers,
        )?;
        self.validate_overrides().map(|_| ())
    }

    /// How the quota counts (what its numbers, and its overrides', may
    /// be).
    pub fn kind(&self) -> Kind {
        Kind::of(self.window, self.in_flight)
    }

    /// The overrides' keys and rules, checked: only a per-key template
    /// has overrides, each names a key hash once, with numbers its
    /// template's kind may have.
    pub fn validate_overrides(&self) -> Result<Vec<(KeyHash, Rule)>, ValidationError> {
        if !self.overrides.is_empty() && !self.per_key {
            return Err(ValidationError::new(
                "overrides",
                "only a per-key template (\"per_key\": true) has overrides",
            ));
        }
        let mut seen = std::collections::HashSet::new();
        let mut out = Vec::with_capacity(self.overrides.len());
        for (i, o) in self.overrides.iter().enumerate() {
            let at = |e: ValidationError| {
                ValidationError::new("overrides", format!("[{i}].{}: {}", e.field, e.message))
            };
            let Some(text) = o.key_hash.as_deref() else {
                return Err(at(ValidationError::new("key_hash", "is missing")));
            };
            let key = parse_key_hash(text).map_err(at)?;
            if !seen.insert(key) {
                return Err(at(ValidationError::new(
                    "key_hash",
                    "appears more than once",
                )));
            }
            if o.expires.is_some() {
                return Err(at(ValidationError::new(
                    "expires",
                    "a quota file's overrides do not expire (the file is the set); \
                     give expiring ones through the admin API",
                )));
            }
            let rule = o.rule().map_err(at)?;
            rule.validate_for(self.kind()).map_err(at)?;
            out.push((key, rule));
        }
        Ok(out)
    }
}

/// A change to some fields of one quota (`PATCH /v1/quotas/{name}`,
/// `sluice quota set`): a field left out keeps its value, so an edit
/// changes only what its author touched.
///
/// `null` clears a field that may be absent: `parent` (top-level),
/// `window` (a leaky bucket), `low_burst` and `high_burst` (their
/// defaults, from the merged limit). `limit`, `per_key` and `sliding`
/// have no `null`. The merged quota is checked as a whole, as a
/// [`QuotaSpec`] is.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QuotaPatch {
    /// The quota's name; the admin API takes it from the path, and a body
    /// may repeat it but not change it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// `Some(None)` makes the quota top-level.
    #[serde(
        default,
        deserialize_with = "given",
        skip_serializing_if = "Option::is_none"
    )]
    pub parent: Option<Option<String>>,
    /// Leak rate (or units per window): a number or a rate with its unit,
    /// as [`QuotaSpec::limit`].
    #[serde(
        default,
        deserialize_with = "not_null_rate",
        skip_serializing_if = "Option::is_none"
    )]
    pub limit: Option<f64>,
    /// `Some(None)`: back to its default, the limit.
    #[serde(
        default,
        deserialize_with = "given",
        skip_serializing_if = "Option::is_none"
    )]
    pub low_burst: Option<Option<f64>>,
    /// `Some(None)`: back to its default, the low burst.
    #[serde(
        default,
        deserialize_with = "given",
        skip_serializing_if = "Option::is_none"
    )]
    pub high_burst: Option<Option<f64>>,
    /// A per-key template, or a plain quota again.
    #[serde(
        default,
        deserialize_with = "not_null",
        skip_serializing_if = "Option::is_none"
    )]
    pub per_key: Option<bool>,
    /// `Some(None)` makes the quota a leaky bucket again.
    #[serde(
        default,
        deserialize_with = "given",
        skip_serializing_if = "Option::is_none"
    )]
    pub window: Option<Option<Window>>,
    /// A sliding window, or a fixed one.
    #[serde(
        default,
        deserialize_with = "not_null",
        skip_serializing_if = "Option::is_none"
    )]
    pub sliding: Option<bool>,
    /// `Some(None)` takes the penalty away.
    #[serde(
        default,
        deserialize_with = "given",
        skip_serializing_if = "Option::is_none"
    )]
    pub penalty: Option<Option<PenaltyTime>>,
    /// An in-flight quota, or a counting one again.
    #[serde(
        default,
        deserialize_with = "not_null",
        skip_serializing_if = "Option::is_none"
    )]
    pub in_flight: Option<bool>,
}

impl QuotaPatch {
    /// True when the patch names no field to change.
    pub fn is_empty(&self) -> bool {
        let Self {
            name: _,
            parent,
            limit,
            low_burst,
            high_burst,
            per_key,
            window,
            sliding,
            penalty,
            in_flight,
        } = self;
        penalty.is_none()
            && parent.is_none()
            && limit.is_none()
            && low_burst.is_none()
            && high_burst.is_none()
            && per_key.is_none()
            && window.is_none()
            && sliding.is_none()
            && in_flight.is_none()
    }

    /// `current` with this patch's fields put in (unchecked: validate the
    /// result).
    pub fn applied_to(&self, current: &QuotaSpec) -> QuotaSpec {
        fn pick<T: Clone>(given: &Option<T>, current: &T) -> T {
            given.clone().unwrap_or_else(|| current.clone())
        }
        QuotaSpec {
            name: current.name.clone(),
            parent: pick(&self.parent, &current.parent),
            limit: pick(&self.limit, &current.limit),
            low_burst: pick(&self.low_burst, &current.low_burst),
            high_burst: pick(&self.high_burst, &current.high_burst),
            per_key: pick(&self.per_key, &current.per_key),
            window: pick(&self.window, &current.window),
            sliding: pick(&self.sliding, &current.sliding),
            penalty: pick(&self.penalty, &current.penalty),
            overrides: current.overrides.clone(),
            in_flight: pick(&self.in_flight, &current.in_flight),
        }
    }
}

/// A field that is present, `null` included (`Some(None)`); serde leaves
/// an absent one at its default (`None`).
fn given<'de, D, T>(de: D) -> Result<Option<Option<T>>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de>,
{
    Option::<T>::deserialize(de).map(Some)
}

/// A field that may be absent but not `null`.
fn not_null<'de, D, T>(de: D) -> Result<Option<T>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de>,
{
    T::deserialize(de).map(Some)
}

/// A limit as written ([`parse_rate`]): a number, or a string such as
/// `"10/m"`; units per second.
fn written_rate<'de, D: Deserializer<'de>>(de: D) -> Result<f64, D::Error> {
    Written::deserialize(de).map(|w| w.0.per_second)
}

/// [`written_rate`] for a field that may be absent but not `null`.
fn not_null_rate<'de, D: Deserializer<'de>>(de: D) -> Result<Option<f64>, D::Error> {
    written_rate(de).map(Some)
}

/// A limit as written in JSON or TOML: a number, or a rate with its unit.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct Written(pub(super) Rate);

impl<'de> Deserialize<'de> for Written {
    fn deserialize<D: Deserializer<'de>>(de: D) -> Result<Self, D::Error> {
        de.deserialize_any(WrittenVisitor)
    }
}

struct WrittenVisitor;

impl Visitor<'_> for WrittenVisitor {
    type Value = Written;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str(RATE_FORMS)
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Written, E> {
        Ok(Written(Rate {
            per_second: v,
            unit: None,
        }))
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Written, E> {
        self.visit_f64(v as f64)
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Written, E> {
        self.visit_f64(v as f64)
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Written, E> {
        parse_rate(v).map(Written).map_err(E::custom)
    }
}
