//! The name index: open addressing from a name's hash to its slot and
//! the name's place in the arena, walked by a lookup under the index's
//! sequence (a rebuild makes a miss retry), and written under the writer
//! lock when quotas are added or removed.

use std::sync::atomic::{fence, Ordering};

use super::layout::{
    entry_matches, entry_parts, index_entry, index_home, FLAG_LIVE, INDEX_EMPTY, INDEX_TOMBSTONE,
};
use super::names;
use super::sections::{read_pause, region_view, SlotId, ACQ, READ_ATTEMPTS, REL, RLX};
use super::slots::prefetch_for_write;

region_view!(
    /// The name index.
    NameIndex
);

impl NameIndex<'_> {
    /// Finds the live slot named `name`.
    pub(in crate::table) fn lookup(&self, name: &[u8]) -> Option<SlotId> {
        self.probe(name, |slot, name_at| {
            self.slot_is_named(slot, name_at, name).then_some(slot)
        })
    }

    /// Walks the index for `name`, calling `at_match` with the slot and
    /// name place of every entry whose tag matches, until it returns
    /// something.
    pub(in crate::table) fn probe<T>(
        &self,
        name: &[u8],
        mut at_match: impl FnMut(SlotId, u32) -> Option<T>,
    ) -> Option<T> {
        let h = self.header();
        let index = self.index();
        let hash = names::hash(name);
        for attempt in 0..READ_ATTEMPTS {
            let seq = h.index_seq.load(ACQ);
            let mut pos = index_home(hash, index.len());
            for _ in 0..index.len() {
                let entry = index[pos].load(ACQ);
                if entry == INDEX_EMPTY {
                    break;
                }
                if entry_matches(entry, hash) {
                    let (slot, name_at) = entry_parts(entry);
                    if let Some(found) = at_match(slot, name_at) {
                        return Some(found);
                    }
                }
                pos = if pos + 1 == index.len() { 0 } else { pos + 1 };
            }
            // A miss is final unless the index was being rebuilt meanwhile.
            if seq & 1 == 0 && h.index_seq.load(ACQ) == seq {
                return None;
            }
            read_pause(attempt);
        }
        None
    }

    /// True when `slot` is live and named `name`, stored at `name_at`.
    /// The name's words and the slot are independent loads, so their cache
    /// misses overlap.
    fn slot_is_named(&self, slot: SlotId, name_at: u32, name: &[u8]) -> bool {
        let Some(s) = self.slot(slot) else {
            return false;
        };
        let Some(words) = names::name_words(self.arena(), name_at, name.len()) else {
            return false;
        };
        // The check will add to line B next: start fetching it now, beside
        // line A and the name, instead of after them.
        prefetch_for_write(&s.pending);
        for attempt in 0..READ_ATTEMPTS {
            let seq = s.seq.load(ACQ);
            if seq & 1 == 0 {
                let same = names::equals(words, name)
                    && s.flags.load(RLX) & FLAG_LIVE != 0
                    && s.name_len.load(RLX) as usize == name.len()
                    && s.name_at.load(RLX) == name_at;
                fence(ACQ);
                if s.seq.load(RLX) == seq {
                    return same;
                }
            }
            read_pause(attempt);
        }
        false
    }

    pub(in crate::table) fn index_insert(&self, name: &[u8], slot: SlotId, name_at: u32) {
        let h = self.header();
        let index = self.index();
        let hash = names::hash(name);
        let mut pos = index_home(hash, index.len());
        loop {
            let e = index[pos].load(RLX);
            if e == INDEX_EMPTY || e == INDEX_TOMBSTONE {
                if e == INDEX_TOMBSTONE {
                    h.index_tombstones.fetch_sub(1, RLX);
                }
                index[pos].store(index_entry(hash, slot, name_at), REL);
                return;
            }
            // The index has 1.5 entries per slot, so an empty or deleted
            // entry is always found.
            pos = if pos + 1 == index.len() { 0 } else { pos + 1 };
        }
    }

    pub(in crate::table) fn index_remove(&self, name: &[u8], slot: SlotId, name_at: u32) {
        let index = self.index();
        let hash = names::hash(name);
        let entry = index_entry(hash, slot, name_at);
        let mut pos = index_home(hash, index.len());
        for _ in 0..index.len() {
            let e = index[pos].load(RLX);
            if e == INDEX_EMPTY {
                return;
            }
            if e == entry {
                index[pos].store(INDEX_TOMBSTONE, REL);
                self.header().index_tombstones.fetch_add(1, RLX);
                return;
            }
            pos = if pos + 1 == index.len() { 0 } else { pos + 1 };
        }
    }

    /// Rebuilds the index when tombstones make up a sixth of it, so
    /// misses keep ending at an empty entry soon. Lookups that miss during
    /// the rebuild see `index_seq` move and retry.
    pub(in crate::table) fn maybe_rebuild_index(&self) {
        let h = self.header();
        let index = self.index();
        if (h.index_tombstones.load(RLX) as usize) * 6 < index.len() {
            return;
        }
        h.index_seq.fetch_add(1, REL);
        fence(Ordering::SeqCst);
        for e in index {
            e.store(INDEX_EMPTY, RLX);
        }
        h.index_tombstones.store(0, RLX);
        for (i, s) in self.used_slots() {
            if s.flags.load(RLX) & FLAG_LIVE != 0 {
                let len = s.name_len.load(RLX) as usize;
                let at = s.name_at.load(RLX);
                if let Some(w) = names::name_words(self.arena(), at, len) {
                    self.index_insert(&names::load(w, len), i, at);
                }
            }
        }
        h.index_seq.fetch_add(1, REL);
    }
}
