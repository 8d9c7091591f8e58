//! Reference models of the leaky bucket family, in exact integer
//! arithmetic (times in nanoseconds, amounts in units × 10^9), written
//! from the seed articles: GCRA's theoretical arrival time
//! (gcra-python-redis.txt), the leaky bucket and its mirror, the token
//! bucket (pushwoosh-algorithms.txt).
//!
//! All three take `rate` units a second and a burst of `burst` units, and
//! answer the same questions: does a request of `weight` units at time
//! `t` fit (a weight of 0 asks whether the bucket is full), and for
//! pacing, how long must a request counted now wait.

/// Nanoseconds per second, and the scale of amounts.
pub const SEC: i128 = 1_000_000_000;

/// GCRA: one number, the theoretical arrival time `tat` of the next
/// request. Each unit moves it `T = 1 s / rate` further; a request is
/// late enough when, after moving `tat`, it is at most `tau = burst * T`
/// ahead of now.
#[derive(Clone, Debug)]
pub struct Gcra {
    /// Emission interval: nanoseconds one unit occupies.
    pub t: i128,
    /// Tolerance: how far `tat` may run ahead of now.
    pub tau: i128,
    /// Theoretical arrival time, nanoseconds.
    pub tat: i128,
}

impl Gcra {
    /// `rate` must divide 10^9, so `T` is a whole number of nanoseconds.
    pub fn new(rate: i128, burst: i128) -> Gcra {
        assert_eq!(SEC % rate, 0, "GCRA model rates divide 10^9");
        let t = SEC / rate;
        Gcra {
            t,
            tau: burst * t,
            tat: 0,
        }
    }

    /// How far a request of `weight` at `now` is from the boundary, in
    /// nanoseconds of `tat`: how much further `tat` could be and the
    /// request still fit (negative: it does not fit, by that much). At 0,
    /// the boundary itself, a weight fits exactly; a weight of 0 (is the
    /// bucket full?) finds it full.
    pub fn margin(&self, now: i128, weight: i128) -> i128 {
        self.tau - (self.tat.max(now) + weight * self.t - now)
    }

    /// Counts `weight` at `now`: `tat` moves `weight * T` on from now or
    /// from where it was, whichever is later.
    pub fn admit(&mut self, now: i128, weight: i128) {
        self.tat = self.tat.max(now) + weight * self.t;
    }

    /// Admits `weight` at `now` if it fits, moving `tat`.
    pub fn check(&mut self, now: i128, weight: i128) -> bool {
        let margin = self.margin(now, weight);
        let fits = if weight == 0 { margin > 0 } else { margin >= 0 };
        if fits {
            self.admit(now, weight);
        }
        fits
    }

    /// The room left at `now`, in nanoseconds of `tat` (a unit is `T`).
    pub fn room(&self, now: i128) -> i128 {
        self.margin(now, 0).max(0)
    }

    /// Pacing: how long a request of `weight` counted at `now` must wait
    /// until it fits, or `None` when it never fits (above the burst).
    pub fn wait(&self, now: i128, weight: i128) -> Option<i128> {
        (weight * self.t <= self.tau).then(|| (-self.margin(now, weight)).max(0))
    }

    /// The bucket level the theoretical arrival time stands for, in
    /// units × 10^9.
    pub fn level(&self, now: i128) -> i128 {
        (self.tat - now).max(0) * SEC / self.t
    }
}

/// The leaky bucket as a level that drains at `rate` and may hold
/// `burst`.
#[derive(Clone, Debug)]
pub struct Leaky {
    pub rate: i128,
    pub burst: i128,
    /// Units × 10^9 at time `at`.
    pub level: i128,
    pub at: i128,
}

impl Leaky {
    pub fn new(rate: i128, burst: i128) -> Leaky {
        Leaky {
            rate,
            burst: burst * SEC,
            level: 0,
            at: 0,
        }
    }

    fn drain(&mut self, now: i128) {
        let dt = (now - self.at).max(0);
        self.level = (self.level - self.rate * dt).max(0);
        self.at = self.at.max(now);
    }

    pub fn check(&mut self, now: i128, weight: i128) -> bool {
        self.drain(now);
        let fits = if weight == 0 {
            self.level < self.burst
        } else {
            self.level + weight * SEC <= self.burst
        };
        if fits {
            self.level += weight * SEC;
        }
        fits
    }
}

/// The token bucket: tokens flow in at `rate` up to `burst`; a request
/// takes its weight in tokens. Its tokens are always `burst` minus the
/// leaky bucket's level: the same decisions, seen from the other side.
#[derive(Clone, Debug)]
pub struct TokenBucket {
    pub rate: i128,
    pub burst: i128,
    /// Tokens × 10^9 at time `at`; a new bucket is full.
    pub tokens: i128,
    pub at: i128,
}

impl TokenBucket {
    pub fn new(rate: i128, burst: i128) -> TokenBucket {
        TokenBucket {
            rate,
            burst: burst * SEC,
            tokens: burst * SEC,
            at: 0,
        }
    }

    pub fn check(&mut self, now: i128, weight: i128) -> bool {
        let dt = (now - self.at).max(0);
        self.tokens = (self.tokens + self.rate * dt).min(self.burst);
        self.at = self.at.max(now);
        let fits = if weight == 0 {
            self.tokens > 0
        } else {
            self.tokens >= weight * SEC
        };
        if fits {
            self.tokens -= weight * SEC;
        }
        fits
    }
}

/// The sliding window counter (pushwoosh-algorithms.txt): a count per
/// fixed window, and a request is weighed against this window's count
/// plus the previous window's, scaled by how much of the previous window
/// a window-long span ending now still covers ("25% into the window, 75%
/// of the previous one counts"). Windows of `len` nanoseconds from 0.
#[derive(Clone, Debug)]
pub struct SlidingWindow {
    pub len: i128,
    pub limit: i128,
    /// The window `count` belongs to.
    pub index: i128,
    pub count: i128,
    /// The count of window `index - 1`.
    pub prev: i128,
}

impl SlidingWindow {
    pub fn new(len: i128, limit: i128) -> SlidingWindow {
        SlidingWindow {
            len,
            limit,
            index: i128::MIN / 2,
            count: 0,
            prev: 0,
        }
    }

    /// Moves to the window holding `now`.
    fn roll(&mut self, now: i128) {
        let index = now.div_euclid(self.len);
        if index == self.index + 1 {
            self.prev = self.count;
        } else if index != self.index {
            self.prev = 0;
        }
        if index != self.index {
            self.count = 0;
            self.index = index;
        }
    }

    /// How many units × `len` a request of `weight` at `now` is below
    /// the limit (negative: above it): `limit - (prev * covered + count +
    /// weight)`, all scaled by the window's length so it stays exact.
    pub fn margin(&mut self, now: i128, weight: i128) -> i128 {
        self.roll(now);
        let covered = self.len - now.rem_euclid(self.len);
        self.limit * self.len - self.prev * covered - (self.count + weight) * self.len
    }

    pub fn admit(&mut self, now: i128, weight: i128) {
        self.roll(now);
        self.count += weight;
    }
}
