//! The JSON given to `sluice_init`, parsed and checked whole before
//! anything starts: every field follows the rule nginx's `sluice_*`
//! directive for it follows (the sync settings through
//! [`SyncConfig::validate`], the extrapolation through
//! [`Extrapolation::validate`]), and an error names the JSON key.

use std::time::Duration;

use serde::Deserialize;

use crate::core::key::KeySecret;
use crate::core::object::{optional_object, Object};
use crate::core::quota::MAX_NAME_LEN;
use crate::core::{Extrapolation, ValidationError};
use crate::sync::SyncConfig;
use crate::table::layout::MAX_CAPACITY;
use crate::table::KeyOverflow;

/// One entry of `roots`: a base URL (in group 0), or a URL with its root
/// group.
#[derive(Debug, Deserialize)]
#[serde(
    untagged,
    expecting = "a root URL or {\"url\": \"http://...\", \"group\": n}"
)]
enum RootEntry {
    /// `"http://10.0.0.1:7070"`.
    Url(String),
    /// `{"url": "http://10.0.0.1:7070", "group": 1}` (an object only).
    Grouped(Object<GroupedRoot>),
}

/// A root URL with its group.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct GroupedRoot {
    url: String,
    #[serde(default)]
    group: u32,
}

impl RootEntry {
    fn split(self) -> (String, u32) {
        match self {
            RootEntry::Url(url) => (url, 0),
            RootEntry::Grouped(Object(g)) => (g.url, g.group),
        }
    }
}

/// Limiter configuration, from the JSON given to `sluice_init`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct Config {
    /// Quotas the table can hold.
    capacity: u32,
    /// Average quota name length the name space is sized for.
    avg_name_bytes: usize,
    /// Keys of per-key quotas the table holds at once.
    key_capacity: u64,
    /// File holding the fleet's key secret (keys are hashed with it).
    key_secret_file: Option<String>,
    /// What a check does with a key that finds no entry: `shared`,
    /// `reject` or `pass`.
    key_overflow: Option<String>,
    /// What a check of a per-key quota without a key does: `pass` (the
    /// default) or `reject`.
    no_key: Option<String>,
    /// Overrides of per-key templates' keys and penalties the table holds.
    override_capacity: u64,
    /// Quota roots: URLs (group 0), or `{"url": ..., "group": n}`; none
    /// for standalone.
    roots: Vec<RootEntry>,
    /// Sync interval in milliseconds.
    sync_interval_ms: u64,
    /// Timeout of one sync request (default: 80% of the interval).
    sync_timeout_ms: Option<u64>,
    /// Bearer token the roots require for `/v1/sync`.
    sync_token: Option<String>,
    /// This limiter's id at the roots (default: the host name).
    limiter_id: Option<String>,
    /// How levels are extrapolated between syncs.
    #[serde(deserialize_with = "optional_object")]
    extrapolation: Option<Extrapolation>,
    /// Sync early when a quota's unsent weight passes a share of its band.
    #[serde(deserialize_with = "optional_object")]
    early_sync: Option<crate::sync::EarlySync>,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            capacity: 100_000,
            avg_name_bytes: 32,
            key_capacity: 100_000,
            key_secret_file: None,
            key_overflow: None,
            no_key: None,
            override_capacity: DEFAULT_OVERRIDE_CAPACITY,
            roots: Vec::new(),
            sync_interval_ms: 1000,
            sync_timeout_ms: None,
            sync_token: None,
            limiter_id: None,
            extrapolation: None,
            early_sync: None,
        }
    }
}

/// `override_capacity` when not given: room for ten thousand overrides
/// and penalties (about 1 MiB).
pub(super) const DEFAULT_OVERRIDE_CAPACITY: u64 = 10_000;

/// A checked configuration: what the limiter is built from.
#[derive(Debug)]
pub(super) struct Settings {
    /// Quotas the table holds (1 to [`MAX_CAPACITY`]).
    pub capacity: u32,
    /// Average quota name length (1 to [`MAX_NAME_LEN`]).
    pub avg_name_bytes: usize,
    /// Keys of per-key quotas held at once.
    pub key_capacity: u64,
    /// The fleet's key secret, when a file gave one.
    pub key_secret: Option<KeySecret>,
    /// What a check does with a key that finds no entry.
    pub key_overflow: KeyOverflow,
    /// A check of a per-key quota without a key is rejected (`no_key`
    /// `reject`), not passed uncounted.
    pub no_key_rejects: bool,
    /// Overrides and penalties the table holds.
    pub override_capacity: u64,
    /// How levels are extrapolated between syncs.
    pub extrapolation: Extrapolation,
    /// The sync thread's configuration, validated.
    pub sync: SyncConfig,
}

impl Settings {
    /// Parses and checks `sluice_init`'s JSON (`None`: the defaults),
    /// reading the key secret file it names.
    pub fn from_json(json: Option<&str>) -> Result<Self, String> {
        // An object only: `[1, 2]` would be read by position.
        let config: Config = match json {
            Some(text) => serde_json::from_str::<Object<Config>>(text)
                .map_err(|e| format!("invalid config JSON: {e}"))?
                .into_inner(),
            None => Config::default(),
        };
        let invalid = |e: ValidationError| format!("invalid config: {}", config_field(e));
        let extrapolation = config.extrapolation.unwrap_or(Extrapolation::Adaptive);
        extrapolation.validate().map_err(invalid)?;
        validate_table(config.capacity, config.avg_name_bytes).map_err(invalid)?;
        let (roots, root_groups) = config.roots.into_iter().map(RootEntry::split).unzip();
        let sync = SyncConfig {
            roots,
            root_groups,
            interval: Duration::from_millis(config.sync_interval_ms),
            timeout: config.sync_timeout_ms.map(Duration::from_millis),
            token: config.sync_token,
            limiter_id: config
                .limiter_id
                .unwrap_or_else(crate::sync::default_limiter_id),
            early_sync: config.early_sync,
            ..SyncConfig::default()
        };
        sync.validate().map_err(invalid)?;
        crate::table::geometry::check_key_capacity(config.key_capacity)
            .map_err(|why| format!("key_capacity: {why}"))?;
        let key_overflow = match config.key_overflow.as_deref() {
            None => KeyOverflow::default(),
            Some(word) => KeyOverflow::parse(word).ok_or_else(|| {
                format!("key_overflow: {word:?} is not one of \"shared\", \"reject\", \"pass\"")
            })?,
        };
        let no_key_rejects = match config.no_key.as_deref() {
            None | Some("pass") => false,
            Some("reject") => true,
            Some(word) => {
                return Err(format!(
                    "no_key: {word:?} is not one of \"pass\", \"reject\""
                ))
            }
        };
        crate::table::geometry::check_tier_capacity(config.override_capacity)
            .map_err(|why| format!("override_capacity: {why}"))?;
        let key_secret = match &config.key_secret_file {
            Some(path) => {
                let contents =
                    std::fs::read(path).map_err(|e| format!("key_secret_file {path:?}: {e}"))?;
                Some(
                    KeySecret::from_file_contents(&contents)
                        .map_err(|why| format!("key_secret_file {path:?} {why}"))?,
                )
            }
            None => None,
        };
        Ok(Self {
            capacity: config.capacity,
            avg_name_bytes: config.avg_name_bytes,
            key_capacity: config.key_capacity,
            key_secret,
            key_overflow,
            no_key_rejects,
            override_capacity: config.override_capacity,
            extrapolation,
            sync,
        })
    }
}

/// Checks the table's size: 1 to [`MAX_CAPACITY`] quotas, names of 1 to
/// [`MAX_NAME_LEN`] bytes on average (the table would otherwise clamp
/// them silently, and a table of no quota is no limiter).
fn validate_table(capacity: u32, avg_name_bytes: usize) -> Result<(), ValidationError> {
    if !(1..=MAX_CAPACITY).contains(&capacity) {
        return Err(ValidationError::new(
            "capacity",
            format!("{capacity} is not 1 to {MAX_CAPACITY} quotas"),
        ));
    }
    if !(1..=MAX_NAME_LEN).contains(&avg_name_bytes) {
        return Err(ValidationError::new(
            "avg_name_bytes",
            format!("{avg_name_bytes} is not 1 to {MAX_NAME_LEN} bytes"),
        ));
    }
    Ok(())
}

/// A configuration error in the C ABI's words: the JSON key names the
/// field (`interval` is `sync_interval_ms`, and so on).
fn config_field(e: ValidationError) -> String {
    let key = match e.field {
        "interval" => "sync_interval_ms",
        "timeout" => "sync_timeout_ms",
        "token" => "sync_token",
        "limiter" => "limiter_id",
        "root_groups" => "roots",
        "ratio" => "extrapolation.ratio",
        other => other,
    };
    format!("{key}: {}", e.message)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn roots_of(json: &str) -> Result<(Vec<String>, Vec<u32>), String> {
        let config: Config = serde_json::from_str(json).map_err(|e| e.to_string())?;
        Ok(config.roots.into_iter().map(RootEntry::split).unzip())
    }

    /// The error `sluice_init` gives for `json`.
    fn refused(json: &str) -> String {
        Settings::from_json(Some(json)).unwrap_err()
    }

    #[test]
    fn roots_are_urls_or_urls_with_their_group() {
        let (urls, groups) = roots_of(r#"{"roots": ["http://a:1", "http://b:1"]}"#).unwrap();
        assert_eq!((urls.len(), groups), (2, vec![0, 0]));
        let (urls, groups) =
            roots_of(r#"{"roots": ["http://a:1", {"url": "http://b:1", "group": 1}]}"#).unwrap();
        assert_eq!(urls, vec!["http://a:1", "http://b:1"]);
        assert_eq!(groups, vec![0, 1]);
        let err = roots_of(r#"{"roots": [{"url": "http://b:1", "grup": 1}]}"#).unwrap_err();
        assert!(err.contains("a root URL or"), "{err}");
        // A gap is refused by the shared check, naming `roots`.
        let (roots, root_groups) =
            roots_of(r#"{"roots": [{"url": "http://b:1", "group": 1}]}"#).unwrap();
        let e = SyncConfig {
            roots,
            root_groups,
            ..SyncConfig::default()
        }
        .validate()
        .unwrap_err();
        assert_eq!(config_field(e).split(':').next(), Some("roots"));
    }

    #[test]
    fn the_defaults_are_valid() {
        let settings = Settings::from_json(None).unwrap();
        assert_eq!(settings.capacity, 100_000);
        assert_eq!(settings.extrapolation, Extrapolation::Adaptive);
        assert!(Settings::from_json(Some("{}")).is_ok());
    }

    #[test]
    fn a_table_of_no_quota_or_beyond_the_largest_is_refused() {
        assert!(refused(r#"{"capacity": 0}"#).starts_with("invalid config: capacity: 0 is not"));
        let over = format!(r#"{{"capacity": {}}}"#, MAX_CAPACITY + 1);
        assert!(refused(&over).contains("capacity:"));
        let most = format!(r#"{{"capacity": {MAX_CAPACITY}}}"#);
        assert_eq!(
            Settings::from_json(Some(&most)).unwrap().capacity,
            MAX_CAPACITY
        );
    }

    #[test]
    fn average_names_must_be_lengths_a_name_can_have() {
        assert!(refused(r#"{"avg_name_bytes": 0}"#).contains("avg_name_bytes: 0 is not"));
        assert!(refused(r#"{"avg_name_bytes": 256}"#).contains("avg_name_bytes: 256 is not"));
        assert!(Settings::from_json(Some(r#"{"avg_name_bytes": 255}"#)).is_ok());
    }

    #[test]
    fn a_negative_or_infinite_ratio_is_refused_naming_the_key() {
        let e = refused(r#"{"extrapolation": {"mode": "constant_ratio", "ratio": -1}}"#);
        assert!(
            e.starts_with("invalid config: extrapolation.ratio: -1 is not"),
            "{e}"
        );
        assert!(Settings::from_json(Some(
            r#"{"extrapolation": {"mode": "constant_ratio", "ratio": 0.5}}"#
        ))
        .is_ok());
    }

    #[test]
    fn a_sync_token_must_be_one_printable_token() {
        for bad in [r#""""#, r#""a b""#, r#""a\nb""#, r#""tok\u00e9n""#] {
            let e = refused(&format!(r#"{{"sync_token": {bad}}}"#));
            assert!(e.starts_with("invalid config: sync_token: "), "{bad}: {e}");
        }
        assert!(Settings::from_json(Some(r#"{"sync_token": "s3cr3t-T0ken"}"#)).is_ok());
    }

    #[test]
    fn a_missing_key_passes_unless_no_key_says_reject() {
        assert!(!Settings::from_json(None).unwrap().no_key_rejects);
        let pass = Settings::from_json(Some(r#"{"no_key": "pass"}"#)).unwrap();
        assert!(!pass.no_key_rejects);
        let reject = Settings::from_json(Some(r#"{"no_key": "reject"}"#)).unwrap();
        assert!(reject.no_key_rejects);
        let e = refused(r#"{"no_key": "deny"}"#);
        assert!(e.starts_with("no_key: \"deny\" is not one of"), "{e}");
    }

    #[test]
    fn overrides_have_room_unless_told_otherwise() {
        let settings = Settings::from_json(None).unwrap();
        assert_eq!(settings.override_capacity, DEFAULT_OVERRIDE_CAPACITY);
        let none = Settings::from_json(Some(r#"{"override_capacity": 0}"#)).unwrap();
        assert_eq!(none.override_capacity, 0);
        let e = refused(r#"{"override_capacity": 1000000000000}"#);
        assert!(e.starts_with("override_capacity: "), "{e}");
    }

    #[test]
    fn a_config_is_an_object_never_read_by_position() {
        let object = "expected a JSON object";
        for (bad, says) in [
            ("[1, 2]", object),
            ("[]", object),
            ("7", object),
            (r#"{"extrapolation": ["constant_ratio", 0.5]}"#, object),
            (r#"{"early_sync": [0.5]}"#, object),
            (r#"{"roots": [["http://a:1", 1]]}"#, "a root URL or {"),
        ] {
            let e = refused(bad);
            assert!(
                e.starts_with("invalid config JSON: ") && e.contains(says),
                "{bad}: {e}"
            );
        }
    }

    #[test]
    fn sync_settings_follow_the_shared_rules() {
        assert!(refused(r#"{"sync_interval_ms": 5}"#).contains("sync_interval_ms: "));
        assert!(
            refused(r#"{"sync_interval_ms": 1000, "sync_timeout_ms": 1000}"#)
                .contains("sync_timeout_ms: ")
        );
        assert!(refused(r#"{"limiter_id": "a b"}"#).contains("limiter_id: "));
    }
}
