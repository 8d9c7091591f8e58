//! What the access handler counts that the table does not: weight errors,
//! unpassable rejections and `wait=` holds. The counters live in the
//! shared zone (every worker adds to them) and `sluice_metrics` shows a
//! [`RequestCounts`] snapshot of them. Pure: no nginx types.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

/// `sluice_wait_max` directives one configuration may hold: each counts
/// the requests held under it in a slot of its own in the zone.
pub const WAIT_MAX_SLOTS: usize = 32;

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
    /// Units given back by held requests that ended before their turn.
    pub returned: AtomicU64,
    /// Requests `sluice_wait_max` refused a hold (rejected at once).
    pub hold_refused: AtomicU64,
    /// Requests held now under each `sluice_wait_max` directive.
    pub held_by_cap: [AtomicU32; WAIT_MAX_SLOTS],
}

impl RequestCounters {
    /// Takes a place among the requests held under the `sluice_wait_max`
    /// directive `slot` allows `max` of; false when all are taken.
    pub fn take_hold(&self, slot: usize, max: u32) -> bool {
        let Some(held) = self.held_by_cap.get(slot) else {
            return true;
        };
        if held.fetch_add(1, Ordering::AcqRel) >= max {
            held.fetch_sub(1, Ordering::AcqRel);
            return false;
        }
        true
    }

    /// Gives back a place [`RequestCounters::take_hold`] took.
    pub fn end_hold(&self, slot: usize) {
        if let Some(held) = self.held_by_cap.get(slot) {
            let _ = held.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1));
        }
    }
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
            returned: get(&self.returned),
            hold_refused: get(&self.hold_refused),
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
            &counters.returned,
            &counters.hold_refused,
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
                returned: 10,
                hold_refused: 11,
            }
        );
    }

    #[test]
    fn a_wait_max_slot_holds_at_most_its_cap_and_a_place_comes_back_when_a_hold_ends() {
        let counters = RequestCounters::default();
        assert!(counters.take_hold(3, 2));
        assert!(counters.take_hold(3, 2));
        assert!(!counters.take_hold(3, 2));
        assert!(counters.take_hold(4, 2), "another directive's slot");
        counters.end_hold(3);
        assert!(counters.take_hold(3, 2));
        // An end never taken (a reload reset the zone's count) stops at 0.
        counters.end_hold(5);
        assert_eq!(counters.held_by_cap[5].load(Ordering::Relaxed), 0);
        // A slot past the table is not capped.
        assert!(counters.take_hold(WAIT_MAX_SLOTS, 0));
    }
}
