//! In-flight quotas in the core: what a quota file and a quota accept,
//! and a counter that never leaks.

use super::counter::Tally;
use super::quota::{Quota, ValidationError};
use super::spec::{QuotaSet, SpecError};

fn invalid(json: &str) -> ValidationError {
    match QuotaSet::from_json(json) {
        Err(SpecError::Invalid { error, .. }) => error,
        other => panic!("expected an invalid quota, got {other:?}"),
    }
}

#[test]
fn a_quota_file_takes_an_in_flight_quota_with_its_bursts_at_the_limit() {
    let set = QuotaSet::from_json(
        r#"[{"name": "uploads", "limit": 100, "in_flight": true},
            {"name": "per_client", "limit": 3, "in_flight": true, "per_key": true}]"#,
    )
    .unwrap();
    let quotas = set.to_quotas(1);
    assert!(quotas[0].in_flight && quotas[1].in_flight && quotas[1].per_key);
    assert_eq!((quotas[0].low_burst, quotas[0].high_burst), (100.0, 100.0));
    assert_eq!(quotas[0].leak(), 0.0, "a slot is held until given back");
}

#[test]
fn an_in_flight_limit_is_a_whole_number_of_slots() {
    for limit in ["0", "2.5", "1e13"] {
        let json = format!(r#"[{{"name": "u", "limit": {limit}, "in_flight": true}}]"#);
        assert_eq!(invalid(&json).field, "limit", "{limit}");
    }
}

#[test]
fn an_in_flight_quota_has_no_band_no_window_and_no_parent() {
    let band = invalid(r#"[{"name": "u", "limit": 5, "high_burst": 8, "in_flight": true}]"#);
    assert_eq!(band.field, "high_burst");
    let window = invalid(r#"[{"name": "u", "limit": 5, "window": "1m", "in_flight": true}]"#);
    assert_eq!(window.field, "in_flight");
    let parent = invalid(
        r#"[{"name": "p", "limit": 5}, {"name": "u", "parent": "p", "limit": 5, "in_flight": true}]"#,
    );
    assert_eq!(parent.field, "in_flight");
    let child = invalid(
        r#"[{"name": "u", "limit": 5, "in_flight": true}, {"name": "c", "parent": "u", "limit": 5}]"#,
    );
    assert_eq!(child.field, "parent");
    assert!(child.message.contains("in-flight"), "{}", child.message);
}

#[test]
fn an_in_flight_flag_must_be_a_boolean() {
    let error = QuotaSet::from_json(r#"[{"name": "u", "limit": 5, "in_flight": 1}]"#).unwrap_err();
    assert!(error.to_string().contains("in_flight"), "{error}");
}

#[test]
fn an_in_flight_counter_keeps_its_slots_and_gives_them_back() {
    let q = Quota::new(1, "u", 3.0, 3.0, 3.0).in_flight_if(true);
    q.validate().unwrap();
    let counting = q.counting(0);
    let sec = 1_000_000_000;
    let held = counting.add(Tally::default(), sec, 2.0);
    assert_eq!(counting.current(held, 3600 * sec), 2.0);
    let back = counting.give_back_in(held, None, 3600 * sec, 1.0);
    assert_eq!(counting.current(back, 7200 * sec), 1.0);
}
