//! TOML quota files: `specs_from_toml` (the same serde visitor as JSON),
//! then what every quota file must satisfy.
#![no_main]
use libfuzzer_sys::fuzz_target;
use sluice::core::spec::specs_from_toml;

mod spec_common;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    spec_common::check_specs(text, specs_from_toml(text));
});
