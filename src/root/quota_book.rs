//! The quotas a root holds in memory, as loaded from the database.
//!
//! Three views of one set of quotas, each shared through `Arc` so a quota is
//! stored once:
//!
//! - by id (tombstones included): what a delta or a parent id refers to;
//! - by `(epoch, id)` (tombstones included): the change log limiters page
//!   through, so a sync reply costs the size of the page, not of the set;
//! - by name (live quotas only): the admin API's lookups and listings.

use std::borrow::Borrow;
use std::cmp::Ordering;
use std::collections::{BTreeMap, BTreeSet};
use std::ops::Bound;
use std::sync::Arc;

use rustc_hash::FxHashMap;

use crate::core::{Counting, Quota};
use crate::wire::QuotaCursor;

/// What loading one quota changed, for the counters.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum QuotaChange {
    /// The quota is live, counting like this.
    Live {
        /// Quota id.
        id: u64,
        /// A per-key template (the counting is its keys').
        per_key: bool,
    },
    /// The quota is a tombstone now.
    Deleted {
        /// Quota id.
        id: u64,
    },
    /// Nothing: the book already held this or a newer version.
    Stale,
}

/// A live quota ordered by name, so the name index borrows the quota's own
/// name instead of keeping a copy.
#[derive(Clone, Debug)]
struct ByName(Arc<Quota>);

impl PartialEq for ByName {
    fn eq(&self, other: &Self) -> bool {
        self.0.name == other.0.name
    }
}

impl Eq for ByName {}

impl PartialOrd for ByName {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for ByName {
    fn cmp(&self, other: &Self) -> Ordering {
        self.0.name.cmp(&other.0.name)
    }
}

impl Borrow<str> for ByName {
    fn borrow(&self) -> &str {
        &self.0.name
    }
}

/// One page of the change log.
#[derive(Clone, Debug, Default)]
pub struct QuotaPage {
    /// Quotas after the requested cursor, in `(epoch, id)` order.
    pub quotas: Vec<Arc<Quota>>,
    /// Cursor after the last quota of the page (the requested one when the
    /// page is empty).
    pub after: QuotaCursor,
    /// More quotas follow the page.
    pub more: bool,
}

/// The in-memory quota set of a root.
#[derive(Debug, Default)]
pub struct QuotaBook {
    /// Every quota ever loaded, tombstones included, by id.
    by_id: FxHashMap<u64, Arc<Quota>>,
    /// The same quotas by `(epoch, id)`: the change log.
    log: BTreeMap<(u64, u64), Arc<Quota>>,
    /// Live quotas by name.
    by_name: BTreeSet<ByName>,
    /// Position of the last quota loaded from the database.
    cursor: QuotaCursor,
}

impl QuotaBook {
    /// Stores a quota read from the database (new, changed or a tombstone)
    /// and says what that means for its counter.
    pub fn load(&mut self, quota: Quota) -> QuotaChange {
        let position = QuotaCursor {
            epoch: quota.epoch,
            id: quota.id,
        };
        if let Some(old) = self.by_id.get(&quota.id) {
            if old.epoch >= quota.epoch {
                return QuotaChange::Stale;
            }
            let old = Arc::clone(old);
            self.log.remove(&(old.epoch, old.id));
            if !old.deleted {
                self.by_name.remove(old.name.as_str());
            }
        }
        self.cursor = self.cursor.max(position);
        let change = if quota.deleted {
            QuotaChange::Deleted { id: quota.id }
        } else {
            QuotaChange::Live {
                id: quota.id,
                per_key: quota.per_key,
            }
        };
        let quota = Arc::new(quota);
        self.log.insert((quota.epoch, quota.id), Arc::clone(&quota));
        if !quota.deleted {
            self.by_name.insert(ByName(Arc::clone(&quota)));
        }
        self.by_id.insert(quota.id, quota);
        change
    }

    /// Position of the last quota loaded: where the next reload starts.
    pub fn cursor(&self) -> QuotaCursor {
        self.cursor
    }

    /// Up to `max` quotas after `after`, in `(epoch, id)` order.
    pub fn page_after(&self, after: QuotaCursor, max: usize) -> QuotaPage {
        let range = (Bound::Excluded((after.epoch, after.id)), Bound::Unbounded);
        let mut entries = self.log.range(range);
        let quotas: Vec<Arc<Quota>> = entries
            .by_ref()
            .take(max)
            .map(|(_, q)| Arc::clone(q))
            .collect();
        let more = entries.next().is_some();
        let after = quotas.last().map_or(after, |q| QuotaCursor {
            epoch: q.epoch,
            id: q.id,
        });
        QuotaPage {
            quotas,
            after,
            more,
        }
    }

    /// A quota by id, tombstones included.
    pub fn get(&self, id: u64) -> Option<&Arc<Quota>> {
        self.by_id.get(&id)
    }

    /// The limit of a live quota.
    pub fn live_limit(&self, id: u64) -> Option<f64> {
        self.by_id.get(&id).filter(|q| !q.deleted).map(|q| q.limit)
    }

    /// Live quota `id`, when it counts `keyed` counters: a per-key
    /// template's keys (`keyed`), or any quota's own counter (a per-key
    /// template's own counter is the one its keys share when a limiter's
    /// key section has no room for them).
    pub fn counting_quota(&self, id: u64, keyed: bool) -> Option<&Quota> {
        self.by_id
            .get(&id)
            .filter(|q| !q.deleted && (q.per_key || !keyed))
            .map(|q| q.as_ref())
    }

    /// How live quota `id` counts, when it counts `keyed` counters (see
    /// [`Self::counting_quota`]); window rules place windows with
    /// `utc_offset`.
    pub fn counting(&self, id: u64, keyed: bool, utc_offset: i64) -> Option<Counting> {
        self.counting_quota(id, keyed)
            .map(|q| q.counting(utc_offset))
    }

    /// A live quota by name.
    pub fn by_name(&self, name: &str) -> Option<&Arc<Quota>> {
        self.by_name.get(name).map(|entry| &entry.0)
    }

    /// The name of a quota by id (tombstones included).
    pub fn name_of(&self, id: u64) -> Option<&str> {
        self.by_id.get(&id).map(|q| q.name.as_str())
    }

    /// Live quotas whose name starts with `prefix`, after the name `after`,
    /// in name order, at most `max`; the flag says whether more follow.
    pub fn list(&self, prefix: &str, after: Option<&str>, max: usize) -> (Vec<Arc<Quota>>, bool) {
        let start = match after {
            Some(after) if after >= prefix => Bound::Excluded(after),
            _ => Bound::Included(prefix),
        };
        let mut names = self
            .by_name
            .range::<str, _>((start, Bound::Unbounded))
            .take_while(|entry| entry.0.name.starts_with(prefix));
        let quotas: Vec<Arc<Quota>> = names.by_ref().take(max).map(|e| Arc::clone(&e.0)).collect();
        let more = names.next().is_some();
        (quotas, more)
    }

    /// Number of live quotas.
    pub fn live(&self) -> usize {
        self.by_name.len()
    }

    /// Number of tombstones.
    pub fn tombstones(&self) -> usize {
        self.by_id.len() - self.by_name.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn quota(id: u64, name: &str, epoch: u64, deleted: bool) -> Quota {
        Quota {
            deleted,
            ..Quota::new(id, name, 10.0, 10.0, 20.0).at_epoch(epoch)
        }
    }

    #[test]
    fn loading_moves_a_quota_to_its_new_place_in_the_log() {
        let mut book = QuotaBook::default();
        book.load(quota(1, "a", 1, false));
        book.load(quota(2, "b", 2, false));
        assert_eq!(
            book.load(quota(1, "a", 3, false)),
            QuotaChange::Live {
                id: 1,
                per_key: false
            }
        );
        let page = book.page_after(QuotaCursor::default(), 10);
        let ids: Vec<u64> = page.quotas.iter().map(|q| q.id).collect();
        assert_eq!(ids, [2, 1]);
        assert_eq!(page.after, QuotaCursor { epoch: 3, id: 1 });
        assert_eq!(book.cursor(), QuotaCursor { epoch: 3, id: 1 });
    }

    #[test]
    fn older_versions_are_ignored() {
        let mut book = QuotaBook::default();
        book.load(quota(1, "a", 5, false));
        assert_eq!(book.load(quota(1, "a", 4, true)), QuotaChange::Stale);
        assert!(book.by_name("a").is_some());
    }

    #[test]
    fn tombstones_stay_in_the_log_but_leave_the_name_index() {
        let mut book = QuotaBook::default();
        book.load(quota(1, "a", 1, false));
        assert_eq!(
            book.load(quota(1, "a", 2, true)),
            QuotaChange::Deleted { id: 1 }
        );
        assert!(book.by_name("a").is_none());
        assert_eq!(book.live_limit(1), None);
        assert_eq!((book.live(), book.tombstones()), (0, 1));
        let page = book.page_after(QuotaCursor { epoch: 1, id: 1 }, 10);
        assert!(page.quotas[0].deleted);
        // A revived quota returns to the index.
        book.load(quota(1, "a", 3, false));
        assert_eq!(book.by_name("a").map(|q| q.epoch), Some(3));
    }

    #[test]
    fn pages_resume_inside_one_epoch() {
        let mut book = QuotaBook::default();
        for id in 1..=5 {
            book.load(quota(id, &format!("q{id}"), 7, false));
        }
        let first = book.page_after(QuotaCursor::default(), 2);
        assert!(first.more);
        assert_eq!(first.after, QuotaCursor { epoch: 7, id: 2 });
        let second = book.page_after(first.after, 3);
        assert!(!second.more);
        assert_eq!(
            second.quotas.iter().map(|q| q.id).collect::<Vec<_>>(),
            [3, 4, 5]
        );
        let empty = book.page_after(second.after, 3);
        assert!(empty.quotas.is_empty() && !empty.more);
        assert_eq!(empty.after, second.after);
    }

    #[test]
    fn listing_filters_by_prefix_and_resumes_after_a_name() {
        let mut book = QuotaBook::default();
        for (id, name) in ["s3_a", "s3_b", "s3_c", "t_a", "s2"].iter().enumerate() {
            book.load(quota(id as u64 + 1, name, 1, false));
        }
        let (page, more) = book.list("s3_", None, 2);
        assert_eq!(
            page.iter().map(|q| q.name.as_str()).collect::<Vec<_>>(),
            ["s3_a", "s3_b"]
        );
        assert!(more);
        let (page, more) = book.list("s3_", Some("s3_b"), 2);
        assert_eq!(
            page.iter().map(|q| q.name.as_str()).collect::<Vec<_>>(),
            ["s3_c"]
        );
        assert!(!more);
        let (all, _) = book.list("", Some("s3_c"), 10);
        assert_eq!(
            all.iter().map(|q| q.name.as_str()).collect::<Vec<_>>(),
            ["t_a"]
        );
    }
}
