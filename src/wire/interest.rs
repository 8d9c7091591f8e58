//! The keys a limiter holds, told to a root that answers by interest.
//!
//! A root that says it answers by interest
//! ([`super::SyncResponse::takes_interest`]) sends a limiter only the key
//! counters it holds, and every named counter (see docs/DESIGN.md,
//! "Replies by interest"). It learns what a limiter holds from the keys of
//! its deltas and from this list: the whole list (`full`) when the root
//! asks for it ([`super::SyncResponse::wants_interest`]: it knows nothing
//! of the limiter, after its own restart or the limiter's) and every
//! [`REFRESH_SECONDS`], so that keys the limiter forgot leave the root's
//! record; or keys to add to what the root knows (`full` false).

use serde::{Deserialize, Serialize};

use super::{CounterKey, RefusedKeys, WireError};

/// A limiter sends its whole list at least this often to a root that
/// answers by interest: keys it no longer holds then leave the root's
/// record of it.
pub const REFRESH_SECONDS: u64 = 30;

/// Keys of per-key templates a limiter holds, by template (see the module
/// doc).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Interest {
    /// The list is everything the limiter holds of the root's group: the
    /// root replaces what it knew with it. Otherwise the keys are added.
    #[serde(default)]
    pub full: bool,
    /// The keys, by template (a template's id, then its keys' hashes).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub keys: Vec<RefusedKeys>,
}

impl Interest {
    /// Entries it takes of [`super::MAX_DELTAS_PER_SYNC`]: a template and
    /// each key one.
    pub fn entry_count(&self) -> usize {
        self.keys.len() + self.keys.iter().map(|g| g.keys.len()).sum::<usize>()
    }

    /// Every key, as a counter.
    pub fn counters(&self) -> impl Iterator<Item = CounterKey> + '_ {
        RefusedKeys::counters(&self.keys)
    }

    /// No key hash 0 (that names a template's own counter).
    pub fn check(&self) -> Result<(), WireError> {
        for (g, group) in self.keys.iter().enumerate() {
            if let Some(i) = group.keys.iter().position(|&k| k == 0) {
                return Err(WireError::new(
                    format!("interest.keys[{g}].keys[{i}]"),
                    "key hash 0 names no key",
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_interest_list_counts_its_entries_and_refuses_key_zero() {
        let list = Interest {
            full: true,
            keys: RefusedKeys::by_template(vec![
                CounterKey { id: 2, key: 9 },
                CounterKey { id: 1, key: 5 },
                CounterKey { id: 2, key: 3 },
            ]),
        };
        assert_eq!(list.entry_count(), 5);
        assert_eq!(list.check(), Ok(()));
        let ids: Vec<_> = list.counters().map(|c| (c.id, c.key)).collect();
        assert_eq!(ids, [(1, 5), (2, 3), (2, 9)]);
        let json = serde_json::to_string(&list).unwrap();
        assert_eq!(serde_json::from_str::<Interest>(&json).unwrap(), list);
        let zero = Interest {
            full: false,
            keys: vec![RefusedKeys {
                id: 1,
                keys: vec![4, 0],
            }],
        };
        assert_eq!(zero.check().unwrap_err().field, "interest.keys[0].keys[1]");
    }
}
