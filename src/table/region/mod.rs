//! The region core: the table's bytes and what gives them shape, with no
//! decision in it. Both faces of the table (the request face in `gate/`,
//! the sync face in `books/`) stand on it.
//!
//! # Layout
//!
//! - `sections.rs` — [`Region`]: a heap mapping or lent memory (an nginx
//!   zone), formatted or attached to, and the accessors that turn its
//!   offsets into sections; table-wide numbers and settings.
//! - `words.rs` — how numbers are packed into the region's words (a
//!   key's level and time, a sliding key's rate, a sliding slot's rate
//!   and previous count) and the keys' coarse clock.
//! - `layout.rs` — the format: header, status block, slot, index entry,
//!   key entry and tier entry layouts, their flags and packings.
//! - `geometry.rs` — where each section starts for a given size, and the
//!   ceilings of the key and tier sections.
//! - `names.rs` — the name hash, the fingerprint the name hints key on,
//!   and the name arena's words.
//! - `heap.rs` — the anonymous mapping behind a heap region.
//! - `lock.rs` — the writer lock, the seqlock write, process-id helpers.
//! - `status.rs` — the sync status block, written and read under its own
//!   seqlock.
//! - `slots.rs` — a slot as the other files read it: its quota under the
//!   seqlock, its counter, its flags.
//! - `index.rs` — the name index: open addressing from a name's hash to
//!   its slot, lookups and inserts.
//! - `keys.rs` — the counters of per-key quotas, one per (template, key
//!   hash): found, created, read; `key_entries.rs` — the key section's
//!   entries (a key's two buckets, its counter word, the overflow
//!   counter); `key_moves.rs` — making room for a key whose two buckets
//!   are full (moving entries, evicting drained ones).
//! - `ring.rs` — dirty rings (keys', named quotas'): the counters with
//!   weight not collected yet, queued by checks, drained by a sync; the
//!   marking of named quotas.
//! - `tier_section.rs` — overrides and penalties per key in the region.
//! - `holds.rs` — hold records: which process holds which in-flight
//!   slots, claimed, freed, and taken over from a dead process.
//! - `handover.rs` — the handover section: what a sync thread leaves
//!   for one that takes over from it should it die or stop;
//!   `handover_header.rs` — its shared words in the header.
//! - `listing.rs` — the table read whole: every quota with its live state
//!   (listings, snapshots, the busiest quotas).

pub mod geometry;
pub mod handover;
pub mod handover_header;
pub(in crate::table) mod heap;
pub(in crate::table) mod holds;
pub(in crate::table) mod index;
pub(in crate::table) mod key_entries;
pub(in crate::table) mod key_moves;
pub(in crate::table) mod keys;
pub mod layout;
pub(in crate::table) mod listing;
pub(in crate::table) mod lock;
pub mod names;
pub(in crate::table) mod ring;
mod sections;
pub(in crate::table) mod slots;
pub(in crate::table) mod status;
pub(in crate::table) mod tier_section;
pub(in crate::table) mod words;

pub(in crate::table) use sections::{read_pause, region_view, ACQ, READ_ATTEMPTS, REL, RLX};
pub use sections::{Region, SlotId, TableError};
