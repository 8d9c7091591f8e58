//! Names and weights as they arrive from outside: quota names (the rule,
//! the table's name words, lookups of arbitrary bytes), key hashes as
//! operators write them, window names, key secrets, and checks through the
//! C ABI with any name, key and weight.
#![no_main]
use std::collections::HashSet;
use std::ffi::c_char;
use std::sync::atomic::AtomicU64;
use std::sync::Once;

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use sluice::core::key::{format_hash, parse_hash, KeySecret};
use sluice::core::quota::{is_name_byte, validate_name, MAX_NAME_LEN};
use sluice::core::{Quota, Window};
use sluice::ffi;
use sluice::table::{names, Outcome, Table};

#[derive(Arbitrary, Debug)]
struct Input {
    /// Candidate quota names.
    names: Vec<Vec<u8>>,
    /// Checks: name, key, weight.
    checks: Vec<(Vec<u8>, Vec<u8>, u64)>,
    /// A key hash or window name as text; a key secret file.
    text: String,
}

/// The quota name rule, written out: 1 to 255 bytes of
/// `[A-Za-z0-9_.:-]`, not `.` or `..`.
fn reference_valid(name: &str) -> bool {
    (1..=MAX_NAME_LEN).contains(&name.len())
        && name != "."
        && name != ".."
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_.:-".contains(&b))
}

fn words_of(name: &[u8]) -> Vec<AtomicU64> {
    (0..name.len().div_ceil(8))
        .map(|_| AtomicU64::new(0))
        .collect()
}

/// The C ABI's process-wide limiter, standalone, with three quotas.
fn c_abi() {
    static INIT: Once = Once::new();
    INIT.call_once(|| unsafe {
        let config = c"{\"capacity\": 64, \"avg_name_bytes\": 16}";
        assert_eq!(ffi::sluice_init(config.as_ptr()), ffi::SLUICE_PASS);
        let quotas = c"[{\"name\": \"api\", \"limit\": 1000, \"high_burst\": 2000},
            {\"name\": \"api_user\", \"parent\": \"api\", \"limit\": 10, \"per_key\": true},
            {\"name\": \"a\", \"parent\": \"api\", \"limit\": 0, \"low_burst\": 0}]";
        assert_eq!(
            ffi::sluice_load_quotas_json(quotas.as_ptr()),
            ffi::SLUICE_PASS
        );
    });
}

fuzz_target!(|input: Input| {
    // The name rule.
    let mut valid = Vec::new();
    for name in &input.names {
        let text = std::str::from_utf8(name);
        if let Ok(text) = text {
            let ok = validate_name(text).is_ok();
            assert_eq!(ok, reference_valid(text), "{text:?}");
            if ok {
                valid.push(text.to_string());
            }
        }
        assert_eq!(
            name.iter().all(|&b| is_name_byte(b)),
            name.iter()
                .all(|&b| b.is_ascii_alphanumeric() || b"_.:-".contains(&b))
        );
        // Name words: what is stored loads back, and only it compares
        // equal.
        let words = words_of(name);
        names::store(&words, name);
        assert_eq!(&names::load(&words, name.len()), name);
        let mut out = [0u8; 300];
        if name.len() <= out.len() {
            assert_eq!(
                names::load_into(&words, name.len(), &mut out),
                Some(name.len())
            );
            assert_eq!(&out[..name.len()], &name[..]);
        }
        assert!(names::equals(&words, name));
        if let Some(last) = name.len().checked_sub(1) {
            let mut other = name.clone();
            other[last] ^= 1;
            assert!(!names::equals(&words, &other));
        }
        assert_eq!(names::hash(name), names::hash(&name.clone()));
    }

    // A table holding the valid names: each found, named back, checked;
    // anything else unknown.
    let mut seen = HashSet::new();
    valid.retain(|n| seen.insert(n.clone()));
    valid.truncate(64);
    if !valid.is_empty() {
        let longest = valid.iter().map(String::len).max().unwrap_or(1);
        let table = Table::new_heap(valid.len() as u32, longest);
        let quotas: Vec<Quota> = valid
            .iter()
            .enumerate()
            .map(|(i, n)| Quota::new(i as u64 + 1, n.as_str(), 10.0, 20.0, 40.0))
            .collect();
        let report = table.books().apply_quotas(&quotas);
        assert!(
            report.refused.is_empty() && report.inserted == valid.len(),
            "{report:?}"
        );
        let kept: HashSet<&str> = valid.iter().map(String::as_str).collect();
        let mut out = [0u8; 256];
        for n in &valid {
            let slot = table
                .gate()
                .lookup(n.as_bytes())
                .expect("inserted name found");
            assert_eq!(table.name_into(slot, &mut out), Some(n.as_bytes()));
        }
        for (name, _, weight) in &input.checks {
            let outcome = table.gate().check(name, *weight, 1_000);
            let known = std::str::from_utf8(name).is_ok_and(|n| kept.contains(n));
            assert_eq!(outcome == Outcome::Unknown, !known, "{name:?}: {outcome:?}");
        }
    }

    // Key hashes as operators write them, windows, key secrets.
    if let Some(hash) = parse_hash(&input.text) {
        assert_ne!(hash, 0);
        assert!(
            format_hash(hash).eq_ignore_ascii_case(&input.text),
            "{:?} read as {hash:#x}",
            input.text
        );
    }
    if let Some(window) = Window::parse(&input.text) {
        assert_eq!(window.name(), input.text);
        assert_eq!(Window::from_code(window.code()), Some(window));
    }
    if let Ok(secret) = KeySecret::from_file_contents(input.text.as_bytes()) {
        assert_ne!(secret.hash(input.text.as_bytes()), 0);
    }

    // The C ABI: any bytes and weight get an answer, never an error (a
    // panic inside would be one, if the fuzzer's hook let it get there).
    c_abi();
    for (name, key, weight) in input.checks.iter().take(8) {
        let code =
            unsafe { ffi::sluice_check(name.as_ptr().cast::<c_char>(), name.len(), *weight) };
        // A name or key longer than any quota's is refused before it is
        // read: the one error a check gives for its bytes.
        if name.len() > ffi::SLUICE_MAX_NAME_LEN {
            assert_eq!(code, ffi::SLUICE_ERROR, "{name:?}");
            continue;
        }
        assert!(
            [
                ffi::SLUICE_PASS,
                ffi::SLUICE_REJECT,
                ffi::SLUICE_UNKNOWN,
                ffi::SLUICE_NO_KEY
            ]
            .contains(&code),
            "{name:?}: {code}"
        );
        let known = [&b"api"[..], b"api_user", b"a"].contains(&name.as_slice());
        assert_eq!(code == ffi::SLUICE_UNKNOWN, !known, "{name:?}: {code}");
        let code = unsafe {
            ffi::sluice_check_key(
                name.as_ptr().cast::<c_char>(),
                name.len(),
                key.as_ptr().cast::<c_char>(),
                key.len(),
                *weight,
            )
        };
        assert_eq!(
            code == ffi::SLUICE_ERROR,
            key.len() > ffi::SLUICE_MAX_KEY_LEN,
            "{name:?} {key:?}"
        );
        if name == b"api_user" && key.is_empty() {
            assert_eq!(code, ffi::SLUICE_NO_KEY);
        }
    }
});
