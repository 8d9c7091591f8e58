//! When to log a check of a name no quota has. Such a check passes
//! uncounted, so a typo in a name (or a variable that builds one nobody
//! configured) lifts a limit without a word unless the log says so: the
//! first check of each name is logged, and then the name at most once a
//! [`PERIOD`].
//!
//! The state lives in the zone, so every worker shares one rate limit per
//! name, and it is fixed in size whatever the names: a direct-mapped
//! table of [`ENTRIES`] words, each holding a name's hash and the second
//! it was last logged, claimed with one compare-and-swap. Two names that
//! share an entry take it from each other and are each logged as if new;
//! a flood of made-up names (a name built from a client's header) is
//! bounded by a budget of [`MAX_LINES`] lines a period for all names
//! together, and the next line that is logged says how many were held
//! back. Per worker tables would log a name once per worker and could not
//! see each other; a single global limit would let one busy name hide
//! every other. Pure: no nginx types.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::core::key::KeySecret;
use crate::core::Nanos;

/// Nanoseconds in a second.
const NANOS_PER_SEC: Nanos = 1_000_000_000;

/// Names rate-limited each on its own at once (more share entries).
pub const ENTRIES: usize = 64;
/// Seconds between two lines about one name.
pub const PERIOD: u64 = 60;
/// Lines about unknown names, all names together, in one period.
pub const MAX_LINES: u64 = ENTRIES as u64;

/// The shared state (`#[repr(C)]`: its place in the zone is fixed for
/// every process that maps it). All zeroes is the empty state.
#[repr(C)]
#[derive(Debug)]
pub struct UnknownNames {
    /// Per entry: a name's 32-bit hash above, and below the second (of the
    /// monotonic clock, plus one: 0 is never) it was last logged.
    entries: [AtomicU64; ENTRIES],
    /// Per entry: checks of its name since that line, not logged.
    since: [AtomicU64; ENTRIES],
    /// The period the budget counts in above, lines logged in it below.
    budget: AtomicU64,
    /// Lines the budget held back since the last line logged.
    held_back: AtomicU64,
}

impl Default for UnknownNames {
    fn default() -> Self {
        Self {
            entries: [const { AtomicU64::new(0) }; ENTRIES],
            since: [const { AtomicU64::new(0) }; ENTRIES],
            budget: AtomicU64::new(0),
            held_back: AtomicU64::new(0),
        }
    }
}

/// A line to log about an unknown name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Due {
    /// Checks of this name since its last line, not logged (0 the first
    /// time, and after another name took its entry).
    pub repeats: u64,
    /// Lines about other names held back by the budget since the last
    /// line logged.
    pub held_back: u64,
}

impl UnknownNames {
    /// Notes a check of `name`, which has no quota, at `now` (the
    /// monotonic clock every worker reads): `Some` when it is to be
    /// logged now.
    pub fn note(&self, name: &[u8], now: Nanos) -> Option<Due> {
        let hash = name_hash(name);
        let index = (hash as usize) % ENTRIES;
        let second = now / NANOS_PER_SEC + 1;
        let entry = &self.entries[index];
        let seen = entry.load(Ordering::Relaxed);
        let (seen_hash, seen_at) = (seen >> 32, seen & u64::from(u32::MAX));
        let same = seen != 0 && seen_hash == hash;
        if same && second < seen_at.saturating_add(PERIOD) {
            self.since[index].fetch_add(1, Ordering::Relaxed);
            return None;
        }
        let claim = (hash << 32) | (second & u64::from(u32::MAX));
        if entry
            .compare_exchange(seen, claim, Ordering::Relaxed, Ordering::Relaxed)
            .is_err()
        {
            // Another worker logs it (or another name took the entry).
            self.since[index].fetch_add(1, Ordering::Relaxed);
            return None;
        }
        let since = self.since[index].swap(0, Ordering::Relaxed);
        if !self.spend(second / PERIOD) {
            self.held_back.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        Some(Due {
            repeats: if same { since } else { 0 },
            held_back: self.held_back.swap(0, Ordering::Relaxed),
        })
    }

    /// Takes one line of `period`'s budget; false when it is spent.
    fn spend(&self, period: u64) -> bool {
        let mut current = self.budget.load(Ordering::Relaxed);
        loop {
            let (at, lines) = (current >> 32, current & u64::from(u32::MAX));
            let period = period & u64::from(u32::MAX);
            let next = if at == period {
                if lines >= MAX_LINES {
                    return false;
                }
                current + 1
            } else {
                (period << 32) | 1
            };
            match self.budget.compare_exchange_weak(
                current,
                next,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => return true,
                Err(actual) => current = actual,
            }
        }
    }
}

/// A name's 32-bit hash: the same in every worker (the hasher has fixed
/// keys), never 0.
fn name_hash(name: &[u8]) -> u64 {
    let h = KeySecret::from_words(0x736c_7569_6365, 0x0075_6e6b_6e6f_776e).hash(name);
    (((h >> 32) ^ h) & u64::from(u32::MAX)) | 1
}

/// A name as a log line shows it: the bytes a quota name may hold as they
/// are, anything else (the name may come from a client) as `\xNN`, and at
/// most the first 255 bytes.
pub struct ShownName<'a>(pub &'a [u8]);

impl std::fmt::Display for ShownName<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let cut = self.0.len().min(crate::core::quota::MAX_NAME_LEN);
        for &b in &self.0[..cut] {
            if b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b':' | b'-') {
                std::fmt::Write::write_char(f, char::from(b))?;
            } else {
                write!(f, "\\x{b:02x}")?;
            }
        }
        if cut < self.0.len() {
            f.write_str("...")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SEC: Nanos = NANOS_PER_SEC;

    #[test]
    fn a_name_is_logged_the_first_time_then_once_a_period() {
        let names = UnknownNames::default();
        let start = 1000 * SEC;
        let first = names.note(b"s3_phtos", start);
        assert_eq!(
            first,
            Some(Due {
                repeats: 0,
                held_back: 0
            })
        );
        for i in 1..10 {
            assert_eq!(names.note(b"s3_phtos", start + i * SEC), None);
        }
        assert_eq!(names.note(b"s3_phtos", start + (PERIOD - 1) * SEC), None);
        let again = names.note(b"s3_phtos", start + PERIOD * SEC).unwrap();
        assert_eq!(again.repeats, 10, "the checks not logged meanwhile");
        assert_eq!(names.note(b"s3_phtos", start + (PERIOD + 1) * SEC), None);
    }

    #[test]
    fn each_name_has_its_own_limit() {
        let names = UnknownNames::default();
        let now = 5 * SEC;
        // Names whose entries differ: each is logged once.
        let mut logged = 0;
        let mut entries = std::collections::HashSet::new();
        for i in 0..200 {
            let name = format!("name{i}");
            let index = name_hash(name.as_bytes()) as usize % ENTRIES;
            if entries.insert(index) && entries.len() <= 8 {
                assert!(names.note(name.as_bytes(), now).is_some(), "{name}");
                assert!(names.note(name.as_bytes(), now).is_none(), "{name}");
                logged += 1;
            }
        }
        assert_eq!(logged, 8);
    }

    /// A client making up a name per request: at most the budget's lines a
    /// period, whatever the entries do; the next period's first line
    /// says how many were held back.
    #[test]
    fn made_up_names_are_bounded_by_the_budget() {
        let names = UnknownNames::default();
        let now = 7 * PERIOD * SEC;
        let logged = (0..10_000)
            .filter(|i| names.note(format!("x{i}").as_bytes(), now).is_some())
            .count();
        assert_eq!(logged as u64, MAX_LINES);
        let next = names
            .note(b"a_name_of_the_next_period", now + PERIOD * SEC)
            .unwrap();
        assert!(next.held_back > 0, "{next:?}");
        assert_eq!(
            names.note(b"other", now + PERIOD * SEC).unwrap().held_back,
            0
        );
    }

    #[test]
    fn names_show_only_the_bytes_a_quota_name_may_hold() {
        assert_eq!(ShownName(b"s3_a.b:c-d").to_string(), "s3_a.b:c-d");
        assert_eq!(ShownName(b"a\nb\"c\xff").to_string(), "a\\x0ab\\x22c\\xff");
        let long = vec![b'a'; 300];
        let shown = ShownName(&long).to_string();
        assert_eq!(shown.len(), 255 + 3);
        assert!(shown.ends_with("..."));
    }
}
