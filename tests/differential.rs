//! Differential tests: sluice against reference models of the systems it
//! was designed from (`/work/shared/seeds/`), on the same random request
//! sequences, decision by decision.
//!
//! - **Rapidity** (fixed windows in Redis, partial grants): the reference
//!   is `differential/rapidity.lua`, run by a private `redis-server`; the
//!   time is the test's, passed to the script. sluice is a one-host
//!   limiter (a table folded as the standalone sync thread folds it) with
//!   window quotas in a ladder (1s under 1m under ... under month). Every
//!   check's decision and every partial grant must be the same.
//! - **Sliding window counter** (Pushwoosh's survey): a sliding window
//!   quota against an exact model, checks and partial grants.
//! - **GCRA** (a theoretical arrival time): `differential/models.rs` in
//!   exact integer arithmetic; a band-free leaky quota (`low_burst ==
//!   high_burst`) must decide and grant the same, and a reservation must
//!   wait the same (rounded up to a whole nanosecond). The token bucket
//!   is the leaky bucket's mirror: same decisions.
//!
//! The models are exact and sluice counts in `f64`: on a model's boundary
//! itself (a request that fits with exactly 0 to spare) sluice may answer
//! the other way, and the tests allow that there and nowhere else,
//! counting how often it happens. Where sluice differs from a model by
//! design, a test below states the difference exactly (`*_differs_*`).

#[path = "differential/models.rs"]
mod models;
#[path = "differential/redis.rs"]
mod redis;

use models::{Gcra, Leaky, SlidingWindow, TokenBucket, SEC};
use sluice::core::window::{days_from_civil, ATTRIBUTION_GRACE};
use sluice::core::{Nanos, Quota, Wait, Window, WindowRule};
use sluice::table::{CheckItem, CheckOptions, Outcome, Table};

/// The reference model of Rapidity's windows, for Redis.
const RAPIDITY_LUA: &str = include_str!("differential/rapidity.lua");

/// splitmix64: a seeded sequence, so a failure names its seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n`.
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    /// True with probability `percent`%.
    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

/// UTC nanoseconds of a date and time.
fn utc(y: i64, mo: u32, d: u32, h: i64, mi: i64, s: i64) -> Nanos {
    ((days_from_civil(y, mo, d) * 86_400 + h * 3600 + mi * 60 + s) * 1_000_000_000) as Nanos
}

/// Never rejects inside a band (the window quotas here have none).
fn no_draw() -> f64 {
    0.999_999
}

// ---------------------------------------------------------------------------
// Rapidity: window ladders against Redis

/// A request in a sequence.
#[derive(Clone, Copy, Debug)]
enum Op {
    /// All or nothing: `check_by_name(name, weight)`.
    Check(u64),
    /// A partial grant: `sluice_obtain(name, want)`.
    Obtain(u64),
}

/// One level of a ladder: its window and how many units it allows.
#[derive(Clone, Copy, Debug)]
struct Level {
    window: Window,
    limit: u64,
}

/// A ladder (shortest window first) as a quota tree, each level the
/// parent of the one before; the first may be per-key.
fn ladder_quotas(levels: &[Level], keyed: bool) -> Vec<Quota> {
    levels
        .iter()
        .enumerate()
        .map(|(i, l)| {
            let limit = l.limit as f64;
            let parent = (i + 1 < levels.len()).then_some(i as u64 + 2);
            Quota::new(i as u64 + 1, format!("l{i}"), limit, limit, limit)
                .windowed(l.window, false)
                .with_parent(parent)
                .keyed_if(keyed && i == 0)
        })
        .collect()
}

/// The one-host sluice of a test: a table with no roots, folded as the
/// standalone sync thread folds it (just after each window boundary, and
/// between boundaries now and then), with the test's clock, which is UTC.
struct Host {
    table: Table,
    rules: Vec<WindowRule>,
    /// Time of the last request.
    last: Nanos,
}

impl Host {
    fn new(quotas: &[Quota], start: Nanos) -> Host {
        let table = Table::new_heap_with_keys(64, 16, 1024);
        table.set_utc_offset(0);
        assert!(table.books().apply_quotas(quotas).refused.is_empty());
        let rules = quotas
            .iter()
            .map(|q| q.window_rule(0).expect("a window quota"))
            .collect();
        Host {
            table,
            rules,
            last: start,
        }
    }

    /// Moves the clock to `now`: the sync thread's fold at the first
    /// window boundary passed since the last request (it wakes there; its
    /// fold attributes the weight to the window that just ended), its key
    /// upkeep (every key bucket each hour; here every 12 hours of a long
    /// gap, enough to keep keys' packed times from wrapping after 26
    /// days), and, if `fold_now`, a fold now as well when `now` is past
    /// the attribution grace of its window's start (a routine cycle).
    fn advance(&mut self, now: Nanos, fold_now: bool) {
        let boundary = self
            .rules
            .iter()
            .map(|r| r.end_of(self.last))
            .min()
            .unwrap();
        if boundary <= now {
            self.table.books().fold_local(boundary);
        }
        let buckets = self.table.geometry().key_buckets as usize;
        let mut upkeep = self.last;
        while upkeep + HALF_DAY < now {
            upkeep += HALF_DAY;
            self.table.books().maintain_keys(buckets, upkeep);
        }
        let start = self.rules.iter().map(|r| r.start_of(now)).max().unwrap();
        if fold_now && now >= start + ATTRIBUTION_GRACE {
            self.table.books().fold_local(now);
        }
        self.last = now;
    }

    fn item<'a>(&self, key: Option<&'a [u8]>, weight: u64) -> CheckItem<'a> {
        CheckItem {
            name: b"l0",
            key,
            weight,
            max_wait: None,
        }
    }

    /// The units counted: the weight or `None` (rejected) for a check,
    /// the grant for an obtain.
    fn run(&self, op: Op, key: Option<&[u8]>, now: Nanos) -> Option<u64> {
        match op {
            Op::Check(w) => {
                let out = self.table.gate().check_many(
                    &[self.item(key, w)],
                    now,
                    CheckOptions::default(),
                    no_draw,
                );
                match out.outcome {
                    Outcome::Pass => Some(w),
                    Outcome::Reject(_) => None,
                    other => panic!("check: {other:?}"),
                }
            }
            Op::Obtain(n) => Some(self.table.gate().obtain(&self.item(key, n), now).granted),
        }
    }
}

/// Twelve hours, nanoseconds.
const HALF_DAY: Nanos = 12 * 3600 * 1_000_000_000;

/// The Redis side: the script and the ladder's arguments.
struct Reference {
    client: redis::Client,
    sha: String,
    levels: Vec<Level>,
    prefix: String,
}

impl Reference {
    fn new(server: &redis::Server, levels: &[Level], prefix: String) -> Reference {
        let mut client = server.connect();
        let sha = client.load_script(RAPIDITY_LUA);
        Reference {
            client,
            sha,
            levels: levels.to_vec(),
            prefix,
        }
    }

    /// Runs `op` (`"check"`, `"obtain"` or `"compose"`) at UTC `now`; the
    /// first level's counter is the key's own when `key` is given.
    fn call(&mut self, op: &str, amount: u64, key: Option<&[u8]>, now: Nanos) -> i64 {
        let keys: Vec<String> = (0..self.levels.len())
            .map(|i| match key {
                Some(k) if i == 0 => format!("{}:l0:{}", self.prefix, String::from_utf8_lossy(k)),
                _ => format!("{}:l{i}", self.prefix),
            })
            .collect();
        let mut args = vec![
            op.to_string(),
            amount.to_string(),
            (now / 1_000_000_000).to_string(),
        ];
        for l in &self.levels {
            args.push(l.window.name().to_string());
            args.push(l.limit.to_string());
        }
        self.client.evalsha(&self.sha, &keys, &args)
    }

    /// The units counted, as [`Host::run`] reports them.
    fn run(&mut self, op: Op, key: Option<&[u8]>, now: Nanos) -> Option<u64> {
        match op {
            Op::Check(w) => {
                let got = self.call("check", w, key, now);
                (got >= 0).then_some(got as u64)
            }
            Op::Obtain(n) => Some(self.call("obtain", n, key, now) as u64),
        }
    }
}

/// Instants where windows of every length end together or close by: a
/// month and a day ending (2026-01-31, a Saturday), a leap day, a Sunday
/// night (2026-11-22; weeks start on Monday), the end of a year, and an
/// afternoon.
fn starts() -> [Nanos; 5] {
    [
        utc(2026, 1, 31, 23, 59, 50),
        utc(2024, 2, 29, 23, 59, 55),
        utc(2026, 11, 22, 23, 59, 58),
        utc(2026, 12, 31, 23, 59, 59),
        utc(2026, 11, 23, 13, 37, 12) + 345_678_901,
    ]
}

/// The gap to the next request: mostly well inside a second, sometimes
/// seconds or minutes, now and then weeks (months then end between two
/// requests).
fn step(rng: &mut Rng) -> Nanos {
    match rng.below(100) {
        0..=59 => rng.below(250_000_000),
        60..=89 => rng.below(3_000_000_000),
        90..=97 => rng.below(120_000_000_000),
        _ => rng.below(40 * 86_400_000_000_000),
    }
}

/// A random ladder: a few windows, shortest first, each allowing at
/// least as much as the one before, small enough to be exhausted.
fn random_ladder(rng: &mut Rng) -> Vec<Level> {
    let mut levels = Vec::new();
    let mut limit = 2 + rng.below(9);
    for window in Window::ALL {
        if levels.is_empty() || rng.chance(55) {
            levels.push(Level { window, limit });
            limit *= 2 + rng.below(5);
        }
    }
    levels
}

/// Runs `ops` random requests of `seed` through sluice and the Redis
/// model and compares every answer.
fn compare_ladder(server: &redis::Server, seed: u64, ops: usize, keyed: bool) -> (usize, usize) {
    let mut rng = Rng(seed);
    let levels = random_ladder(&mut rng);
    let mut now = starts()[rng.below(5) as usize];
    let mut host = Host::new(&ladder_quotas(&levels, keyed), now);
    let mut reference = Reference::new(server, &levels, format!("seed{seed}:{keyed}"));
    let tokens: [&[u8]; 3] = [b"alice", b"bob", b"carol"];
    let (mut granted, mut rejected) = (0, 0);
    for i in 0..ops {
        now += step(&mut rng);
        host.advance(now, rng.chance(20));
        let op = if rng.chance(50) {
            Op::Check(rng.below(5))
        } else {
            Op::Obtain(1 + rng.below(12))
        };
        let key = keyed.then(|| tokens[rng.below(3) as usize]);
        let want = reference.run(op, key, now);
        let got = host.run(op, key, now);
        assert_eq!(
            got, want,
            "seed {seed}, request {i}: {op:?} at {now} (key {key:?}) on ladder {levels:?}: \
             sluice counted {got:?}, the Redis model {want:?}"
        );
        match got {
            Some(0) | None => rejected += 1,
            Some(_) => granted += 1,
        }
    }
    // A sequence where nothing is ever refused (or granted) would test
    // little.
    (granted, rejected)
}

#[test]
fn window_ladders_decide_and_grant_as_the_redis_model() {
    let server = redis::Server::start();
    let (mut granted, mut refused) = (0, 0);
    for seed in 1..=40 {
        let (g, r) = compare_ladder(&server, seed, 400, false);
        (granted, refused) = (granted + g, refused + r);
    }
    // Sequences where nothing is ever refused (or granted) would test
    // little.
    assert!(
        granted > 4000 && refused > 2000,
        "{granted} granted, {refused} refused"
    );
}

#[test]
fn keyed_window_ladders_decide_and_grant_as_the_redis_model() {
    let server = redis::Server::start();
    let (mut granted, mut refused) = (0, 0);
    for seed in 101..=130 {
        let (g, r) = compare_ladder(&server, seed, 400, true);
        (granted, refused) = (granted + g, refused + r);
    }
    assert!(
        granted > 3000 && refused > 1500,
        "{granted} granted, {refused} refused"
    );
}

#[test]
fn a_single_window_grants_as_rapidity_itself() {
    // With one window the gem's Composer is its one limiter: sluice's
    // obtain on a window quota is Rapidity's obtain.
    let server = redis::Server::start();
    for seed in 201..=220 {
        let mut rng = Rng(seed);
        let window = Window::ALL[rng.below(4) as usize];
        let levels = [Level {
            window,
            limit: 3 + rng.below(20),
        }];
        let mut now = starts()[rng.below(5) as usize];
        let mut host = Host::new(&ladder_quotas(&levels, false), now);
        let mut reference = Reference::new(&server, &levels, format!("single{seed}"));
        for i in 0..300 {
            now += step(&mut rng);
            host.advance(now, rng.chance(20));
            let want = 1 + rng.below(8);
            let gem = reference.call("compose", want, None, now) as u64;
            let got = host.run(Op::Obtain(want), None, now);
            assert_eq!(
                got,
                Some(gem),
                "seed {seed}, request {i}: obtain({want}) at {now}"
            );
        }
    }
}

#[test]
fn rapidity_composer_differs_by_keeping_what_a_longer_window_refused() {
    // The gem's Composer asks each window in turn and each keeps what it
    // granted, even when a later window grants less: those units are
    // counted but never used. sluice (and the model's atomic "obtain")
    // count the final grant on every window.
    let server = redis::Server::start();
    let levels = [
        Level {
            window: Window::Minute,
            limit: 10,
        },
        Level {
            window: Window::Hour,
            limit: 4,
        },
    ];
    let now = utc(2026, 11, 23, 13, 0, 5);
    let host = Host::new(&ladder_quotas(&levels, false), now);
    let mut atomic = Reference::new(&server, &levels, "atomic".into());
    let mut composer = Reference::new(&server, &levels, "composer".into());
    // Both grant 4 of 6: the hour has 4.
    assert_eq!(host.run(Op::Obtain(6), None, now), Some(4));
    assert_eq!(atomic.call("obtain", 6, None, now), 4);
    assert_eq!(composer.call("compose", 6, None, now), 4);
    // The minute took 6 in the Composer, 4 in sluice: 6 and 4 left.
    let minute_left = |r: &mut Reference| match r.client.call(&[
        b"GET",
        format!("{}:l0:1m:{}", r.prefix, now / 60_000_000_000).as_bytes(),
    ]) {
        redis::Reply::Bulk(Some(v)) => String::from_utf8(v).unwrap(),
        other => panic!("{other:?}"),
    };
    assert_eq!(minute_left(&mut composer), "4");
    assert_eq!(minute_left(&mut atomic), "6");
    let state = host.table.quota(b"l0", now).unwrap();
    assert_eq!(state.level, 4.0);
}

#[test]
fn a_request_before_the_wake_after_a_boundary_differs_by_seeing_the_last_window() {
    // The standalone sync thread folds a millisecond after each boundary
    // (sluice::sync::window_wake). A request inside that millisecond
    // still counts the last window's unfolded weight (the estimate errs
    // high), where the model sees an empty window: the one place a
    // one-host sluice refuses what Rapidity grants.
    let server = redis::Server::start();
    let levels = [Level {
        window: Window::Second,
        limit: 5,
    }];
    let start = utc(2026, 11, 23, 13, 0, 0) + 500_000_000;
    let host = Host::new(&ladder_quotas(&levels, false), start);
    let mut reference = Reference::new(&server, &levels, "gap".into());
    assert_eq!(host.run(Op::Obtain(5), None, start), Some(5));
    assert_eq!(reference.run(Op::Obtain(5), None, start), Some(5));
    let wake = sluice::sync::window_wake(&host.table, start, 0).unwrap();
    assert_eq!(
        wake,
        500_000_000 + 1_000_000,
        "the thread wakes 1 ms after the boundary"
    );
    let early = utc(2026, 11, 23, 13, 0, 1) + 400_000;
    assert_eq!(reference.run(Op::Obtain(5), None, early), Some(5));
    assert_eq!(host.run(Op::Obtain(5), None, early), Some(0));
    // From the wake on, the same again.
    host.table.books().fold_local(start + wake);
    assert_eq!(host.run(Op::Obtain(5), None, start + wake), Some(5));
}

#[test]
fn a_sliding_window_quota_decides_and_grants_as_the_sliding_window_counter() {
    compare_sliding(false, 401..=560);
}

#[test]
fn a_sliding_window_per_key_quota_decides_and_grants_per_key_as_the_sliding_window_counter() {
    // Each key's counter against a sliding window counter of its own; a
    // key's previous count lives in its entry as an `f32`, exact for
    // these counts.
    compare_sliding(true, 601..=700);
}

/// Random requests at random times on one sliding window quota (per-key:
/// on three keys of one), each decided by sluice and by an exact sliding
/// window counter (per key), off the boundary exactly; on it (the exact
/// weighted count right at the limit, with a previous window to weigh)
/// sluice's f64 share of the previous window may fall an ulp to either
/// side, as for GCRA.
fn compare_sliding(keyed: bool, seeds: std::ops::RangeInclusive<u64>) {
    let windows = [
        (Window::Second, 1),
        (Window::TenSeconds, 10),
        (Window::Minute, 60),
        (Window::Hour, 3600),
    ];
    let tokens: [&[u8]; 3] = [b"alice", b"bob", b"carol"];
    let mut boundary = Boundary::default();
    let (mut granted, mut refused) = (0, 0);
    for seed in seeds {
        let mut rng = Rng(seed);
        let (window, secs) = windows[rng.below(4) as usize];
        let len = secs * SEC;
        let limit = 3 + rng.below(30);
        let quota = Quota::new(1, "l0", limit as f64, limit as f64, limit as f64)
            .windowed(window, true)
            .keyed_if(keyed);
        let mut now = starts()[rng.below(5) as usize];
        let mut host = Host::new(&[quota], now);
        let mut models: Vec<SlidingWindow> = (0..tokens.len())
            .map(|_| SlidingWindow::new(len, limit as i128))
            .collect();
        for i in 0..400 {
            now += if rng.chance(85) {
                rng.below(len as u64 / 3)
            } else {
                rng.below(3 * len as u64)
            };
            host.advance(now, rng.chance(20));
            let k = if keyed { rng.below(3) as usize } else { 0 };
            let key = keyed.then_some(tokens[k]);
            let model = &mut models[k];
            let at = now as i128;
            let what = format!(
                "seed {seed} ({limit} per {secs} s sliding, key {key:?}), request {i} at {now}"
            );
            let (got, on_boundary, differs) = if rng.chance(40) {
                let want = 1 + rng.below(8);
                let room = model.margin(at, 0).max(0);
                let exact = (room / len).min(want as i128) as u64;
                let got = host.run(Op::Obtain(want), key, now).unwrap();
                let on_boundary =
                    model.prev > 0 && room > 0 && room % len == 0 && room / len <= want as i128;
                assert!(
                    got == exact || on_boundary && got + 1 == exact,
                    "{what}: obtain({want}): sluice {got}, the model {exact}"
                );
                (got, on_boundary, got != exact)
            } else {
                let weight = rng.below(5);
                let margin = model.margin(at, weight as i128);
                let exact = if weight == 0 { margin > 0 } else { margin >= 0 };
                let passed = host.run(Op::Check(weight), key, now).is_some();
                let on_boundary = model.prev > 0 && margin == 0;
                assert!(
                    passed == exact || on_boundary,
                    "{what}: check({weight}): sluice {passed}, the model {exact} (margin {margin})"
                );
                (
                    if passed { weight } else { 0 },
                    on_boundary,
                    passed != exact,
                )
            };
            model.admit(at, got as i128);
            boundary.met += usize::from(on_boundary);
            boundary.differed += usize::from(differs);
            if got > 0 {
                granted += 1;
            } else {
                refused += 1;
            }
        }
    }
    let least = if keyed { 5_000 } else { 10_000 };
    assert!(
        granted > least && refused > least,
        "{granted} granted, {refused} refused"
    );
    eprintln!(
        "sliding{}, on the boundary: {} requests, {} decided the other way",
        if keyed { " per key" } else { "" },
        boundary.met,
        boundary.differed
    );
}

// ---------------------------------------------------------------------------
// GCRA and the buckets

/// Rates (units/s) whose emission interval is a whole number of
/// nanoseconds, so the GCRA model is exact.
const RATES: [u64; 12] = [1, 2, 4, 5, 8, 10, 20, 25, 40, 100, 250, 1000];

/// A one-host sluice whose own weight reaches its counter at once (as
/// if the host were its own root and synced after every request).
fn leaky_host(rate: u64, burst: u64) -> Table {
    let table = Table::new_heap(8, 16);
    let (rate, burst) = (rate as f64, burst as f64);
    assert!(table
        .books()
        .apply_quotas(&[Quota::new(1, "g", rate, burst, burst)])
        .refused
        .is_empty());
    table
}

fn leaky_item(weight: u64) -> CheckItem<'static> {
    CheckItem {
        name: b"g",
        key: None,
        weight,
        max_wait: None,
    }
}

/// How far apart requests come: anywhere, or (`on_grid`) on multiples of
/// half an emission interval, where the exact model sits right on its
/// boundary again and again.
fn gcra_step(rng: &mut Rng, t: u64, on_grid: bool) -> Nanos {
    if on_grid {
        rng.below(5) * (t / 2)
    } else if rng.chance(5) {
        rng.below(40 * t)
    } else {
        rng.below(3 * t)
    }
}

/// A reservation's wait against GCRA's exact one. sluice computes the
/// wait in `f64` seconds and rounds it up to whole nanoseconds, so where
/// the exact wait is a whole number of nanoseconds the float's last bit
/// can make it one more: never less (no caller acts early), at most one
/// nanosecond more.
fn assert_wait(got: Nanos, exact: i128, what: &str) {
    let over = got as i128 - exact;
    assert!(
        over == 0 || over == 1,
        "{what}: sluice waits {got} ns, GCRA {exact} ns"
    );
}

/// Requests that fell on GCRA's boundary, and those of them sluice
/// decided the other way.
#[derive(Default)]
struct Boundary {
    met: usize,
    differed: usize,
}

/// Same random checks, partial grants and reservations through GCRA and
/// a band-free leaky quota. Every decision, grant and wait must be the
/// same, except on the boundary itself: where GCRA's exact arithmetic
/// puts a request exactly on it (a margin of 0 ns), sluice's `f64`
/// level (a leak of `limit * dt * 1e-9`) may be an ulp to either side,
/// so a check may go either way, a grant may be one unit short, and a
/// reservation whose wait is exactly `max_wait` may be refused. After
/// such a request the model takes sluice's answer, and the comparison
/// goes on.
fn compare_gcra(seed: u64, ops: usize, on_grid: bool, boundary: &mut Boundary) {
    let mut rng = Rng(seed);
    let rate = RATES[rng.below(RATES.len() as u64) as usize];
    let burst = 1 + rng.below(20);
    let mut gcra = Gcra::new(rate as i128, burst as i128);
    let t = gcra.t;
    let table = leaky_host(rate, burst);
    let mut now: Nanos = 1_000_000_000 + rng.below(1_000_000_000);
    let mut counted = 0u64;
    for i in 0..ops {
        now += gcra_step(&mut rng, t as u64, on_grid);
        let at = now as i128;
        // An empty bucket's level is exactly 0 in sluice too: a request
        // can only fall on the boundary by float rounding while the
        // bucket is draining.
        let draining = gcra.tat > at;
        let weight = rng.below(burst + 2);
        let what = format!("seed {seed} (rate {rate}, burst {burst}), request {i} at {now}");
        let (got, on_boundary, differs) = if rng.chance(20) {
            let want = 1 + rng.below(burst + 2);
            let room = gcra.room(at);
            let exact = (room / t).min(want as i128) as u64;
            let got = table.gate().obtain(&leaky_item(want), now).granted;
            let on_boundary = draining && room > 0 && room % t == 0 && room / t <= want as i128;
            assert!(
                got == exact || on_boundary && got + 1 == exact,
                "{what}: obtain({want}): sluice {got}, GCRA {exact} (room {room} ns)"
            );
            (got, on_boundary, got != exact)
        } else if rng.chance(30) {
            let max_wait = rng.below(burst * t as u64);
            let got = table.gate().reserve(&leaky_item(weight), max_wait, now);
            let Some(exact) = gcra.wait(at, weight as i128) else {
                let never =
                    matches!(got.outcome, Outcome::Reject(r) if matches!(r.wait, Wait::Never(_)));
                assert!(never, "{what}: reserve({weight}) can never pass: {got:?}");
                continue;
            };
            assert_wait(got.wait, exact, &what);
            let passed = got.outcome == Outcome::Pass;
            let on_boundary = draining && exact == max_wait as i128;
            assert!(
                passed == (exact <= max_wait as i128) || on_boundary,
                "{what}: reserve({weight}, {max_wait} ns): sluice {got:?}, GCRA waits {exact} ns"
            );
            let differs = passed != (exact <= max_wait as i128);
            (if passed { weight } else { 0 }, on_boundary, differs)
        } else {
            let margin = gcra.margin(at, weight as i128);
            let exact = if weight == 0 { margin > 0 } else { margin >= 0 };
            let passed = table.gate().check_with(b"g", weight, now, no_draw) == Outcome::Pass;
            let on_boundary = draining && margin == 0;
            assert!(
                passed == exact || on_boundary,
                "{what}: check({weight}): sluice {passed}, GCRA {exact} ({margin} ns from the boundary)"
            );
            (
                if passed { weight } else { 0 },
                on_boundary,
                passed != exact,
            )
        };
        // The model counts what sluice counted (the same, off the boundary).
        gcra.admit(at, got as i128);
        counted += got;
        boundary.met += usize::from(on_boundary);
        boundary.differed += usize::from(differs);
        table.books().fold_local(now);
    }
    assert!(counted > 0, "seed {seed}: nothing passed");
}

#[test]
fn a_band_free_leaky_quota_decides_as_gcra() {
    let mut boundary = Boundary::default();
    for seed in 1..=300 {
        compare_gcra(seed, 300, false, &mut boundary);
    }
    // Random nanoseconds almost never land on a boundary.
    assert!(
        boundary.met < 30,
        "{} requests on the boundary",
        boundary.met
    );
}

#[test]
fn a_band_free_leaky_quota_decides_as_gcra_off_its_boundary_nanosecond() {
    // Requests half an emission interval apart land on GCRA's boundary
    // again and again: only there may sluice answer the other way.
    let mut boundary = Boundary::default();
    for seed in 1001..=1300 {
        compare_gcra(seed, 300, true, &mut boundary);
    }
    assert!(
        boundary.met > 1000,
        "{} requests on the boundary",
        boundary.met
    );
    eprintln!(
        "on the boundary: {} requests, {} decided the other way",
        boundary.met, boundary.differed
    );
}

#[test]
fn the_token_bucket_is_the_leaky_buckets_mirror() {
    // Tokens are what the leaky bucket has room for: burst - level, at
    // every step, so the two decide alike; and both are GCRA.
    for seed in 1..=300 {
        let mut rng = Rng(seed);
        let rate = RATES[rng.below(RATES.len() as u64) as usize] as i128;
        let burst = 1 + rng.below(20) as i128;
        let (mut leaky, mut tokens, mut gcra) = (
            Leaky::new(rate, burst),
            TokenBucket::new(rate, burst),
            Gcra::new(rate, burst),
        );
        let mut now = 0i128;
        for i in 0..400 {
            let on_grid = rng.chance(50);
            now += gcra_step(&mut rng, (SEC / rate) as u64, on_grid) as i128;
            let weight = rng.below(burst as u64 + 2) as i128;
            let (a, b, c) = (
                leaky.check(now, weight),
                tokens.check(now, weight),
                gcra.check(now, weight),
            );
            assert!(
                a == b && b == c,
                "seed {seed}, request {i}: leaky {a}, token {b}, GCRA {c}"
            );
            assert_eq!(
                tokens.tokens,
                leaky.burst - leaky.level,
                "seed {seed}, request {i}"
            );
            assert_eq!(gcra.level(now), leaky.level, "seed {seed}, request {i}");
        }
    }
}

#[test]
fn standalone_folding_differs_from_gcra_by_leaking_own_weight_from_the_fold() {
    // sluice counts a host's own weight into its counter at the next fold
    // (every 100 ms standalone, at the roots' replies with roots), and the
    // weight leaks from then: until the fold a host is stricter than GCRA
    // by up to `limit * fold interval` units. Here: 10/s, burst 2, both
    // used at 0; 100 ms later GCRA has room for one, sluice does not
    // until its fold leaks from the fold's time on.
    let table = leaky_host(10, 2);
    let mut gcra = Gcra::new(10, 2);
    assert!(gcra.check(0, 2));
    assert_eq!(table.gate().check_with(b"g", 2, 0, no_draw), Outcome::Pass);
    assert!(gcra.check(100_000_000, 1));
    assert!(matches!(
        table.gate().check_with(b"g", 1, 100_000_000, no_draw),
        Outcome::Reject(_)
    ));
    table.books().fold_local(100_000_000);
    assert!(matches!(
        table.gate().check_with(b"g", 1, 150_000_000, no_draw),
        Outcome::Reject(_)
    ));
    assert_eq!(
        table.gate().check_with(b"g", 1, 200_000_000, no_draw),
        Outcome::Pass
    );
}
