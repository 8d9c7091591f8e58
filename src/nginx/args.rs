//! Directive arguments as nginx users write them (sizes, times, numbers,
//! flags, weights, early sync), weights read from variables at request
//! time, what `$sluice_status` says, and how the access handler answers a
//! check's outcome ([`Answer`]). Pure: `cargo test` covers it without
//! nginx.

use super::headers::{retry_after_secs, Reset};
use crate::core::quota::MAX_WEIGHT;
use crate::core::Wait;
use crate::sync::config::{EarlySync, MAX_EARLY_PER_SECOND};
use crate::table::{Cause, ManyOutcome, Outcome};

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

/// Longest `wait=` a `sluice` directive accepts: a request held longer
/// than this is better told to come back (`Retry-After`).
pub const MAX_WAIT_MS: u64 = 3_600_000;

/// Parses the value of `wait=` (nginx time syntax: `500ms`, `1s`, `2m`)
/// into nanoseconds; 0 is no waiting (`None`: a plain check).
pub fn parse_wait(arg: &[u8]) -> Result<Option<u64>, String> {
    if arg.first() == Some(&b'-') {
        return Err("must not be negative".into());
    }
    match parse_time_ms(arg) {
        Some(0) => Ok(None),
        Some(ms) if ms <= MAX_WAIT_MS => Ok(Some(ms * 1_000_000)),
        Some(_) => Err("must be at most 1h".into()),
        None => Err("must be a time such as 500ms, 1s or 2m".into()),
    }
}

/// Longest `sluice_wait_coalesce`: a held request is let go at most this
/// much before its turn.
pub const MAX_WAIT_COALESCE_MS: u64 = 1000;

/// Parses `sluice_wait_coalesce <time>` into milliseconds (0 is off).
pub fn parse_wait_coalesce(arg: &[u8]) -> Result<u64, String> {
    if arg.first() == Some(&b'-') {
        return Err("must not be negative".into());
    }
    match parse_time_ms(arg) {
        Some(ms) if ms <= MAX_WAIT_COALESCE_MS => Ok(ms),
        Some(_) => Err("must be at most 1s".into()),
        None => Err("must be a time such as 5ms or 20ms".into()),
    }
}

/// Milliseconds an nginx timer waits for a wait of `ns` nanoseconds:
/// rounded up, so a request never acts before its turn.
pub fn wait_timer_ms(ns: u64) -> u64 {
    ns.div_ceil(1_000_000)
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

/// Parses `sluice_sync_early <fraction> [rate=<n>]`: the share of a
/// quota's burst band (0 < f <= 1) whose unsent weight starts a sync
/// early, and the most early syncs per second (default 4, at most 100).
pub fn parse_early_sync(args: &[&[u8]]) -> Result<EarlySync, String> {
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    let first = args.first().copied().unwrap_or_default();
    let mut early = EarlySync {
        fraction: std::str::from_utf8(first)
            .ok()
            .and_then(|s| s.parse::<f64>().ok())
            .unwrap_or(f64::NAN),
        max_per_second: 4.0,
    };
    let mut rate_arg: &[u8] = b"4";
    // No argument at all (nginx never calls it so) is no fraction.
    for arg in args.get(1..).unwrap_or_default() {
        rate_arg = arg
            .strip_prefix(b"rate=")
            .ok_or_else(|| format!("invalid parameter \"{}\"", text(arg)))?;
        // Whole numbers only, as nginx users write rates.
        early.max_per_second = parse_u64(rate_arg).map_or(f64::NAN, |r| r as f64);
    }
    early.validate().map_err(|e| match e.field {
        "early_sync.fraction" => format!(
            "invalid fraction \"{}\": must be a number above 0 and at most 1",
            text(first)
        ),
        _ => format!(
            "invalid rate \"{}\": must be 1 to {MAX_EARLY_PER_SECOND} per second",
            text(rate_arg)
        ),
    })?;
    Ok(early)
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

/// What an empty weight variable means: the `empty=` parameter of
/// `sluice <name> weight=$var empty=reject|<n>`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EmptyWeight {
    /// Reject the request, as for a value that is not a number (the
    /// default: a client that leaves out its cost header is not let
    /// through uncounted).
    Reject,
    /// Count this many units (`empty=0`: check without counting, for
    /// example `weight=$content_length` on requests without a body).
    Units(u64),
}

/// Parses the value of `empty=`: `reject` or a weight.
pub fn parse_empty_weight(arg: &[u8]) -> Result<EmptyWeight, String> {
    if arg == b"reject" {
        return Ok(EmptyWeight::Reject);
    }
    match parse_u64(arg) {
        Some(w) if w <= MAX_WEIGHT => Ok(EmptyWeight::Units(w)),
        _ => Err(format!(
            "must be \"reject\" or a non-negative integer of at most {MAX_WEIGHT}"
        )),
    }
}

/// Why a request has no weight.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WeightError {
    /// The variable is empty and `empty=reject` (the default).
    Empty,
    /// The value is not a non-negative integer (`abc`, `-1`, `1e3`,
    /// `1.5`, ` 5`).
    Invalid,
}

/// The weight a request carries from its variable's value: a decimal
/// integer (capped at 2^40), an empty value as `empty` says, anything
/// else an error (the caller rejects the request: nothing passes
/// uncounted because a client sent garbage).
pub fn runtime_weight(value: &[u8], empty: EmptyWeight) -> Result<u64, WeightError> {
    if value.is_empty() {
        return match empty {
            EmptyWeight::Units(w) => Ok(w),
            EmptyWeight::Reject => Err(WeightError::Empty),
        };
    }
    if !value.iter().all(u8::is_ascii_digit) {
        return Err(WeightError::Invalid);
    }
    // All digits: only overflow fails, and that is over the cap anyway.
    Ok(parse_u64(value).unwrap_or(u64::MAX).min(MAX_WEIGHT))
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
    /// The quotas are per-key and the key was empty: not checked, not
    /// counted (as `limit_req` does with an empty key).
    NoKey = 5,
    /// Over a quota but within `wait=`: counted, held until its turn
    /// (an nginx timer), then passed.
    Delayed = 6,
    /// As [`RequestStatus::Delayed`], but `sluice_dry_run on` let it
    /// through without holding it (the weight was counted).
    DelayedDryRun = 7,
    /// A per-key quota's key found no entry (the key section is full of
    /// live keys) and the request passed as `sluice_key_overflow` says:
    /// counted on the template's shared counter, or not at all.
    KeyOverflow = 8,
    /// An override denies the key: answered with `sluice_deny_status`.
    Denied = 9,
    /// A check with `no_key=reject` had an empty key: answered with
    /// `sluice_status`, nothing checked or counted. `$sluice_status` says
    /// `NO_KEY`, as for a keyless request let through.
    NoKeyRejected = 10,
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
            RequestStatus::NoKey => "NO_KEY",
            RequestStatus::Delayed => "DELAYED",
            RequestStatus::DelayedDryRun => "DELAYED_DRY_RUN",
            RequestStatus::KeyOverflow => "KEY_OVERFLOW",
            RequestStatus::Denied => "DENIED",
            RequestStatus::NoKeyRejected => "NO_KEY",
        }
    }

    /// The request was refused (not let through by dry run): its response
    /// is sluice's own answer, and a `sluice_charge` after it charges
    /// nothing (its bytes would only deepen the debt that refused it, and
    /// a flood of refusals could keep a quota shut).
    pub fn refused(self) -> bool {
        matches!(
            self,
            RequestStatus::Rejected | RequestStatus::Denied | RequestStatus::NoKeyRejected
        )
    }
}

/// What a check does with a request whose key is empty (the header or
/// variable it comes from is missing): the `no_key=` parameter of
/// `sluice <name> key=... no_key=pass|reject`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum NoKey {
    /// The check is skipped: the request goes on, not counted on the
    /// per-key quota (`$sluice_status` `NO_KEY`). The default, as
    /// `limit_req` skips a request whose key is empty.
    #[default]
    Pass,
    /// The request is answered with `sluice_status`, nothing counted
    /// (`$sluice_status` `NO_KEY`): a per-key limit a client cannot
    /// escape by leaving its key out.
    Reject,
}

/// Parses the value of `no_key=`: `pass` or `reject`.
pub fn parse_no_key(arg: &[u8]) -> Result<NoKey, String> {
    match arg {
        b"pass" => Ok(NoKey::Pass),
        b"reject" => Ok(NoKey::Reject),
        _ => Err("must be \"pass\" or \"reject\"".into()),
    }
}

/// What becomes of a request once it is checked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Then {
    /// It goes on to the next phase (`NGX_DECLINED`).
    Continue,
    /// It is held this many nanoseconds (`wait=`), then goes on.
    Hold(u64),
    /// It is answered with the location's `sluice_status`.
    Reject,
    /// It is answered with the location's `sluice_deny_status` (an
    /// override denies its key).
    Deny,
}

/// How the access handler answers a check: the decision part of its
/// work, which `answer.rs` only applies (and logs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Answer {
    /// What `$sluice_status` says.
    pub status: RequestStatus,
    /// What becomes of the request.
    pub then: Then,
    /// The rate-limit headers go out (`sluice_headers on` and a quota was
    /// checked).
    pub headers: bool,
    /// The `RateLimit` reset: estimated, a rejection's `Retry-After`
    /// (sent with the headers, only when waiting helps), or none for a
    /// rejection waiting cannot help.
    pub reset: Reset,
    /// A rejection that waiting cannot help (counted as unpassable, with
    /// or without dry run).
    pub unpassable: bool,
}

impl Answer {
    /// The answer to a check's `result` (its outcome, pacing wait and key
    /// overflow) under `sluice_dry_run` (`dry_run`) and `sluice_headers`
    /// (`headers`). Dry run lets through what would be held or rejected;
    /// only a real rejection carries `Retry-After`.
    pub fn of(result: &ManyOutcome, dry_run: bool, headers: bool) -> Self {
        let wait = result.wait;
        let answer = |status, then| Answer {
            status,
            then,
            headers,
            reset: Reset::Estimated,
            unpassable: false,
        };
        match &result.outcome {
            Outcome::Pass if wait == 0 && result.overflow => {
                answer(RequestStatus::KeyOverflow, Then::Continue)
            }
            Outcome::Pass if wait == 0 => answer(RequestStatus::Passed, Then::Continue),
            Outcome::Pass if dry_run => answer(RequestStatus::DelayedDryRun, Then::Continue),
            Outcome::Pass => answer(RequestStatus::Delayed, Then::Hold(wait)),
            Outcome::Unknown => Answer {
                headers: false,
                ..answer(RequestStatus::Unknown, Then::Continue)
            },
            Outcome::NoKey => Answer {
                headers: false,
                ..answer(RequestStatus::NoKey, Then::Continue)
            },
            Outcome::KeyOverflow => Answer {
                headers: false,
                ..answer(RequestStatus::KeyOverflow, Then::Continue)
            },
            Outcome::Reject(rejection) if rejection.cause == Cause::Denied => {
                if dry_run {
                    answer(RequestStatus::RejectedDryRun, Then::Continue)
                } else {
                    Answer {
                        reset: Reset::Never,
                        ..answer(RequestStatus::Denied, Then::Deny)
                    }
                }
            }
            Outcome::Reject(rejection) => {
                let unpassable = matches!(rejection.wait, Wait::Never(_));
                if dry_run {
                    Answer {
                        unpassable,
                        ..answer(RequestStatus::RejectedDryRun, Then::Continue)
                    }
                } else {
                    let reset = match retry_after_secs(rejection.wait) {
                        Some(secs) => Reset::RetryAfter(secs),
                        None => Reset::Never,
                    };
                    Answer {
                        unpassable,
                        reset,
                        ..answer(RequestStatus::Rejected, Then::Reject)
                    }
                }
            }
        }
    }

    /// This answer when `sluice_wait_max` refuses its hold of `wait_ns`:
    /// rejected at once, told when its turn would have come
    /// (`Retry-After`, with `sluice_headers on`).
    pub fn refused_hold(self, wait_ns: u64) -> Self {
        let reset = retry_after_secs(Wait::Seconds(wait_ns as f64 * 1e-9))
            .map_or(Reset::Never, Reset::RetryAfter);
        Answer {
            status: RequestStatus::Rejected,
            then: Then::Reject,
            reset,
            unpassable: false,
            ..self
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_denied_key_is_answered_with_the_deny_status_and_no_retry_after() {
        let mut denied = rejected(Wait::Never(crate::core::Never::Denied));
        if let Outcome::Reject(r) = &mut denied.outcome {
            r.cause = Cause::Denied;
        }
        let answer = Answer::of(&denied, false, true);
        assert_eq!(
            (answer.status, answer.then, answer.reset, answer.unpassable),
            (RequestStatus::Denied, Then::Deny, Reset::Never, false)
        );
        assert_eq!(answer.status.as_str(), "DENIED");
        let dry = Answer::of(&denied, true, true);
        assert_eq!(
            (dry.status, dry.then),
            (RequestStatus::RejectedDryRun, Then::Continue)
        );
        // A penalty is a rejection told when it ends.
        let mut penalized = rejected(Wait::Seconds(899.2));
        if let Outcome::Reject(r) = &mut penalized.outcome {
            r.cause = Cause::Penalty;
        }
        let answer = Answer::of(&penalized, false, true);
        assert_eq!(
            (answer.status, answer.then, answer.reset),
            (
                RequestStatus::Rejected,
                Then::Reject,
                Reset::RetryAfter(900)
            )
        );
    }

    #[test]
    fn a_hold_refused_by_wait_max_is_a_rejection_told_when_its_turn_was() {
        let held = ManyOutcome {
            outcome: Outcome::Pass,
            item: Some(0),
            headroom: None,
            wait: 2_500_000_000,
            overflow: false,
        };
        let answer = Answer::of(&held, false, true);
        assert_eq!(answer.then, Then::Hold(2_500_000_000));
        let refused = answer.refused_hold(2_500_000_000);
        assert_eq!(
            (refused.status, refused.then, refused.reset),
            (RequestStatus::Rejected, Then::Reject, Reset::RetryAfter(3))
        );
        assert!(refused.headers && !refused.unpassable);
    }

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
    fn waits_parse_as_nginx_times_up_to_an_hour() {
        assert_eq!(parse_wait(b"500ms"), Ok(Some(500_000_000)));
        assert_eq!(parse_wait(b"1s"), Ok(Some(1_000_000_000)));
        assert_eq!(parse_wait(b"2m"), Ok(Some(120_000_000_000)));
        assert_eq!(parse_wait(b"1h"), Ok(Some(3_600_000_000_000)));
        assert_eq!(parse_wait(b"3"), Ok(Some(3_000_000_000)));
        assert_eq!(parse_wait(b"0"), Ok(None));
        assert_eq!(parse_wait(b"0ms"), Ok(None));
        assert!(parse_wait(b"-1s").unwrap_err().contains("negative"));
        assert!(parse_wait(b"61m").unwrap_err().contains("at most 1h"));
        assert!(parse_wait(b"99999999999999999999")
            .unwrap_err()
            .contains("time"));
        for bad in [&b""[..], b"1x", b"s", b"1.5s", b"1s2", b" 1s", b"$w"] {
            assert!(parse_wait(bad).unwrap_err().contains("time"), "{bad:?}");
        }
    }

    #[test]
    fn wait_coalesce_parses_as_an_nginx_time_up_to_a_second() {
        assert_eq!(parse_wait_coalesce(b"10ms"), Ok(10));
        assert_eq!(parse_wait_coalesce(b"0"), Ok(0));
        assert_eq!(parse_wait_coalesce(b"1s"), Ok(1000));
        assert!(parse_wait_coalesce(b"-5ms")
            .unwrap_err()
            .contains("negative"));
        assert!(parse_wait_coalesce(b"1001ms")
            .unwrap_err()
            .contains("at most 1s"));
        for bad in [&b""[..], b"5x", b"ms", b"1.5ms", b"$t"] {
            assert!(
                parse_wait_coalesce(bad).unwrap_err().contains("time"),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn wait_timers_round_up_to_the_millisecond() {
        assert_eq!(wait_timer_ms(1), 1);
        assert_eq!(wait_timer_ms(1_000_000), 1);
        assert_eq!(wait_timer_ms(1_000_001), 2);
        assert_eq!(wait_timer_ms(0), 0);
    }

    #[test]
    fn refused_requests_are_the_rejected_the_denied_and_the_keyless_rejected() {
        use RequestStatus::*;
        for status in [Rejected, Denied, NoKeyRejected] {
            assert!(status.refused(), "{status:?}");
        }
        for status in [
            Unchecked,
            Passed,
            RejectedDryRun,
            Unknown,
            NoKey,
            Delayed,
            DelayedDryRun,
            KeyOverflow,
        ] {
            assert!(!status.refused(), "{status:?}");
        }
        assert_eq!(NoKeyRejected.as_str(), "NO_KEY");
    }

    #[test]
    fn no_key_is_pass_or_reject_and_passes_by_default() {
        assert_eq!(parse_no_key(b"pass"), Ok(NoKey::Pass));
        assert_eq!(parse_no_key(b"reject"), Ok(NoKey::Reject));
        assert_eq!(NoKey::default(), NoKey::Pass);
        for bad in [&b""[..], b"deny", b"Reject", b"0"] {
            assert!(
                parse_no_key(bad).unwrap_err().contains("\"pass\""),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn statuses_name_themselves() {
        assert_eq!(RequestStatus::Delayed.as_str(), "DELAYED");
        assert_eq!(RequestStatus::DelayedDryRun.as_str(), "DELAYED_DRY_RUN");
        assert_eq!(RequestStatus::Unchecked.as_str(), "");
    }

    #[test]
    fn weights_from_variables_cap_and_refuse_garbage() {
        let reject = EmptyWeight::Reject;
        assert_eq!(runtime_weight(b"1234", reject), Ok(1234));
        assert_eq!(runtime_weight(b"0", reject), Ok(0));
        assert_eq!(runtime_weight(b"007", reject), Ok(7));
        assert_eq!(
            runtime_weight(b"99999999999999999999999", reject),
            Ok(MAX_WEIGHT)
        );
        // The escapes, and their cousins: never a free pass.
        for garbage in [
            &b"abc"[..],
            b"-1",
            b"1e3",
            b"1.5",
            b"+5",
            b" 5",
            b"5 ",
            b"0x10",
            b"\xff",
        ] {
            assert_eq!(
                runtime_weight(garbage, EmptyWeight::Units(0)),
                Err(WeightError::Invalid),
                "{garbage:?}"
            );
        }
    }

    #[test]
    fn an_empty_weight_is_rejected_unless_configured() {
        assert_eq!(
            runtime_weight(b"", EmptyWeight::Reject),
            Err(WeightError::Empty)
        );
        assert_eq!(runtime_weight(b"", EmptyWeight::Units(0)), Ok(0));
        assert_eq!(runtime_weight(b"", EmptyWeight::Units(3)), Ok(3));
        assert_eq!(parse_empty_weight(b"reject"), Ok(EmptyWeight::Reject));
        assert_eq!(parse_empty_weight(b"0"), Ok(EmptyWeight::Units(0)));
        assert_eq!(parse_empty_weight(b"12"), Ok(EmptyWeight::Units(12)));
        for bad in [&b"zero"[..], b"-1", b"", b"1099511627777"] {
            assert!(parse_empty_weight(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn fixed_weights_parse_as_written() {
        assert_eq!(parse_weight(b"10"), Ok(10));
        assert!(parse_weight(b"$x").is_err());
        assert!(parse_weight(b"1099511627777").is_err());
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
    fn early_sync_without_arguments_is_an_error_not_a_panic() {
        // Found by the `args` fuzz target (tests/fuzz): `&args[1..]` on
        // an empty list panicked.
        let error = parse_early_sync(&[]).unwrap_err();
        assert!(error.starts_with("invalid fraction \"\""), "{error}");
    }

    /// A check's result: `outcome`, held `wait` ns, a key overflow or not.
    fn result(outcome: Outcome, wait: u64, overflow: bool) -> ManyOutcome {
        ManyOutcome {
            outcome,
            item: Some(0),
            headroom: None,
            wait,
            overflow,
        }
    }

    /// A rejection of the given `wait`.
    fn rejected(wait: Wait) -> ManyOutcome {
        let rejection = crate::table::Rejection {
            depth: 0,
            slot: 0,
            limit: 10.0,
            wait,
            key: 0,
            cause: crate::table::Cause::Limit,
        };
        result(Outcome::Reject(rejection), 0, false)
    }

    #[test]
    fn a_pass_goes_on_and_a_paced_pass_is_held_unless_dry_run() {
        let pass = Answer::of(&result(Outcome::Pass, 0, false), false, true);
        assert_eq!(
            (pass.status, pass.then, pass.headers),
            (RequestStatus::Passed, Then::Continue, true)
        );
        let paced = Answer::of(&result(Outcome::Pass, 5_000_000, false), false, false);
        assert_eq!(
            (paced.status, paced.then, paced.headers),
            (RequestStatus::Delayed, Then::Hold(5_000_000), false)
        );
        let dry = Answer::of(&result(Outcome::Pass, 5_000_000, false), true, false);
        assert_eq!(
            (dry.status, dry.then),
            (RequestStatus::DelayedDryRun, Then::Continue)
        );
        assert_eq!(
            (pass.reset, paced.reset),
            (Reset::Estimated, Reset::Estimated)
        );
    }

    #[test]
    fn a_key_that_found_no_entry_passes_as_an_overflow_with_headers() {
        let a = Answer::of(&result(Outcome::Pass, 0, true), false, true);
        assert_eq!(
            (a.status, a.then, a.headers),
            (RequestStatus::KeyOverflow, Then::Continue, true)
        );
    }

    #[test]
    fn unknown_quotas_and_missing_keys_go_on_without_headers() {
        for (outcome, status) in [
            (Outcome::Unknown, RequestStatus::Unknown),
            (Outcome::NoKey, RequestStatus::NoKey),
            (Outcome::KeyOverflow, RequestStatus::KeyOverflow),
        ] {
            let a = Answer::of(&result(outcome, 0, false), false, true);
            assert_eq!(
                (a.status, a.then, a.headers),
                (status, Then::Continue, false)
            );
        }
    }

    #[test]
    fn a_rejection_answers_with_the_status_and_retry_after_unless_dry_run() {
        let wait = Wait::Seconds(2.5);
        let real = Answer::of(&rejected(wait), false, true);
        assert_eq!(
            real,
            Answer {
                status: RequestStatus::Rejected,
                then: Then::Reject,
                headers: true,
                reset: Reset::RetryAfter(3),
                unpassable: false,
            }
        );
        let dry = Answer::of(&rejected(wait), true, true);
        assert_eq!(
            (dry.status, dry.then, dry.reset),
            (
                RequestStatus::RejectedDryRun,
                Then::Continue,
                Reset::Estimated
            )
        );
    }

    #[test]
    fn an_unpassable_rejection_is_counted_and_gets_no_retry_after_nor_reset() {
        let never = Wait::Never(crate::core::Never::NoLeak);
        let real = Answer::of(&rejected(never), false, true);
        assert!(real.unpassable);
        assert_eq!(real.reset, Reset::Never);
        // Dry run lets it through: the headers describe the quota.
        let dry = Answer::of(&rejected(never), true, true);
        assert!(dry.unpassable);
        assert_eq!(dry.reset, Reset::Estimated);
    }
}
