//! What the access handler counts that the table does not: weight errors,
//! unpassable rejections and `wait=` holds. The counters live in the
//! shared zone (every worker adds to them) and `sluice_metrics` shows a
//! [`RequestCounts`] snapshot of them. Pure: no nginx types.

use std::sync::atomic::{AtomicU64, Ordering};

use super::prometheus::RequestCounts;

/// The request counters in the zone (`#[repr(C)]`: their place in the
/// zone is fixed for every process that maps it).
#[repr(C)]
#[derive(Debug, Default)]
pub struct RequestCounters {
    /// Requests whose weight variable was not a number.
    pub invalid_weight: AtomicU64,
    /// Requests whose weight variable was empty, with `empty=reject`.
    pub empty_weight: AtomicU64,
    /// Rejections that waiting cannot help (no `Retry-After`).
    pub unpassable: AtomicU64,
    /// Requests held by `wait=` until their turn.
    pub delayed: AtomicU64,
    /// Requests `wait=` would have held, let through at once by dry run.
    pub delayed_dry_run: AtomicU64,
    /// Nanoseconds held requests were given to wait, summed.
    pub delay_ns: AtomicU64,
    /// Held requests that ended before their turn (the client closed).
    pub abandoned: AtomicU64,
    /// Requests held right now: their timers are pending.
    pub waiting: AtomicU64,
    /// Held requests let go before their turn (`sluice_wait_coalesce`).
    pub coalesced: AtomicU64,
}

impl RequestCounters {
    /// The counts as they are now, for the Prometheus text.
    pub fn snapshot(&self) -> RequestCounts {
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        RequestCounts {
            invalid_weight: get(&self.invalid_weight),
            empty_weight: get(&self.empty_weight),
            unpassable: get(&self.unpassable),
            delayed: get(&self.delayed),
            delayed_dry_run: get(&self.delayed_dry_run),
            delay_ns: get(&self.delay_ns),
            abandoned: get(&self.abandoned),
            waiting: get(&self.waiting),
            coalesced: get(&self.coalesced),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_snapshot_reads_each_counter_into_its_own_field() {
        let counters = RequestCounters::default();
        let fields = [
            &counters.invalid_weight,
            &counters.empty_weight,
            &counters.unpassable,
            &counters.delayed,
            &counters.delayed_dry_run,
            &counters.delay_ns,
            &counters.abandoned,
            &counters.waiting,
            &counters.coalesced,
        ];
        for (i, field) in fields.iter().enumerate() {
            field.store(i as u64 + 1, Ordering::Relaxed);
        }
        assert_eq!(
            counters.snapshot(),
            RequestCounts {
                invalid_weight: 1,
                empty_weight: 2,
                unpassable: 3,
                delayed: 4,
                delayed_dry_run: 5,
                delay_ns: 6,
                abandoned: 7,
                waiting: 8,
                coalesced: 9,
            }
        );
    }
}
