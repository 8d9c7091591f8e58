//! The sync thread's metrics as every process sharing a table sees them:
//! written into the table's status block after each step of a cycle, read
//! back by any nginx worker serving the metrics.

use std::sync::atomic::Ordering::Relaxed;

use super::metrics::{RootMetrics, SyncMetrics};
use crate::table::layout::{REMEMBERED_INSTANCES, STATUS_ROOTS};
use crate::table::Table;

/// Publishes `m` in `table` for every process sharing it (the first
/// [`STATUS_ROOTS`] roots).
pub fn publish(table: &Table, m: &SyncMetrics) {
    table.books().write_status(|st| {
        st.cycles.store(m.cycles, Relaxed);
        let groups = m
            .groups_down
            .iter()
            .filter(|&&g| g < 63)
            .fold(0u64, |bits, &g| bits | 1 << (1 + g));
        st.down.store(u64::from(m.all_roots_down) | groups, Relaxed);
        st.roots
            .store(m.roots.len().min(STATUS_ROOTS) as u32, Relaxed);
        for (slot, r) in st.root.iter().zip(&m.roots) {
            slot.up.store(u64::from(r.up), Relaxed);
            slot.last_success.store(r.last_success, Relaxed);
            slot.syncs.store(r.syncs, Relaxed);
            slot.errors.store(r.errors, Relaxed);
            slot.round_trip.store(r.round_trip, Relaxed);
            slot.clock_offset.store(r.clock_offset as u64, Relaxed);
            slot.bytes_sent.store(r.bytes_sent, Relaxed);
            slot.bytes_received.store(r.bytes_received, Relaxed);
            slot.dropped_deltas.store(r.dropped_deltas, Relaxed);
            slot.dropped_returns.store(r.dropped_returns, Relaxed);
            slot.unconfirmed.store(r.unconfirmed, Relaxed);
            slot.unconfirmed_merged.store(r.unconfirmed_merged, Relaxed);
        }
    });
}

/// What a sync thread knew of a root, remembered in the region for the
/// next sync thread (after an nginx reload; see
/// `SyncEngine::resume`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RememberedRoot {
    /// The root instance that last answered.
    pub instance: u64,
    /// The restarts of the root seen so far.
    pub restarts: u8,
    /// Its last answer said it takes returns.
    pub takes_returns: bool,
    /// Its last answer said it takes sequences.
    pub takes_sequence: bool,
    /// Its last answer said it takes held slots.
    pub takes_held: bool,
    /// Its last answer said it takes the held slots of keys.
    pub takes_keyed_held: bool,
    /// Other instances that answered at its URL lately, oldest first (0:
    /// none; see `RootLink::others`).
    pub others: [u64; REMEMBERED_INSTANCES],
}

/// Bits of a remembered root's `takes` word.
const TAKES_RETURNS: u64 = 1;
const TAKES_SEQUENCE: u64 = 2;
const TAKES_HELD: u64 = 4;
const TAKES_KEYED_HELD: u64 = 8;

/// Remembers in `table` what is known of the root at `index` in the
/// configuration (`url`). Only the first [`STATUS_ROOTS`] roots are
/// remembered.
pub fn remember_root(table: &Table, index: usize, url: &str, root: RememberedRoot) {
    if index >= STATUS_ROOTS {
        return;
    }
    let hash = url_hash(url);
    table.books().write_status(|st| {
        for (i, r) in st.root.iter().enumerate() {
            if i == index {
                r.url_hash.store(hash, Relaxed);
                r.instance.store(root.instance, Relaxed);
                r.restarts.store(u64::from(root.restarts), Relaxed);
                let takes = if root.takes_returns { TAKES_RETURNS } else { 0 }
                    | if root.takes_sequence {
                        TAKES_SEQUENCE
                    } else {
                        0
                    }
                    | if root.takes_held { TAKES_HELD } else { 0 }
                    | if root.takes_keyed_held {
                        TAKES_KEYED_HELD
                    } else {
                        0
                    };
                r.takes.store(takes, Relaxed);
                for (to, &other) in r.others.iter().zip(&root.others) {
                    to.store(other, Relaxed);
                }
            } else if r.url_hash.load(Relaxed) == hash {
                // The root moved in the configuration: its old place
                // must not be found later, stale.
                r.url_hash.store(0, Relaxed);
            }
        }
    });
}

/// What an earlier sync thread remembered of root `url` in `table`.
pub fn remembered_root(table: &Table, url: &str) -> Option<RememberedRoot> {
    let hash = url_hash(url);
    table
        .read_status(|st| {
            st.root
                .iter()
                .find(|r| r.url_hash.load(Relaxed) == hash)
                .map(|r| RememberedRoot {
                    instance: r.instance.load(Relaxed),
                    restarts: r.restarts.load(Relaxed) as u8,
                    takes_returns: r.takes.load(Relaxed) & TAKES_RETURNS != 0,
                    takes_sequence: r.takes.load(Relaxed) & TAKES_SEQUENCE != 0,
                    takes_held: r.takes.load(Relaxed) & TAKES_HELD != 0,
                    takes_keyed_held: r.takes.load(Relaxed) & TAKES_KEYED_HELD != 0,
                    others: r.others.each_ref().map(|o| o.load(Relaxed)),
                })
        })
        .flatten()
}

/// A root URL's hash as the region keeps it: the name index's hash,
/// the same in every process (never 0, which means none).
fn url_hash(url: &str) -> u64 {
    crate::table::names::hash(url.as_bytes()).max(1)
}

/// The metrics last published in `table` (root URLs and errors are left
/// empty: every process knows the URLs from its own configuration).
pub fn published(table: &Table) -> SyncMetrics {
    table
        .read_status(|st| {
            let n = (st.roots.load(Relaxed) as usize).min(STATUS_ROOTS);
            let roots = st.root[..n]
                .iter()
                .map(|r| RootMetrics {
                    url: String::new(),
                    // Every process knows the groups from its configuration.
                    group: 0,
                    up: r.up.load(Relaxed) != 0,
                    last_success: r.last_success.load(Relaxed),
                    syncs: r.syncs.load(Relaxed),
                    errors: r.errors.load(Relaxed),
                    last_error: String::new(),
                    round_trip: r.round_trip.load(Relaxed),
                    clock_offset: r.clock_offset.load(Relaxed) as i64,
                    bytes_sent: r.bytes_sent.load(Relaxed),
                    bytes_received: r.bytes_received.load(Relaxed),
                    dropped_deltas: r.dropped_deltas.load(Relaxed),
                    dropped_returns: r.dropped_returns.load(Relaxed),
                    unconfirmed: r.unconfirmed.load(Relaxed),
                    unconfirmed_merged: r.unconfirmed_merged.load(Relaxed),
                    // Not published in the region: the sync thread's own.
                    ..RootMetrics::default()
                })
                .collect();
            let down = st.down.load(Relaxed);
            SyncMetrics {
                cycles: st.cycles.load(Relaxed),
                all_roots_down: down & 1 != 0,
                roots,
                groups_down: (0..63).filter(|g| down & 1 << (1 + g) != 0).collect(),
            }
        })
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sync_status_is_published_for_other_processes() {
        let t = Table::new_heap(4, 16);
        assert_eq!(published(&t), SyncMetrics::default());
        let m = SyncMetrics {
            cycles: 5,
            all_roots_down: true,
            roots: vec![RootMetrics {
                url: String::new(),
                up: true,
                syncs: 4,
                errors: 1,
                clock_offset: -12,
                dropped_returns: 7,
                ..Default::default()
            }],
            groups_down: Vec::new(),
        };
        publish(&t, &m);
        assert_eq!(published(&t), m);
    }

    #[test]
    fn a_root_is_remembered_for_the_next_sync_thread_by_its_url() {
        let t = Table::new_heap(4, 16);
        let known = |instance, restarts| RememberedRoot {
            instance,
            restarts,
            takes_returns: true,
            takes_sequence: restarts % 2 == 0,
            takes_held: restarts % 2 == 0,
            takes_keyed_held: restarts % 2 == 1,
            others: [instance + 100, instance + 200, 0, 0],
        };
        assert_eq!(remembered_root(&t, "http://a"), None);
        remember_root(&t, 0, "http://a", known(7, 2));
        remember_root(&t, 1, "http://b", RememberedRoot::default());
        assert_eq!(remembered_root(&t, "http://a"), Some(known(7, 2)));
        assert_eq!(
            remembered_root(&t, "http://b"),
            Some(RememberedRoot::default())
        );
        // Metrics published over it leave it alone.
        publish(&t, &SyncMetrics::default());
        assert_eq!(remembered_root(&t, "http://a"), Some(known(7, 2)));
        // Moved in the configuration: only the new place is found.
        remember_root(&t, 2, "http://a", known(8, 3));
        remember_root(&t, 0, "http://c", known(1, 0));
        assert_eq!(remembered_root(&t, "http://a"), Some(known(8, 3)));
        remember_root(&t, 2, "http://c", known(1, 0));
        assert_eq!(remembered_root(&t, "http://a"), None);
        // Every root a limiter may have is kept, the last too (past the
        // 16th, once the limit, nothing was).
        for i in 0..STATUS_ROOTS {
            remember_root(&t, i, &format!("http://r{i}"), known(i as u64 + 1, 0));
        }
        for i in [16, 40, STATUS_ROOTS - 1] {
            let url = format!("http://r{i}");
            assert_eq!(remembered_root(&t, &url), Some(known(i as u64 + 1, 0)));
        }
        // Past the block's roots nothing is kept.
        remember_root(&t, STATUS_ROOTS, "http://z", known(1, 0));
        assert_eq!(remembered_root(&t, "http://z"), None);
    }

    #[test]
    fn groups_down_are_published_for_other_processes() {
        let t = Table::new_heap(4, 16);
        let m = SyncMetrics {
            cycles: 9,
            groups_down: vec![0, 2],
            ..Default::default()
        };
        publish(&t, &m);
        assert_eq!(published(&t), m);
        let up = SyncMetrics {
            cycles: 10,
            ..Default::default()
        };
        publish(&t, &up);
        assert_eq!(published(&t), up);
    }
}
