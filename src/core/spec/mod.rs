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

//!
//! # Layout
//!
//! - `written.rs` — one quota as a user writes it, a patch of some of its
//!   fields, rates with their unit.
//! - `file.rs` — quota files read whole (JSON, TOML) with errors that
//!   name the quota, field and line; [`SpecError`].
//! - `mod.rs` — [`QuotaSet`]: a set checked as a whole; its tests.

use std::collections::HashMap;

use super::quota::{in_flight_as_parent, validate_chain, Quota, ValidationError};

mod file;
mod written;

pub use file::{
    line_column, read_specs, specs_from_json, FileFormat, FilePlace, ParseError, SpecError,
};
#[cfg(feature = "toml")]
pub use file::{specs_from_toml, toml_position};
pub use written::{QuotaPatch, QuotaSpec};

/// A whole set of quotas, checked together: every quota valid, names
/// unique, parents present in the set, chains acyclic and at most
/// [`crate::core::quota::MAX_DEPTH`] deep.
#[derive(Clone, Debug, PartialEq)]
pub struct QuotaSet {
    /// The quotas, in file order.
    pub quotas: Vec<QuotaSpec>,
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
    use crate::core::window::Window;

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
