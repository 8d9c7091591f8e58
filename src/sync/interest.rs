//! What a limiter tells one root of the keys it holds, for a root that
//! answers by interest (see [`crate::wire::interest`] and docs/DESIGN.md,
//! "Replies by interest").
//!
//! The root learns a key from its delta. A key the table holds without
//! sending weight (a check of weight 0, a check rejected before its
//! first delta, a key whose entry came back from a restart) is listed:
//!
//! - the whole list when the root asks for it (it knows nothing of this
//!   limiter) and every [`REFRESH_SECONDS`] (so that keys the table let go
//!   leave the root's record);
//! - in between, the keys the table took in since the root last took a
//!   list, found only when the key section counts new entries (an
//!   unchanged count costs no scan).
//!
//! A list counts as known to the root once a reply to its request came
//! back; a failed exchange leaves it to the next cycle.

use std::collections::HashSet;

use crate::core::Nanos;
use crate::table::Table;
use crate::wire::interest::REFRESH_SECONDS;
use crate::wire::{CounterKey, Interest, RefusedKeys, SyncResponse};

/// One root link's side of interest.
#[derive(Debug, Default)]
pub struct LinkInterest {
    /// The root's last answer said it answers by interest.
    pub takes: bool,
    /// The root's last answer asked for the whole list.
    pub wants: bool,
    /// Local time the next whole list is due.
    due: Nanos,
    /// The keys the root took from lists (keys learned from deltas are
    /// not tracked: listing one again costs its 8 bytes once).
    known: HashSet<CounterKey>,
    /// The key section's count of new entries when the root last took a
    /// list.
    stamp: u64,
    /// The list of the request under way: its stamp, whether whole, and
    /// its keys.
    sending: Option<(u64, bool, Vec<CounterKey>)>,
}

/// The key section's count of keys that got an entry: a new key, or an
/// entry reused for another.
pub fn key_stamp(table: &Table) -> u64 {
    let stats = table.key_stats();
    stats.inserts.wrapping_add(stats.reclaimed)
}

impl LinkInterest {
    /// The list a request at `now` carries, when one is due: `stamp` is
    /// [`key_stamp`] now, `mine` reads every key this host holds of the
    /// root's group (called only when a list may go), `most` bounds its
    /// keys.
    pub fn next(
        &mut self,
        now: Nanos,
        stamp: u64,
        most: usize,
        mine: impl FnOnce() -> Vec<CounterKey>,
    ) -> Option<Interest> {
        self.sending = None;
        if !self.takes {
            return None;
        }
        let full = self.wants || now >= self.due;
        if !full && stamp == self.stamp {
            return None;
        }
        let mut keys = mine();
        if !full {
            keys.retain(|k| !self.known.contains(k));
        }
        keys.truncate(most);
        if !full && keys.is_empty() {
            self.stamp = stamp;
            return None;
        }
        let list = Interest {
            full,
            keys: RefusedKeys::by_template(keys.clone()),
        };
        self.sending = Some((stamp, full, keys));
        Some(list)
    }

    /// A reply to the request came back at `received`: the list it
    /// carried is the root's, and the reply says what it wants next.
    pub fn succeeded(&mut self, reply: &SyncResponse, received: Nanos) {
        if let Some((stamp, full, keys)) = self.sending.take() {
            if full {
                self.known = keys.into_iter().collect();
                self.due = received.saturating_add(REFRESH_SECONDS * 1_000_000_000);
            } else {
                self.known.extend(keys);
            }
            self.stamp = stamp;
        }
        self.takes = reply.takes_interest;
        self.wants = reply.wants_interest;
    }

    /// The exchange failed: its list goes again.
    pub fn failed(&mut self) {
        self.sending = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SEC: Nanos = 1_000_000_000;

    fn key(k: u64) -> CounterKey {
        CounterKey { id: 3, key: k }
    }

    fn reply(takes: bool, wants: bool) -> SyncResponse {
        SyncResponse {
            takes_interest: takes,
            wants_interest: wants,
            ..SyncResponse::default()
        }
    }

    fn keys(list: &Interest) -> Vec<u64> {
        list.counters().map(|c| c.key).collect()
    }

    #[test]
    fn the_whole_list_goes_when_asked_then_new_keys_then_the_whole_list_again() {
        let mut i = LinkInterest::default();
        // A root that does not answer by interest is sent nothing.
        assert!(i.next(0, 1, 100, || vec![key(1)]).is_none());
        i.succeeded(&reply(true, true), 0);
        let list = i.next(SEC, 1, 100, || vec![key(1), key(2)]).unwrap();
        assert!(list.full);
        assert_eq!(keys(&list), [1, 2]);
        i.succeeded(&reply(true, false), SEC);
        // Nothing new in the table: no list, not even a scan.
        assert!(i.next(2 * SEC, 1, 100, || panic!("scanned")).is_none());
        // A new key: only it goes, as an addition.
        let list = i.next(3 * SEC, 2, 100, || vec![key(1), key(2), key(5)]);
        let list = list.unwrap();
        assert!(!list.full);
        assert_eq!(keys(&list), [5]);
        // Its exchange failed: it goes again.
        i.failed();
        let list = i.next(4 * SEC, 2, 100, || vec![key(1), key(2), key(5)]);
        assert_eq!(keys(&list.unwrap()), [5]);
        i.succeeded(&reply(true, false), 4 * SEC);
        assert!(i.next(5 * SEC, 2, 100, || panic!("scanned")).is_none());
        // The refresh: the whole list again, without keys let go.
        let at = SEC + REFRESH_SECONDS * SEC;
        let list = i.next(at, 2, 100, || vec![key(2), key(5)]).unwrap();
        assert!(list.full);
        assert_eq!(keys(&list), [2, 5]);
        // A root that forgot the limiter asks again.
        i.succeeded(&reply(true, true), at);
        assert!(i.next(at + SEC, 2, 100, || vec![key(2)]).unwrap().full);
        // A root rolled back to one before interest: nothing goes.
        i.succeeded(&reply(false, false), at + SEC);
        assert!(i.next(at + 2 * SEC, 3, 100, || vec![key(9)]).is_none());
    }
}
