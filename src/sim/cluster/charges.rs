//! Charged requests: a cost known only once the request is done (an LLM
//! completion's tokens, a download's bytes). Each arrival draws its cost
//! and duration; its host checks it with its estimate (or weight 0) and,
//! when it ends, charges its cost or settles its estimate at it
//! ([`crate::table::Table::charge`], [`crate::table::Table::settle`]), as
//! `sluice_charge` does in nginx's log phase.
//!
//! The series count a request's actual cost when it arrives (offered,
//! admitted or rejected), so a window's admitted weight is the cost of
//! the requests admitted in it; the true level takes it at admission too.
//! The ideal limiter decides with the actual cost, known to it alone.

use super::load::key_bytes;
use super::queue::Event;
use super::{Sim, SEC};
use crate::core::Nanos;
use crate::table::{CheckItem, CheckOptions, Outcome};

impl Sim<'_> {
    /// A charged request reaches a host.
    pub(super) fn arrive_charged(&mut self, host: usize, load: usize, now: Nanos) {
        let Some(charge) = self.checked.scenario.load[load].charge else {
            return;
        };
        if !self.hosts[host].alive {
            return;
        }
        let rank = self.keys[load]
            .as_mut()
            .map(|k| k.pick(&mut self.key_rng, host));
        let slot = (load, rank.unwrap_or(0));
        let in_flight = self.in_flight.get(&slot).copied().unwrap_or(0);
        if charge.in_flight.is_some_and(|most| in_flight >= most) {
            // The client's own concurrency: it does not send this one.
            return;
        }
        let cost = charge.cost_at(self.charge_rng.next_unit());
        let [short, long] = charge.duration_s;
        let duration = short + (long - short) * self.charge_rng.next_unit();
        let estimate = if charge.estimate { charge.cost[1] } else { 0 };
        let q = self.load_quota[load];
        let key = key_bytes(load, rank);
        let item = CheckItem {
            name: self.quotas[q].name.as_bytes(),
            key: rank.map(|_| &key[..]),
            weight: estimate,
            max_wait: None,
        };
        let h = &mut self.hosts[host];
        let local = h.local(now);
        let result = h
            .table
            .gate()
            .check_many(&[item], local, CheckOptions::default(), || {
                h.rng.next_unit()
            });
        let admitted = !matches!(result.outcome, Outcome::Reject(_));
        if admitted {
            *self.in_flight.entry(slot).or_insert(0) += 1;
            self.queue.push(
                now + (duration * SEC as f64) as Nanos,
                Event::Done {
                    host,
                    load,
                    rank: rank.unwrap_or(0),
                    estimate,
                    cost,
                    charged_at: local,
                },
            );
        }
        let ideal = match rank {
            Some(rank) => self.ideal_check_key(q, (load, rank), cost as f64, now),
            None => self.ideal_check(q, cost as f64, now),
        };
        self.record(q, cost, admitted, ideal, now);
    }

    /// A charged request ends: its host charges its cost, or settles its
    /// estimate at it.
    pub(super) fn done(&mut self, host: usize, load: usize, done: Done, now: Nanos) {
        let slot = (load, done.rank);
        if let Some(n) = self.in_flight.get_mut(&slot) {
            *n = n.saturating_sub(1);
        }
        let h = &self.hosts[host];
        if !h.alive {
            return;
        }
        let keyed = self.keys[load].is_some();
        let key = key_bytes(load, keyed.then_some(done.rank));
        let item = CheckItem {
            name: self.quotas[self.load_quota[load]].name.as_bytes(),
            key: keyed.then_some(&key[..]),
            weight: done.cost,
            max_wait: None,
        };
        h.table
            .gate()
            .settle(&item, done.estimate, done.charged_at, h.local(now));
    }
}

/// What a charged request that ends carries.
#[derive(Clone, Copy, Debug)]
pub(super) struct Done {
    /// Its key's rank (0 unkeyed).
    pub(super) rank: u64,
    /// What its check counted.
    pub(super) estimate: u64,
    /// What it cost.
    pub(super) cost: u64,
    /// When its check counted it, on its host's clock.
    pub(super) charged_at: Nanos,
}
