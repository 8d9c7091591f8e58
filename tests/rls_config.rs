//! `sluice rls`'s configuration loader: every load error envoyproxy/ratelimit
//! raises, each naming the file and the problem, and files written for it
//! loaded unchanged.

mod rls_support;

use sluice::core::Window;
use sluice::rls::config::{Config, ConfigError, Value};
use sluice::rls::limit::Unit;

fn load(text: &str) -> Result<Config, ConfigError> {
    Config::from_texts([("limits.yaml", text)])
}

fn problem(text: &str) -> String {
    let error = load(text).expect_err("the file should be refused");
    assert_eq!(error.file, "limits.yaml");
    assert!(error.to_string().starts_with("limits.yaml: "), "{error}");
    error.problem
}

#[test]
fn bad_yaml_is_refused_with_the_parser_message() {
    let p = problem("domain: d\ndescriptors: [\n");
    assert!(p.starts_with("error loading config file: "), "{p}");
}

#[test]
fn a_value_of_the_wrong_type_is_a_yaml_error() {
    let p = problem(
        "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: ten}\n",
    );
    assert!(
        p.starts_with("error loading config file: requests_per_unit"),
        "{p}"
    );
    let p = problem(
        "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: -1}\n",
    );
    assert!(p.contains("uint32"), "{p}");
}

#[test]
fn an_unknown_key_is_refused() {
    assert_eq!(
        problem("domain: d\ndescriptors:\n  - key: k\n    rate_limitt: {}\n"),
        "config error, unknown key 'rate_limitt'"
    );
}

#[test]
fn a_key_that_is_not_a_string_is_refused() {
    assert_eq!(
        problem("domain: d\n5: x\n"),
        "config error, key is not of type string: 5"
    );
}

#[test]
fn a_list_item_that_is_not_a_map_is_refused() {
    assert_eq!(
        problem("domain: d\ndescriptors:\n  - just_a_string\n"),
        "config error, yaml file contains list of type other than map: just_a_string"
    );
}

#[test]
fn an_empty_domain_is_refused() {
    assert_eq!(
        problem("descriptors:\n  - key: k\n"),
        "config file cannot have empty domain"
    );
    assert_eq!(
        problem("domain: ''\n"),
        "config file cannot have empty domain"
    );
}

#[test]
fn an_empty_key_is_refused() {
    assert_eq!(
        problem("domain: d\ndescriptors:\n  - value: v\n"),
        "descriptor has empty key"
    );
}

#[test]
fn a_duplicate_composite_key_is_refused_with_its_full_key() {
    let text = "domain: d
descriptors:
  - key: k
    descriptors:
      - key: user
        value: alice
      - key: user
        value: alice
";
    assert_eq!(
        problem(text),
        "duplicate descriptor composite key 'd.k.user_alice'"
    );
    assert_eq!(
        problem("domain: d\ndescriptors:\n  - key: k\n  - key: k\n"),
        "duplicate descriptor composite key 'd.k'"
    );
}

#[test]
fn an_unknown_unit_is_refused() {
    assert_eq!(
        problem("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n"),
        "invalid rate limit unit 'fortnight'"
    );
    assert_eq!(
        problem("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {requests_per_unit: 1}\n"),
        "invalid rate limit unit ''"
    );
}

#[test]
fn a_unit_with_unlimited_is_refused() {
    assert_eq!(
        problem("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unlimited: true, unit: second}\n"),
        "should not specify rate limit unit when unlimited"
    );
}

#[test]
fn replaces_naming_itself_or_nothing_is_refused() {
    assert_eq!(
        problem(
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      name: a\n      unit: second\n      requests_per_unit: 1\n      replaces: [{name: a}]\n"
        ),
        "replaces should not contain name of same descriptor"
    );
    assert_eq!(
        problem(
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: second\n      requests_per_unit: 1\n      replaces: [{name: ''}]\n"
        ),
        "should not have an empty replaces entry"
    );
}

#[test]
fn a_domain_in_two_files_is_refused_naming_the_second() {
    let error = Config::from_texts([("a.yaml", "domain: d\n"), ("b.yaml", "domain: d\n")])
        .expect_err("duplicate domain");
    assert_eq!(error.file, "b.yaml");
    assert_eq!(error.problem, "duplicate domain 'd' in config file");
}

#[test]
fn a_directory_holds_one_domain_per_file_and_a_bad_one_names_its_path() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("a.yaml"), "domain: one\n").unwrap();
    std::fs::write(dir.path().join("b.yml"), "domain: two\n").unwrap();
    std::fs::write(dir.path().join(".hidden.yaml"), "not: [valid\n").unwrap();
    std::fs::write(dir.path().join("notes.txt"), "ignored").unwrap();
    let config = Config::load(dir.path()).unwrap();
    let mut names: Vec<&str> = config.domains.keys().map(String::as_str).collect();
    names.sort();
    assert_eq!(names, ["one", "two"]);

    std::fs::write(dir.path().join("c.yaml"), "domain: one\n").unwrap();
    let error = Config::load(dir.path()).unwrap_err();
    assert!(error.file.ends_with("c.yaml"), "{error}");
    assert_eq!(error.problem, "duplicate domain 'one' in config file");
}

#[test]
fn sluice_keys_are_what_envoyproxy_ratelimit_would_refuse() {
    for key in sluice::rls::config::SLUICE_KEYS {
        assert!(!sluice::rls::config::RATELIMIT_KEYS.contains(&key), "{key}");
    }
}

/// A file in envoyproxy/ratelimit's documented shape using every key it
/// knows loads unchanged.
#[test]
fn a_file_with_every_ratelimit_key_loads() {
    let text = r#"
domain: edge
descriptors:
  # A default per address, and one address blocked.
  - key: remote_address
    rate_limit:
      unit: Second
      requests_per_unit: 10
  - key: remote_address
    value: 50.0.0.5
    rate_limit: {unit: SECOND, requests_per_unit: 0}
  - key: path
    value: "/files/*"
    share_threshold: true
    detailed_metric: true
    value_to_metric: true
    rate_limit: {unit: hour, requests_per_unit: 100}
  - key: internal
    rate_limit:
      unlimited: true
  - key: tenant
    quota_mode: true
    metadata:
      backend: primary
      weight: 3
    rate_limit: {unit: day, requests_per_unit: 1000}
  - key: service
    descriptors:
      - key: user
        value: user-a
        shadow_mode: true
        rate_limit: {requests_per_unit: 10, unit: minute, name: specific}
      - key: user
        value: user-b
        rate_limit:
          requests_per_unit: 20
          unit: week
          replaces:
            - name: specific
  - key: tier
    value: 7
    rate_limit: {unit: month, requests_per_unit: 5}
  - key: plan
    rate_limit: {unit: year, requests_per_unit: 5}
"#;
    let config = load(text).unwrap();
    let edge = &config.domains["edge"];
    assert_eq!(edge.root.descriptors.len(), 8);
    let addr = edge.root.find("remote_address", "50.0.0.5").unwrap();
    assert_eq!(addr.limits[0].requests_per_unit, 0);
    let any = edge.root.find("remote_address", "10.1.1.1").unwrap();
    assert_eq!(any.value, Value::Any);
    assert_eq!(any.limits[0].unit, Some(Unit::Second));
    let files = edge.root.find("path", "/files/a.pdf").unwrap();
    assert!(files.share_threshold && files.detailed_metric && files.value_to_metric);
    assert_eq!(
        edge.root.find("tier", "7").unwrap().limits[0].unit,
        Some(Unit::Month)
    );
    let tenant = edge.root.find("tenant", "t1").unwrap();
    assert!(tenant.quota_mode);
    assert_eq!(tenant.metadata.as_ref().unwrap()["weight"], 3);
    let service = edge.root.find("service", "s").unwrap();
    let b = service.children.find("user", "user-b").unwrap();
    assert_eq!(b.limits[0].replaces, ["specific"]);
    assert!(service.children.find("user", "user-a").unwrap().shadow_mode);
    // Every limit with a count became a valid quota; week, month and
    // year count in the epoch-aligned windows of their length.
    let specs = config.quota_specs();
    assert_eq!(specs.len(), 8);
    let window_of = |name: &str| specs.iter().find(|s| s.name == name).unwrap().window;
    assert_eq!(
        window_of("rls.edge.service.user:user-b"),
        Some(Window::EpochWeek)
    );
    assert_eq!(window_of("rls.edge.tier:7"), Some(Window::Days30));
    assert_eq!(window_of("rls.edge.plan"), Some(Window::Days365));
}

#[test]
fn matching_takes_the_exact_value_then_patterns_in_file_order_then_the_key() {
    let text = r#"
domain: d
descriptors:
  - key: path
    value: "/a/*/x*"
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: path
    value: "/a/*"
    rate_limit: {unit: second, requests_per_unit: 2}
  - key: path
    value: "/a/b/xyz"
    rate_limit: {unit: second, requests_per_unit: 3}
  - key: path
    rate_limit: {unit: second, requests_per_unit: 4}
"#;
    let config = load(text).unwrap();
    let root = &config.domains["d"].root;
    let rpu = |v: &str| root.find("path", v).unwrap().limits[0].requests_per_unit;
    assert_eq!(rpu("/a/b/xyz"), 3);
    assert_eq!(rpu("/a/b/xy"), 1);
    assert_eq!(rpu("/a/b/y"), 2);
    assert_eq!(rpu("/b"), 4);
}

#[test]
fn a_period_without_a_window_says_which_exist() {
    let p = problem(
        "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, units: 5, requests_per_unit: 1}\n",
    );
    assert!(p.starts_with("no window of 5 x minute"), "{p}");
    load("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, units: 5, leaky: true, requests_per_unit: 1}\n")
        .unwrap();
    load("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, units: 10, requests_per_unit: 1}\n")
        .unwrap();
}

/// Scalars YAML reads as booleans or numbers are strings as written where
/// a string goes, as Go's YAML hands them to envoyproxy/ratelimit.
#[test]
fn keys_and_values_that_look_like_booleans_or_numbers_keep_their_text() {
    let text = "domain: d
descriptors:
  - key: y
    value: 1.10
    rate_limit: {unit: hour, requests_per_unit: 1}
  - key: on
    value: 010
    shadow_mode: yes
    rate_limit: {unit: hour, requests_per_unit: 1}
";
    let config = load(text).unwrap();
    let root = &config.domains["d"].root;
    let y = root.find("y", "1.10").expect("key 'y', value '1.10'");
    assert_eq!(y.full_key, "d.y_1.10");
    let on = root.find("on", "010").expect("key 'on', value '010'");
    assert!(on.shadow_mode);
    assert!(root.find("true", "1.1").is_none());
}

/// Every ratelimit file docs/envoy.md shows loads (its Envoy bootstrap is
/// validated by a real Envoy in tests/rls_envoy.rs).
#[test]
fn the_yaml_files_of_docs_envoy_md_load() {
    let blocks = rls_support::yaml_blocks(include_str!("../docs/envoy.md"), "domain:");
    assert!(blocks.len() >= 2, "the YAML blocks were not found");
    for block in blocks {
        let config = load(block).unwrap_or_else(|e| panic!("{e}\n{block}"));
        assert!(!config.quota_specs().is_empty(), "{block}");
    }
}
