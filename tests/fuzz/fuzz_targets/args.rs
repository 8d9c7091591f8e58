//! The nginx directive arguments (`src/nginx/args.rs` and the zone size
//! check of `src/nginx/zone_size.rs`, pure: no nginx),
//! each against a plain reference or its documented bounds, and the root
//! URL of `sluice_root`.
//!
//! The first byte picks the parser; the rest is the argument (for the
//! several-argument `sluice_sync_early`, split at spaces as nginx does).
#![no_main]
use libfuzzer_sys::fuzz_target;
use sluice::core::quota::MAX_WEIGHT;
use sluice::nginx::args::{
    parse_early_sync, parse_empty_weight, parse_flag, parse_size, parse_time_ms, parse_u64,
    parse_weight, runtime_weight, EmptyWeight, WeightError,
};
use sluice::nginx::zone_size::check_zone_size;
use sluice::sync::config::{parse_root_url, MAX_EARLY_PER_SECOND};

/// A plain decimal number, by the standard library (which also takes a
/// `+`, refused here).
fn reference_u64(arg: &[u8]) -> Option<u64> {
    if arg.is_empty() || !arg.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(arg).ok()?.parse().ok()
}

fn reference_size(arg: &[u8]) -> Option<usize> {
    let (digits, unit): (&[u8], u128) = match arg.last()? {
        b'k' | b'K' => (&arg[..arg.len() - 1], 1 << 10),
        b'm' | b'M' => (&arg[..arg.len() - 1], 1 << 20),
        b'g' | b'G' => (&arg[..arg.len() - 1], 1 << 30),
        _ => (arg, 1),
    };
    let bytes = u128::from(reference_u64(digits)?) * unit;
    usize::try_from(bytes).ok()
}

fn reference_time_ms(arg: &[u8]) -> Option<u64> {
    let digits = arg.iter().take_while(|b| b.is_ascii_digit()).count();
    let per: u128 = match &arg[digits..] {
        b"ms" => 1,
        b"" | b"s" => 1000,
        b"m" => 60_000,
        b"h" => 3_600_000,
        _ => return None,
    };
    u64::try_from(u128::from(reference_u64(&arg[..digits])?) * per).ok()
}

fuzz_target!(|data: &[u8]| {
    let Some((&which, arg)) = data.split_first() else {
        return;
    };
    match which % 8 {
        0 => assert_eq!(parse_u64(arg), reference_u64(arg), "{arg:?}"),
        1 => {
            let size = parse_size(arg);
            assert_eq!(size, reference_size(arg), "{arg:?}");
            if let Some(size) = size {
                let _ = check_zone_size(size, 256 << 10, 3 << 30, Some(8 << 30));
            }
        }
        2 => assert_eq!(parse_time_ms(arg), reference_time_ms(arg), "{arg:?}"),
        3 => match parse_weight(arg) {
            Ok(w) => assert!(w <= MAX_WEIGHT && reference_u64(arg) == Some(w)),
            Err(why) => assert!(reference_u64(arg).is_none_or(|w| w > MAX_WEIGHT), "{why}"),
        },
        4 => {
            match parse_empty_weight(arg) {
                Ok(EmptyWeight::Reject) => assert_eq!(arg, b"reject"),
                Ok(EmptyWeight::Units(w)) => assert_eq!(reference_u64(arg), Some(w)),
                Err(_) => assert!(arg != b"reject"),
            }
            // A request's weight from a variable: digits (capped), empty as
            // configured, anything else refused.
            let empty = EmptyWeight::Units(7);
            let got = runtime_weight(arg, empty);
            if arg.is_empty() {
                assert_eq!(got, Ok(7));
                assert_eq!(
                    runtime_weight(arg, EmptyWeight::Reject),
                    Err(WeightError::Empty)
                );
            } else if arg.iter().all(u8::is_ascii_digit) {
                let capped = reference_u64(arg).map_or(MAX_WEIGHT, |w| w.min(MAX_WEIGHT));
                assert_eq!(got, Ok(capped), "{arg:?}");
            } else {
                assert_eq!(got, Err(WeightError::Invalid), "{arg:?}");
            }
        }
        5 => {
            let args: Vec<&[u8]> = arg
                .split(|&b| b == b' ')
                .filter(|a| !a.is_empty())
                .collect();
            if let Ok(early) = parse_early_sync(&args) {
                assert!(early.fraction > 0.0 && early.fraction <= 1.0, "{early:?}");
                assert!(
                    early.max_per_second >= 1.0 && early.max_per_second <= MAX_EARLY_PER_SECOND,
                    "{early:?}"
                );
            }
        }
        6 => {
            let flag = parse_flag(arg);
            assert_eq!(flag.is_some(), arg == b"on" || arg == b"off");
        }
        _ => {
            if let Ok(url) = parse_root_url(arg) {
                assert!(
                    url.starts_with("http://") || url.starts_with("https://"),
                    "{url}"
                );
                assert!(!url.ends_with('/'), "{url}");
                // What it returns is itself a valid root URL, unchanged.
                assert_eq!(parse_root_url(url.as_bytes()).as_deref(), Ok(url.as_str()));
            }
        }
    }
});
