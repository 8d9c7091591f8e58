//! What a limiter knows about one root: where it is in that root's quota
//! log and counter versions, its clock offset, the deltas it still owes the
//! root, its health and its metrics.

use std::collections::{HashMap, VecDeque};

use serde::Serialize;

use crate::core::{Level, Nanos};
use crate::wire::{CounterValue, QuotaCursor, SyncResponse};

/// Round-trip samples kept for the clock offset.
const OFFSET_SAMPLES: usize = 8;

/// Per-root state kept by the sync thread.
#[derive(Debug)]
pub struct RootLink {
    /// The root's base URL, e.g. `http://10.0.0.1:7070`.
    pub url: String,
    /// Last quota position received from this root.
    pub cursor: QuotaCursor,
    /// Last counter version received from this root.
    pub counter_version: u64,
    /// Instance the version belongs to.
    pub root_instance: u64,
    /// Deltas this root has not received yet (it failed or was not asked),
    /// by quota id; resent with the next request.
    pub owed: HashMap<u64, u64>,
    /// Recent `(round trip, offset)` samples; the offset of the quickest
    /// round trip is the best estimate (NTP's rule).
    samples: VecDeque<(u64, i64)>,
    /// Consecutive failures, for backoff.
    pub failures: u32,
    /// Local time before which this root is not tried again.
    pub retry_at: Nanos,
    /// Counters exposed to metrics.
    pub metrics: RootMetrics,
}

/// Sync metrics of one root.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct RootMetrics {
    /// The root's URL.
    pub url: String,
    /// True when the last attempt succeeded.
    pub up: bool,
    /// Local monotonic time of the last success (ns; 0: never).
    pub last_success: Nanos,
    /// Successful syncs.
    pub syncs: u64,
    /// Failed syncs (connection, timeout, HTTP status, malformed reply).
    pub errors: u64,
    /// Last error, for humans.
    pub last_error: String,
    /// Last round trip, nanoseconds.
    pub round_trip: u64,
    /// Clock offset in use: root time minus local time, nanoseconds.
    pub clock_offset: i64,
    /// Request bytes sent.
    pub bytes_sent: u64,
    /// Response bytes received.
    pub bytes_received: u64,
    /// Owed delta entries dropped because the root stayed away too long.
    pub dropped_deltas: u64,
}

impl RootLink {
    /// A link to a root never synced with.
    pub fn new(url: String) -> Self {
        let metrics = RootMetrics {
            url: url.clone(),
            ..RootMetrics::default()
        };
        Self {
            url,
            cursor: QuotaCursor::default(),
            counter_version: 0,
            root_instance: 0,
            owed: HashMap::new(),
            samples: VecDeque::new(),
            failures: 0,
            retry_at: 0,
            metrics,
        }
    }

    /// Adds this cycle's deltas to what the root is owed, dropping
    /// everything (with a metric) past `max_entries` distinct counters, so a
    /// root that stays dead does not grow memory without bound.
    pub fn owe(&mut self, deltas: impl Iterator<Item = (u64, u64)>, max_entries: usize) {
        for (id, delta) in deltas {
            if self.owed.len() >= max_entries && !self.owed.contains_key(&id) {
                self.metrics.dropped_deltas += 1;
                continue;
            }
            *self.owed.entry(id).or_default() += delta;
        }
    }

    /// Records a successful exchange sent at `sent` and answered at
    /// `received` (local time) and takes the root's state from `reply`.
    pub fn succeeded(&mut self, sent: Nanos, received: Nanos, reply: &SyncResponse) {
        let rtt = received.saturating_sub(sent);
        let mid = sent + rtt / 2;
        let offset = reply.root_time as i64 - mid as i64;
        if reply.root_instance != self.root_instance {
            // A restarted root has another clock.
            self.samples.clear();
        }
        if self.samples.len() == OFFSET_SAMPLES {
            self.samples.pop_front();
        }
        self.samples.push_back((rtt, offset));
        self.cursor = reply.quotas_after;
        self.counter_version = reply.counter_version;
        self.root_instance = reply.root_instance;
        self.failures = 0;
        self.retry_at = 0;
        self.metrics.up = true;
        self.metrics.last_success = received;
        self.metrics.syncs += 1;
        self.metrics.round_trip = rtt;
        self.metrics.clock_offset = self.offset();
    }

    /// Records a failure at `now` and schedules the next try with capped
    /// exponential backoff: one interval, then 2, 4, up to 8.
    pub fn failed(&mut self, now: Nanos, interval: Nanos, error: String) {
        self.failures = self.failures.saturating_add(1);
        let factor = 1u64 << self.failures.saturating_sub(1).min(3);
        self.retry_at = now + interval.saturating_mul(factor);
        self.metrics.up = false;
        self.metrics.errors += 1;
        self.metrics.last_error = error;
    }

    /// Root time minus local time, from the quickest recent round trip.
    pub fn offset(&self) -> i64 {
        self.samples
            .iter()
            .min_by_key(|(rtt, _)| *rtt)
            .map_or(0, |&(_, off)| off)
    }

    /// A root counter value in local time.
    pub fn to_local(&self, value: &CounterValue) -> Level {
        let at = (value.at as i128 - i128::from(self.offset())).clamp(0, i128::from(u64::MAX));
        Level {
            level: value.level,
            at: at as u64,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reply(root_time: u64, instance: u64) -> SyncResponse {
        SyncResponse {
            root_instance: instance,
            root_time,
            quotas: vec![],
            quotas_after: QuotaCursor { epoch: 3, id: 0 },
            more_quotas: false,
            counters: vec![],
            counter_version: 9,
        }
    }

    #[test]
    fn the_offset_comes_from_the_quickest_round_trip() {
        let mut l = RootLink::new("r".into());
        // Sent at 1000, answered at 1100: midpoint 1050, root said 5050.
        l.succeeded(1000, 1100, &reply(5050, 1));
        assert_eq!(l.offset(), 4000);
        // A slow exchange with an asymmetric delay is ignored.
        l.succeeded(2000, 3000, &reply(6900, 1));
        assert_eq!(l.offset(), 4000);
        assert_eq!((l.cursor.epoch, l.counter_version), (3, 9));
        let v = CounterValue {
            id: 1,
            level: 2.0,
            at: 10_000,
        };
        assert_eq!(
            l.to_local(&v),
            Level {
                level: 2.0,
                at: 6000
            }
        );
    }

    #[test]
    fn a_new_root_instance_forgets_old_clock_samples() {
        let mut l = RootLink::new("r".into());
        l.succeeded(1000, 1010, &reply(5005, 1));
        l.succeeded(2000, 2100, &reply(102_050, 2));
        assert_eq!(l.offset(), 100_000);
    }

    #[test]
    fn failures_back_off_up_to_eight_intervals() {
        let mut l = RootLink::new("r".into());
        let waits: Vec<u64> = (0..6)
            .map(|_| {
                l.failed(100, 10, "down".into());
                l.retry_at - 100
            })
            .collect();
        assert_eq!(waits, vec![10, 20, 40, 80, 80, 80]);
        assert!(!l.metrics.up);
        l.succeeded(0, 1, &reply(1, 1));
        assert_eq!((l.failures, l.retry_at), (0, 0));
    }

    #[test]
    fn owed_deltas_accumulate_and_are_bounded() {
        let mut l = RootLink::new("r".into());
        l.owe([(1, 5), (2, 1)].into_iter(), 2);
        l.owe([(1, 5), (3, 7)].into_iter(), 2);
        assert_eq!(l.owed.get(&1), Some(&10));
        assert_eq!(l.owed.get(&3), None);
        assert_eq!(l.metrics.dropped_deltas, 1);
    }
}
