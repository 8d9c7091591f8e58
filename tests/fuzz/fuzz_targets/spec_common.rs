//! What every parsed quota file must satisfy, JSON or TOML: a parse error
//! is one line with a sane position; a set that parses and validates
//! round-trips through JSON, becomes valid table quotas, and loads into a
//! table (the quota file loader in `src/table/file.rs`) with every quota
//! found by name and a second load of the same file changing nothing.

use sluice::core::quota::MAX_DEPTH;
use sluice::core::spec::{specs_from_json, ParseError, QuotaSet, QuotaSpec, SpecError};
use sluice::table::file::{load_set, FileRole};
use sluice::table::{Outcome, Table};

/// Equal, or a float parse away (serde_json reads floats to within an ulp
/// unless its `float_roundtrip` feature is on).
pub fn close(a: f64, b: f64) -> bool {
    a == b || (a - b).abs() <= 1e-12 * a.abs().max(b.abs())
}

fn close_opt(a: Option<f64>, b: Option<f64>) -> bool {
    match (a, b) {
        (Some(a), Some(b)) => close(a, b),
        (None, None) => true,
        _ => false,
    }
}

pub fn same_spec(a: &QuotaSpec, b: &QuotaSpec) -> bool {
    a.name == b.name
        && a.parent == b.parent
        && close(a.limit, b.limit)
        && close_opt(a.low_burst, b.low_burst)
        && close_opt(a.high_burst, b.high_burst)
        && a.per_key == b.per_key
        && a.window == b.window
        && a.sliding == b.sliding
}

pub fn check_parse_error(text: &str, e: &ParseError) {
    let shown = e.to_string();
    assert!(!shown.contains('\n'), "error spans lines: {shown:?}");
    if e.place.field.is_some() {
        assert!(e.place.index.is_some(), "a field without a quota: {e:?}");
    }
    if let Some(line) = e.place.line {
        let lines = text.split('\n').count();
        assert!(line >= 1 && line <= lines, "line {line} of {lines}: {e:?}");
        assert!(e.place.column.is_some_and(|c| c >= 1), "{e:?}");
    }
}

/// Checks a parse result; `text` is what was parsed.
pub fn check_specs(text: &str, parsed: Result<Vec<QuotaSpec>, ParseError>) {
    let specs = match parsed {
        Ok(specs) => specs,
        Err(e) => return check_parse_error(text, &e),
    };
    // Every quota that validates alone survives JSON (the CLI sends a
    // TOML file to the root as JSON; the root answers in JSON).
    let valid: Vec<QuotaSpec> = specs
        .iter()
        .filter(|s| s.validate().is_ok())
        .cloned()
        .collect();
    let json =
        serde_json::to_string(&serde_json::json!({ "quotas": valid })).expect("valid specs encode");
    let back = match specs_from_json(&json) {
        Ok(back) => back,
        Err(e) => panic!("{json} does not parse back: {e}"),
    };
    assert_eq!(back.len(), valid.len());
    for (a, b) in valid.iter().zip(&back) {
        assert!(same_spec(a, b), "{a:?} came back as {b:?}");
    }

    let set = match QuotaSet::new(specs.clone()) {
        Ok(set) => set,
        Err(SpecError::Invalid { name, error }) => {
            assert!(
                specs.iter().any(|s| s.name == name),
                "error about {name:?}, not in the file: {error}"
            );
            return;
        }
        Err(e) => panic!("QuotaSet::new gave a parse error: {e}"),
    };
    let quotas = set.to_quotas(1);
    for q in &quotas {
        if let Err(e) = q.validate() {
            panic!("{q:?} from a valid set is invalid: {e}");
        }
        // Parents are in the set and chains end within MAX_DEPTH.
        let mut depth = 1;
        let mut cur = q.parent;
        while let Some(p) = cur {
            depth += 1;
            assert!(depth <= MAX_DEPTH, "chain of {} too deep", q.name);
            let parent = quotas.iter().find(|x| x.id == p).expect("parent in set");
            assert!(!parent.per_key, "a template is a parent");
            cur = parent.parent;
        }
    }
    if quotas.is_empty() {
        return;
    }
    let longest = quotas.iter().map(|q| q.name.len()).max().unwrap_or(1);
    let table = Table::new_heap(quotas.len() as u32, longest);
    let first = load_set(&table, &set, FileRole::Authoritative);
    assert!(first.refused.is_empty(), "{:?}", first.refused);
    assert_eq!(first.inserted, quotas.len());
    for q in &quotas {
        let state = table
            .quota(q.name.as_bytes(), 0)
            .expect("loaded quota found");
        assert_eq!(state.quota.parent.is_some(), q.parent.is_some());
        assert!(close(state.quota.limit, q.limit) && state.quota.limit == q.limit);
        assert_eq!(
            (state.quota.low_burst, state.quota.high_burst),
            (q.low_burst, q.high_burst)
        );
        let outcome = table.gate().check(q.name.as_bytes(), 1, 1);
        if q.per_key {
            assert_eq!(outcome, Outcome::NoKey, "{}", q.name);
        } else {
            assert!(
                matches!(outcome, Outcome::Pass | Outcome::Reject(_)),
                "{}: {outcome:?}",
                q.name
            );
        }
    }
    let ids: Vec<u64> = quotas
        .iter()
        .map(|q| table.quota(q.name.as_bytes(), 0).unwrap().quota.id)
        .collect();
    // The same file again (a reload): the same ids, nothing new or gone.
    let again = load_set(&table, &set, FileRole::Authoritative);
    assert!(again.refused.is_empty() && again.inserted == 0 && again.deleted == 0);
    for (q, id) in quotas.iter().zip(ids) {
        assert_eq!(table.quota(q.name.as_bytes(), 0).unwrap().quota.id, id);
    }
    assert_eq!(table.len() as usize, quotas.len());
}
