//! The access handler's answer to a decided check: the log lines
//! (rejections, delays, unknown names, bad weights), the zone's request
//! counts, the `RateLimit` headers, and the status (or the hold) that
//! nginx gets back.

use std::fmt::Write;
use std::sync::atomic::Ordering;

use ngx::ffi::{ngx_http_request_t, ngx_int_t, ngx_uint_t, NGX_DECLINED};
use ngx::http::Request;

use super::args::{wait_timer_ms, Answer, RequestStatus, Then, WeightError};
use super::conf::{Check, LocConf};
use super::headers::{rate_limit_fields, HeaderValue, Reset};
use super::rejection_line::{KeyOverride, RejectionLine};
use super::request_counters::RequestCounters;
use super::request_state::{hold, RequestState};
use super::unknown_names::{self, ShownName, UnknownNames};
use super::util::{log, text};
use crate::core::key::KeyHash;
use crate::core::Nanos;
use crate::table::layout::{TIER_ALLOW, TIER_DENY, TIER_KIND, TIER_LIMIT};
use crate::table::{CheckItem, Headroom, ManyOutcome, Outcome, Rejection, Table};

/// Most bytes of a bad weight value a log line quotes (the value comes
/// from the client).
const MAX_LOGGED_WEIGHT: usize = 64;

/// A weight value as a log line quotes it: its first [`MAX_LOGGED_WEIGHT`]
/// bytes, and `...` when there were more.
pub(super) struct ShownWeight<'a>(pub(super) &'a [u8]);

impl std::fmt::Display for ShownWeight<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let value = self.0;
        f.write_str(&text(&value[..value.len().min(MAX_LOGGED_WEIGHT)]))?;
        if value.len() > MAX_LOGGED_WEIGHT {
            f.write_str("...")?;
        }
        Ok(())
    }
}

/// A request's checks and what came of them: what its answer is made of.
pub(super) struct Decision<'a> {
    /// The checks as evaluated for this request.
    pub items: &'a [CheckItem<'a>],
    /// The location's `sluice` directives, one per item.
    pub checks: &'a [Check],
    /// What the table said.
    pub result: ManyOutcome,
    /// What becomes of the request.
    pub answer: Answer,
}

/// Answers a decided request: sets `$sluice_status`, logs a delay or a
/// rejection, counts what the zone counts, adds the headers, and returns
/// what nginx gets (a hold starts here).
pub(super) fn respond(
    r: &mut ngx_http_request_t,
    lcf: &LocConf,
    table: &Table,
    counters: Option<&RequestCounters>,
    state: &mut RequestState,
    decision: &Decision,
) -> ngx_int_t {
    let Decision {
        items,
        checks,
        result,
        answer,
    } = decision;
    let dry_run = lcf.dry_run.unwrap_or(false);
    state.status = answer.status;
    match (result.outcome, result.item) {
        (Outcome::Pass, Some(i)) if result.wait > 0 => {
            if let (Some(item), Some(check)) = (items.get(i), checks.get(i)) {
                let allowed = check.max_wait.unwrap_or(0);
                log_delay(r, lcf, dry_run, item, result.wait, allowed);
            }
        }
        (Outcome::Reject(rejection), item) => {
            log_rejected(r, lcf, dry_run, table, items, item.unwrap_or(0), &rejection);
        }
        _ => {}
    }
    if let Some(c) = counters {
        if answer.unpassable {
            c.unpassable.fetch_add(1, Ordering::Relaxed);
        }
        if answer.status == RequestStatus::DelayedDryRun {
            c.delayed_dry_run.fetch_add(1, Ordering::Relaxed);
        }
    }
    if answer.headers {
        add_rate_limit_headers(r, lcf, table, items, result, answer.reset);
    }
    match answer.then {
        Then::Continue => NGX_DECLINED as ngx_int_t,
        Then::Hold(wait) => hold(r, state, counters, wait, lcf.wait_coalesce_ms()),
        Then::Reject => lcf.status() as ngx_int_t,
        Then::Deny => lcf.deny_status() as ngx_int_t,
    }
}

/// Logs the checks of `items` whose names have no quota (at
/// `sluice_unknown_log`), each the first time and then at most once a
/// period per name ([`UnknownNames`]).
pub(super) fn log_unknown(
    r: &mut ngx_http_request_t,
    level: ngx_uint_t,
    table: &Table,
    names: &UnknownNames,
    items: &[CheckItem],
    now: Nanos,
) {
    for item in items {
        if table.gate().lookup(item.name).is_some() {
            continue;
        }
        let Some(due) = names.note(item.name, now) else {
            continue;
        };
        let name = ShownName(item.name);
        let period = unknown_names::PERIOD;
        let mut more = HeaderValue::default();
        if due.repeats > 0 {
            let _ = write!(more, "; {} check(s) of it since the last line", due.repeats);
        }
        if due.held_back > 0 {
            let _ = write!(
                more,
                "; {} line(s) about other unknown names held back",
                due.held_back
            );
        }
        let more = more.as_str();
        // SAFETY: the request's log; nginx appends client and request.
        unsafe {
            log(
                level,
                (*r.connection).log,
                format_args!(
                    "sluice: no quota is named \"{name}\": its checks pass uncounted \
                     (logged at most once every {period}s per name{more})"
                ),
            )
        }
    }
}

/// Logs a rejection (at `sluice_log_level`) naming the quota that
/// rejected, which may be an ancestor of the checked one, the limit that
/// applied (a key's override's), and what decided ([`RejectionLine`]).
fn log_rejected(
    r: &mut ngx_http_request_t,
    lcf: &LocConf,
    dry_run: bool,
    table: &Table,
    items: &[CheckItem],
    item: usize,
    rejection: &Rejection,
) {
    let level = lcf.log_level();
    // SAFETY: the request's connection and its log are live.
    let log_to = unsafe { (*r.connection).log };
    // SAFETY: as above.
    if log_to.is_null() || unsafe { (*log_to).log_level } < level {
        // Nothing is written: spare the lookups below.
        return;
    }
    let checked = items.get(item).map_or(&[][..], |i| i.name);
    let mut quota_buf = [0u8; 256];
    let quota = table
        .name_into(rejection.slot, &mut quota_buf)
        .unwrap_or(checked);
    let key_override = key_override(table, quota, rejection.key);
    let (quota, checked) = (text(quota), text(checked));
    let line = RejectionLine {
        dry_run,
        quota: &quota,
        checked: &checked,
        weight: items.get(item).map_or(0, |i| i.weight),
        terms: table.terms_of(rejection.slot),
        limit: rejection.limit,
        wait: rejection.wait,
        cause: rejection.cause,
        key: rejection.key,
        key_override,
    };
    // SAFETY: the request's log; nginx appends client and request.
    unsafe { log(level, log_to, format_args!("sluice: {line}")) }
}

/// The override the key `key` (0: none) of the per-key template `quota`
/// has now, if any: read from the table's tier section, for a log line.
fn key_override(table: &Table, quota: &[u8], key: KeyHash) -> Option<KeyOverride> {
    if key == 0 {
        return None;
    }
    let now = crate::clock::now();
    let template = table.quota(quota, now)?.quota;
    let read = table.tier(template.id, key)?;
    match read.kind_at(now as i64 + table.utc_offset()) & TIER_KIND {
        TIER_LIMIT => Some(KeyOverride::Limit {
            limit: read.limit,
            burst: read.high_burst,
            template_burst: template.high_burst,
        }),
        TIER_ALLOW => Some(KeyOverride::Allow),
        TIER_DENY => Some(KeyOverride::Deny),
        _ => None,
    }
}

/// Logs a request held (or, in dry run, one that would have been held)
/// by `wait=`.
fn log_delay(
    r: &mut ngx_http_request_t,
    lcf: &LocConf,
    dry_run: bool,
    item: &CheckItem,
    wait_ns: u64,
    allowed_ns: u64,
) {
    let how = if dry_run { ", dry run," } else { "" };
    let quota = text(item.name);
    let weight = item.weight;
    let ms = wait_timer_ms(wait_ns);
    let allowed = allowed_ns / 1_000_000;
    // SAFETY: the request's log; nginx appends client and request.
    unsafe {
        log(
            lcf.log_level(),
            (*r.connection).log,
            format_args!(
                "sluice: delaying request{how} by {ms}ms for quota \"{quota}\" \
                 (weight {weight}, wait={allowed}ms)"
            ),
        )
    }
}

/// Refuses a request whose key is empty where the check of `quota` says
/// `no_key=reject`: answered with `sluice_status` (let through by dry
/// run, as `REJECTED_DRY_RUN`), `$sluice_status` `NO_KEY`; nothing is
/// checked or counted, and there is no `Retry-After`: waiting brings no
/// key.
pub(super) fn reject_no_key(
    r: &mut ngx_http_request_t,
    lcf: &LocConf,
    state: &mut RequestState,
    quota: &[u8],
) -> ngx_int_t {
    let dry_run = lcf.dry_run.unwrap_or(false);
    let how = if dry_run { ", dry run," } else { "" };
    let quota = text(quota);
    // SAFETY: the request's log; nginx appends client and request.
    unsafe {
        log(
            lcf.log_level(),
            (*r.connection).log,
            format_args!(
                "sluice: limiting requests{how} for quota \"{quota}\": the request has no key \
                 (its key= value is empty, and no_key=reject)"
            ),
        )
    }
    refuse_unchecked(lcf, state, RequestStatus::NoKeyRejected)
}

/// Rejects a request whose weight is not a number (or empty, with
/// `empty=reject`): as a rejection by a quota (the configured status and
/// log level, let through by dry run), but nothing is checked or counted,
/// and there is no `Retry-After`: waiting cannot fix the weight.
pub(super) fn reject_weight(
    r: &mut ngx_http_request_t,
    lcf: &LocConf,
    state: &mut RequestState,
    counters: Option<&RequestCounters>,
    quota: &[u8],
    error: WeightError,
    value: &[u8],
) -> ngx_int_t {
    let dry_run = lcf.dry_run.unwrap_or(false);
    if let Some(c) = counters {
        let counter = match error {
            WeightError::Invalid => &c.invalid_weight,
            WeightError::Empty => &c.empty_weight,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }
    let how = if dry_run { ", dry run," } else { "" };
    let quota = text(quota);
    let shown = ShownWeight(value);
    // SAFETY: the request's log; nginx appends client and request.
    unsafe {
        match error {
            WeightError::Invalid => log(
                lcf.log_level(),
                (*r.connection).log,
                format_args!(
                    "sluice: limiting requests{how} for quota \"{quota}\": weight \
                     \"{shown}\" is not a non-negative integer"
                ),
            ),
            WeightError::Empty => log(
                lcf.log_level(),
                (*r.connection).log,
                format_args!(
                    "sluice: limiting requests{how} for quota \"{quota}\": the weight is \
                     empty (set \"empty=0\" to check such requests without counting)"
                ),
            ),
        }
    }
    refuse_unchecked(lcf, state, RequestStatus::Rejected)
}

/// Answers a request refused before its checks were made: with
/// `sluice_status` and `refused` as its status, or let through by dry run
/// (`REJECTED_DRY_RUN`).
fn refuse_unchecked(lcf: &LocConf, state: &mut RequestState, refused: RequestStatus) -> ngx_int_t {
    if lcf.dry_run.unwrap_or(false) {
        state.status = RequestStatus::RejectedDryRun;
        NGX_DECLINED as ngx_int_t
    } else {
        state.status = refused;
        lcf.status() as ngx_int_t
    }
}

/// Adds `RateLimit-Policy` and `RateLimit` for the tightest quota (named
/// as `sluice_headers ... names=` says), and `Retry-After` when `retry`
/// is given.
fn add_rate_limit_headers(
    r: &mut ngx_http_request_t,
    lcf: &LocConf,
    table: &Table,
    items: &[CheckItem],
    result: &ManyOutcome,
    reset: Reset,
) {
    let mut name_buf = [0u8; 256];
    // SAFETY: `r` is the live request; Request is a transparent wrapper.
    let request = unsafe { Request::from_ngx_http_request(r) };
    if let Reset::RetryAfter(secs) = reset {
        let mut value = HeaderValue::default();
        if std::fmt::Write::write_fmt(&mut value, format_args!("{secs}")).is_ok() {
            request.add_header_out("Retry-After", value.as_str());
        }
    }
    let Some(h): Option<Headroom> = result.headroom else {
        return;
    };
    if table.terms_of(h.slot).is_some_and(|t| t.in_flight) {
        // The fields describe a quota per window of time; an in-flight
        // quota has none, and a window or reset of any length would be
        // read as "more quota then" (`docs`: RateLimit headers).
        return;
    }
    let name = match table.name_into(h.slot, &mut name_buf) {
        Some(n) => n,
        None => items.get(h.item).map_or(&[][..], |i| i.name),
    };
    let Ok(name) = std::str::from_utf8(name) else {
        return;
    };
    let mut shown = HeaderValue::default();
    let name = lcf.header_names.show(name, table.key_secret(), &mut shown);
    if let Some((policy, state)) = rate_limit_fields(name, &h.room, reset) {
        request.add_header_out("RateLimit-Policy", policy.as_str());
        request.add_header_out("RateLimit", state.as_str());
    }
}
