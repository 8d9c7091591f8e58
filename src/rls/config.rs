//! envoyproxy/ratelimit's YAML configuration: files read, checked and
//! turned into domains of descriptor trees.
//!
//! Every file holds one domain. A file is refused whole, with its name
//! and the problem, for each error envoyproxy/ratelimit's loader raises,
//! in its words: bad YAML, a key that is not a string, an unknown key, a
//! list item that is not a map, an empty domain, a domain already loaded
//! from another file, a descriptor without a key, a duplicate descriptor
//! composite key, an unknown unit, a unit given with `unlimited`, an
//! empty `replaces` entry or one naming its own limit. A value of the
//! wrong type (`requests_per_unit: ten`) is a YAML error as there.
//!
//! Keys are checked as envoyproxy/ratelimit checks them: against one set
//! of known keys wherever they appear (a known key in a place it means
//! nothing is ignored there too). The set adds sluice's own keys
//! ([`SLUICE_KEYS`]), which envoyproxy/ratelimit refuses as unknown, so
//! a file using one is plainly sluice's.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::core::spec::QuotaSpec;

use super::limit::{Extension, Limit, Unit};
use super::metrics::Stats;
use super::quotas::{quotas_of, spec_of, LimitQuota};
use super::yaml::Node;

/// Keys envoyproxy/ratelimit knows.
pub const RATELIMIT_KEYS: [&str; 16] = [
    "domain",
    "key",
    "value",
    "descriptors",
    "rate_limit",
    "unit",
    "requests_per_unit",
    "unlimited",
    "shadow_mode",
    "quota_mode",
    "name",
    "replaces",
    "detailed_metric",
    "value_to_metric",
    "share_threshold",
    "metadata",
];

/// sluice's own keys (see docs/envoy.md): `rate_limits` (several limits
/// on one descriptor), and in a limit `sliding`, `units` (a period of N
/// units), `leaky` with `low_burst` and `high_burst`.
pub const SLUICE_KEYS: [&str; 6] = [
    "rate_limits",
    "sliding",
    "units",
    "leaky",
    "low_burst",
    "high_burst",
];

/// A file that could not be loaded, and why.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{file}: {problem}")]
pub struct ConfigError {
    /// The file, as it was named to the loader.
    pub file: String,
    /// What is wrong, in envoyproxy/ratelimit's words where it has them.
    pub problem: String,
}

/// A descriptor's `value`: none (any value), an exact value, or a
/// pattern with `*` wildcards.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Value {
    /// No value: every value of the key matches, each with its own counter.
    Any,
    /// This value only.
    Exact(String),
    /// A pattern: `*` matches any run of characters (several allowed).
    Pattern(String),
}

impl Value {
    /// The value as written (empty for [`Value::Any`]).
    pub fn text(&self) -> &str {
        match self {
            Value::Any => "",
            Value::Exact(v) | Value::Pattern(v) => v,
        }
    }
}

/// One descriptor of the tree.
#[derive(Clone, Debug)]
pub struct Descriptor {
    /// The entry's key.
    pub key: String,
    /// The entry's value.
    pub value: Value,
    /// Its limits: envoyproxy/ratelimit's one `rate_limit`, or several
    /// (`rate_limits`, sluice's).
    pub limits: Vec<Limit>,
    /// Each limit's quota, in the order of `limits`.
    pub quotas: Vec<LimitQuota>,
    /// Nested descriptors.
    pub children: Level,
    /// Over-limit answers OK (still counted).
    pub shadow_mode: bool,
    /// Over-limit answers OK unless every quota-mode descriptor of the
    /// request is over (envoyproxy/ratelimit's quota mode).
    pub quota_mode: bool,
    /// The request's value goes into the metric's descriptor label.
    pub detailed_metric: bool,
    /// This entry's request value replaces its configured one in the
    /// metric's descriptor label.
    pub value_to_metric: bool,
    /// Every value matching the pattern shares one counter.
    pub share_threshold: bool,
    /// Metadata sent back to the client while the descriptor is under its
    /// limit.
    pub metadata: Option<serde_json::Value>,
    /// The composite key as envoyproxy/ratelimit writes it
    /// (`domain.key_value.key`): errors, logs, metrics.
    pub full_key: String,
    /// Its decisions, counted under `full_key` (carried over from the
    /// configuration a reload replaces).
    pub stats: Arc<Stats>,
}

impl Descriptor {
    /// True when the request's value picks the counter: no value, or a
    /// pattern whose matches do not share one.
    pub fn value_varies(&self) -> bool {
        match self.value {
            Value::Any => true,
            Value::Pattern(_) => !self.share_threshold,
            Value::Exact(_) => false,
        }
    }
}

/// The descriptors at one depth, with what matching needs.
#[derive(Clone, Debug, Default)]
pub struct Level {
    /// In file order.
    pub descriptors: Vec<Descriptor>,
}

impl Level {
    /// The descriptor for a request entry `(key, value)`: the exact value
    /// first, then the patterns in file order, then the key alone.
    pub fn find(&self, key: &str, value: &str) -> Option<&Descriptor> {
        let of_key = || self.descriptors.iter().filter(move |d| d.key == key);
        of_key()
            .find(|d| matches!(&d.value, Value::Exact(v) if v == value))
            .or_else(|| of_key().find(|d| matches!(&d.value, Value::Pattern(p) if glob(p, value))))
            .or_else(|| of_key().find(|d| d.value == Value::Any))
    }
}

/// True when `value` matches `pattern`, whose `*` match any run of
/// characters (empty too).
pub fn glob(pattern: &str, value: &str) -> bool {
    let mut parts = pattern.split('*');
    let first = parts.next().unwrap_or("");
    let Some(mut rest) = value.strip_prefix(first) else {
        return false;
    };
    let parts: Vec<&str> = parts.collect();
    let Some((last, middle)) = parts.split_last() else {
        return rest.is_empty();
    };
    for part in middle {
        match rest.find(part) {
            Some(at) => rest = &rest[at + part.len()..],
            None => return false,
        }
    }
    rest.len() >= last.len() && rest.ends_with(last)
}

/// One domain, from one file.
#[derive(Clone, Debug)]
pub struct Domain {
    /// The domain.
    pub name: String,
    /// The file it came from.
    pub file: String,
    /// Its top-level descriptors.
    pub root: Level,
}

/// A loaded configuration: every domain.
#[derive(Clone, Debug, Default)]
pub struct Config {
    /// By name.
    pub domains: HashMap<String, Domain>,
}

impl Config {
    /// Loads `files` (each `(name, text)`), in order: one domain a file.
    pub fn from_texts<'a>(
        files: impl IntoIterator<Item = (&'a str, &'a str)>,
    ) -> Result<Config, ConfigError> {
        let mut config = Config::default();
        for (file, text) in files {
            let domain = parse_file(file, text)?;
            if config.domains.contains_key(&domain.name) {
                return Err(error(
                    file,
                    format!("duplicate domain '{}' in config file", domain.name),
                ));
            }
            config.domains.insert(domain.name.clone(), domain);
        }
        Ok(config)
    }

    /// Loads a file, or every `.yaml` and `.yml` file of a directory in
    /// name order (names starting with `.` skipped: editors' and
    /// Kubernetes' ConfigMap bookkeeping).
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let files = config_files(path)?;
        let mut texts = Vec::with_capacity(files.len());
        for file in &files {
            let name = file.display().to_string();
            let text = std::fs::read_to_string(file)
                .map_err(|e| error(&name, format!("cannot read the file: {e}")))?;
            texts.push((name, text));
        }
        Config::from_texts(texts.iter().map(|(n, t)| (n.as_str(), t.as_str())))
    }

    /// Every descriptor's counters, as `((domain, full key), stats)`.
    pub fn stats(&self) -> Vec<((String, String), Arc<Stats>)> {
        let mut out = Vec::new();
        for domain in self.domains.values() {
            let mut path = Vec::new();
            walk(&domain.root, &mut path, &mut |p| {
                if let Some(d) = p.last() {
                    out.push((
                        (domain.name.clone(), d.full_key.clone()),
                        Arc::clone(&d.stats),
                    ));
                }
            });
        }
        out
    }

    /// Takes over the counters of `old`'s descriptors of the same full
    /// key, so a reload does not reset them.
    pub fn adopt_stats(&mut self, old: &Config) {
        let old: HashMap<(String, String), Arc<Stats>> = old.stats().into_iter().collect();
        for domain in self.domains.values_mut() {
            adopt_level(&domain.name, &mut domain.root, &old);
        }
    }

    /// Every limit with the path of descriptors leading to it, domain by
    /// domain in name order, each tree in file order.
    pub fn limits(&self) -> Vec<(&Domain, Vec<&Descriptor>)> {
        let mut domains: Vec<&Domain> = self.domains.values().collect();
        domains.sort_by(|a, b| a.name.cmp(&b.name));
        let mut out = Vec::new();
        for domain in domains {
            let mut path = Vec::new();
            walk(&domain.root, &mut path, &mut |p| {
                if p.last().is_some_and(|d| !d.limits.is_empty()) {
                    out.push((domain, p.to_vec()))
                }
            });
        }
        out
    }

    /// Every limit's quota spec (unlimited ones have none), domain by
    /// domain: what `sluice rls` loads and `sluice quota apply` sends.
    pub fn quota_specs(&self) -> Vec<QuotaSpec> {
        let mut specs = Vec::new();
        for (_, path) in self.limits() {
            let Some(last) = path.last() else { continue };
            for (limit, quota) in last.limits.iter().zip(&last.quotas) {
                specs.extend(spec_of(quota, limit));
            }
        }
        specs
    }
}

fn adopt_level(domain: &str, level: &mut Level, old: &HashMap<(String, String), Arc<Stats>>) {
    for d in &mut level.descriptors {
        if let Some(stats) = old.get(&(domain.to_string(), d.full_key.clone())) {
            d.stats = Arc::clone(stats);
        }
        adopt_level(domain, &mut d.children, old);
    }
}

/// Calls `each` with the path to every descriptor below `level`, in file
/// order, parents first.
fn walk<'a>(
    level: &'a Level,
    path: &mut Vec<&'a Descriptor>,
    each: &mut dyn FnMut(&[&'a Descriptor]),
) {
    for d in &level.descriptors {
        path.push(d);
        each(path);
        walk(&d.children, path, each);
        path.pop();
    }
}

/// The files a `--config` path names: itself, or a directory's YAML
/// files in name order.
pub fn config_files(path: &Path) -> Result<Vec<PathBuf>, ConfigError> {
    let shown = path.display().to_string();
    let meta = std::fs::metadata(path).map_err(|e| error(&shown, format!("cannot read: {e}")))?;
    if !meta.is_dir() {
        return Ok(vec![path.to_path_buf()]);
    }
    let entries =
        std::fs::read_dir(path).map_err(|e| error(&shown, format!("cannot list: {e}")))?;
    let mut files: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
            !name.starts_with('.')
                && (name.ends_with(".yaml") || name.ends_with(".yml"))
                && p.is_file()
        })
        .collect();
    files.sort();
    Ok(files)
}

/// The quota specs of envoyproxy/ratelimit's configuration at `path` (a
/// `.yaml` or `.yml` file, or a directory of them), as `sluice quota
/// apply -f` sends them to a root; `None` for any other path, and for a
/// YAML file shaped as a sluice quota file (a top-level `quotas` and no
/// `domain`), which the quota file reader refuses with its own words.
pub fn specs_of_path(path: &Path) -> Option<Result<Vec<QuotaSpec>, ConfigError>> {
    let yaml = path
        .extension()
        .and_then(|e| e.to_str())
        .is_some_and(|e| e.eq_ignore_ascii_case("yaml") || e.eq_ignore_ascii_case("yml"));
    if path.is_dir() {
        return Some(Config::load(path).map(|config| config.quota_specs()));
    }
    if !yaml || looks_like_a_quota_file(path) {
        return None;
    }
    Some(Config::load(path).map(|config| config.quota_specs()))
}

/// A YAML file whose top level has `quotas` and no `domain`.
fn looks_like_a_quota_file(path: &Path) -> bool {
    let Ok(Node::Map(top)) = std::fs::read_to_string(path)
        .map_err(|e| e.to_string())
        .and_then(|text| Node::parse(&text))
    else {
        return false;
    };
    let has = |name: &str| {
        top.iter()
            .any(|(k, _)| matches!(k, Node::Str(s) if s == name))
    };
    has("quotas") && !has("domain")
}

fn error(file: &str, problem: impl Into<String>) -> ConfigError {
    ConfigError {
        file: file.to_string(),
        problem: problem.into(),
    }
}

/// Parses one file into its domain.
pub fn parse_file(file: &str, text: &str) -> Result<Domain, ConfigError> {
    let root =
        Node::parse(text).map_err(|e| error(file, format!("error loading config file: {e}")))?;
    let map = match &root {
        Node::Map(map) => map.as_slice(),
        Node::Null => &[],
        other => {
            return Err(error(
                file,
                format!(
                    "error loading config file: the document is {}, not a map",
                    other.kind()
                ),
            ))
        }
    };
    check_keys(file, map)?;
    let fields = Fields { file, map };
    let name = fields.text("domain")?.unwrap_or_default();
    if name.is_empty() {
        return Err(error(file, "config file cannot have empty domain"));
    }
    let mut root = Level::default();
    let mut at = Place {
        file,
        domain: &name,
        path: Vec::new(),
        varies: false,
    };
    load_level(
        &mut at,
        &format!("{name}."),
        fields.list("descriptors")?,
        &mut root,
    )?;
    Ok(Domain {
        name,
        file: file.to_string(),
        root,
    })
}

/// envoyproxy/ratelimit's key check: every key of every map is a string
/// from the known set, and every list item is a map (`metadata` is the
/// user's and not checked).
fn check_keys(file: &str, map: &[(Node, Node)]) -> Result<(), ConfigError> {
    for (key, value) in map {
        let Node::Str(key) = key else {
            return Err(error(
                file,
                format!("config error, key is not of type string: {key}"),
            ));
        };
        if !RATELIMIT_KEYS.contains(&key.as_str()) && !SLUICE_KEYS.contains(&key.as_str()) {
            return Err(error(file, format!("config error, unknown key '{key}'")));
        }
        if key == "metadata" {
            continue;
        }
        match value {
            Node::Seq(items) => {
                for item in items {
                    let Node::Map(inner) = item else {
                        return Err(error(
                            file,
                            format!(
                                "config error, yaml file contains list of type other than map: {item}"
                            ),
                        ));
                    };
                    check_keys(file, inner)?;
                }
            }
            Node::Map(inner) => check_keys(file, inner)?,
            _ => {}
        }
    }
    Ok(())
}

/// The fields of one map, read with envoyproxy/ratelimit's types.
struct Fields<'a> {
    file: &'a str,
    map: &'a [(Node, Node)],
}

impl<'a> Fields<'a> {
    fn get(&self, name: &str) -> Option<&'a Node> {
        self.map
            .iter()
            .find(|(k, _)| matches!(k, Node::Str(s) if s == name))
            .map(|(_, v)| v)
    }

    fn type_error(&self, name: &str, node: &Node, wanted: &str) -> ConfigError {
        error(
            self.file,
            format!(
                "error loading config file: {name}: cannot unmarshal {} `{node}` into {wanted}",
                node.kind()
            ),
        )
    }

    fn text(&self, name: &str) -> Result<Option<String>, ConfigError> {
        match self.get(name) {
            None => Ok(None),
            Some(node) => node
                .as_text()
                .map(Some)
                .ok_or_else(|| self.type_error(name, node, "a string")),
        }
    }

    fn flag(&self, name: &str) -> Result<bool, ConfigError> {
        match self.get(name) {
            None | Some(Node::Null) => Ok(false),
            Some(Node::Bool(b, _)) => Ok(*b),
            // YAML 1.1's booleans, which envoyproxy/ratelimit's parser takes.
            Some(Node::Str(s))
                if matches!(s.as_str(), "yes" | "Yes" | "YES" | "on" | "On" | "ON") =>
            {
                Ok(true)
            }
            Some(Node::Str(s))
                if matches!(s.as_str(), "no" | "No" | "NO" | "off" | "Off" | "OFF") =>
            {
                Ok(false)
            }
            Some(node) => Err(self.type_error(name, node, "a boolean")),
        }
    }

    fn uint32(&self, name: &str) -> Result<Option<u32>, ConfigError> {
        match self.get(name) {
            None | Some(Node::Null) => Ok(None),
            Some(node @ Node::Int(i, _)) => u32::try_from(*i)
                .map(Some)
                .map_err(|_| self.type_error(name, node, "uint32")),
            Some(node) => Err(self.type_error(name, node, "uint32")),
        }
    }

    fn number(&self, name: &str) -> Result<Option<f64>, ConfigError> {
        match self.get(name) {
            None | Some(Node::Null) => Ok(None),
            Some(Node::Int(i, _)) if *i >= 0 => Ok(Some(*i as f64)),
            Some(Node::Float(f, _)) if *f >= 0.0 && f.is_finite() => Ok(Some(*f)),
            Some(node) => Err(self.type_error(name, node, "a number of requests")),
        }
    }

    fn list(&self, name: &str) -> Result<&'a [Node], ConfigError> {
        match self.get(name) {
            None | Some(Node::Null) => Ok(&[]),
            Some(Node::Seq(items)) => Ok(items),
            Some(node) => Err(self.type_error(name, node, "a list")),
        }
    }

    fn map(&self, name: &str) -> Result<Option<&'a [(Node, Node)]>, ConfigError> {
        match self.get(name) {
            None | Some(Node::Null) => Ok(None),
            Some(Node::Map(map)) => Ok(Some(map)),
            Some(node) => Err(self.type_error(name, node, "a map")),
        }
    }
}

fn as_map<'a>(file: &str, node: &'a Node) -> Result<&'a [(Node, Node)], ConfigError> {
    match node {
        Node::Map(map) => Ok(map),
        // check_keys refused these already; kept for a direct caller.
        other => Err(error(
            file,
            format!("config error, yaml file contains list of type other than map: {other}"),
        )),
    }
}

/// Where the loader is: the file, the domain, the descriptors above.
struct Place<'a> {
    file: &'a str,
    domain: &'a str,
    /// `(key, value)` of each descriptor above, the value empty when none.
    path: Vec<(String, String)>,
    /// Some descriptor above picks the counter by its request value.
    varies: bool,
}

fn load_level(
    at: &mut Place<'_>,
    parent_key: &str,
    items: &[Node],
    level: &mut Level,
) -> Result<(), ConfigError> {
    let file = at.file;
    for item in items {
        let fields = Fields {
            file,
            map: as_map(file, item)?,
        };
        let key = fields.text("key")?.unwrap_or_default();
        if key.is_empty() {
            return Err(error(file, "descriptor has empty key"));
        }
        let value_text = fields.text("value")?.unwrap_or_default();
        let composite = if value_text.is_empty() {
            key.clone()
        } else {
            format!("{key}_{value_text}")
        };
        let full_key = format!("{parent_key}{composite}");
        let taken = level
            .descriptors
            .iter()
            .any(|d| d.key == key && d.value.text() == value_text);
        if taken {
            return Err(error(
                file,
                format!("duplicate descriptor composite key '{full_key}'"),
            ));
        }
        let value = if value_text.is_empty() {
            Value::Any
        } else if value_text.contains('*') {
            Value::Pattern(value_text)
        } else {
            Value::Exact(value_text)
        };
        let mut limits = Vec::new();
        if let Some(map) = fields.map("rate_limit")? {
            limits.push(load_limit(file, map)?);
        }
        for item in fields.list("rate_limits")? {
            limits.push(load_limit(file, as_map(file, item)?)?);
        }
        let mut descriptor = Descriptor {
            key,
            value,
            limits,
            quotas: Vec::new(),
            children: Level::default(),
            shadow_mode: fields.flag("shadow_mode")?,
            quota_mode: fields.flag("quota_mode")?,
            detailed_metric: fields.flag("detailed_metric")?,
            value_to_metric: fields.flag("value_to_metric")?,
            share_threshold: fields.flag("share_threshold")?,
            metadata: fields.get("metadata").map(Node::to_json),
            full_key,
            stats: Arc::default(),
        };
        let varies = at.varies || descriptor.value_varies();
        at.path
            .push((descriptor.key.clone(), descriptor.value.text().to_string()));
        let path: Vec<(&str, &str)> = at
            .path
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        descriptor.quotas = quotas_of(at.domain, &path, varies, &descriptor.limits)
            .map_err(|problem| error(file, problem))?;
        let outer = std::mem::replace(&mut at.varies, varies);
        let loaded = load_level(
            at,
            &format!("{}.", descriptor.full_key),
            fields.list("descriptors")?,
            &mut descriptor.children,
        );
        at.varies = outer;
        at.path.pop();
        loaded?;
        level.descriptors.push(descriptor);
    }
    Ok(())
}

fn load_limit(file: &str, map: &[(Node, Node)]) -> Result<Limit, ConfigError> {
    let fields = Fields { file, map };
    let unlimited = fields.flag("unlimited")?;
    let unit_text = fields.text("unit")?.unwrap_or_default();
    let unit = Unit::parse(&unit_text);
    if unlimited {
        if unit.is_some() {
            return Err(error(
                file,
                "should not specify rate limit unit when unlimited",
            ));
        }
    } else if unit.is_none() {
        return Err(error(
            file,
            format!("invalid rate limit unit '{unit_text}'"),
        ));
    }
    let name = fields.text("name")?.unwrap_or_default();
    let mut replaces = Vec::new();
    for item in fields.list("replaces")? {
        let entry = Fields {
            file,
            map: as_map(file, item)?,
        };
        let replaced = entry.text("name")?.unwrap_or_default();
        if replaced.is_empty() {
            return Err(error(file, "should not have an empty replaces entry"));
        }
        if replaced == name {
            return Err(error(
                file,
                "replaces should not contain name of same descriptor",
            ));
        }
        replaces.push(replaced);
    }
    let units = fields.uint32("units")?.unwrap_or(1);
    if units == 0 {
        return Err(error(file, "units must be at least 1"));
    }
    let extension = Extension {
        sliding: fields.flag("sliding")?,
        units,
        leaky: fields.flag("leaky")?,
        low_burst: fields.number("low_burst")?,
        high_burst: fields.number("high_burst")?,
    };
    if extension.sliding && extension.leaky {
        return Err(error(file, "a limit is either sliding or leaky, not both"));
    }
    if (extension.low_burst.is_some() || extension.high_burst.is_some()) && !extension.leaky {
        return Err(error(
            file,
            "low_burst and high_burst belong to a leaky limit (leaky: true)",
        ));
    }
    Ok(Limit {
        requests_per_unit: fields.uint32("requests_per_unit")?.unwrap_or(0),
        unit,
        unlimited,
        name,
        replaces,
        extension,
    })
}
