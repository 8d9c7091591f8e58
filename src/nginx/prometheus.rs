//! Prometheus text for a limiter: table totals, the busiest quotas, sync
//! state per root. Served by nginx's `sluice_metrics` location.
//!
//! Per-quota series are bounded: only the `top` quotas with the most
//! checks get their own series (a table can hold millions of quotas; a
//! scrape must not), and the rest are summed into `quota="_other"`. Keys
//! of per-key quotas appear by hash only, the [`TOP_KEYS`] with the
//! highest level (at most `top`).

use std::collections::HashMap;
use std::fmt::Write;

use crate::core::{Nanos, Terms};
use crate::sync::SyncMetrics;
use crate::table::{QuotaState, Table};

/// Renders the metrics of `table` (and its published sync status) as
/// Prometheus text. `roots` names the configured roots in order; `top`
/// bounds the per-quota series.
pub fn render(table: &Table, roots: &[String], top: usize, now: Nanos) -> String {
    let mut out = String::with_capacity(4096);
    let quotas = table.quotas(now);
    gauge(
        &mut out,
        "sluice_quotas",
        "Quotas in the table.",
        quotas.len() as f64,
    );
    gauge(
        &mut out,
        "sluice_table_capacity",
        "Quotas the table can hold.",
        table.capacity().into(),
    );
    counter(
        &mut out,
        "sluice_unknown_checks_total",
        "Checks of names with no quota (passed uncounted).",
        table.unknown_checks() as f64,
    );
    counter(
        &mut out,
        "sluice_refused_quotas_total",
        "Quotas refused because the table was full.",
        table.refused_quotas() as f64,
    );
    let holds = table.hold_stats();
    counter(
        &mut out,
        "sluice_in_flight_reclaimed_total",
        "In-flight slots given back because the worker holding them died.",
        holds.reclaimed as f64,
    );
    counter(
        &mut out,
        "sluice_in_flight_unrecorded_total",
        "In-flight slots taken while every hold record was in use: not given back \
         should their worker die.",
        holds.unrecorded as f64,
    );
    let handover = table.handover_stats();
    counter(
        &mut out,
        "sluice_sync_handover_overflows_total",
        "Handover records the sync thread could not leave (larger than a third of the zone's \
         handover section): a sync worker killed then has its unconfirmed weight sent \
         again as new.",
        handover.overflowed as f64,
    );
    let _ = writeln!(
        out,
        "# HELP sluice_sync_takeovers_total Sync threads that took over from one whose worker \
         died: continuing its numbered requests from its handover record (continued), or \
         sending its weight again as new (resent).\n# TYPE sluice_sync_takeovers_total \
         counter\nsluice_sync_takeovers_total{{outcome=\"continued\"}} {}\n\
         sluice_sync_takeovers_total{{outcome=\"resent\"}} {}",
        handover.continued, handover.resent
    );
    gauge(
        &mut out,
        "sluice_quota_epoch",
        "Highest quota epoch applied.",
        table.max_epoch() as f64,
    );
    let names: std::collections::HashMap<u32, String> = quotas
        .iter()
        .filter(|q| q.quota.per_key)
        .map(|q| (q.slot, q.quota.name.clone()))
        .collect();
    // Names of penalized quotas, by id (only when the section holds any).
    let by_id: std::collections::HashMap<u64, String> = if table.tier_stats().live > 0 {
        quotas
            .iter()
            .map(|q| (q.quota.id, q.quota.name.clone()))
            .collect()
    } else {
        Default::default()
    };
    render_quotas(&mut out, quotas, top);
    render_keys(&mut out, table, &names, top.min(TOP_KEYS), now);
    render_tiers(&mut out, table, &by_id, now);
    render_sync(&mut out, &crate::sync::status::published(table), roots, now);
    out
}

fn render_quotas(out: &mut String, mut quotas: Vec<QuotaState>, top: usize) {
    let below = descendant_checks(&quotas);
    // A quota is as busy as the checks through it, its descendants' too.
    let busy = |q: &QuotaState| {
        q.passed + q.rejected + q.dry_run + below.get(&q.quota.id).map_or(0, Checks::total)
    };
    if quotas.len() > top {
        quotas.select_nth_unstable_by_key(top, |q| std::cmp::Reverse(busy(q)));
    }
    let rest = if quotas.len() > top {
        quotas.split_off(top)
    } else {
        Vec::new()
    };
    quotas.sort_by(|a, b| a.quota.name.cmp(&b.quota.name));
    let _ = writeln!(
        out,
        "# HELP sluice_checks_total Checks that named the quota, by result (top {top} quotas; \
         checks of its descendants are in sluice_descendant_checks_total)."
    );
    let _ = writeln!(out, "# TYPE sluice_checks_total counter");
    for q in &quotas {
        let name = escape(&q.quota.name);
        let _ = writeln!(
            out,
            "sluice_checks_total{{quota=\"{name}\",result=\"passed\"}} {}",
            q.passed
        );
        let _ = writeln!(
            out,
            "sluice_checks_total{{quota=\"{name}\",result=\"rejected\"}} {}",
            q.rejected
        );
        let _ = writeln!(
            out,
            "sluice_checks_total{{quota=\"{name}\",result=\"dry_run_rejected\"}} {}",
            q.dry_run
        );
    }
    if !rest.is_empty() {
        let passed: u64 = rest.iter().map(|q| q.passed).sum();
        let rejected: u64 = rest.iter().map(|q| q.rejected).sum();
        let dry_run: u64 = rest.iter().map(|q| q.dry_run).sum();
        let _ = writeln!(
            out,
            "sluice_checks_total{{quota=\"_other\",result=\"passed\"}} {passed}"
        );
        let _ = writeln!(
            out,
            "sluice_checks_total{{quota=\"_other\",result=\"rejected\"}} {rejected}"
        );
        let _ = writeln!(
            out,
            "sluice_checks_total{{quota=\"_other\",result=\"dry_run_rejected\"}} {dry_run}"
        );
    }
    render_descendant_checks(out, &quotas, &below);
    let _ = writeln!(
        out,
        "# HELP sluice_quota_level Estimated bucket level per quota (top quotas)."
    );
    let _ = writeln!(out, "# TYPE sluice_quota_level gauge");
    for q in &quotas {
        let _ = writeln!(
            out,
            "sluice_quota_level{{quota=\"{}\"}} {}",
            escape(&q.quota.name),
            q.level
        );
    }
    let _ = writeln!(
        out,
        "# HELP sluice_quota_limit Quota limit in units per `per` (top quotas): per second \
         (per=\"s\") for a leaky quota, per window (per=\"min\", \"day\", ...) for a window quota; \
         kind is leaky, window, sliding or in_flight (per=\"at_once\": requests at once)."
    );
    let _ = writeln!(out, "# TYPE sluice_quota_limit gauge");
    for q in &quotas {
        let terms = Terms::of(&q.quota);
        let _ = writeln!(
            out,
            "sluice_quota_limit{{quota=\"{}\",per=\"{}\",kind=\"{}\"}} {}",
            escape(&q.quota.name),
            terms.per(),
            terms.kind(),
            q.quota.limit
        );
    }
    render_in_flight(out, &quotas);
}

/// The slots held per in-flight quota (its level: every host's, as this
/// one estimates it), for the top quotas that are in-flight and not
/// per-key templates (whose keys hold the slots).
fn render_in_flight(out: &mut String, quotas: &[QuotaState]) {
    let mut held = quotas
        .iter()
        .filter(|q| q.quota.in_flight && !q.quota.per_key)
        .peekable();
    if held.peek().is_none() {
        return;
    }
    let _ = writeln!(
        out,
        "# HELP sluice_in_flight_slots Slots held across the fleet per in-flight quota, as this \
         host estimates it (top quotas; the limit is sluice_quota_limit{{per=\"at_once\"}})."
    );
    let _ = writeln!(out, "# TYPE sluice_in_flight_slots gauge");
    for q in held {
        let _ = writeln!(
            out,
            "sluice_in_flight_slots{{quota=\"{}\"}} {}",
            escape(&q.quota.name),
            q.level
        );
    }
}

/// Checks by result.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Checks {
    passed: u64,
    rejected: u64,
    dry_run: u64,
}

impl Checks {
    fn total(&self) -> u64 {
        self.passed + self.rejected + self.dry_run
    }
}

/// For each quota with descendants (by id), the checks that named one of
/// them: a check is counted on the quota it names, and passes (and is
/// counted) only when every ancestor passes too, so these are the checks
/// that went through it. Summed from the tree as it is now.
fn descendant_checks(quotas: &[QuotaState]) -> HashMap<u64, Checks> {
    let parents: HashMap<u64, Option<u64>> = quotas
        .iter()
        .map(|q| (q.quota.id, q.quota.parent))
        .collect();
    let mut below: HashMap<u64, Checks> = HashMap::new();
    for q in quotas {
        let mut next = q.quota.parent;
        // A chain is at most MAX_DEPTH long; the bound also stops a cycle
        // a torn read could show.
        for _ in 0..crate::core::quota::MAX_DEPTH {
            let Some(id) = next else {
                break;
            };
            let c = below.entry(id).or_default();
            c.passed += q.passed;
            c.rejected += q.rejected;
            c.dry_run += q.dry_run;
            next = parents.get(&id).copied().flatten();
        }
    }
    below
}

/// `sluice_descendant_checks_total` of the quotas shown that have
/// descendants.
fn render_descendant_checks(out: &mut String, quotas: &[QuotaState], below: &HashMap<u64, Checks>) {
    let _ = writeln!(
        out,
        "# HELP sluice_descendant_checks_total Checks that named a quota below this one \
         (a child, a grandchild...) and so went through it, by the check's result: passed \
         (counted here too), rejected (by this quota or another of the chain), \
         dry_run_rejected (top quotas with descendants; from the tree as it is now).\n\
         # TYPE sluice_descendant_checks_total counter"
    );
    for q in quotas {
        let Some(c) = below.get(&q.quota.id) else {
            continue;
        };
        let name = escape(&q.quota.name);
        for (result, n) in [
            ("passed", c.passed),
            ("rejected", c.rejected),
            ("dry_run_rejected", c.dry_run),
        ] {
            let _ = writeln!(
                out,
                "sluice_descendant_checks_total{{quota=\"{name}\",result=\"{result}\"}} {n}"
            );
        }
    }
}

/// Keys of per-key quotas shown by level, at most.
pub const TOP_KEYS: usize = 10;

/// The key section's counters and the busiest keys (by hash) of the
/// templates named in `names` (template slot to name).
fn render_keys(
    out: &mut String,
    table: &Table,
    names: &std::collections::HashMap<u32, String>,
    top: usize,
    now: Nanos,
) {
    let s = table.key_stats();
    gauge(
        out,
        "sluice_keys",
        "Keys of per-key quotas with a counter here.",
        s.live as f64,
    );
    gauge(
        out,
        "sluice_key_capacity",
        "Keys the key section can hold.",
        s.capacity as f64,
    );
    for (name, help, value) in [
        (
            "sluice_key_inserts_total",
            "Keys given a counter.",
            s.inserts,
        ),
        (
            "sluice_key_relocations_total",
            "Key entries moved to their other bucket to make room for a new key.",
            s.relocations,
        ),
        (
            "sluice_key_reclaimed_total",
            "Drained key entries (equal to no entry) reused for another key.",
            s.reclaimed,
        ),
        (
            "sluice_key_overflow_total",
            "Checks of a key that found no entry (the key section is full of live keys): \
             decided by sluice_key_overflow.",
            s.overflows,
        ),
        (
            "sluice_key_overflow_busy_total",
            "Of sluice_key_overflow_total: new keys that needed entries moved and could \
             not have the key lock in time (its holder was descheduled), whatever the fill.",
            s.busy,
        ),
        (
            "sluice_key_refused_total",
            "Keys a quota root refused to hold, once per reply (this limiter holds its \
             max_keys_per_limiter share there): they keep their counts here and are checked \
             as sluice_key_overflow says besides.",
            s.refused,
        ),
        (
            "sluice_keyless_checks_total",
            "Checks of a per-key quota without a key (not checked, not counted).",
            s.keyless,
        ),
    ] {
        counter(out, name, help, value as f64);
    }
    if names.is_empty() || top == 0 {
        return;
    }
    let mut keys = table.keys(None, now);
    keys.sort_by(|a, b| b.level.total_cmp(&a.level));
    keys.truncate(top);
    let _ = writeln!(
        out,
        "# HELP sluice_key_level Estimated level of the busiest keys (by hash).\n\
         # TYPE sluice_key_level gauge"
    );
    for k in &keys {
        if let Some(name) = names.get(&k.template) {
            let _ = writeln!(
                out,
                "sluice_key_level{{quota=\"{}\",key=\"{:016x}\"}} {}",
                escape(name),
                k.hash,
                k.level
            );
        }
    }
}

/// Penalties in force shown, at most (the latest ends).
pub const TOP_PENALTIES: usize = 20;

/// The tier section's counters, and the penalties in force with their
/// seconds left (by quota, and key hash for a key's).
fn render_tiers(
    out: &mut String,
    table: &Table,
    by_id: &std::collections::HashMap<u64, String>,
    now: Nanos,
) {
    let s = table.tier_stats();
    let tiers = table.tiers();
    let overrides = tiers.iter().filter(|t| t.rule.is_some()).count();
    gauge(
        out,
        "sluice_overrides",
        "Overrides of per-key templates held for single keys.",
        overrides as f64,
    );
    gauge(
        out,
        "sluice_override_capacity",
        "Overrides and penalties the tier section (sluice_overrides) can hold.",
        s.capacity as f64,
    );
    for (name, help, value) in [
        (
            "sluice_overrides_refused_total",
            "Overrides refused: the tier section was full of overrides.",
            s.refused,
        ),
        (
            "sluice_penalties_refused_total",
            "Penalties refused: the penalties' share of the tier section (half) was full of \
             penalties ending later.",
            s.penalties_refused,
        ),
        (
            "sluice_penalties_evicted_total",
            "Penalties that gave way, ending first, to a later penalty or to an override.",
            s.penalties_evicted,
        ),
        (
            "sluice_penalties_started_total",
            "Penalties this host started (a rejection at the high burst of a quota with a \
             penalty).",
            s.started,
        ),
        (
            "sluice_penalized_checks_total",
            "Checks rejected by a penalty in force.",
            s.penalized,
        ),
        (
            "sluice_denied_checks_total",
            "Checks rejected by a deny override.",
            s.denied,
        ),
    ] {
        counter(out, name, help, value as f64);
    }
    let now_utc = now as i64 + table.utc_offset();
    let mut active: Vec<_> = tiers.iter().filter(|t| t.until > now_utc).collect();
    gauge(
        out,
        "sluice_penalties",
        "Penalties in force (quotas and keys barred until they end).",
        active.len() as f64,
    );
    if active.is_empty() {
        return;
    }
    active.sort_by_key(|t| std::cmp::Reverse(t.until));
    active.truncate(TOP_PENALTIES);
    let _ = writeln!(
        out,
        "# HELP sluice_penalty_seconds_left Seconds until a penalty in force ends (the latest ends).\n\
         # TYPE sluice_penalty_seconds_left gauge"
    );
    for t in active {
        let Some(name) = by_id.get(&t.quota) else {
            continue;
        };
        let left = (t.until - now_utc) as f64 * 1e-9;
        if t.key == 0 {
            let _ = writeln!(
                out,
                "sluice_penalty_seconds_left{{quota=\"{}\"}} {left:.0}",
                escape(name)
            );
        } else {
            let _ = writeln!(
                out,
                "sluice_penalty_seconds_left{{quota=\"{}\",key=\"{:016x}\"}} {left:.0}",
                escape(name),
                t.key
            );
        }
    }
}

/// One per-root series: name, type, help, and how to read it.
type RootSeries = (
    &'static str,
    &'static str,
    &'static str,
    fn(&crate::sync::RootMetrics, Nanos) -> f64,
);

fn render_sync(out: &mut String, m: &SyncMetrics, roots: &[String], now: Nanos) {
    counter(
        out,
        "sluice_sync_cycles_total",
        "Sync cycles run.",
        m.cycles as f64,
    );
    gauge(
        out,
        "sluice_sync_all_roots_down",
        "1 while no root answered for two intervals (limiting is per host).",
        u64::from(m.all_roots_down) as f64,
    );
    gauge(
        out,
        "sluice_sync_groups_down",
        "Root groups none of whose roots answered for two intervals (their shards are limited per host).",
        m.groups_down.len() as f64,
    );
    let series: [RootSeries; 10] = [
        (
            "sluice_sync_root_up",
            "gauge",
            "1 when the last sync with the root succeeded.",
            |r, _| u64::from(r.up) as f64,
        ),
        (
            "sluice_sync_root_syncs_total",
            "counter",
            "Successful syncs.",
            |r, _| r.syncs as f64,
        ),
        (
            "sluice_sync_root_errors_total",
            "counter",
            "Failed syncs.",
            |r, _| r.errors as f64,
        ),
        (
            "sluice_sync_root_round_trip_seconds",
            "gauge",
            "Last sync round trip.",
            |r, _| r.round_trip as f64 * 1e-9,
        ),
        (
            "sluice_sync_root_clock_offset_seconds",
            "gauge",
            "Root clock minus local clock.",
            |r, _| r.clock_offset as f64 * 1e-9,
        ),
        (
            "sluice_sync_root_last_success_age_seconds",
            "gauge",
            "Seconds since the last success.",
            |r, now| {
                if r.last_success == 0 {
                    -1.0
                } else {
                    now.saturating_sub(r.last_success) as f64 * 1e-9
                }
            },
        ),
        (
            "sluice_sync_root_dropped_deltas_total",
            "counter",
            "Owed deltas dropped.",
            |r, _| r.dropped_deltas as f64,
        ),
        (
            "sluice_sync_root_dropped_returns_total",
            "counter",
            "Units given back and not sent: the root predates returns and keeps them.",
            |r, _| r.dropped_returns as f64,
        ),
        (
            "sluice_sync_root_unconfirmed",
            "gauge",
            "Numbered requests whose exchanges failed: each goes again with the next, and the root applies it once.",
            |r, _| r.unconfirmed as f64,
        ),
        (
            "sluice_sync_root_unconfirmed_merged_total",
            "counter",
            "Times the two oldest unconfirmed requests were carried as one (64 failed in a row).",
            |r, _| r.unconfirmed_merged as f64,
        ),
    ];
    for (name, kind, help, value) in series {
        let _ = writeln!(out, "# HELP {name} {help}");
        let _ = writeln!(out, "# TYPE {name} {kind}");
        for (r, url) in m.roots.iter().zip(roots) {
            let _ = writeln!(out, "{name}{{root=\"{}\"}} {}", escape(url), value(r, now));
        }
    }
    for (name, help, pick) in [
        (
            "sluice_sync_root_sent_bytes_total",
            "Sync request bytes sent.",
            0,
        ),
        (
            "sluice_sync_root_received_bytes_total",
            "Sync reply bytes received.",
            1,
        ),
    ] {
        let _ = writeln!(out, "# HELP {name} {help}");
        let _ = writeln!(out, "# TYPE {name} counter");
        for (r, url) in m.roots.iter().zip(roots) {
            let v = if pick == 0 {
                r.bytes_sent
            } else {
                r.bytes_received
            };
            let _ = writeln!(out, "{name}{{root=\"{}\"}} {v}", escape(url));
        }
    }
}

/// The root group of each root (`sluice_root ... group=<n>`), when there
/// is more than one group: `sluice_sync_root_group{root="..."} n`.
pub fn render_root_groups(out: &mut String, roots: &[String], groups: &[u32]) {
    if groups.iter().all(|&g| g == 0) {
        return;
    }
    out.push_str(
        "# HELP sluice_sync_root_group The root group (shard) each quota root serves.\n\
         # TYPE sluice_sync_root_group gauge\n",
    );
    for (url, g) in roots.iter().zip(groups) {
        let _ = writeln!(
            out,
            "sluice_sync_root_group{{root=\"{}\"}} {g}",
            escape(url)
        );
    }
}

/// What the access handler counted beside the table: requests rejected
/// for their weight, rejections waiting cannot help, and requests held
/// by `wait=`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RequestCounts {
    /// Weight variables that were not a number.
    pub invalid_weight: u64,
    /// Weight variables that were empty, with `empty=reject`.
    pub empty_weight: u64,
    /// Rejections answered without `Retry-After`: the request can never
    /// pass as the quota stands.
    pub unpassable: u64,
    /// Requests held by `wait=` until their turn.
    pub delayed: u64,
    /// Requests `wait=` would have held, let through by dry run.
    pub delayed_dry_run: u64,
    /// Nanoseconds held requests were given to wait, summed.
    pub delay_ns: u64,
    /// Held requests that ended before their turn (the client closed).
    pub abandoned: u64,
    /// Requests held right now.
    pub waiting: u64,
    /// Held requests let go before their turn (`sluice_wait_coalesce`).
    pub coalesced: u64,
    /// Units given back by held requests that ended before their turn.
    pub returned: u64,
    /// Requests `sluice_wait_max` refused a hold (rejected at once).
    pub hold_refused: u64,
}

/// Appends the [`RequestCounts`] series.
pub fn render_request_counts(out: &mut String, counts: &RequestCounts) {
    let name = "sluice_weight_errors_total";
    let _ = writeln!(
        out,
        "# HELP {name} Requests rejected (or let through by dry run) because their weight \
         variable was not a number or was empty; never counted in a quota.\n\
         # TYPE {name} counter\n\
         {name}{{reason=\"invalid\"}} {}\n\
         {name}{{reason=\"empty\"}} {}",
        counts.invalid_weight, counts.empty_weight
    );
    counter(
        out,
        "sluice_unpassable_rejections_total",
        "Rejections that waiting cannot help (weight above high_burst, limit 0, or more \
         than a year to drain): answered without Retry-After.",
        counts.unpassable as f64,
    );
    let name = "sluice_delayed_requests_total";
    let _ = writeln!(
        out,
        "# HELP {name} Requests over a quota whose turn came within wait=: counted at once, \
         then held until it (dry_run: let through at once by sluice_dry_run).\n\
         # TYPE {name} counter\n\
         {name}{{mode=\"held\"}} {}\n\
         {name}{{mode=\"dry_run\"}} {}",
        counts.delayed, counts.delayed_dry_run
    );
    counter(
        out,
        "sluice_delay_seconds_total",
        "Seconds held requests were given to wait, summed.",
        counts.delay_ns as f64 / 1e9,
    );
    counter(
        out,
        "sluice_delay_abandoned_total",
        "Held requests that ended before their turn (the client closed); their weight is \
         given back (sluice_delay_returned_units_total).",
        counts.abandoned as f64,
    );
    counter(
        out,
        "sluice_delay_returned_units_total",
        "Units held requests that ended before their turn gave back to their quotas: what \
         was not sent to the roots yet, or all of it while counting locally.",
        counts.returned as f64,
    );
    counter(
        out,
        "sluice_delay_refused_total",
        "Requests rejected at once because sluice_wait_max requests were already held under \
         the directive that applied.",
        counts.hold_refused as f64,
    );
    gauge(
        out,
        "sluice_delay_waiting",
        "Requests held right now (nginx timers pending).",
        counts.waiting as f64,
    );
    counter(
        out,
        "sluice_delay_coalesced_total",
        "Held requests let go before their turn, at most sluice_wait_coalesce early, on a \
         wakeup the worker had anyway.",
        counts.coalesced as f64,
    );
}

fn gauge(out: &mut String, name: &str, help: &str, value: f64) {
    let _ = writeln!(
        out,
        "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {value}"
    );
}

fn counter(out: &mut String, name: &str, help: &str, value: f64) {
    let _ = writeln!(
        out,
        "# HELP {name} {help}\n# TYPE {name} counter\n{name} {value}"
    );
}

/// Escapes a label value (quota names cannot need it; URLs might).
fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::Quota;

    fn quota(id: u64, name: &str) -> Quota {
        Quota::new(id, name, 5.0, 2.0, 2.0)
    }

    #[test]
    fn an_in_flight_quota_shows_its_slots_held_and_its_limit_at_once() {
        let t = Table::new_heap(8, 16);
        t.books().apply_quotas(&[
            Quota::new(1, "uploads", 3.0, 3.0, 3.0).in_flight_if(true),
            quota(2, "rate"),
        ]);
        let item = crate::table::CheckItem {
            name: b"uploads",
            key: None,
            weight: 1,
            max_wait: None,
        };
        for _ in 0..2 {
            t.gate().acquire(&item, 1, false, || 0.5);
        }
        let text = render(&t, &[], 10, 1);
        assert!(
            text.contains("sluice_in_flight_slots{quota=\"uploads\"} 2\n"),
            "{text}"
        );
        assert!(
            !text.contains("sluice_in_flight_slots{quota=\"rate\"}"),
            "{text}"
        );
        assert!(
            text.contains(
                "sluice_quota_limit{quota=\"uploads\",per=\"at_once\",kind=\"in_flight\"} 3"
            ),
            "{text}"
        );
    }

    #[test]
    fn metrics_show_the_busiest_quotas_and_sum_the_rest() {
        let t = Table::new_heap(8, 16);
        t.books()
            .apply_quotas(&[quota(1, "busy"), quota(2, "quiet"), quota(3, "idle")]);
        for _ in 0..5 {
            t.gate().check(b"busy", 1, 0);
        }
        t.gate().check(b"quiet", 1, 0);
        t.gate().check(b"nobody", 1, 0);
        let text = render(&t, &[], 1, 0);
        assert!(
            text.contains("sluice_checks_total{quota=\"busy\",result=\"passed\"} 2\n"),
            "{text}"
        );
        assert!(text.contains("sluice_checks_total{quota=\"busy\",result=\"rejected\"} 3\n"));
        assert!(text.contains("sluice_checks_total{quota=\"_other\",result=\"passed\"} 1\n"));
        assert!(!text.contains("quota=\"quiet\""));
        assert!(text.contains("sluice_unknown_checks_total 1\n"));
        assert!(text.contains("sluice_quotas 3\n"));
    }

    /// The case: every photos request went through `s3_photos`,
    /// whose own series said 0.
    #[test]
    fn an_ancestor_counts_the_checks_of_its_descendants() {
        let t = Table::new_heap(8, 16);
        let read = Quota::new(2, "s3_photos_read", 5.0, 3.0, 3.0).with_parent(Some(1));
        let thumbs = Quota::new(3, "s3_photos_thumbs", 5.0, 2.0, 2.0).with_parent(Some(2));
        let write = Quota::new(4, "s3_photos_write", 5.0, 2.0, 2.0).with_parent(Some(1));
        t.books().apply_quotas(&[
            Quota::new(1, "s3_photos", 100.0, 100.0, 100.0),
            read,
            thumbs,
            write,
        ]);
        t.gate().check(b"s3_photos_thumbs", 1, 0);
        for _ in 0..5 {
            t.gate().check(b"s3_photos_read", 1, 0);
        }
        t.gate().check(b"s3_photos_write", 1, 0);
        let text = render(&t, &[], 10, 0);
        let has = |line: &str| assert!(text.contains(&format!("{line}\n")), "{line}\n{text}");
        has("sluice_checks_total{quota=\"s3_photos\",result=\"passed\"} 0");
        // The thumbnail passed through both ancestors, two of the reads
        // passed and three were rejected (by s3_photos_read), the write
        // passed.
        has("sluice_descendant_checks_total{quota=\"s3_photos\",result=\"passed\"} 4");
        has("sluice_descendant_checks_total{quota=\"s3_photos\",result=\"rejected\"} 3");
        has("sluice_descendant_checks_total{quota=\"s3_photos_read\",result=\"passed\"} 1");
        has("sluice_descendant_checks_total{quota=\"s3_photos_read\",result=\"rejected\"} 0");
        // A leaf has no descendant series.
        assert!(!text.contains("sluice_descendant_checks_total{quota=\"s3_photos_thumbs\""));
        // An ancestor busy only through its descendants still makes the top.
        let top = render(&t, &[], 1, 0);
        assert!(
            top.contains(
                "sluice_descendant_checks_total{quota=\"s3_photos\",result=\"passed\"} 4\n"
            ),
            "{top}"
        );
    }

    #[test]
    fn keys_appear_as_counts_and_by_hash_never_raw() {
        use crate::table::{CheckItem, CheckOptions};
        let t = Table::new_heap_with_keys(8, 16, 64);
        t.books()
            .apply_quotas(&[Quota::new(1, "per_user", 1.0, 10.0, 10.0).keyed()]);
        for (key, weight) in [(&b"token-aaa"[..], 5), (b"token-bbb", 1)] {
            let item = CheckItem {
                name: b"per_user",
                key: Some(key),
                weight,
                max_wait: None,
            };
            t.gate()
                .check_many(&[item], 0, CheckOptions::default(), || 0.5);
        }
        let text = render(&t, &[], 10, 0);
        assert!(text.contains("sluice_keys 2\n"), "{text}");
        assert!(text.contains("sluice_key_capacity 64\n"));
        let hash = t.key_secret().hash(b"token-aaa");
        assert!(text.contains(&format!(
            "sluice_key_level{{quota=\"per_user\",key=\"{hash:016x}\"}} 5\n"
        )));
        assert!(!text.contains("token-"));
    }

    #[test]
    fn weight_errors_and_unpassable_rejections_are_counters() {
        let mut text = String::new();
        let counts = RequestCounts {
            invalid_weight: 3,
            empty_weight: 1,
            unpassable: 7,
            delayed: 5,
            delayed_dry_run: 2,
            delay_ns: 1_500_000_000,
            abandoned: 1,
            waiting: 4,
            coalesced: 6,
            ..Default::default()
        };
        render_request_counts(&mut text, &counts);
        for line in [
            "# TYPE sluice_weight_errors_total counter\n",
            "sluice_weight_errors_total{reason=\"invalid\"} 3\n",
            "sluice_weight_errors_total{reason=\"empty\"} 1\n",
            "# TYPE sluice_unpassable_rejections_total counter\n",
            "sluice_unpassable_rejections_total 7\n",
            "sluice_delayed_requests_total{mode=\"held\"} 5\n",
            "sluice_delayed_requests_total{mode=\"dry_run\"} 2\n",
            "# TYPE sluice_delay_seconds_total counter\n",
            "sluice_delay_seconds_total 1.5\n",
            "sluice_delay_abandoned_total 1\n",
            "# TYPE sluice_delay_waiting gauge\n",
            "sluice_delay_waiting 4\n",
            "# TYPE sluice_delay_coalesced_total counter\n",
            "sluice_delay_coalesced_total 6\n",
        ] {
            assert!(text.contains(line), "{line:?} in\n{text}");
        }
    }

    #[test]
    fn sync_state_is_labelled_by_root() {
        let t = Table::new_heap(8, 16);
        let m = SyncMetrics {
            cycles: 3,
            all_roots_down: false,
            roots: vec![crate::sync::RootMetrics {
                up: true,
                syncs: 3,
                ..Default::default()
            }],
            groups_down: Vec::new(),
        };
        crate::sync::status::publish(&t, &m);
        let text = render(&t, &["http://r1:7070".to_string()], 10, 0);
        assert!(
            text.contains("sluice_sync_root_up{root=\"http://r1:7070\"} 1\n"),
            "{text}"
        );
        assert!(text.contains("sluice_sync_root_syncs_total{root=\"http://r1:7070\"} 3\n"));
        assert!(text.contains("sluice_sync_all_roots_down 0\n"));
        assert!(text.contains("sluice_sync_groups_down 0\n"));
        t.books().count_takeover(true);
        t.books().count_takeover(false);
        t.books().count_takeover(true);
        let text = render(&t, &["http://r1:7070".to_string()], 10, 0);
        assert!(
            text.contains("sluice_sync_takeovers_total{outcome=\"continued\"} 2\n"),
            "{text}"
        );
        assert!(text.contains("sluice_sync_takeovers_total{outcome=\"resent\"} 1\n"));
        assert!(text.contains("# TYPE sluice_sync_takeovers_total counter\n"));
        assert!(text.contains("sluice_sync_handover_overflows_total 0\n"));
    }

    #[test]
    fn root_groups_are_shown_only_when_there_are_several() {
        let roots = ["http://a:1".to_string(), "http://b:1".to_string()];
        let mut one = String::new();
        render_root_groups(&mut one, &roots, &[0, 0]);
        assert!(one.is_empty());
        let mut two = String::new();
        render_root_groups(&mut two, &roots, &[0, 1]);
        assert!(two.contains("sluice_sync_root_group{root=\"http://a:1\"} 0\n"));
        assert!(two.contains("sluice_sync_root_group{root=\"http://b:1\"} 1\n"));
    }
}
