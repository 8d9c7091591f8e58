//! The limiters that have synced with this root.
//!
//! Each limiter id is interned to a small index, so counters can remember
//! which limiters fed them without storing names. The registry is bounded:
//! past [`MAX_LIMITERS`] distinct ids, new ones are still served but not
//! recorded.

use rustc_hash::FxHashMap;

use crate::core::Nanos;
use crate::wire::ClockReport;

/// Most limiters the registry records.
pub const MAX_LIMITERS: usize = 100_000;

/// What the root knows about one limiter.
#[derive(Clone, Debug, PartialEq)]
pub struct LimiterInfo {
    /// The limiter's id as it sends it.
    pub name: Box<str>,
    /// Root time of its last sync.
    pub last_sync: Nanos,
    /// Syncs received from it since the root started.
    pub syncs: u64,
    /// Its latest report of its clock offset to this root.
    pub clock: Option<ClockReport>,
    /// Its deltas cut to its allowance (more than it could have admitted).
    pub clipped: u64,
    /// The weight cut from them.
    pub clipped_weight: f64,
    /// Root time of its last clipped delta.
    pub last_clipped: Option<Nanos>,
}

/// Registry of limiters by id.
#[derive(Debug, Default)]
pub struct Limiters {
    /// Limiter id to index in `list`.
    index: FxHashMap<Box<str>, u32>,
    /// Limiters in order of first sync.
    list: Vec<LimiterInfo>,
}

impl Limiters {
    /// Records a sync from `name` at `now`; returns the limiter's index, or
    /// `None` when the registry is full and `name` is new.
    pub fn touch(&mut self, name: &str, now: Nanos) -> Option<u32> {
        self.touch_since(name, now, 0.0).map(|(index, _)| index)
    }

    /// As [`Self::touch`], with the seconds since the limiter's previous
    /// sync (`first` for its first).
    pub fn touch_since(&mut self, name: &str, now: Nanos, first: f64) -> Option<(u32, f64)> {
        let index = match self.index.get(name) {
            Some(&index) => index,
            None if self.list.len() >= MAX_LIMITERS => return None,
            None => {
                let index = self.list.len() as u32;
                self.list.push(LimiterInfo {
                    name: name.into(),
                    last_sync: now,
                    syncs: 0,
                    clock: None,
                    clipped: 0,
                    clipped_weight: 0.0,
                    last_clipped: None,
                });
                self.index.insert(name.into(), index);
                index
            }
        };
        let info = &mut self.list[index as usize];
        let since = if info.syncs == 0 {
            first
        } else {
            crate::core::counter::seconds_between(info.last_sync, now)
        };
        info.last_sync = now;
        info.syncs += 1;
        Some((index, since))
    }

    /// A limiter by index.
    pub fn get(&self, index: u32) -> Option<&LimiterInfo> {
        self.list.get(index as usize)
    }

    /// Counts `deltas` of limiter `index` clipped at `now`, `weight` cut.
    pub fn clipped(&mut self, index: u32, deltas: u64, weight: f64, now: Nanos) {
        if let Some(info) = self.list.get_mut(index as usize) {
            info.clipped += deltas;
            info.clipped_weight += weight;
            info.last_clipped = Some(now);
        }
    }

    /// Keeps the clock offset `name` reported with its sync.
    pub fn report_clock(&mut self, name: &str, clock: ClockReport) {
        if let Some(&index) = self.index.get(name) {
            self.list[index as usize].clock = Some(clock);
        }
    }

    /// Every recorded limiter, in order of first sync.
    pub fn iter(&self) -> impl Iterator<Item = &LimiterInfo> {
        self.list.iter()
    }

    /// Number of limiters ever recorded.
    pub fn len(&self) -> usize {
        self.list.len()
    }

    /// True when no limiter has synced.
    pub fn is_empty(&self) -> bool {
        self.list.is_empty()
    }

    /// Number of limiters whose last sync was at or after `since`.
    pub fn active_since(&self, since: Nanos) -> usize {
        self.list.iter().filter(|l| l.last_sync >= since).count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limiters_are_interned_and_counted() {
        let mut limiters = Limiters::default();
        assert_eq!(limiters.touch("a", 1), Some(0));
        assert_eq!(limiters.touch("b", 2), Some(1));
        assert_eq!(limiters.touch("a", 3), Some(0));
        let a = limiters.get(0).unwrap();
        assert_eq!((a.last_sync, a.syncs), (3, 2));
        assert_eq!(limiters.active_since(3), 1);
        assert_eq!(limiters.len(), 2);
    }
}
