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

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use super::quota::{validate_chain, validate_name, validate_params, Quota, ValidationError};

/// One quota by name, as a user writes it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QuotaSpec {
    /// Unique quota name.
    pub name: String,
    /// Name of the parent quota, if any.
    #[serde(default)]
    pub parent: Option<String>,
    /// Leak rate, units per second.
    pub limit: f64,
    /// Level up to which everything passes (default: `limit`).
    #[serde(default)]
    pub low_burst: Option<f64>,
    /// Level from which everything is rejected (default: `low_burst`).
    #[serde(default)]
    pub high_burst: Option<f64>,
}

impl QuotaSpec {
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
        validate_params(self.limit, self.low(), self.high())
    }
}

#[derive(Deserialize)]
#[serde(untagged)]
enum SpecFile {
    Wrapped { quotas: Vec<QuotaSpec> },
    Bare(Vec<QuotaSpec>),
}

/// Parses a JSON quota file (wrapped or bare) without checking the quotas,
/// for callers that check them against more than the file (the root merges
/// a file with the quotas it already has).
pub fn specs_from_json(text: &str) -> Result<Vec<QuotaSpec>, SpecError> {
    let file: SpecFile = serde_json::from_str(text).map_err(|e| SpecError::Json(e.to_string()))?;
    match file {
        SpecFile::Wrapped { quotas } | SpecFile::Bare(quotas) => Ok(quotas),
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
    /// The text is not JSON of the expected shape.
    #[error("invalid quota JSON: {0}")]
    Json(String),
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
                id: i as u64 + 1,
                name: q.name.clone(),
                parent: q.parent.as_deref().map(|p| ids[p]),
                limit: q.limit,
                low_burst: q.low(),
                high_burst: q.high(),
                epoch,
                deleted: false,
            })
            .collect()
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
    fn parsing_alone_leaves_parents_unchecked() {
        let specs = specs_from_json(r#"[{"name":"a","parent":"elsewhere","limit":1}]"#).unwrap();
        assert_eq!(specs[0].parent.as_deref(), Some("elsewhere"));
        assert!(matches!(specs_from_json("[1]"), Err(SpecError::Json(_))));
    }

    #[test]
    fn unknown_fields_and_bad_json_are_rejected() {
        assert!(matches!(
            QuotaSet::from_json(r#"[{"name":"a","limit":1,"limt":2}]"#),
            Err(SpecError::Json(_))
        ));
        assert!(matches!(QuotaSet::from_json("{"), Err(SpecError::Json(_))));
    }

    #[test]
    fn depth_nine_is_rejected() {
        let mut qs = vec![QuotaSpec {
            name: "q0".into(),
            parent: None,
            limit: 1.0,
            low_burst: None,
            high_burst: None,
        }];
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
}
