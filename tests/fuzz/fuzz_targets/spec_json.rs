//! JSON quota files: `specs_from_json`, `QuotaSet::new`, `load_set`.
#![no_main]
use libfuzzer_sys::fuzz_target;
use sluice::core::spec::{specs_from_json, SpecError};

mod spec_common;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let parsed = specs_from_json(text).map_err(|e| match e {
        SpecError::Parse(e) => e,
        other => panic!("parsing alone gave {other:?}"),
    });
    spec_common::check_specs(text, parsed);
});
