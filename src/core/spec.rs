//! Quotas as users write them: by name, parents by name.
//!
//! The same shape serves quota files (`sluice_quotas`, the C ABI's
//! standalone mode, `sluice quota apply -f`) and the root's admin API:
//!
//! ```json
//! {"quotas": [
//!   {"name": "s3_photos", "limit": 1000, "low_burst": 1000, "high_burst": 2000},
//!   {"name": "s3_photos_read", "parent": "s3_photos",
//!    "limit": 800, "low_burst": 800, "high_burst": 1600}
//! ]}
//! ```
//!
//! A bare JSON array of quotas is accepted too. `high_burst` defaults to
//! `low_burst`, and `low_burst` to `limit` (one second of traffic).
//!
//! A leaky bucket's `limit` may be written with its unit, as nginx writes
//! `rate=10r/m`: `"limit": "10/m"`, `"100/h"`, `"5/s"` (the `r` optional);
//! it is kept as units per second.

use std::cell::RefCell;
use std::collections::HashMap;

use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Serialize};

use super::key::KeyHash;
use super::object::Object;
use super::quota::{
    in_flight_as_parent, validate_chain, validate_kind, validate_name, Kind, Quota, ValidationError,
};
use super::terms::{parse_rate, Rate, RATE_FORMS};
use super::tier::{parse_key_hash, OverrideSpec, PenaltyTime, Rule};
use super::window::Window;

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
    #[serde(default, skip_serializing_if = "super::quota::is_false")]
    pub per_key: bool,
    /// Count `limit` units per window of this length instead of leaking
    /// (see [`crate::core::Quota::window`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window: Option<Window>,
    /// A sliding window (see [`crate::core::Quota::sliding`]).
    #[serde(default, skip_serializing_if = "super::quota::is_false")]
    pub sliding: bool,
    /// A penalty (see [`crate::core::Quota::penalty`]): `"15m"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub penalty: Option<PenaltyTime>,
    /// Overrides of a per-key template's numbers for some keys (see
    /// [`super::tier`]); a quota file's only (the admin API keeps them
    /// at `/v1/quotas/{name}/overrides`).
    #[serde(
        default,
        deserialize_with = "super::object::objects",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub overrides: Vec<OverrideSpec>,
    /// At most `limit` requests at once (see
    /// [`crate::core::Quota::in_flight`]).
    #[serde(default, skip_serializing_if = "super::quota::is_false")]
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
struct Written(Rate);

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

/// Parses a JSON quota file (wrapped or bare) without checking the quotas,
/// for callers that check them against more than the file (the root merges
/// a file with the quotas it already has).
pub fn specs_from_json(text: &str) -> Result<Vec<QuotaSpec>, SpecError> {
    let place = RefCell::new(FilePlace::default());
    let mut de = serde_json::Deserializer::from_str(text);
    let specs = read_specs(&mut de, &place).and_then(|specs| de.end().map(|()| specs));
    specs.map_err(|e| {
        let mut place = place.into_inner();
        if e.line() > 0 {
            place.line = Some(e.line());
            // serde_json counts an error before a line's first byte (an
            // empty file) as column 0; columns here start at 1.
            place.column = Some(e.column().max(1));
        }
        // serde_json puts the position at the end of its message; the
        // place carries it instead.
        let full = e.to_string();
        let suffix = format!(" at line {} column {}", e.line(), e.column());
        let mut message = full.strip_suffix(&suffix).unwrap_or(&full).to_string();
        if let Some(other) = sniff_other_format(text) {
            // "expected value at line 1, column 1" says nothing to someone
            // who wrote YAML.
            (place.line, place.column) = (None, None);
            message = format!(
                "not JSON: it looks like {other}; {}",
                FileFormat::WHAT_IS_READ
            );
        }
        SpecError::Parse(ParseError { place, message })
    })
}

/// The format a quota file is read in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FileFormat {
    /// `{"quotas": [...]}` or a bare list: every reader.
    Json,
    /// `[[quotas]]` tables: `sluice quota apply` only.
    Toml,
}

impl FileFormat {
    /// What each reader takes, for messages.
    pub const WHAT_IS_READ: &'static str =
        "quota files are JSON (nginx's sluice_quotas, the C ABI, \
         sluice quota apply) or TOML (sluice quota apply, for a name ending in .toml); \
         convert it to one of them";

    /// The format of a quota file named `path`: TOML for a name ending in
    /// `.toml` when the reader takes TOML (`toml`), JSON otherwise. A
    /// name ending in `.yaml` or `.yml` is refused (YAML is not read),
    /// and so is `.toml` where only JSON is read, saying what is.
    pub fn for_path(path: &std::path::Path, toml: bool) -> Result<Self, String> {
        let extension = path
            .extension()
            .and_then(|e| e.to_str())
            .map(str::to_ascii_lowercase);
        match extension.as_deref() {
            Some("yaml" | "yml") => Err(format!(
                "{}: YAML quota files are not read: {}",
                path.display(),
                Self::WHAT_IS_READ
            )),
            Some("toml") if toml => Ok(Self::Toml),
            Some("toml") => Err(format!(
                "{}: TOML quota files are read by sluice quota apply only; this reads JSON",
                path.display()
            )),
            _ => Ok(Self::Json),
        }
    }
}

/// The format `text` looks written in when it is not JSON (its first
/// character is not `{` or `[`, or it starts with a TOML table header):
/// `YAML` or `TOML`; `None` when it looks like (broken) JSON or nothing
/// recognisable.
fn sniff_other_format(text: &str) -> Option<&'static str> {
    let first = text
        .lines()
        .map(str::trim)
        .find(|l| !l.is_empty() && !l.starts_with('#'))?;
    if first.starts_with("[[")
        || (first.starts_with('[') && first.ends_with(']') && {
            let inner = &first[1..first.len() - 1];
            !inner.is_empty()
                && inner
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"_.-".contains(&b))
        })
    {
        return Some("TOML");
    }
    if first.starts_with('{') || first.starts_with('[') {
        return None;
    }
    if first.starts_with("---") || first.starts_with("%YAML") || first.starts_with("- ") {
        return Some("YAML");
    }
    let key = first.split(':').next().unwrap_or("");
    if first.contains(':') && !key.is_empty() && !key.contains(' ') && !key.contains('=') {
        return Some("YAML");
    }
    if first.contains('=') {
        return Some("TOML");
    }
    None
}

/// Parses a TOML quota file (`[[quotas]]` tables, the same fields), with
/// errors as [`specs_from_json`] gives them: quota, field, line and
/// column. Like it, checks the shape only.
#[cfg(feature = "toml")]
pub fn specs_from_toml(text: &str) -> Result<Vec<QuotaSpec>, ParseError> {
    let place = RefCell::new(FilePlace::default());
    read_specs(toml::Deserializer::new(text), &place).map_err(|e| {
        let mut place = place.into_inner();
        if let Some((line, column)) = toml_position(text, &e) {
            (place.line, place.column) = (Some(line), Some(column));
        }
        ParseError {
            place,
            message: e.message().trim().to_string(),
        }
    })
}

/// Line and column (from 1) where a TOML error starts, when it says.
#[cfg(feature = "toml")]
pub fn toml_position(text: &str, error: &toml::de::Error) -> Option<(usize, usize)> {
    error.span().map(|span| line_column(text, span.start))
}

/// Reads a quota list (`{"quotas": [...]}` or a bare list) from any serde
/// format, keeping `place` up to date: when an error comes back, `place`
/// says which quota (index, and name if it was read) and which field it
/// is in; the caller adds the format's position.
pub fn read_specs<'de, D: Deserializer<'de>>(
    de: D,
    place: &RefCell<FilePlace>,
) -> Result<Vec<QuotaSpec>, D::Error> {
    de.deserialize_any(FileVisitor { place })
}

/// Where in a quota file a parse error is.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FilePlace {
    /// Index of the quota in the list (from 0), when the error is in one.
    pub index: Option<usize>,
    /// That quota's name, when it was read before the error.
    pub name: Option<String>,
    /// The quota's field, when the error is in its value.
    pub field: Option<&'static str>,
    /// Line of the error in the text, from 1, when the format says.
    pub line: Option<usize>,
    /// Column of the error in its line, from 1.
    pub column: Option<usize>,
}

/// A quota file that is not JSON (or TOML) of the expected shape: what is
/// wrong and where.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParseError {
    /// Where.
    pub place: FilePlace,
    /// What the parser said, without its position.
    pub message: String,
}

impl ParseError {
    /// The path to the offending value: `quotas[3].limit`, `quotas[3]`, or
    /// `None` outside the list.
    pub fn path(&self) -> Option<String> {
        let index = self.place.index?;
        Some(match self.place.field {
            Some(field) => format!("quotas[{index}].{field}"),
            None => format!("quotas[{index}]"),
        })
    }

    /// The message with the position, when known.
    pub fn message_at(&self) -> String {
        match (self.place.line, self.place.column) {
            (Some(line), Some(column)) => {
                format!("{} at line {line}, column {column}", self.message)
            }
            _ => self.message.clone(),
        }
    }
}

impl std::fmt::Display for ParseError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if let Some(path) = self.path() {
            f.write_str(&path)?;
            if let Some(name) = &self.place.name {
                write!(f, " (quota {name:?})")?;
            }
            f.write_str(": ")?;
        }
        // One line whatever the parser wrote.
        f.write_str(&self.message_at().replace('\n', " "))
    }
}

/// Line and column (both from 1) of byte `offset` in `text`, for formats
/// whose errors carry a byte span (TOML).
pub fn line_column(text: &str, offset: usize) -> (usize, usize) {
    let before = &text.as_bytes()[..offset.min(text.len())];
    let line = before.iter().filter(|&&b| b == b'\n').count() + 1;
    let start = before
        .iter()
        .rposition(|&b| b == b'\n')
        .map_or(0, |i| i + 1);
    let column = String::from_utf8_lossy(&before[start..]).chars().count() + 1;
    (line, column)
}

/// The top of a quota file: a map with `quotas`, or the list itself.
struct FileVisitor<'p> {
    place: &'p RefCell<FilePlace>,
}

/// The one key of a wrapped quota file.
#[derive(Deserialize)]
#[serde(field_identifier, rename_all = "snake_case")]
enum FileKey {
    Quotas,
}

impl<'de> Visitor<'de> for FileVisitor<'_> {
    type Value = Vec<QuotaSpec>;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("{\"quotas\": [...]} or a list of quotas")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut quotas = None;
        while let Some(FileKey::Quotas) = map.next_key()? {
            if quotas.is_some() {
                return Err(de::Error::duplicate_field("quotas"));
            }
            quotas = Some(map.next_value_seed(ListSeed { place: self.place })?);
        }
        quotas.ok_or_else(|| de::Error::missing_field("quotas"))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Self::Value, A::Error> {
        ListSeed { place: self.place }.visit_seq(seq)
    }
}

/// The list of quotas; notes the index of each as it is read.
#[derive(Clone, Copy)]
struct ListSeed<'p> {
    place: &'p RefCell<FilePlace>,
}

impl<'de> DeserializeSeed<'de> for ListSeed<'_> {
    type Value = Vec<QuotaSpec>;

    fn deserialize<D: Deserializer<'de>>(self, de: D) -> Result<Self::Value, D::Error> {
        de.deserialize_seq(self)
    }
}

impl<'de> Visitor<'de> for ListSeed<'_> {
    type Value = Vec<QuotaSpec>;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a list of quotas")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        // The hint comes from the input: trust it only so far.
        let mut quotas = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(1 << 16));
        loop {
            *self.place.borrow_mut() = FilePlace {
                index: Some(quotas.len()),
                ..FilePlace::default()
            };
            match seq.next_element_seed(SpecSeed { place: self.place })? {
                Some(spec) => quotas.push(spec),
                None => break,
            }
        }
        *self.place.borrow_mut() = FilePlace::default();
        Ok(quotas)
    }
}

/// The fields of a quota in a file.
#[derive(Clone, Copy, Deserialize)]
#[serde(field_identifier, rename_all = "snake_case")]
enum SpecField {
    Name,
    Parent,
    Limit,
    LowBurst,
    HighBurst,
    PerKey,
    Window,
    Sliding,
    Penalty,
    Overrides,
    InFlight,
}

impl SpecField {
    const NAMES: &'static [&'static str] = &[
        "name",
        "parent",
        "limit",
        "low_burst",
        "high_burst",
        "per_key",
        "window",
        "sliding",
        "penalty",
        "overrides",
        "in_flight",
    ];

    fn name(self) -> &'static str {
        Self::NAMES[self as usize]
    }
}

/// One quota; notes the field being read, and the name once read.
struct SpecSeed<'p> {
    place: &'p RefCell<FilePlace>,
}

impl<'de> DeserializeSeed<'de> for SpecSeed<'_> {
    type Value = QuotaSpec;

    fn deserialize<D: Deserializer<'de>>(self, de: D) -> Result<Self::Value, D::Error> {
        de.deserialize_struct("QuotaSpec", SpecField::NAMES, self)
    }
}

impl SpecSeed<'_> {
    /// Notes the quota's name (if read) for an error about to be returned.
    fn noting<E>(&self, name: &Option<String>, error: E) -> E {
        if let Some(name) = name {
            self.place.borrow_mut().name = Some(name.clone());
        }
        error
    }
}

impl<'de> Visitor<'de> for SpecSeed<'_> {
    type Value = QuotaSpec;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a quota: {\"name\", \"limit\", ...}")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut name: Option<String> = None;
        let mut parent: Option<Option<String>> = None;
        let mut limit: Option<Written> = None;
        let mut low_burst: Option<Option<f64>> = None;
        let mut high_burst: Option<Option<f64>> = None;
        let mut per_key: Option<bool> = None;
        let mut window: Option<Option<Window>> = None;
        let mut sliding: Option<bool> = None;
        let mut penalty: Option<Option<PenaltyTime>> = None;
        let mut overrides: Option<Vec<OverrideSpec>> = None;
        let mut in_flight: Option<bool> = None;
        loop {
            self.place.borrow_mut().field = None;
            let key = map
                .next_key::<SpecField>()
                .map_err(|e| self.noting(&name, e))?;
            let Some(key) = key else { break };
            self.place.borrow_mut().field = Some(key.name());
            let duplicate = match key {
                SpecField::Name => name.is_some(),
                SpecField::Parent => parent.is_some(),
                SpecField::Limit => limit.is_some(),
                SpecField::LowBurst => low_burst.is_some(),
                SpecField::HighBurst => high_burst.is_some(),
                SpecField::PerKey => per_key.is_some(),
                SpecField::Window => window.is_some(),
                SpecField::Sliding => sliding.is_some(),
                SpecField::Penalty => penalty.is_some(),
                SpecField::Overrides => overrides.is_some(),
                SpecField::InFlight => in_flight.is_some(),
            };
            if duplicate {
                return Err(self.noting(&name, de::Error::duplicate_field(key.name())));
            }
            let read = match key {
                SpecField::Name => map.next_value().map(|v| name = Some(v)),
                SpecField::Parent => map.next_value().map(|v| parent = Some(v)),
                SpecField::Limit => map.next_value().map(|v| limit = Some(v)),
                SpecField::LowBurst => map.next_value().map(|v| low_burst = Some(v)),
                SpecField::HighBurst => map.next_value().map(|v| high_burst = Some(v)),
                SpecField::PerKey => map.next_value().map(|v| per_key = Some(v)),
                SpecField::Window => map.next_value().map(|v| window = Some(v)),
                SpecField::Sliding => map.next_value().map(|v| sliding = Some(v)),
                SpecField::Penalty => map.next_value().map(|v| penalty = Some(v)),
                SpecField::Overrides => map
                    .next_value::<Vec<Object<OverrideSpec>>>()
                    .map(|v| overrides = Some(v.into_iter().map(Object::into_inner).collect())),
                SpecField::InFlight => map.next_value().map(|v| in_flight = Some(v)),
            };
            read.map_err(|e| self.noting(&name, e))?;
        }
        let Some(Written(limit)) = limit else {
            self.place.borrow_mut().field = Some("limit");
            return Err(self.noting(&name, de::Error::missing_field("limit")));
        };
        let window = window.flatten();
        let in_flight = in_flight.unwrap_or(false);
        if let (Some(unit), true) = (limit.unit, window.is_some() || in_flight) {
            self.place.borrow_mut().field = Some("limit");
            let what = if in_flight {
                "an in-flight quota's limit is a number of requests at once"
            } else {
                "a window quota's limit is a count per window (\"limit\": 10, \"window\": \"1m\")"
            };
            return Err(self.noting(
                &name,
                de::Error::custom(format!(
                    "a rate per {} is a leaky bucket's; {what}: give a number",
                    unit.letter()
                )),
            ));
        }
        let limit = limit.per_second;
        Ok(QuotaSpec {
            name: name.unwrap_or_default(),
            parent: parent.flatten(),
            limit,
            low_burst: low_burst.flatten(),
            high_burst: high_burst.flatten(),
            per_key: per_key.unwrap_or(false),
            window,
            sliding: sliding.unwrap_or(false),
            penalty: penalty.flatten(),
            overrides: overrides.unwrap_or_default(),
            in_flight,
        })
    }
}

/// A whole set of quotas, checked together: every quota valid, names
/// unique, parents present in the set, chains acyclic and at most
/// [`super::quota::MAX_DEPTH`] deep.
#[derive(Clone, Debug, PartialEq)]
pub struct QuotaSet {
    /// The quotas, in file order.
    pub quotas: Vec<QuotaSpec>,
}

/// An error in a quota set, with the quota it is about.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum SpecError {
    /// The text is not JSON (or TOML) of the expected shape.
    #[error("{0}")]
    Parse(ParseError),
    /// One quota is invalid.
    #[error("quota {name:?}: {error}")]
    Invalid {
        /// The quota's name as written.
        name: String,
        /// What is wrong.
        error: ValidationError,
    },
}

impl QuotaSet {
    /// Parses and checks a JSON quota set.
    pub fn from_json(text: &str) -> Result<Self, SpecError> {
        Self::new(specs_from_json(text)?)
    }

    /// Checks a set of quotas.
    pub fn new(quotas: Vec<QuotaSpec>) -> Result<Self, SpecError> {
        let invalid = |q: &QuotaSpec, error| SpecError::Invalid {
            name: q.name.clone(),
            error,
        };
        let mut parent_of: HashMap<&str, Option<&str>> = HashMap::with_capacity(quotas.len());
        let templates: std::collections::HashSet<&str> = quotas
            .iter()
            .filter(|q| q.per_key)
            .map(|q| q.name.as_str())
            .collect();
        let in_flight: std::collections::HashSet<&str> = quotas
            .iter()
            .filter(|q| q.in_flight)
            .map(|q| q.name.as_str())
            .collect();
        for q in &quotas {
            q.validate().map_err(|e| invalid(q, e))?;
            if parent_of.insert(&q.name, q.parent.as_deref()).is_some() {
                return Err(invalid(
                    q,
                    ValidationError::new("name", "appears more than once"),
                ));
            }
        }
        for q in &quotas {
            if let Some(parent) = q.parent.as_deref() {
                if !parent_of.contains_key(parent) {
                    let msg = format!("parent {parent:?} is not in the set");
                    return Err(invalid(q, ValidationError::new("parent", msg)));
                }
                if templates.contains(parent) {
                    return Err(invalid(q, template_as_parent(parent)));
                }
                if in_flight.contains(parent) {
                    return Err(invalid(q, in_flight_as_parent(parent)));
                }
            }
            validate_chain(&q.name.as_str(), |k| parent_of.get(k).copied().flatten())
                .map_err(|e| invalid(q, e))?;
        }
        Ok(Self { quotas })
    }

    /// The set as table quotas: ids `1..=n` in order, every one at `epoch`.
    pub fn to_quotas(&self, epoch: u64) -> Vec<Quota> {
        let ids: HashMap<&str, u64> = self
            .quotas
            .iter()
            .enumerate()
            .map(|(i, q)| (q.name.as_str(), i as u64 + 1))
            .collect();
        self.quotas
            .iter()
            .enumerate()
            .map(|(i, q)| Quota {
                per_key: q.per_key,
                window: q.window,
                sliding: q.sliding,
                penalty: q.penalty,
                in_flight: q.in_flight,
                ..Quota::new(i as u64 + 1, q.name.clone(), q.limit, q.low(), q.high())
                    .with_parent(q.parent.as_deref().map(|p| ids[p]))
                    .at_epoch(epoch)
            })
            .collect()
    }
}

/// The error for a quota placed under a per-key template.
pub fn template_as_parent(parent: &str) -> ValidationError {
    ValidationError::new(
        "parent",
        format!("{parent:?} is a per-key template, which cannot be a parent"),
    )
}

#[cfg(test)]
mod format_tests {
    use super::*;
    use std::path::Path;

    /// The issue's case: a YAML file got "expected value at line 1, column
    /// 1".
    #[test]
    fn yaml_is_refused_by_name_and_by_look_saying_what_is_read() {
        let refused = FileFormat::for_path(Path::new("/etc/quotas.yaml"), true).unwrap_err();
        assert!(
            refused.contains("/etc/quotas.yaml: YAML quota files are not read")
                && refused.contains("JSON")
                && refused.contains("TOML"),
            "{refused}"
        );
        assert!(FileFormat::for_path(Path::new("q.YML"), false).is_err());
        let yaml = "# plans\nquotas:\n  - name: a\n    limit: 1\n";
        let error = specs_from_json(yaml).unwrap_err().to_string();
        assert!(
            error.contains("it looks like YAML") && error.contains("quota files are JSON"),
            "{error}"
        );
        for yaml in ["---\n- name: a\n", "- name: a\n  limit: 1\n", "name: a\n"] {
            let error = specs_from_json(yaml).unwrap_err().to_string();
            assert!(error.contains("looks like YAML"), "{yaml:?}: {error}");
        }
    }

    #[test]
    fn toml_is_read_only_where_toml_is_and_named_elsewhere() {
        assert_eq!(
            FileFormat::for_path(Path::new("q.toml"), true),
            Ok(FileFormat::Toml)
        );
        let refused = FileFormat::for_path(Path::new("q.toml"), false).unwrap_err();
        assert!(refused.contains("sluice quota apply only"), "{refused}");
        assert_eq!(
            FileFormat::for_path(Path::new("q.json"), false),
            Ok(FileFormat::Json)
        );
        assert_eq!(
            FileFormat::for_path(Path::new("quotas"), true),
            Ok(FileFormat::Json)
        );
        let error = specs_from_json("[[quotas]]\nname = \"a\"\n")
            .unwrap_err()
            .to_string();
        assert!(error.contains("looks like TOML"), "{error}");
    }

    #[test]
    fn broken_json_keeps_its_own_message() {
        let error = specs_from_json("{\"quotas\": [ {\"name\": \"a\",, } ]}")
            .unwrap_err()
            .to_string();
        assert!(!error.contains("looks like"), "{error}");
        let error = specs_from_json("").unwrap_err().to_string();
        assert!(!error.contains("looks like"), "{error}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wrapped_or_bare_set_parses_with_defaults_and_parent_ids() {
        let text = r#"{"quotas":[
            {"name":"b","limit":10},
            {"name":"b_read","parent":"b","limit":5,"low_burst":6,"high_burst":9}]}"#;
        let set = QuotaSet::from_json(text).unwrap();
        let qs = set.to_quotas(4);
        assert_eq!(qs[0].low_burst, 10.0);
        assert_eq!(qs[0].high_burst, 10.0);
        assert_eq!(qs[1].parent, Some(1));
        assert_eq!(qs[1].epoch, 4);
        let bare = QuotaSet::from_json(r#"[{"name":"x","limit":1}]"#).unwrap();
        assert_eq!(bare.quotas.len(), 1);
    }

    #[test]
    fn errors_name_the_quota_and_the_field() {
        let cases = [
            (r#"[{"name":"a b","limit":1}]"#, "name"),
            (r#"[{"name":"a","limit":-1}]"#, "limit"),
            (
                r#"[{"name":"a","limit":1,"low_burst":5,"high_burst":2}]"#,
                "low_burst",
            ),
            (r#"[{"name":"a","limit":1,"parent":"zz"}]"#, "parent"),
            (r#"[{"name":"a","limit":1},{"name":"a","limit":2}]"#, "name"),
            (
                r#"[{"name":"a","limit":1,"parent":"b"},{"name":"b","limit":1,"parent":"a"}]"#,
                "parent",
            ),
        ];
        for (text, field) in cases {
            match QuotaSet::from_json(text) {
                Err(SpecError::Invalid { error, .. }) => assert_eq!(error.field, field, "{text}"),
                other => panic!("{text}: {other:?}"),
            }
        }
    }

    #[test]
    fn window_quotas_parse_and_bad_windows_are_refused_naming_the_field() {
        let set = QuotaSet::from_json(
            r#"[{"name":"day","limit":1000,"window":"1d"},
                {"name":"minute","parent":"day","limit":10,"window":"1m","sliding":true}]"#,
        )
        .unwrap();
        let qs = set.to_quotas(1);
        assert_eq!(qs[0].window, Some(Window::Day));
        assert_eq!((qs[1].window, qs[1].sliding), (Some(Window::Minute), true));
        let unknown = specs_from_json(r#"[{"name":"q","limit":1,"window":"2m"}]"#).unwrap_err();
        let SpecError::Parse(e) = unknown else {
            panic!("{unknown:?}")
        };
        assert_eq!(e.place.field, Some("window"));
        assert!(e.message.contains("unknown variant `2m`"), "{}", e.message);
        let wide =
            QuotaSet::from_json(r#"[{"name":"q","limit":10,"high_burst":20,"window":"1h"}]"#)
                .unwrap_err();
        assert!(
            matches!(wide, SpecError::Invalid { ref error, .. } if error.field == "high_burst")
        );
    }

    #[test]
    fn per_key_templates_parse_and_cannot_be_parents() {
        let set = QuotaSet::from_json(
            r#"[{"name":"api","limit":100},
                {"name":"api_user","parent":"api","limit":15,"per_key":true}]"#,
        )
        .unwrap();
        let qs = set.to_quotas(1);
        assert_eq!((qs[0].per_key, qs[1].per_key), (false, true));
        let under =
            r#"[{"name":"t","limit":1,"per_key":true},{"name":"c","parent":"t","limit":1}]"#;
        match QuotaSet::from_json(under) {
            Err(SpecError::Invalid { name, error }) => {
                assert_eq!((name.as_str(), error.field), ("c", "parent"))
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn parsing_alone_leaves_parents_unchecked() {
        let specs = specs_from_json(r#"[{"name":"a","parent":"elsewhere","limit":1}]"#).unwrap();
        assert_eq!(specs[0].parent.as_deref(), Some("elsewhere"));
        assert!(matches!(specs_from_json("[1]"), Err(SpecError::Parse(_))));
    }

    fn parse_error(text: &str) -> ParseError {
        match specs_from_json(text) {
            Err(SpecError::Parse(e)) => e,
            other => panic!("{text}: {other:?}"),
        }
    }

    #[test]
    fn unknown_fields_and_bad_json_are_rejected() {
        let e = parse_error(r#"[{"name":"a","limit":1,"limt":2}]"#);
        assert_eq!(e.path().as_deref(), Some("quotas[0]"));
        assert!(e.message.contains("unknown field `limt`"), "{e}");
        let e = parse_error("{");
        assert_eq!((e.path(), e.place.line), (None, Some(1)));
        let e = parse_error(r#"{"quotas": [], "extra": 1}"#);
        assert!(e.message.contains("unknown field `extra`"), "{e}");
        let e = parse_error(r#"{"quota": []}"#);
        assert!(e.to_string().contains("quota"), "{e}");
        let e = parse_error("[] x");
        assert!(e.message.contains("trailing"), "{e}");
    }

    #[test]
    fn type_errors_name_the_quota_the_field_and_the_position() {
        let text = "{\"quotas\": [\n  {\"name\": \"a\", \"limit\": 1},\n  {\"name\": \"b\", \"limit\": \"ten\"}\n]}";
        let e = parse_error(text);
        assert_eq!(e.path().as_deref(), Some("quotas[1].limit"));
        assert_eq!(e.place.name.as_deref(), Some("b"));
        assert_eq!((e.place.line, e.place.column), (Some(3), Some(30)));
        assert_eq!(
            e.to_string(),
            "quotas[1].limit (quota \"b\"): invalid rate \"ten\": expected a number, or a \
             rate such as 10/m, 100/h or 5/s (10r/m as nginx writes it) at line 3, column 30"
        );
        // Bare lists, a field before the name, and a missing field.
        let e = parse_error(r#"[{"high_burst": true, "name": "c", "limit": 1}]"#);
        assert_eq!(e.path().as_deref(), Some("quotas[0].high_burst"));
        assert_eq!(e.place.name, None);
        let e = parse_error(r#"[{"name": "d"}]"#);
        assert_eq!(e.path().as_deref(), Some("quotas[0].limit"));
        assert!(e
            .to_string()
            .starts_with("quotas[0].limit (quota \"d\"): missing field `limit`"));
        let e = parse_error(r#"[{"name": "d", "limit": 1, "limit": 2}]"#);
        assert!(e.message.contains("duplicate field `limit`"), "{e}");
        let e = parse_error(r#"[{"name": "e", "limit": 1}, 7]"#);
        assert_eq!(e.path().as_deref(), Some("quotas[1]"));
    }

    #[test]
    fn an_empty_file_is_an_error_at_line_1_column_1() {
        // Found by the `spec_json` fuzz target (tests/fuzz): serde_json
        // said column 0.
        for text in ["", "\n", "[\n"] {
            let e = parse_error(text);
            assert!(e.place.line.is_some_and(|l| l >= 1), "{text:?}: {e:?}");
            assert!(e.place.column.is_some_and(|c| c >= 1), "{text:?}: {e:?}");
        }
        assert!(parse_error("").to_string().ends_with("at line 1, column 1"));
    }

    #[test]
    fn nulls_stand_for_defaults_as_before() {
        let specs =
            specs_from_json(r#"[{"name":"a","limit":2,"low_burst":null,"parent":null}]"#).unwrap();
        assert_eq!((specs[0].low(), specs[0].parent.as_deref()), (2.0, None));
    }

    #[test]
    fn byte_offsets_become_lines_and_columns() {
        let text = "ab\ncdé\nf";
        assert_eq!(line_column(text, 0), (1, 1));
        assert_eq!(line_column(text, 3), (2, 1));
        assert_eq!(line_column(text, 7), (2, 4));
        assert_eq!(line_column(text, 100), (3, 2));
    }

    #[test]
    #[cfg(feature = "toml")]
    fn toml_quota_files_report_quota_field_and_line() {
        let text =
            "[[quotas]]\nname = \"a\"\nlimit = 1\n\n[[quotas]]\nname = \"b\"\nlimit = \"ten\"\n";
        let error = specs_from_toml(text).unwrap_err();
        assert_eq!(error.path().as_deref(), Some("quotas[1].limit"));
        let line = error.to_string();
        assert!(
            line.starts_with("quotas[1].limit (quota \"b\"): "),
            "{line}"
        );
        assert!(line.contains("at line 7, column 9"), "{line}");
        let syntax = specs_from_toml("[[quotas]\nname = 1")
            .unwrap_err()
            .to_string();
        assert!(
            !syntax.contains('\n') && syntax.contains("at line 1"),
            "{syntax}"
        );
        let ok = specs_from_toml("[[quotas]]\nname = \"a\"\nlimit = 2\n").unwrap();
        assert_eq!((ok[0].name.as_str(), ok[0].limit), ("a", 2.0));
    }

    #[test]
    fn depth_nine_is_rejected() {
        let mut qs = vec![QuotaSpec::new("q0", 1.0)];
        for i in 1..9 {
            qs.push(QuotaSpec {
                name: format!("q{i}"),
                parent: Some(format!("q{}", i - 1)),
                ..qs[0].clone()
            });
        }
        assert!(QuotaSet::new(qs[..8].to_vec()).is_ok());
        assert!(QuotaSet::new(qs).is_err());
    }

    fn sliding_per_key() -> QuotaSpec {
        QuotaSpec {
            parent: Some("s3_photos".into()),
            low_burst: Some(4.0),
            high_burst: Some(5.0),
            per_key: true,
            window: Some(Window::Minute),
            sliding: true,
            ..QuotaSpec::new("per_client", 5.0)
        }
    }

    #[test]
    fn a_patch_changes_only_the_fields_it_names() {
        let current = sliding_per_key();
        let patch: QuotaPatch = serde_json::from_str(r#"{"limit": 6}"#).unwrap();
        assert_eq!(
            patch.applied_to(&current),
            QuotaSpec {
                limit: 6.0,
                ..current.clone()
            }
        );
        let empty: QuotaPatch = serde_json::from_str("{}").unwrap();
        assert!(empty.is_empty());
        assert_eq!(empty.applied_to(&current), current);
    }

    #[test]
    fn a_limit_is_a_number_or_a_rate_with_its_unit() {
        let set = QuotaSet::from_json(
            r#"[{"name": "a", "limit": "10/m"}, {"name": "b", "limit": "100r/h"},
                {"name": "c", "limit": "5/s"}, {"name": "d", "limit": 0.5}]"#,
        )
        .unwrap();
        let limits: Vec<f64> = set.quotas.iter().map(|q| q.limit).collect();
        assert_eq!(limits, [10.0 / 60.0, 100.0 / 3600.0, 5.0, 0.5]);
        // The low burst defaults to the limit: a tenth of a unit for 10/m.
        assert_eq!(set.quotas[0].low(), 10.0 / 60.0);
        let patch: QuotaPatch = serde_json::from_str(r#"{"limit": "6/m"}"#).unwrap();
        assert_eq!(patch.limit, Some(0.1));
        let spec: QuotaSpec = serde_json::from_str(r#"{"name": "x", "limit": "2/h"}"#).unwrap();
        assert_eq!(spec.limit, 2.0 / 3600.0);
        for (text, said) in [
            (
                r#"[{"name": "a", "limit": "10/d"}]"#,
                "invalid rate \"10/d\"",
            ),
            (
                r#"[{"name": "a", "limit": "10/m", "window": "1m"}]"#,
                "quotas[0].limit (quota \"a\"): a rate per m is a leaky bucket's; a window",
            ),
            (
                r#"[{"name": "a", "limit": "3/s", "in_flight": true}]"#,
                "a rate per s is a leaky bucket's; an in-flight quota's limit",
            ),
        ] {
            let error = QuotaSet::from_json(text).unwrap_err().to_string();
            assert!(error.contains(said), "{text}: {error}");
        }
    }

    #[test]
    fn null_clears_the_nullable_fields_of_a_patch() {
        let current = sliding_per_key();
        let patch: QuotaPatch = serde_json::from_str(
            r#"{"parent": null, "window": null, "sliding": false, "low_burst": null, "high_burst": null}"#,
        )
        .unwrap();
        let merged = patch.applied_to(&current);
        assert_eq!(merged.parent, None);
        assert_eq!((merged.window, merged.sliding), (None, false));
        assert_eq!((merged.low(), merged.high()), (5.0, 5.0));
        assert!(merged.per_key);
        // Serialised back, a cleared field stays an explicit null.
        let text = serde_json::to_value(&patch).unwrap();
        assert_eq!(text["parent"], serde_json::Value::Null);
        assert!(text.as_object().unwrap().contains_key("window"));
        assert!(!text.as_object().unwrap().contains_key("limit"));
    }

    #[test]
    fn a_patch_refuses_unknown_fields_and_nulls_without_a_meaning() {
        for body in [
            r#"{"limit": null}"#,
            r#"{"per_key": null}"#,
            r#"{"sliding": null}"#,
            r#"{"limits": 5}"#,
            r#"{"window": "2m"}"#,
        ] {
            assert!(
                serde_json::from_str::<QuotaPatch>(body).is_err(),
                "{body} was accepted"
            );
        }
    }
}
