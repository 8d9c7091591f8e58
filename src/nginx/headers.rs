//! The rate-limit response header values (`Retry-After`, the IETF
//! `RateLimit-Policy` and `RateLimit` fields), written into a stack buffer
//! so the request path does not allocate. Pure: tested without nginx.

use std::fmt::{self, Write};

use crate::core::key::KeySecret;
use crate::core::{Room, Wait};

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

/// How the `RateLimit-Policy` and `RateLimit` fields name the quota
/// (`sluice_headers on names=...`). A quota's name can tell a client more
/// than its numbers (a tenant, a plan, a bucket), which the console hides
/// from anyone without the admin token.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum PolicyNames {
    /// `names=on`: the quota's name.
    #[default]
    Quota,
    /// `names=hash`: 16 hex digits of a keyed hash of the name under the
    /// fleet's key secret: the same on every host of a fleet, and not
    /// computable from a guessed name without the secret (with the
    /// built-in secret anyone who knows sluice can).
    Hash,
    /// `names=off`: every policy is named `quota`.
    Off,
}

impl PolicyNames {
    /// The value of `names=`.
    pub fn parse(word: &[u8]) -> Option<Self> {
        match word {
            b"on" => Some(Self::Quota),
            b"hash" => Some(Self::Hash),
            b"off" => Some(Self::Off),
            _ => None,
        }
    }

    /// The name the fields give quota `quota`, written into `buf` when it
    /// is not the quota's own.
    pub fn show<'a>(self, quota: &'a str, secret: KeySecret, buf: &'a mut HeaderValue) -> &'a str {
        match self {
            Self::Quota => quota,
            Self::Off => "quota",
            Self::Hash => {
                let id = policy_secret(secret).hash(quota.as_bytes());
                match write!(buf, "{id:016x}") {
                    Ok(()) => buf.as_str(),
                    Err(_) => "quota",
                }
            }
        }
    }
}

/// The secret policy names are hashed with: derived from the key secret
/// (a keyed hash of fixed text under it), so a policy id never equals the
/// hash a key of the same text is counted under.
fn policy_secret(secret: KeySecret) -> KeySecret {
    KeySecret::from_words(
        secret.hash(b"sluice RateLimit policy name, first word"),
        secret.hash(b"sluice RateLimit policy name, second word"),
    )
}

/// Whole seconds for `Retry-After`: rounded up, at least 1; `None` when
/// waiting cannot help (the header is left out).
pub fn retry_after_secs(wait: Wait) -> Option<u64> {
    match wait {
        // `Wait` bounds the seconds (a year at most), so the cast is exact.
        Wait::Seconds(seconds) => Some((seconds.ceil() as u64).max(1)),
        Wait::Never(_) => None,
    }
}

/// What the `RateLimit` field's `t` (reset) says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reset {
    /// The seconds until the bucket is empty again (a window quota: until
    /// its window ends), estimated from the quota.
    Estimated,
    /// A rejection's `Retry-After` seconds (the draft: `Retry-After` must
    /// not point earlier than the reset).
    RetryAfter(u64),
    /// A rejection that waiting cannot help: no `t` at all. The draft's
    /// `t` is optional and means "more quota then"; any value would invite
    /// a retry that cannot pass.
    Never,
}

/// The IETF `RateLimit-Policy` and `RateLimit` field values
/// (draft-ietf-httpapi-ratelimit-headers) for the tightest quota `name`.
///
/// A leaky bucket maps onto the draft's quota-per-window as: `q` = the
/// low burst (what passes with certainty from an empty bucket), `w` = the
/// seconds an empty bucket takes to refill that much room (`low_burst /
/// limit`, at least 1); `r` = the room left, `t` as `reset` says: the
/// seconds until the bucket is empty again, a rejection's `Retry-After`,
/// or nothing when waiting cannot help. A window quota is the draft's own
/// case: `w` is its window (this month's length for `month`), `t` the
/// seconds to the window's end.
pub fn rate_limit_fields(name: &str, h: &Room, reset: Reset) -> Option<(HeaderValue, HeaderValue)> {
    let mut policy = HeaderValue::default();
    let mut state = HeaderValue::default();
    let window = h.period();
    let reset = match (reset, h.seconds_to_empty()) {
        (Reset::Never, _) => None,
        (Reset::RetryAfter(secs), _) => Some(secs as f64),
        (Reset::Estimated, t) if t.is_finite() => Some(t.ceil()),
        (Reset::Estimated, _) => Some(window),
    };
    write!(
        policy,
        "\"{name}\";q={};w={}",
        h.low_burst.floor() as u64,
        window as u64
    )
    .ok()?;
    write!(state, "\"{name}\";r={}", h.remaining().floor() as u64).ok()?;
    if let Some(reset) = reset {
        write!(state, ";t={}", reset as u64).ok()?;
    }
    Some((policy, state))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rate_limit_fields_describe_the_bucket() {
        let h = Room {
            limit: 10.0,
            low_burst: 25.0,
            high_burst: 50.0,
            level: 7.5,
            window: None,
        };
        let (policy, state) = rate_limit_fields("s3_b_read", &h, Reset::Estimated).unwrap();
        assert_eq!(policy.as_str(), "\"s3_b_read\";q=25;w=3");
        assert_eq!(state.as_str(), "\"s3_b_read\";r=17;t=1");
        let frozen = Room {
            limit: 0.0,
            level: 5.0,
            window: None,
            ..h
        };
        let (policy, state) = rate_limit_fields("q", &frozen, Reset::Estimated).unwrap();
        assert_eq!(policy.as_str(), "\"q\";q=25;w=86400");
        assert_eq!(state.as_str(), "\"q\";r=20;t=86400");
        let (_, state) = rate_limit_fields("q", &h, Reset::RetryAfter(4)).unwrap();
        assert_eq!(state.as_str(), "\"q\";r=17;t=4");
        assert_eq!(retry_after_secs(Wait::Seconds(0.0)), Some(1));
        assert_eq!(retry_after_secs(Wait::Seconds(0.2)), Some(1));
        assert_eq!(retry_after_secs(Wait::Seconds(2.1)), Some(3));
    }

    /// The case: a rejection that can never pass said `t=0` (its
    /// bucket was empty), inviting an immediate retry.
    #[test]
    fn a_rejection_waiting_cannot_help_has_no_reset() {
        let empty = Room {
            limit: 0.001,
            low_burst: 10.0,
            high_burst: 10.0,
            level: 0.0,
            window: None,
        };
        let (policy, state) = rate_limit_fields("api", &empty, Reset::Never).unwrap();
        assert_eq!(policy.as_str(), "\"api\";q=10;w=10000");
        assert_eq!(state.as_str(), "\"api\";r=10");
    }

    #[test]
    fn policy_names_show_the_name_a_keyed_hash_or_nothing() {
        let secret = KeySecret::from_file_contents(b"0123456789abcdef0123").unwrap();
        let other = KeySecret::from_file_contents(b"another secret of a fleet").unwrap();
        let show = |names: PolicyNames, quota: &str, secret| {
            let mut buf = HeaderValue::default();
            names.show(quota, secret, &mut buf).to_string()
        };
        assert_eq!(show(PolicyNames::Quota, "s3_photos", secret), "s3_photos");
        assert_eq!(show(PolicyNames::Off, "s3_photos", secret), "quota");
        let id = show(PolicyNames::Hash, "s3_photos", secret);
        assert_eq!(id.len(), 16);
        assert!(id.bytes().all(|b| b.is_ascii_hexdigit()), "{id}");
        // Stable for a fleet, different per quota and per secret.
        assert_eq!(show(PolicyNames::Hash, "s3_photos", secret), id);
        assert_ne!(show(PolicyNames::Hash, "s3_videos", secret), id);
        assert_ne!(show(PolicyNames::Hash, "s3_photos", other), id);
        // Not the hash a key "s3_photos" is counted under.
        assert_ne!(format!("{:016x}", secret.hash(b"s3_photos")), id);
        assert_eq!(PolicyNames::parse(b"hash"), Some(PolicyNames::Hash));
        assert_eq!(PolicyNames::parse(b"on"), Some(PolicyNames::Quota));
        assert_eq!(PolicyNames::parse(b"off"), Some(PolicyNames::Off));
        assert_eq!(PolicyNames::parse(b"yes"), None);
    }

    #[test]
    fn no_retry_after_when_waiting_cannot_help() {
        let never = |w| {
            retry_after_secs(
                Room {
                    limit: 1.0,
                    low_burst: 10.0,
                    high_burst: 20.0,
                    level: 5.0,
                    window: None,
                }
                .wait(w),
            )
        };
        // The cases: Retry-After 1099511627726 for a weight of 2^40
        // over a burst of 20, and u64::MAX for an inflated level.
        assert_eq!(never(crate::core::quota::MAX_WEIGHT as f64), None);
        assert_eq!(never(21.0), None);
        let inflated = Room {
            limit: 10.0,
            low_burst: 10.0,
            high_burst: 20.0,
            level: 9e20,
            window: None,
        };
        assert_eq!(retry_after_secs(inflated.wait(1.0)), None);
        assert_eq!(never(20.0), Some(5));
    }
}
