//! The sync loop without roots: this host is its own root. It folds local
//! weight into the levels (so the leak is applied smoothly), sweeps keys
//! and reports key pressure; nothing goes over the network. The tokio loop
//! falls back to it when it cannot start.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::config::SyncConfig;
use super::pressure::KeyPressure;
use super::schedule::{key_sweep_budget, local_now, window_wake};
use super::shared::Shared;
use super::status;
use crate::core::Nanos;
use crate::table::Table;

/// No roots: this host is its own root. Folds every 100 ms at most, so the
/// leak is applied smoothly.
pub(super) fn run_standalone(table: &Table, config: &SyncConfig, shared: &Shared) {
    let tick = config.interval.min(Duration::from_millis(100));
    table.books().set_counting_locally(true);
    let mut pressure = KeyPressure::default();
    let mut reported = Instant::now();
    while !shared.stop.load(Ordering::Acquire) {
        if reported.elapsed() >= config.interval {
            reported = Instant::now();
            if let Some((level, line)) = pressure.check(table) {
                (config.log)(level, &line);
            }
        }
        let now = local_now(config.clock_skew);
        // Fold just after each window boundary too, so weight lands in its
        // window.
        let wait = window_wake(table, now, 0).map_or(tick, |ns| tick.min(Duration::from_nanos(ns)));
        shared.wake.wait_timeout(wait);
        let now = local_now(config.clock_skew);
        if table.books().has_retired_handover() {
            // A thread with roots stopped with requests unconfirmed
            // (a reload to a configuration without roots).
            super::takeover::hand_back_retired(table);
        }
        reclaim_abandoned(table, now, config);
        table.books().fold_local(now);
        table
            .books()
            .maintain_keys(key_sweep_budget(table, tick.as_nanos() as Nanos), now);
        if let Ok(mut m) = shared.metrics.lock() {
            m.cycles += 1;
            status::publish(table, &m);
        }
    }
}

/// Gives back the in-flight slots of processes that died holding them (a
/// worker killed with its requests), as releases: standalone they leave
/// the level at the next fold, with roots they go back to each root as
/// returns with this cycle's requests. Logs how many, when any.
pub(super) fn reclaim_abandoned(table: &Table, now: Nanos, config: &SyncConfig) {
    let given = table.reclaim_abandoned_slots(now, crate::host::process_alive);
    if given > 0 {
        (config.log)(
            super::log::LogLevel::Warn,
            &format!("gave back {given} in-flight slot(s) held by processes that died"),
        );
    }
}
