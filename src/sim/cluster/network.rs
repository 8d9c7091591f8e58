//! The simulated network between hosts and roots: a sync cycle's
//! requests travel with latency, jitter and loss, roots answer in their
//! own clocks, and a host gives up on a reply after its timeout.

use super::queue::Event;
use super::{millis, Sim, CLOCK_BASE};
use crate::core::Nanos;
use crate::sync::config::default_timeout;
use crate::sync::link::OwedDeltas;
use crate::sync::Page;
use crate::wire::{SyncRequest, SyncResponse};

/// A sync exchange between a host and a root.
pub(super) struct Exchange {
    host: usize,
    root: usize,
    request: SyncRequest,
    owed: OwedDeltas,
    /// Host local time the request left.
    sent_at: Nanos,
    /// The root's reply, once it answered (`None` at the host: refused).
    reply: Option<SyncResponse>,
}

impl Sim<'_> {
    pub(super) fn delay(&mut self) -> Nanos {
        let n = &self.checked.scenario.network;
        millis(n.latency_ms + n.jitter_ms * self.net_rng.next_unit())
    }

    pub(super) fn lost(&mut self) -> bool {
        let loss = self.checked.scenario.network.loss;
        loss > 0.0 && self.net_rng.next_unit() < loss
    }

    pub(super) fn root_time(&self, root: usize, now: Nanos) -> Nanos {
        (CLOCK_BASE + now).saturating_add_signed(self.root_offsets[root])
    }

    pub(super) fn tick(&mut self, host: usize, now: Nanos) {
        if !self.hosts[host].alive {
            return;
        }
        if self.roots.is_empty() {
            // Standalone: the host is its own root.
            let h = &self.hosts[host];
            h.table.books().fold_local(h.local(now));
            self.schedule_tick(host, now);
            return;
        }
        // As the real loop: a cycle every interval (plus jitter), whatever
        // is still under way; the engine leaves out roots still busy.
        let h = &mut self.hosts[host];
        let local = h.local(now);
        if h.in_cycle {
            h.engine.end_cycle(&h.table, local);
        }
        h.in_cycle = true;
        let outgoing = h.engine.begin_cycle(&h.table, local);
        self.schedule_tick(host, now);
        let timeout = match self.checked.scenario.sync.timeout_ms {
            Some(ms) => millis(ms),
            None => default_timeout(std::time::Duration::from_nanos(self.hosts[host].interval))
                .as_nanos() as Nanos,
        };
        for out in outgoing {
            let id = self.next_exchange;
            self.next_exchange += 1;
            self.exchanges.insert(
                id,
                Exchange {
                    host,
                    root: out.root,
                    request: out.request,
                    owed: out.owed,
                    sent_at: local,
                    reply: None,
                },
            );
            if !self.lost() {
                let delay = self.delay();
                self.queue.push(now + delay, Event::AtRoot { exchange: id });
            }
            self.queue
                .push(now + timeout, Event::Timeout { exchange: id });
        }
    }

    pub(super) fn at_root(&mut self, exchange: u64, now: Nanos) {
        let Some(ex) = self.exchanges.get(&exchange) else {
            return;
        };
        let root = ex.root;
        let root_now = self.root_time(root, now);
        // A killed root's host refuses the connection: the error comes
        // back after one round trip. (Silent drops are `network.loss`.)
        let reply = if self.roots[root].up {
            Some(self.roots[root].sync(&ex.request, root_now))
        } else {
            None
        };
        let refused = reply.is_none();
        if let Some(ex) = self.exchanges.get_mut(&exchange) {
            ex.reply = reply;
        }
        if refused || !self.lost() {
            let delay = self.delay();
            self.queue.push(now + delay, Event::AtHost { exchange });
        }
    }

    /// The reply (or the refusal) reaches the host.
    pub(super) fn at_host(&mut self, exchange: u64, now: Nanos) {
        // After the timeout the exchange is gone, as reqwest would have
        // dropped it.
        let Some(ex) = self.exchanges.remove(&exchange) else {
            return;
        };
        let h = &mut self.hosts[ex.host];
        if h.alive {
            let local = h.local(now);
            match ex.reply {
                Some(reply) => {
                    let page = Page {
                        sent_at: ex.sent_at,
                        received_at: local,
                        reply,
                    };
                    h.engine
                        .finish(&h.table, ex.root, ex.owed, &[page], None, local);
                }
                None => {
                    let error = Some("connection refused".to_string());
                    h.engine
                        .finish(&h.table, ex.root, ex.owed, &[], error, local);
                }
            }
        }
    }

    /// No reply in time: the request or the reply was lost.
    pub(super) fn timeout(&mut self, exchange: u64, now: Nanos) {
        let Some(ex) = self.exchanges.remove(&exchange) else {
            return;
        };
        let h = &mut self.hosts[ex.host];
        if h.alive {
            let local = h.local(now);
            let error = Some("timed out".to_string());
            h.engine
                .finish(&h.table, ex.root, ex.owed, &[], error, local);
        }
    }
}
