//! envoyproxy/ratelimit's limits as sluice quotas: one quota per limit of
//! the configuration, named after its descriptor path, the same on every
//! host and at the roots (`sluice quota apply -f ratelimit.yaml` applies
//! exactly these).
//!
//! - **Names.** `rls.DOMAIN.KEY:VALUE.KEY...`: the domain, then each
//!   descriptor of the path as its key, and `:value` when it has one; a
//!   descriptor's second and later limits (`rate_limits`) end in `:2`,
//!   `:3`. A part with a byte outside `[A-Za-z0-9_-]` (a `/`, a `*`, a
//!   `.`) is written with `_` in its place and the name ends in `::` and
//!   16 hex digits of a hash of the exact path, so two paths never share a
//!   name; so does a name that would pass 255 bytes (cut to fit).
//! - **Keys.** A limit whose path holds a descriptor without a value, or
//!   with a pattern (without `share_threshold`), counts each request value
//!   on its own: a per-key template, keyed by the request's values of
//!   those descriptors (joined by U+001F when there are several).
//! - **Counting.** `requests_per_unit` per `unit` is a window quota of
//!   that unit, aligned to the Unix epoch as envoyproxy/ratelimit's:
//!   second, minute, hour and day in `1s` ... `1d`, a week in
//!   `epoch_week` (604,800 s from the epoch), a month in `30d`, a year
//!   in `365d`. sluice's extensions: `sliding`, `units: N` (where N units
//!   make one of those windows), `leaky` with its band.

use siphasher::sip::SipHasher13;
use std::hash::Hasher;

use crate::core::quota::MAX_NAME_LEN;
use crate::core::spec::QuotaSpec;
use crate::core::Window;

use super::limit::{Limit, Unit};

/// How a limit's quota counts, for what an answer says of it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Counting {
    /// Not counted (`unlimited`).
    Unlimited,
    /// A window quota.
    Window {
        /// The window.
        window: Window,
        /// Sliding.
        sliding: bool,
    },
    /// A leaky bucket of `rate` requests a second.
    Leaky {
        /// Requests a second.
        rate: f64,
    },
}

/// A limit as a quota.
#[derive(Clone, Debug, PartialEq)]
pub struct LimitQuota {
    /// The quota's name.
    pub name: String,
    /// A per-key template, keyed by the request's values.
    pub per_key: bool,
    /// How it counts.
    pub counting: Counting,
}

/// The quota name of limit `index` of the descriptor at the end of `path`
/// (each `(key, value)`, the value empty when none) in `domain`.
pub fn quota_name(domain: &str, path: &[(&str, &str)], index: usize) -> String {
    let mut exact = true;
    let mut name = String::from("rls.");
    push_part(&mut name, domain, &mut exact);
    for (key, value) in path {
        name.push('.');
        push_part(&mut name, key, &mut exact);
        if !value.is_empty() {
            name.push(':');
            push_part(&mut name, value, &mut exact);
        }
    }
    if index > 0 {
        name.push_str(&format!(":{}", index + 1));
    }
    // "::" and 16 hex digits.
    const SUFFIX: usize = 18;
    if exact && name.len() <= MAX_NAME_LEN {
        return name;
    }
    let mut hasher = SipHasher13::new_with_keys(0x736c_7569_6365_726c, 0x7320_7175_6f74_6173);
    hasher.write(domain.as_bytes());
    for (key, value) in path {
        hasher.write_u8(0);
        hasher.write(key.as_bytes());
        hasher.write_u8(0);
        hasher.write(value.as_bytes());
    }
    hasher.write_u64(index as u64);
    name.truncate(MAX_NAME_LEN - SUFFIX);
    format!("{name}::{:016x}", hasher.finish())
}

fn push_part(name: &mut String, part: &str, exact: &mut bool) {
    for b in part.bytes() {
        if b.is_ascii_alphanumeric() || b == b'_' || b == b'-' {
            name.push(b as char);
        } else {
            *exact = false;
            name.push('_');
        }
    }
}

/// The window of `units` × `unit`, where sluice has one: each of these
/// windows starts when the Unix time divides by its length, as
/// envoyproxy/ratelimit's windows of any unit do (a week from Thursday
/// 00:00 UTC, a month of 30 days, a year of 365).
fn window_of(unit: Unit, units: u32) -> Option<Window> {
    Some(match unit.seconds() * u64::from(units) {
        1 => Window::Second,
        10 => Window::TenSeconds,
        60 => Window::Minute,
        3_600 => Window::Hour,
        86_400 => Window::Day,
        604_800 => Window::EpochWeek,
        2_592_000 => Window::Days30,
        31_536_000 => Window::Days365,
        _ => return None,
    })
}

/// How `limit` counts, or why it cannot.
pub fn counting_of(limit: &Limit) -> Result<Counting, String> {
    let Some(unit) = limit.unit.filter(|_| !limit.unlimited) else {
        return Ok(Counting::Unlimited);
    };
    let ext = limit.extension;
    if ext.leaky {
        let period = unit.seconds() as f64 * f64::from(ext.units);
        return Ok(Counting::Leaky {
            rate: f64::from(limit.requests_per_unit) / period,
        });
    }
    match window_of(unit, ext.units) {
        Some(window) => Ok(Counting::Window {
            window,
            sliding: ext.sliding,
        }),
        None => Err(format!(
            "no window of {} x {}: windows of 1 and 10 seconds, a minute, an hour, a day, a \
             week, 30 days and 365 days exist (`units` may express them, as 60 seconds or 7 \
             days); any other period is a leaky bucket (`leaky: true`)",
            ext.units,
            unit.name().to_ascii_lowercase()
        )),
    }
}

/// The quota spec of a limit.
pub fn spec_of(quota: &LimitQuota, limit: &Limit) -> Option<QuotaSpec> {
    let rpu = f64::from(limit.requests_per_unit);
    match quota.counting {
        Counting::Unlimited => None,
        Counting::Window { window, sliding } => Some(QuotaSpec {
            per_key: quota.per_key,
            window: Some(window),
            sliding,
            ..QuotaSpec::new(quota.name.clone(), rpu)
        }),
        Counting::Leaky { rate } => {
            let low = limit.extension.low_burst.unwrap_or(rpu);
            Some(QuotaSpec {
                per_key: quota.per_key,
                low_burst: Some(low),
                high_burst: Some(limit.extension.high_burst.unwrap_or(low)),
                ..QuotaSpec::new(quota.name.clone(), rate)
            })
        }
    }
}

/// The quotas of a descriptor's limits, given its path; a limit that
/// cannot count is the file's error (the problem, which the loader names
/// the file with).
pub(super) fn quotas_of(
    domain: &str,
    path: &[(&str, &str)],
    varies: bool,
    limits: &[Limit],
) -> Result<Vec<LimitQuota>, String> {
    limits
        .iter()
        .enumerate()
        .map(|(i, limit)| {
            let counting = counting_of(limit)?;
            let quota = LimitQuota {
                name: quota_name(domain, path, i),
                per_key: varies,
                counting,
            };
            if let Some(spec) = spec_of(&quota, limit) {
                spec.validate()
                    .map_err(|e| format!("limit of '{}': {e}", quota.name))?;
            }
            Ok(quota)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plain_path_is_its_own_name() {
        assert_eq!(
            quota_name(
                "messaging",
                &[("message_type", "marketing"), ("to_number", "")],
                0
            ),
            "rls.messaging.message_type:marketing.to_number"
        );
        assert_eq!(quota_name("d", &[("k", "")], 1), "rls.d.k:2");
    }

    #[test]
    fn a_path_with_other_bytes_gets_a_hash_so_names_stay_distinct() {
        let a = quota_name("d", &[("path", "/api/*")], 0);
        let b = quota_name("d", &[("path", "_api__")], 0);
        let c = quota_name("d", &[("path", "/api/_")], 0);
        assert!(a.starts_with("rls.d.path:_api__::"), "{a}");
        assert_ne!(a, b);
        assert_ne!(a, c);
        assert!(crate::core::quota::validate_name(&a).is_ok());
    }

    /// Every unit, and every period of N units that is one of the
    /// epoch-aligned windows, counts in that window; other periods have
    /// none.
    #[test]
    fn units_count_in_the_epoch_aligned_window_of_their_length() {
        let cases = [
            (Unit::Second, 1, Some(Window::Second)),
            (Unit::Second, 10, Some(Window::TenSeconds)),
            (Unit::Second, 60, Some(Window::Minute)),
            (Unit::Minute, 1, Some(Window::Minute)),
            (Unit::Minute, 60, Some(Window::Hour)),
            (Unit::Hour, 24, Some(Window::Day)),
            (Unit::Day, 1, Some(Window::Day)),
            (Unit::Week, 1, Some(Window::EpochWeek)),
            (Unit::Day, 7, Some(Window::EpochWeek)),
            (Unit::Second, 604_800, Some(Window::EpochWeek)),
            (Unit::Month, 1, Some(Window::Days30)),
            (Unit::Day, 30, Some(Window::Days30)),
            (Unit::Year, 1, Some(Window::Days365)),
            (Unit::Day, 365, Some(Window::Days365)),
            (Unit::Minute, 5, None),
            (Unit::Week, 2, None),
            (Unit::Month, 12, None),
            (Unit::Year, 2, None),
        ];
        for (unit, units, window) in cases {
            assert_eq!(window_of(unit, units), window, "{units} x {unit:?}");
        }
    }

    /// A year is a window like the others now, sliding too: no leaky
    /// bucket unless the file asks for one.
    #[test]
    fn a_year_is_a_window_of_365_days() {
        let limit = |sliding, leaky| Limit {
            requests_per_unit: 2,
            unit: Some(Unit::Year),
            unlimited: false,
            name: String::new(),
            replaces: Vec::new(),
            extension: super::super::limit::Extension {
                sliding,
                units: 1,
                leaky,
                ..Default::default()
            },
        };
        assert_eq!(
            counting_of(&limit(false, false)),
            Ok(Counting::Window {
                window: Window::Days365,
                sliding: false
            })
        );
        assert_eq!(
            counting_of(&limit(true, false)),
            Ok(Counting::Window {
                window: Window::Days365,
                sliding: true
            })
        );
        assert!(matches!(
            counting_of(&limit(false, true)),
            Ok(Counting::Leaky { .. })
        ));
    }

    #[test]
    fn a_long_path_is_cut_to_a_valid_name() {
        let long = "v".repeat(400);
        let name = quota_name("d", &[("k", &long)], 0);
        assert_eq!(name.len(), MAX_NAME_LEN);
        assert!(crate::core::quota::validate_name(&name).is_ok());
    }
}
