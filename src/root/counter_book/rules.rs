//! What bounds a counter: how it counts, its cap, the allowance each
//! limiter has on it, and the meter of the rate its weight arrives at.

use crate::core::estimate::FILL_RATE_SMOOTHING;
use crate::core::{Counting, Nanos, Tally, SECS_PER_NANO};
use crate::wire::CounterKey;

use super::{CounterBook, Slot};

/// Length of a fill-rate measurement window.
const FILL_WINDOW: Nanos = 1_000_000_000;

/// The rate weight arrives at, averaged over one-second windows.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(super) struct FillMeter {
    /// Smoothed units per second as of `window_start`.
    rate: f64,
    /// Start of the window being summed.
    window_start: Nanos,
    /// Weight received since `window_start`.
    window_sum: f64,
}

impl FillMeter {
    pub(super) fn new(now: Nanos) -> Self {
        Self {
            rate: 0.0,
            window_start: now,
            window_sum: 0.0,
        }
    }

    /// Closes the window when it is at least [`FILL_WINDOW`] old, giving the
    /// old rate the weight `(1 - s)^n` for `n` elapsed windows, so an idle
    /// counter's rate decays towards zero instead of freezing.
    fn roll(&mut self, now: Nanos) {
        let elapsed = now.saturating_sub(self.window_start);
        if elapsed < FILL_WINDOW {
            return;
        }
        let windows = (elapsed / FILL_WINDOW).min(64) as i32;
        let keep = (1.0 - FILL_RATE_SMOOTHING).powi(windows);
        let measured = self.window_sum / (elapsed as f64 * SECS_PER_NANO);
        self.rate = measured * (1.0 - keep) + self.rate * keep;
        self.window_start = now;
        self.window_sum = 0.0;
    }

    pub(super) fn record(&mut self, now: Nanos, weight: f64) {
        self.roll(now);
        self.window_sum += weight;
    }

    pub(super) fn rate_at(mut self, now: Nanos) -> f64 {
        self.roll(now);
        self.rate
    }
}

/// How a counter counts, the most it may hold and what one limiter may
/// add to it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CounterRule {
    /// Its leak rate or its window.
    pub counting: Counting,
    /// The highest level (a window quota: the highest count of one window)
    /// the counter keeps; more is cut off. `f64::INFINITY`: no cap.
    pub cap: f64,
    /// The allowance each limiter has on it (see [`crate::root::trust`]).
    pub allowance: AllowanceShape,
}

/// What one limiter may add to a counter: an allowance of `capacity`
/// units refilling at `refill` per second, measured for the quota as of
/// `epoch` (an edit starts every allowance over).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AllowanceShape {
    /// Units a limiter may add at once.
    pub capacity: f64,
    /// Units per second the allowance refills at.
    pub refill: f64,
    /// Epoch of the quota it was measured for.
    pub epoch: u64,
}

impl From<Counting> for CounterRule {
    /// A rule without a cap or a bound on what a limiter adds.
    fn from(counting: Counting) -> Self {
        Self {
            counting,
            cap: f64::INFINITY,
            allowance: AllowanceShape {
                capacity: f64::INFINITY,
                refill: 0.0,
                epoch: 0,
            },
        }
    }
}

impl CounterBook {
    /// Changes how quota `id`'s counter counts (and, for a per-key
    /// template, every key's: `keyed`). A new leak rate applies from `now`
    /// (each counter is leaked to `now` at the old rate first, so the
    /// change does not act retroactively); a counter that now counts
    /// another way (leaky to window, another window) starts over. A new
    /// cap applies from the next update.
    pub fn set_counting(&mut self, id: u64, keyed: bool, rule: CounterRule, now: Nanos) {
        let CounterRule {
            counting,
            cap,
            allowance,
        } = rule;
        let change = |slot: &mut Slot| {
            slot.cap = cap;
            slot.allowance = allowance;
            if slot.counting == counting {
                return;
            }
            slot.tally = match (slot.counting, counting) {
                (Counting::Leak(_), Counting::Leak(_)) => slot.counting.aged(slot.tally, now),
                (Counting::Window(a), Counting::Window(b))
                    if (a.window, a.sliding) == (b.window, b.sliding) =>
                {
                    slot.tally
                }
                _ => Tally {
                    at: now,
                    ..Tally::default()
                },
            };
            slot.counting = counting;
        };
        if keyed && self.keys > 0 {
            self.slots
                .iter_mut()
                .filter(|s| s.live && s.counter.id == id && s.counter.key != 0)
                .for_each(change);
        }
        // A per-key template's own counter is its keys' overflow counter:
        // it counts as they do.
        if let Some(&index) = self.index.get(&CounterKey::named(id)) {
            change(&mut self.slots[index as usize]);
        }
    }

    /// Changes how one key's counter counts (its override's numbers, or
    /// its template's again), as [`Self::set_counting`] does for a whole
    /// template; nothing when the root holds no counter for it.
    pub fn set_key_counting(&mut self, counter: CounterKey, rule: CounterRule, now: Nanos) {
        let Some(&index) = self.index.get(&counter) else {
            return;
        };
        let slot = &mut self.slots[index as usize];
        slot.cap = rule.cap;
        slot.allowance = rule.allowance;
        if slot.counting != rule.counting {
            slot.tally = match (slot.counting, rule.counting) {
                (Counting::Leak(_), Counting::Leak(_)) => slot.counting.aged(slot.tally, now),
                _ => Tally {
                    at: now,
                    ..Tally::default()
                },
            };
            slot.counting = rule.counting;
        }
    }

    /// Updates whose level was cut to the counter's cap.
    pub fn capped(&self) -> u64 {
        self.capped
    }
}
