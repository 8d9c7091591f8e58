//! What `sluice_sync_metrics_json` says: the sync thread's state in units
//! a caller can use without knowing sluice's clock (the sync thread keeps
//! monotonic nanoseconds), with the units in the field names.

use serde::Serialize;

use crate::core::{round_to, Nanos, SECS_PER_NANO};
use crate::sync::{RootMetrics, SyncMetrics};

/// Milliseconds per nanosecond.
const MS_PER_NANO: f64 = 1e-6;

/// The sync thread's state.
#[derive(Debug, Serialize)]
pub(super) struct SyncStatus {
    /// Completed sync cycles.
    cycles: u64,
    /// The table holds the roots' quota set (see `sluice_wait_ready`);
    /// always true without roots.
    ready: bool,
    /// No root has answered for two intervals: limiting is per host.
    all_roots_down: bool,
    /// Root groups whose shards are limited per host (only with groups).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    groups_down: Vec<u32>,
    /// Per root, in configuration order.
    roots: Vec<RootStatus>,
}

/// One root's sync state.
#[derive(Debug, Serialize)]
struct RootStatus {
    url: String,
    group: u32,
    up: bool,
    /// Seconds since the last successful sync, to the millisecond; null
    /// before the first.
    last_success_seconds_ago: Option<f64>,
    syncs: u64,
    errors: u64,
    last_error: String,
    /// The last sync's round trip, milliseconds to the microsecond.
    round_trip_ms: f64,
    /// The root's clock minus this host's, milliseconds to the
    /// microsecond.
    clock_offset_ms: f64,
    bytes_sent: u64,
    bytes_received: u64,
    dropped_deltas: u64,
    dropped_returns: u64,
    unconfirmed: u64,
    unconfirmed_merged: u64,
}

impl SyncStatus {
    /// `m` as seen at `now` (the monotonic clock the sync thread reads).
    pub(super) fn of(m: &SyncMetrics, ready: bool, now: Nanos) -> Self {
        Self {
            cycles: m.cycles,
            ready,
            all_roots_down: m.all_roots_down,
            groups_down: m.groups_down.clone(),
            roots: m.roots.iter().map(|r| RootStatus::of(r, now)).collect(),
        }
    }
}

impl RootStatus {
    fn of(r: &RootMetrics, now: Nanos) -> Self {
        // 0 is the sync thread's "never".
        let last_success_seconds_ago = (r.last_success != 0)
            .then(|| round_to(now.saturating_sub(r.last_success) as f64 * SECS_PER_NANO, 3));
        Self {
            url: r.url.clone(),
            group: r.group,
            up: r.up,
            last_success_seconds_ago,
            syncs: r.syncs,
            errors: r.errors,
            last_error: r.last_error.clone(),
            round_trip_ms: round_to(r.round_trip as f64 * MS_PER_NANO, 3),
            clock_offset_ms: round_to(r.clock_offset as f64 * MS_PER_NANO, 3),
            bytes_sent: r.bytes_sent,
            bytes_received: r.bytes_received,
            dropped_deltas: r.dropped_deltas,
            dropped_returns: r.dropped_returns,
            unconfirmed: r.unconfirmed,
            unconfirmed_merged: r.unconfirmed_merged,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The case: `last_success` was a raw monotonic value and
    /// `round_trip` undocumented nanoseconds.
    #[test]
    fn times_are_seconds_ago_and_milliseconds() {
        let second = 1_000_000_000;
        let m = SyncMetrics {
            cycles: 7,
            all_roots_down: false,
            roots: vec![
                RootMetrics {
                    url: "http://127.0.0.1:7070".into(),
                    up: true,
                    last_success: 100 * second,
                    syncs: 3,
                    round_trip: 1_234_567,
                    clock_offset: -2_500_000_123,
                    ..RootMetrics::default()
                },
                RootMetrics {
                    url: "http://127.0.0.1:7071".into(),
                    ..RootMetrics::default()
                },
            ],
            groups_down: Vec::new(),
        };
        let json =
            serde_json::to_value(SyncStatus::of(&m, true, 103 * second + 456_789_000)).unwrap();
        let root = &json["roots"][0];
        assert_eq!(root["last_success_seconds_ago"], 3.457);
        assert_eq!(root["round_trip_ms"], 1.235);
        assert_eq!(root["clock_offset_ms"], -2500.0);
        assert!(root.get("last_success").is_none() && root.get("round_trip").is_none());
        assert!(json["roots"][1]["last_success_seconds_ago"].is_null());
        assert_eq!((&json["ready"], &json["cycles"]), (&true.into(), &7.into()));
        assert!(json.get("groups_down").is_none());
    }
}
