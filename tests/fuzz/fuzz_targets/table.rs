//! The quota table under random operation sequences, against a plain
//! in-memory model written from the rules in DESIGN.md and the table's
//! docs: quotas added, edited, re-created under a new id and deleted (by
//! epoch, in batches), checks of one or several quotas with weights at
//! given times (the burst band's draws supplied), deltas collected,
//! cluster values merged, local folding. After every operation the
//! decisions, counters and quota numbers must agree exactly.
//!
//! Leaky quotas (no windows, no per-key templates) and a constant-ratio
//! estimator, whose extrapolation the model states in closed form.
#![no_main]
use std::collections::{BTreeMap, HashMap};

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use sluice::core::quota::{MAX_DEPTH, MAX_WEIGHT};
use sluice::core::{Estimator, Extrapolation, Nanos, Quota, Tally, SECS_PER_NANO};
use sluice::table::{CheckItem, CheckOptions, CollectedDelta, Outcome, Table, TableError};

/// Names of 1 to 16 bytes: one arena granule each, so the name space
/// never runs out before the slots do.
const NAMES: [&str; 12] = [
    "a",
    "b2",
    "c_3",
    "d:44",
    "e.555",
    "f-6666",
    "g777777",
    "h8888888",
    "i99999999",
    "j.........",
    "k:k:k:k:k:k:k",
    "l_______________",
];
const MS: Nanos = 1_000_000;

#[derive(Arbitrary, Debug)]
enum Op {
    /// Quota writes applied as one batch.
    Apply(Vec<Change>),
    /// One request checking up to three quotas; draws for the band.
    Check {
        items: Vec<(u8, Weight)>,
        draws: Vec<u8>,
    },
    /// A partial grant: as many units as every quota of the chain allows
    /// for sure.
    Obtain { name: u8, want: u16 },
    /// Time passes.
    Advance(u16),
    /// The sync thread takes pending weight to send.
    Collect,
    /// A root's value for a quota's counter, `at` around now.
    Merge {
        name: u8,
        level: u16,
        at_ms: i16,
        acked: u16,
        stale_id: bool,
    },
    /// Standalone: every pending and in-flight weight folded in.
    Fold,
}

#[derive(Arbitrary, Debug)]
enum Weight {
    Small(u8),
    Any(u64),
}

#[derive(Arbitrary, Debug)]
enum Change {
    Put {
        name: u8,
        parent: Option<u8>,
        limit: u8,
        low: u8,
        band: u8,
        /// Epoch relative to the model's copy: 0 is stale.
        epoch_step: u8,
        /// Re-created under a new id (the same name).
        new_id: bool,
    },
    Delete {
        name: u8,
        epoch_step: u8,
    },
}

#[derive(Arbitrary, Debug)]
struct Input {
    capacity: u8,
    ratio: u8,
    horizon_ms: u16,
    ops: Vec<Op>,
}

#[derive(Clone, Debug)]
struct MQuota {
    id: u64,
    parent: Option<u64>,
    limit: f64,
    low: f64,
    high: f64,
    epoch: u64,
    level: f64,
    at: Nanos,
    pending: u64,
    unacked: u64,
    passed: u64,
    rejected: u64,
}

/// Seconds from `from` to `to`, zero when `to` is not later.
fn seconds(from: Nanos, to: Nanos) -> f64 {
    to.saturating_sub(from) as f64 * SECS_PER_NANO
}

/// A level leaked to `now` (unchanged if `now` is not later).
fn leaked(level: f64, at: Nanos, limit: f64, now: Nanos) -> (f64, Nanos) {
    if now <= at {
        return (level, at);
    }
    ((level - limit * seconds(at, now)).max(0.0), now)
}

struct Model {
    capacity: usize,
    ratio: f64,
    horizon: Nanos,
    quotas: BTreeMap<&'static str, MQuota>,
    /// The last id each name had, for parents naming a gone quota.
    last_id: HashMap<&'static str, u64>,
    next_id: u64,
    now: Nanos,
}

impl Model {
    fn by_id(&self, id: u64) -> Option<(&'static str, &MQuota)> {
        self.quotas
            .iter()
            .find(|(_, q)| q.id == id)
            .map(|(n, q)| (*n, q))
    }

    /// The quota and its ancestors by parent id, at most MAX_DEPTH.
    fn chain(&self, name: &'static str) -> Vec<&'static str> {
        let mut chain = vec![name];
        let mut cur = self.quotas[name].parent;
        while let Some(pid) = cur {
            if chain.len() == MAX_DEPTH {
                break;
            }
            let Some((n, q)) = self.by_id(pid) else { break };
            chain.push(n);
            cur = q.parent;
        }
        chain
    }

    /// DESIGN.md's estimate: the known level leaking since it was known,
    /// the others extrapolated at `ratio * limit` up to the horizon, plus
    /// this host's own weight not in it yet.
    fn estimate(&self, q: &MQuota) -> f64 {
        let dt = seconds(q.at, self.now);
        let horizon = self.horizon as f64 * SECS_PER_NANO;
        let others = self.ratio * q.limit * dt.min(horizon);
        (q.level + others - q.limit * dt).max(0.0) + (q.pending + q.unacked) as f64
    }

    fn apply(&mut self, changes: &[Change]) -> (Vec<Quota>, usize) {
        let mut batch = Vec::new();
        let mut full = 0;
        // Slots freed in a batch are reusable only after it.
        let mut freed = 0;
        for change in changes.iter().take(8) {
            match *change {
                Change::Put {
                    name,
                    parent,
                    limit,
                    low,
                    band,
                    epoch_step,
                    new_id,
                } => {
                    let name = NAMES[name as usize % NAMES.len()];
                    let old = self.quotas.get(name).cloned();
                    let id = match &old {
                        Some(q) if !new_id => q.id,
                        _ => {
                            self.next_id += 1;
                            self.next_id
                        }
                    };
                    let parent = parent
                        .map(|p| NAMES[p as usize % NAMES.len()])
                        .and_then(|p| {
                            self.quotas
                                .get(p)
                                .map(|q| q.id)
                                .or(self.last_id.get(p).copied())
                        })
                        .filter(|&p| p != id);
                    let epoch = old.as_ref().map_or(1, |q| q.epoch) + u64::from(epoch_step % 3);
                    let q = Quota {
                        parent,
                        epoch,
                        ..Quota::new(
                            id,
                            name,
                            f64::from(limit) / 4.0,
                            f64::from(low),
                            f64::from(low) + f64::from(band),
                        )
                    };
                    match old {
                        Some(o) if o.epoch >= epoch => {}
                        Some(o) => {
                            let fresh = o.id != id;
                            let m = self.quotas.get_mut(name).unwrap();
                            m.id = id;
                            m.parent = parent;
                            m.limit = q.limit;
                            m.low = q.low_burst;
                            m.high = q.high_burst;
                            m.epoch = epoch;
                            if fresh {
                                (m.level, m.at, m.pending, m.unacked) = (0.0, 0, 0, 0);
                                (m.passed, m.rejected) = (0, 0);
                            }
                        }
                        None if self.quotas.len() + freed >= self.capacity => full += 1,
                        None => {
                            self.quotas.insert(
                                name,
                                MQuota {
                                    id,
                                    parent,
                                    limit: q.limit,
                                    low: q.low_burst,
                                    high: q.high_burst,
                                    epoch,
                                    level: 0.0,
                                    at: 0,
                                    pending: 0,
                                    unacked: 0,
                                    passed: 0,
                                    rejected: 0,
                                },
                            );
                        }
                    }
                    self.last_id.insert(name, id);
                    batch.push(q);
                }
                Change::Delete { name, epoch_step } => {
                    let name = NAMES[name as usize % NAMES.len()];
                    let Some(old) = self.quotas.get(name) else {
                        continue;
                    };
                    let epoch = old.epoch + u64::from(epoch_step % 3);
                    batch.push(Quota::tombstone(old.id, name, epoch));
                    if epoch > old.epoch {
                        self.quotas.remove(name);
                        freed += 1;
                    }
                }
            }
        }
        (batch, full)
    }
}

fn draw_from(draws: &[u8], used: &mut usize) -> f64 {
    let x = draws.get(*used).map_or(0.5, |&b| f64::from(b) / 256.0);
    *used += 1;
    x
}

fn compare(table: &Table, model: &Model) {
    assert_eq!(table.len() as usize, model.quotas.len());
    for (name, m) in &model.quotas {
        let s = table
            .quota(name.as_bytes(), model.now)
            .unwrap_or_else(|| panic!("{name} missing from the table"));
        let q = &s.quota;
        assert_eq!(
            (q.id, q.parent, q.epoch),
            (m.id, m.parent, m.epoch),
            "{name}"
        );
        assert_eq!(
            (q.limit, q.low_burst, q.high_burst),
            (m.limit, m.low, m.high),
            "{name}"
        );
        assert_eq!(
            (s.pending, s.unacked),
            (m.pending as i64, m.unacked as i64),
            "{name}"
        );
        assert_eq!((s.passed, s.rejected), (m.passed, m.rejected), "{name}");
        assert_eq!(s.level, model.estimate(m), "{name}: level");
    }
}

fuzz_target!(|input: Input| {
    let capacity = usize::from(input.capacity % 12) + 1;
    let table = Table::new_heap(capacity as u32, 16);
    let horizon = (u64::from(input.horizon_ms) + 1) * MS;
    let ratio = f64::from(input.ratio % 5) / 4.0;
    table.set_estimator(Estimator {
        mode: Extrapolation::ConstantRatio { ratio },
        horizon,
    });
    let mut model = Model {
        capacity,
        ratio,
        horizon,
        quotas: BTreeMap::new(),
        last_id: HashMap::new(),
        next_id: 0,
        now: 1_000 * MS,
    };
    for op in input.ops.iter().take(64) {
        match op {
            Op::Apply(changes) => {
                let (batch, full) = model.apply(changes);
                let report = table.books().apply_quotas(&batch);
                let refused_full = report
                    .refused
                    .iter()
                    .filter(|e| matches!(e, TableError::Full { .. }))
                    .count();
                assert_eq!(refused_full, full, "{report:?}");
                assert_eq!(report.refused.len(), full, "{report:?}");
            }
            Op::Check { items, draws } => {
                let items: Vec<(&'static str, u64)> = items
                    .iter()
                    .take(3)
                    .map(|(n, w)| {
                        let w = match *w {
                            Weight::Small(w) => u64::from(w),
                            Weight::Any(w) => w,
                        };
                        (NAMES[*n as usize % NAMES.len()], w)
                    })
                    .collect();
                // The model decides: every item's chain in order, the
                // first rejection ends it, and only then is anything
                // counted.
                let mut used = 0;
                let mut verdict = None;
                let mut passed = Vec::new();
                for (i, &(name, weight)) in items.iter().enumerate() {
                    if !model.quotas.contains_key(name) {
                        continue;
                    }
                    let w = weight.min(MAX_WEIGHT) as f64;
                    let chain = model.chain(name);
                    for (depth, n) in chain.iter().enumerate() {
                        let q = &model.quotas[n];
                        let after = model.estimate(q) + w;
                        let full = if w > 0.0 {
                            after > q.high
                        } else {
                            after >= q.high
                        };
                        let in_band = after > q.low && after <= q.high;
                        let x = if in_band {
                            draw_from(draws, &mut used)
                        } else {
                            0.0
                        };
                        let reject =
                            full || (after > q.low && x < (after - q.low) / (q.high - q.low));
                        if reject {
                            verdict = Some((i, depth));
                            break;
                        }
                    }
                    if verdict.is_some() {
                        break;
                    }
                    passed.push((chain, weight.min(MAX_WEIGHT)));
                }
                let check: Vec<CheckItem> = items
                    .iter()
                    .map(|&(name, weight)| CheckItem {
                        name: name.as_bytes(),
                        key: None,
                        weight,
                        max_wait: None,
                    })
                    .collect();
                let mut table_used = 0;
                let got =
                    table
                        .gate()
                        .check_many(&check, model.now, CheckOptions::default(), || {
                            draw_from(draws, &mut table_used)
                        });
                assert_eq!(table_used, used, "draws taken");
                match verdict {
                    Some((item, depth)) => {
                        let Outcome::Reject(r) = got.outcome else {
                            panic!("model rejects item {item} at depth {depth}; table: {got:?}")
                        };
                        assert_eq!((got.item, r.depth), (Some(item), depth));
                        let first = items[item].0;
                        model.quotas.get_mut(first).unwrap().rejected += 1;
                    }
                    None if passed.is_empty() => assert_eq!(got.outcome, Outcome::Unknown),
                    None => {
                        assert_eq!(got.outcome, Outcome::Pass, "{got:?}");
                        for (chain, weight) in passed {
                            model.quotas.get_mut(chain[0]).unwrap().passed += 1;
                            for n in chain {
                                model.quotas.get_mut(n).unwrap().pending += weight;
                            }
                        }
                    }
                }
            }
            Op::Obtain { name, want } => {
                let name = NAMES[*name as usize % NAMES.len()];
                let item = CheckItem {
                    name: name.as_bytes(),
                    key: None,
                    weight: u64::from(*want),
                    max_wait: None,
                };
                let got = table.gate().obtain(&item, model.now);
                if !model.quotas.contains_key(name) {
                    assert_eq!((got.outcome, got.granted), (Outcome::Unknown, 0));
                    continue;
                }
                // The room below low_burst of the tightest quota (the first
                // on a tie), whole units, at most what was asked.
                let chain = model.chain(name);
                let mut tightest = (0, f64::INFINITY);
                for (depth, n) in chain.iter().enumerate() {
                    let q = &model.quotas[n];
                    let slack = q.low - model.estimate(q);
                    if slack < tightest.1 {
                        tightest = (depth, slack);
                    }
                }
                let granted = tightest.1.clamp(0.0, f64::from(*want)).floor();
                if granted >= 1.0 {
                    assert_eq!((got.outcome, got.granted), (Outcome::Pass, granted as u64));
                    model.quotas.get_mut(name).unwrap().passed += 1;
                    for n in chain {
                        model.quotas.get_mut(n).unwrap().pending += granted as u64;
                    }
                } else {
                    let Outcome::Reject(r) = got.outcome else {
                        panic!("model grants nothing; table: {got:?}")
                    };
                    assert_eq!((r.depth, got.granted), (tightest.0, 0));
                    model.quotas.get_mut(name).unwrap().rejected += 1;
                }
            }
            Op::Advance(ms) => model.now += u64::from(*ms) * MS,
            Op::Collect => {
                let mut out: Vec<CollectedDelta> = Vec::new();
                table.books().collect_deltas(&mut out);
                let mut got: Vec<(u64, u64)> = out.iter().map(|d| (d.id, d.delta)).collect();
                got.sort_unstable();
                let mut want = Vec::new();
                for q in model.quotas.values_mut() {
                    if q.pending > 0 {
                        want.push((q.id, q.pending));
                        q.unacked += q.pending;
                        q.pending = 0;
                    }
                }
                want.sort_unstable();
                assert_eq!(got, want);
            }
            Op::Merge {
                name,
                level,
                at_ms,
                acked,
                stale_id,
            } => {
                let name = NAMES[*name as usize % NAMES.len()];
                let Some(slot) = table.gate().lookup(name.as_bytes()) else {
                    assert!(!model.quotas.contains_key(name));
                    continue;
                };
                let m = model.quotas.get_mut(name).expect("in the model");
                let id = if *stale_id { m.id + 1000 } else { m.id };
                let at = model
                    .now
                    .saturating_add_signed(i64::from(*at_ms) * MS as i64);
                let value = Tally {
                    level: f64::from(*level),
                    prev: 0.0,
                    at,
                };
                // Source 0: no root's own level, so every value is max-merged as
                // the model does (a root's later value replacing its earlier
                // one is the sync engine's property tests' subject).
                let merged = table
                    .books()
                    .merge_counter(slot, id, 0, value, i64::from(*acked), 0);
                assert_eq!(merged, !*stale_id);
                if merged {
                    // Both views leaked to the later time; the larger
                    // level wins (max of two grow-only counters).
                    let later = m.at.max(at);
                    let (a, _) = leaked(m.level, m.at, m.limit, later);
                    let (b, _) = leaked(value.level, at, m.limit, later);
                    (m.level, m.at) = (a.max(b), later);
                    m.unacked -= u64::from(*acked).min(m.unacked);
                }
            }
            Op::Fold => {
                table.books().fold_local(model.now);
                let now = model.now;
                for q in model.quotas.values_mut() {
                    let (level, at) = leaked(q.level, q.at, q.limit, now);
                    (q.level, q.at) = (level + (q.pending + q.unacked) as f64, at);
                    (q.pending, q.unacked) = (0, 0);
                }
            }
        }
        compare(&table, &model);
    }
});
