//! The simulation's one queue of timed events, ordered by time and then
//! by insertion: events of equal times pop in the order they were pushed,
//! so a run is a pure function of its inputs.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

use crate::core::Nanos;

/// An event in the queue.
#[derive(Debug)]
pub(super) enum Event {
    /// Generate second `s`'s arrivals.
    Second(usize),
    /// A request reaches a host.
    Arrival { host: usize, load: usize },
    /// A host starts a sync cycle (or, without roots, folds locally);
    /// ignored unless `seq` is the host's latest (an early cycle moved it).
    Tick { host: usize, seq: u64 },
    /// A host with early sync looks at its unsent deltas.
    Probe { host: usize },
    /// A sync request reaches its root.
    AtRoot { exchange: u64 },
    /// A root's reply (or its host's refusal) reaches the limiter host.
    AtHost { exchange: u64 },
    /// A host gives up waiting for a reply.
    Timeout { exchange: u64 },
    /// A charged request ends on its host: its cost is charged, or its
    /// estimate settled (`rank`: its key, 0 unkeyed).
    Done {
        host: usize,
        load: usize,
        rank: u64,
        estimate: u64,
        cost: u64,
        charged_at: Nanos,
    },
    /// A request of a holding load ends: its host gives its slot back.
    Release {
        host: usize,
        load: usize,
        rank: Option<u64>,
        held: crate::table::HeldSlot,
    },
    /// A scenario event (index into the scenario's list).
    Scenario(usize),
    /// Sample levels at the end of second `s`.
    Sample(usize),
}

struct Entry {
    at: Nanos,
    seq: u64,
    event: Event,
}

impl PartialEq for Entry {
    fn eq(&self, other: &Self) -> bool {
        (self.at, self.seq) == (other.at, other.seq)
    }
}

impl Eq for Entry {}

impl PartialOrd for Entry {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Entry {
    /// Reversed, so the max-heap pops the earliest (then oldest) entry.
    fn cmp(&self, other: &Self) -> Ordering {
        (other.at, other.seq).cmp(&(self.at, self.seq))
    }
}

/// Events by time, then by insertion.
#[derive(Default)]
pub(super) struct EventQueue {
    heap: BinaryHeap<Entry>,
    /// Insertion number of the last event pushed.
    seq: u64,
}

impl EventQueue {
    /// Adds `event` at time `at`.
    pub(super) fn push(&mut self, at: Nanos, event: Event) {
        self.seq += 1;
        self.heap.push(Entry {
            at,
            seq: self.seq,
            event,
        });
    }

    /// Takes the earliest event (of equal times, the first pushed).
    pub(super) fn pop(&mut self) -> Option<(Nanos, Event)> {
        self.heap.pop().map(|e| (e.at, e.event))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_pop_by_time_then_in_the_order_they_were_pushed() {
        let mut q = EventQueue::default();
        q.push(20, Event::Sample(0));
        q.push(10, Event::Second(1));
        q.push(20, Event::Second(2));
        q.push(10, Event::Sample(3));
        let popped: Vec<String> =
            std::iter::from_fn(|| q.pop().map(|(at, e)| format!("{at}:{e:?}"))).collect();
        assert_eq!(
            popped,
            [
                "10:Second(1)",
                "10:Sample(3)",
                "20:Sample(0)",
                "20:Second(2)"
            ]
        );
    }
}
