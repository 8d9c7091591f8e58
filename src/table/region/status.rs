//! The sync status block: a region of plain atomics ([`SyncStatus`]) the
//! sync thread writes and every process sharing the region reads. The
//! table only guards it (a seqlock under the writer lock); what the
//! fields mean is the sync side's business (`crate::sync::status`).

use std::sync::atomic::{fence, AtomicU64};

use super::layout::{RootStatus, SyncStatus, REMEMBERED_INSTANCES};
use super::sections::{read_pause, Region, ACQ, READ_ATTEMPTS, REL, RLX};

impl Region {
    /// Writes the status block: `write` stores into it while readers are
    /// held off by the block's seqlock (and other writers by the writer
    /// lock).
    pub(in crate::table) fn write_status(&self, write: impl FnOnce(&SyncStatus)) {
        let st = self.status();
        let _guard = self.lock();
        let seq = st.seq.load(RLX);
        st.seq.store(seq.wrapping_add(1) | 1, RLX);
        fence(REL);
        write(st);
        st.seq.store((seq.wrapping_add(1) | 1).wrapping_add(1), REL);
    }

    /// Takes over the per-root words the sync thread keeps for the next
    /// one (`url_hash`, `instance`, `restarts`, `takes`, `others`) from
    /// `old` (an nginx zone that changed size); the metrics start anew.
    pub(in crate::table) fn adopt_remembered_roots(&self, old: &Region) {
        let Some(words) = old.read_status(|st| {
            st.root
                .each_ref()
                .map(|r| remembered_words(r).map(|w| w.load(RLX)))
        }) else {
            return;
        };
        self.write_status(|st| {
            for (r, w) in st.root.iter().zip(words) {
                for (to, w) in remembered_words(r).into_iter().zip(w) {
                    to.store(w, RLX);
                }
            }
        });
    }

    /// Reads the status block consistently: `read` runs until it ran while
    /// no write was under way (`None` if that never happened within the
    /// retry bound). `read` must only load from the block.
    pub(in crate::table) fn read_status<T>(&self, read: impl Fn(&SyncStatus) -> T) -> Option<T> {
        let st = self.status();
        for attempt in 0..READ_ATTEMPTS {
            let seq = st.seq.load(ACQ);
            if seq & 1 == 1 {
                read_pause(attempt);
                continue;
            }
            let value = read(st);
            fence(ACQ);
            if st.seq.load(RLX) == seq {
                return Some(value);
            }
        }
        None
    }
}

/// The words of a root's status that a later sync thread takes over.
fn remembered_words(r: &RootStatus) -> [&AtomicU64; 4 + REMEMBERED_INSTANCES] {
    let first = [&r.url_hash, &r.instance, &r.restarts, &r.takes];
    std::array::from_fn(|i| {
        first
            .get(i)
            .copied()
            .unwrap_or_else(|| &r.others[i - first.len()])
    })
}
