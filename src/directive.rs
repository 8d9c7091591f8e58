//! The nginx module's pure parts: directive arguments as nginx users write
//! them, request weights, and the rate-limit response header values.
//!
//! Kept out of `nginx/` (which only builds against an nginx tree) so that
//! `cargo test` covers them.

use std::fmt::{self, Write};

use crate::core::quota::MAX_WEIGHT;
use crate::table::Headroom;

/// Parses an nginx size: `64k`, `32m`, `1g` or bytes.
pub fn parse_size(arg: &[u8]) -> Option<usize> {
    let (digits, unit) = match arg.last()? {
        b'k' | b'K' => (&arg[..arg.len() - 1], 1usize << 10),
        b'm' | b'M' => (&arg[..arg.len() - 1], 1 << 20),
        b'g' | b'G' => (&arg[..arg.len() - 1], 1 << 30),
        _ => (arg, 1),
    };
    parse_u64(digits)
        .and_then(|n| usize::try_from(n).ok())
        .and_then(|n| n.checked_mul(unit))
}

/// Parses an nginx time into milliseconds: one number and one unit (`ms`,
/// `s`, `m`, `h`); a bare number is seconds.
pub fn parse_time_ms(arg: &[u8]) -> Option<u64> {
    let split = arg
        .iter()
        .position(|b| !b.is_ascii_digit())
        .unwrap_or(arg.len());
    let (digits, unit) = arg.split_at(split);
    let per = match unit {
        b"ms" => 1,
        b"" | b"s" => 1000,
        b"m" => 60_000,
        b"h" => 3_600_000,
        _ => return None,
    };
    parse_u64(digits)?.checked_mul(per)
}

/// Parses a plain decimal number (no sign, no spaces).
pub fn parse_u64(digits: &[u8]) -> Option<u64> {
    if digits.is_empty() {
        return None;
    }
    digits.iter().try_fold(0u64, |n, &b| {
        if b.is_ascii_digit() {
            n.checked_mul(10)?.checked_add(u64::from(b - b'0'))
        } else {
            None
        }
    })
}

/// Checks a quota root URL: `http://` or `https://`, a host, and nothing
/// after the authority but an optional `/`. Returns it without that `/`.
pub fn parse_root_url(arg: &[u8]) -> Result<String, String> {
    let url = std::str::from_utf8(arg).map_err(|_| "is not UTF-8".to_string())?;
    let rest = url
        .strip_prefix("http://")
        .or_else(|| url.strip_prefix("https://"))
        .ok_or("must start with \"http://\" or \"https://\"")?;
    let authority = rest.strip_suffix('/').unwrap_or(rest);
    if authority.is_empty() {
        return Err("has no host".into());
    }
    if authority.contains(['/', '?', '#', ' ', '@']) {
        return Err("must be a base URL (scheme, host and port only)".into());
    }
    if let Some((_, port)) = authority.rsplit_once(':') {
        if !authority.ends_with(']') && port.parse::<u16>().map_or(true, |p| p == 0) {
            return Err(format!("has an invalid port \"{port}\""));
        }
    }
    Ok(url.trim_end_matches('/').to_string())
}

/// Parses `sluice_sync_early <fraction> [rate=<n>]`: the share of a
/// quota's burst band (0 < f <= 1) whose unsent weight starts a sync
/// early, and the most early syncs per second (default 4, at most 100).
pub fn parse_early_sync(args: &[&[u8]]) -> Result<crate::sync::EarlySync, String> {
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    let fraction = std::str::from_utf8(args.first().copied().unwrap_or_default())
        .ok()
        .and_then(|s| s.parse::<f64>().ok())
        .filter(|f| *f > 0.0 && *f <= 1.0)
        .ok_or_else(|| {
            format!(
                "invalid fraction \"{}\": must be a number above 0 and at most 1",
                text(args.first().copied().unwrap_or_default())
            )
        })?;
    let mut max_per_second = 4.0;
    for arg in &args[1..] {
        let rate = arg
            .strip_prefix(b"rate=")
            .ok_or_else(|| format!("invalid parameter \"{}\"", text(arg)))?;
        max_per_second = parse_u64(rate)
            .filter(|r| (1..=100).contains(r))
            .ok_or_else(|| {
                format!(
                    "invalid rate \"{}\": must be 1 to 100 per second",
                    text(rate)
                )
            })? as f64;
    }
    Ok(crate::sync::EarlySync {
        fraction,
        max_per_second,
    })
}

/// Checks a limiter id (`sluice_host_id`): 1 to 255 printable ASCII bytes.
pub fn parse_host_id(arg: &[u8]) -> Result<String, String> {
    if arg.is_empty() || arg.len() > 255 {
        return Err("must be 1 to 255 bytes long".into());
    }
    if !arg.iter().all(|b| b.is_ascii_graphic()) {
        return Err("must be printable ASCII without spaces".into());
    }
    Ok(String::from_utf8_lossy(arg).into_owned())
}

/// Parses `on` / `off`.
pub fn parse_flag(arg: &[u8]) -> Option<bool> {
    match arg {
        b"on" => Some(true),
        b"off" => Some(false),
        _ => None,
    }
}

/// A fixed weight as written in `weight=<n>`: at most 2^40.
pub fn parse_weight(arg: &[u8]) -> Result<u64, String> {
    match parse_u64(arg) {
        Some(w) if w <= MAX_WEIGHT => Ok(w),
        Some(_) => Err(format!("must be at most {MAX_WEIGHT}")),
        None => Err("must be a non-negative integer or a variable".into()),
    }
}

/// A weight taken from a variable's value at request time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RuntimeWeight {
    /// A number (capped at 2^40). An empty value is 0: a request without
    /// a body has no `$content_length`, and is checked without counting.
    Units(u64),
    /// Not a number: the caller logs it and checks without counting.
    Invalid,
}

/// Reads a weight from a variable's value.
pub fn runtime_weight(value: &[u8]) -> RuntimeWeight {
    if value.is_empty() {
        return RuntimeWeight::Units(0);
    }
    if !value.iter().all(u8::is_ascii_digit) {
        return RuntimeWeight::Invalid;
    }
    // All digits: only overflow fails, and that is over the cap anyway.
    RuntimeWeight::Units(parse_u64(value).unwrap_or(u64::MAX).min(MAX_WEIGHT))
}

/// What `$sluice_status` says about a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum RequestStatus {
    /// Not checked (no `sluice` directive applied).
    Unchecked = 0,
    /// Every quota had room; the weight was counted.
    Passed = 1,
    /// Over a quota: answered with `sluice_status`.
    Rejected = 2,
    /// Over a quota, let through by `sluice_dry_run on`.
    RejectedDryRun = 3,
    /// No quota had any of the names: passed uncounted.
    Unknown = 4,
}

impl RequestStatus {
    /// The variable's value; empty when unchecked.
    pub fn as_str(self) -> &'static str {
        match self {
            RequestStatus::Unchecked => "",
            RequestStatus::Passed => "PASSED",
            RequestStatus::Rejected => "REJECTED",
            RequestStatus::RejectedDryRun => "REJECTED_DRY_RUN",
            RequestStatus::Unknown => "UNKNOWN",
        }
    }
}

/// A small text buffer on the stack for header values (no heap on the
/// request path).
pub struct HeaderValue {
    buf: [u8; 384],
    len: usize,
}

impl Default for HeaderValue {
    fn default() -> Self {
        Self {
            buf: [0; 384],
            len: 0,
        }
    }
}

impl HeaderValue {
    /// The text written so far.
    pub fn as_str(&self) -> &str {
        // Only `write_str` fills the buffer, with whole `&str`s.
        std::str::from_utf8(&self.buf[..self.len]).unwrap_or("")
    }
}

impl Write for HeaderValue {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        let end = self.len + s.len();
        if end > self.buf.len() {
            return Err(fmt::Error);
        }
        self.buf[self.len..end].copy_from_slice(s.as_bytes());
        self.len = end;
        Ok(())
    }
}

/// Whole seconds for `Retry-After`: rounded up, at least 1; `None` when
/// waiting cannot help (a zero limit).
pub fn retry_after_secs(seconds: f64) -> Option<u64> {
    if !seconds.is_finite() {
        return None;
    }
    Some((seconds.ceil() as u64).max(1))
}

/// The IETF `RateLimit-Policy` and `RateLimit` field values
/// (draft-ietf-httpapi-ratelimit-headers) for the tightest quota `name`.
///
/// A leaky bucket maps onto the draft's quota-per-window as: `q` = the
/// low burst (what passes with certainty from an empty bucket), `w` = the
/// seconds an empty bucket takes to refill that much room (`low_burst /
/// limit`, at least 1); `r` = the room left, `t` = the seconds until the
/// bucket is empty again, or `retry` (the `Retry-After` of a rejection).
pub fn rate_limit_fields(
    name: &str,
    h: &Headroom,
    retry: Option<u64>,
) -> Option<(HeaderValue, HeaderValue)> {
    let mut policy = HeaderValue::default();
    let mut state = HeaderValue::default();
    let window = if h.limit > 0.0 {
        (h.low_burst / h.limit).ceil().max(1.0)
    } else {
        // Nothing leaks: the window is "forever"; say a day.
        86_400.0
    };
    let reset = match (retry, h.seconds_to_empty()) {
        (Some(secs), _) => secs as f64,
        (None, t) if t.is_finite() => t.ceil(),
        (None, _) => window,
    };
    write!(
        policy,
        "\"{name}\";q={};w={}",
        h.low_burst.floor() as u64,
        window as u64
    )
    .ok()?;
    write!(
        state,
        "\"{name}\";r={};t={}",
        h.remaining().floor() as u64,
        reset as u64
    )
    .ok()?;
    Some((policy, state))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_and_times_parse_as_nginx_writes_them() {
        assert_eq!(parse_size(b"64k"), Some(64 << 10));
        assert_eq!(parse_size(b"32M"), Some(32 << 20));
        assert_eq!(parse_size(b"1000"), Some(1000));
        assert_eq!(parse_size(b"m"), None);
        assert_eq!(parse_size(b"-1m"), None);
        assert_eq!(parse_time_ms(b"200ms"), Some(200));
        assert_eq!(parse_time_ms(b"2s"), Some(2000));
        assert_eq!(parse_time_ms(b"3"), Some(3000));
        assert_eq!(parse_time_ms(b"1m"), Some(60_000));
        assert_eq!(parse_time_ms(b"1x"), None);
        assert_eq!(parse_time_ms(b"s"), None);
        assert_eq!(parse_u64(b"18446744073709551616"), None);
    }

    #[test]
    fn root_urls_are_base_urls() {
        assert_eq!(
            parse_root_url(b"http://127.0.0.1:7070/").unwrap(),
            "http://127.0.0.1:7070"
        );
        assert!(parse_root_url(b"https://root.example").is_ok());
        assert!(parse_root_url(b"http://[::1]:7070").is_ok());
        for bad in [
            &b"ftp://x"[..],
            b"127.0.0.1:7070",
            b"http://",
            b"http://x/v1/sync",
            b"http://x:0",
            b"http://x:99999",
        ] {
            assert!(
                parse_root_url(bad).is_err(),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[test]
    fn weights_from_variables_cap_default_and_flag_garbage() {
        assert_eq!(runtime_weight(b""), RuntimeWeight::Units(0));
        assert_eq!(runtime_weight(b"1234"), RuntimeWeight::Units(1234));
        assert_eq!(
            runtime_weight(b"99999999999999999999999"),
            RuntimeWeight::Units(MAX_WEIGHT)
        );
        assert_eq!(runtime_weight(b"-5"), RuntimeWeight::Invalid);
        assert_eq!(runtime_weight(b"1.5"), RuntimeWeight::Invalid);
        assert_eq!(parse_weight(b"10"), Ok(10));
        assert!(parse_weight(b"$x").is_err());
        assert!(parse_weight(b"1099511627777").is_err());
    }

    #[test]
    fn rate_limit_fields_describe_the_bucket() {
        let h = Headroom {
            item: 0,
            depth: 0,
            slot: 0,
            limit: 10.0,
            low_burst: 25.0,
            level: 7.5,
        };
        let (policy, state) = rate_limit_fields("s3_b_read", &h, None).unwrap();
        assert_eq!(policy.as_str(), "\"s3_b_read\";q=25;w=3");
        assert_eq!(state.as_str(), "\"s3_b_read\";r=17;t=1");
        let frozen = Headroom {
            limit: 0.0,
            level: 5.0,
            ..h
        };
        let (policy, state) = rate_limit_fields("q", &frozen, None).unwrap();
        assert_eq!(policy.as_str(), "\"q\";q=25;w=86400");
        assert_eq!(state.as_str(), "\"q\";r=20;t=86400");
        let (_, state) = rate_limit_fields("q", &h, Some(4)).unwrap();
        assert_eq!(state.as_str(), "\"q\";r=17;t=4");
        assert_eq!(retry_after_secs(0.2), Some(1));
        assert_eq!(retry_after_secs(2.1), Some(3));
        assert_eq!(retry_after_secs(f64::INFINITY), None);
    }

    #[test]
    fn early_sync_takes_a_fraction_and_a_rate() {
        let e = parse_early_sync(&[b"0.02"]).unwrap();
        assert_eq!((e.fraction, e.max_per_second), (0.02, 4.0));
        let e = parse_early_sync(&[b"0.5", b"rate=10"]).unwrap();
        assert_eq!((e.fraction, e.max_per_second), (0.5, 10.0));
        assert!(parse_early_sync(&[b"0"]).is_err());
        assert!(parse_early_sync(&[b"1.5"]).is_err());
        assert!(parse_early_sync(&[b"x"]).is_err());
        assert!(parse_early_sync(&[b"0.1", b"rate=0"]).is_err());
        assert!(parse_early_sync(&[b"0.1", b"burst=3"]).is_err());
    }

    #[test]
    fn host_ids_are_printable() {
        assert!(parse_host_id(b"web-01.dc1").is_ok());
        assert!(parse_host_id(b"").is_err());
        assert!(parse_host_id(b"a b").is_err());
    }
}
