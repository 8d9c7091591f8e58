//! Quota files read whole: their formats (JSON, TOML), the serde visitors
//! that note the quota and field being read, and errors that name the
//! quota, field, line and column.

use std::cell::RefCell;

use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;

use crate::core::object::Object;
use crate::core::quota::ValidationError;
use crate::core::tier::{OverrideSpec, PenaltyTime};
use crate::core::window::Window;

use super::written::{QuotaSpec, Written};

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
