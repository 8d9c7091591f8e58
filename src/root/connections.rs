//! Which connections a root keeps: admission, shedding and timeouts.
//!
//! Anyone who can reach a root can open connections to it, token or not,
//! so connections are a resource an attacker can try to exhaust (idle
//! sockets, or "slowloris" requests that trickle one byte a second). The
//! root keeps `/healthz` and authenticated syncs served through that by
//! three rules, all applied here and counted in `/metrics`
//! (`sluice_root_connections*`):
//!
//! 1. **Timeouts by phase.** A connection is always in one of four phases,
//!    and two of them have deadlines a sweeper enforces:
//!    - *head*: from accept, or from the first byte after an idle spell,
//!      until the request's head (request line and headers) is complete:
//!      `header_timeout` (a slowloris request is cut there);
//!    - *idle*: between requests, no byte of the next one yet:
//!      `idle_timeout`;
//!    - *handling*: a request is being handled; its body must keep up
//!      `min_body_rate` and arrive within `body_timeout` (enforced where
//!      it is read, `api/admission.rs`);
//!    - *sending*: the response body is being written: `body_timeout`,
//!      so a client that never reads cannot pin a connection.
//! 2. **Trust.** A connection becomes *trusted* once one of its requests
//!    presented a valid admin or sync token. Trusted connections do not
//!    count against their address, and are shed only idle and only after
//!    every untrusted one (below).
//! 3. **Shedding instead of refusing.** An untrusted connection in the
//!    head or idle phase is *sheddable*: nothing it asked for is under
//!    way. A new connection is admitted even at a limit, by closing the
//!    least recently active sheddable connection:
//!    - of its own address, when that address already holds
//!      `max_connections_per_address` untrusted connections;
//!    - of anyone, when `max_connections` are open; when no untrusted
//!      connection can be shed, the least recently active idle trusted
//!      one is (a token holder parking thousands of idle connections
//!      must not lock everyone else out; a limiter syncing every second
//!      is among the most recently active, and reconnects if shed).
//!
//!    Only when nothing can be shed (every connection busy, or trusted
//!    and not idle) is the new connection closed at once.
//!
//! So a flood of idle or trickling connections from one address keeps at
//! most `max_connections_per_address` of them, each for at most
//! `header_timeout`, and every new connection (a health probe, a limiter
//! reconnecting) pushes out the flood's oldest: it is served, and once a
//! limiter's first sync has shown its token its connection stays.
//!
//! The accept loop never holds more than `max_connections` +
//! [`SHED_SLACK`] sockets (shed ones included until their task has closed
//! them), so descriptors are bounded too.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tokio::sync::Notify;

/// Sockets the root may hold beyond `max_connections` while shed
/// connections are being closed by their tasks.
pub const SHED_SLACK: usize = 64;

/// Least time between two warnings that connections are being shed.
const WARN_EVERY: Duration = Duration::from_secs(30);

/// The limits connections are admitted and timed by.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConnectionLimits {
    /// Most connections open at once.
    pub max_connections: usize,
    /// Most untrusted connections one client address holds at once.
    pub max_per_address: usize,
    /// Longest wait for a request's head, from accept or from its first
    /// byte after an idle spell.
    pub header_timeout: Duration,
    /// Longest idle spell between requests.
    pub idle_timeout: Duration,
    /// Longest a response body may take to be written.
    pub send_timeout: Duration,
}

impl ConnectionLimits {
    /// How often the sweeper looks for expired deadlines: a tenth of the
    /// shortest timeout, between 10 ms and 1 s.
    pub fn sweep_every(&self) -> Duration {
        let shortest = self
            .header_timeout
            .min(self.idle_timeout)
            .min(self.send_timeout);
        (shortest / 10).clamp(Duration::from_millis(10), Duration::from_secs(1))
    }
}

/// Why the root closed a connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CloseReason {
    /// Its request head did not arrive within `header_timeout`.
    HeaderTimeout,
    /// It sat idle longer than `idle_timeout`.
    IdleTimeout,
    /// Its response was not taken within `body_timeout`.
    SendTimeout,
    /// Shed for a new connection from the same address.
    ShedPerAddress,
    /// Shed for a new connection at `max_connections`.
    ShedFull,
}

impl CloseReason {
    /// Every reason, in metric order.
    pub const ALL: [Self; 5] = [
        Self::HeaderTimeout,
        Self::IdleTimeout,
        Self::SendTimeout,
        Self::ShedPerAddress,
        Self::ShedFull,
    ];

    /// The metric label.
    pub fn label(self) -> &'static str {
        match self {
            Self::HeaderTimeout => "header_timeout",
            Self::IdleTimeout => "idle_timeout",
            Self::SendTimeout => "send_timeout",
            Self::ShedPerAddress => "shed_per_address",
            Self::ShedFull => "shed_full",
        }
    }
}

/// Why a new connection was closed at once.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// Its address holds its limit of connections, none of them sheddable.
    PerAddress,
    /// `max_connections` are open, none of them sheddable.
    Full,
}

impl Refusal {
    /// Every reason, in metric order.
    pub const ALL: [Self; 2] = [Self::PerAddress, Self::Full];

    /// The metric label.
    pub fn label(self) -> &'static str {
        match self {
            Self::PerAddress => "per_address",
            Self::Full => "full",
        }
    }
}

/// What `/metrics` shows about connections.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ConnectionStats {
    /// Connections open (not being closed).
    pub open: usize,
    /// Of those, trusted ones.
    pub trusted: usize,
    /// Connections accepted since start.
    pub accepted: u64,
    /// Connections the root closed, by [`CloseReason`].
    pub closed: [u64; 5],
    /// Connections closed at once on arrival, by [`Refusal`].
    pub refused: [u64; 2],
}

/// Where a connection is in its life (see the module doc).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    Head,
    Idle,
    Handling,
    Sending,
}

/// One open connection as the registry sees it.
#[derive(Debug)]
struct Entry {
    address: IpAddr,
    trusted: bool,
    phase: Phase,
    /// Activity stamp: when it was accepted or last became idle; the
    /// smallest sheddable stamp is shed first.
    stamp: u64,
    deadline: Option<Instant>,
    /// Shed or timed out; its task is closing it.
    closing: bool,
    /// Tells its task to close it.
    close: Arc<Notify>,
}

impl Entry {
    /// Untrusted with nothing under way.
    fn sheddable(&self) -> bool {
        !self.trusted && !self.closing && matches!(self.phase, Phase::Head | Phase::Idle)
    }

    /// Trusted and idle: shed only when nothing untrusted can be.
    fn sheddable_last(&self) -> bool {
        self.trusted && !self.closing && self.phase == Phase::Idle
    }
}

/// Untrusted connections of one client address.
#[derive(Debug, Default)]
struct Address {
    /// Open untrusted connections.
    untrusted: usize,
    /// The sheddable ones by stamp.
    sheddable: BTreeMap<u64, u64>,
}

/// The bookkeeping behind [`Connections`], under one lock.
#[derive(Debug, Default)]
struct Registry {
    next_id: u64,
    next_stamp: u64,
    entries: HashMap<u64, Entry>,
    /// Sheddable connections by stamp: the least recently active first.
    sheddable: BTreeMap<u64, u64>,
    /// Idle trusted connections by stamp, shed after every sheddable one.
    sheddable_last: BTreeMap<u64, u64>,
    addresses: HashMap<IpAddr, Address>,
    deadlines: BTreeSet<(Instant, u64)>,
    /// Entries not closing.
    open: usize,
    /// Of those, trusted.
    trusted: usize,
}

impl Registry {
    fn stamp(&mut self) -> u64 {
        self.next_stamp += 1;
        self.next_stamp
    }

    fn set_deadline(&mut self, id: u64, deadline: Option<Instant>) {
        let Some(entry) = self.entries.get_mut(&id) else {
            return;
        };
        if let Some(old) = entry.deadline.take() {
            self.deadlines.remove(&(old, id));
        }
        if let Some(new) = deadline {
            self.deadlines.insert((new, id));
        }
        entry.deadline = deadline;
    }

    /// Takes `id` out of the shedding order (if it is in it).
    fn unlist(&mut self, id: u64) {
        let Some(entry) = self.entries.get(&id) else {
            return;
        };
        if self.sheddable.remove(&entry.stamp).is_some() {
            if let Some(address) = self.addresses.get_mut(&entry.address) {
                address.sheddable.remove(&entry.stamp);
            }
        }
        self.sheddable_last.remove(&entry.stamp);
    }

    /// Puts `id` in the shedding order if it is sheddable.
    fn list(&mut self, id: u64) {
        let Some(entry) = self.entries.get(&id) else {
            return;
        };
        if entry.sheddable() {
            self.sheddable.insert(entry.stamp, id);
            self.addresses
                .entry(entry.address)
                .or_default()
                .sheddable
                .insert(entry.stamp, id);
        } else if entry.sheddable_last() {
            self.sheddable_last.insert(entry.stamp, id);
        }
    }

    /// The connection to shed at `max_connections`: the least recently
    /// active sheddable one, else the least recently active idle trusted
    /// one.
    fn victim(&self) -> Option<u64> {
        let (_, &id) = self
            .sheddable
            .first_key_value()
            .or_else(|| self.sheddable_last.first_key_value())?;
        Some(id)
    }

    /// Moves `id` to `phase` with `deadline`; idle connections get a new
    /// stamp (they become the most recently active).
    fn enter(&mut self, id: u64, phase: Phase, deadline: Option<Instant>) {
        self.unlist(id);
        let stamp = (phase == Phase::Idle).then(|| self.stamp());
        let Some(entry) = self.entries.get_mut(&id) else {
            return;
        };
        if entry.closing {
            return;
        }
        entry.phase = phase;
        if let Some(stamp) = stamp {
            entry.stamp = stamp;
        }
        self.set_deadline(id, deadline);
        self.list(id);
    }

    /// Stops counting `id` as open (it is closing or gone).
    fn release(&mut self, id: u64) {
        self.unlist(id);
        self.set_deadline(id, None);
        let Some(entry) = self.entries.get_mut(&id) else {
            return;
        };
        if entry.closing {
            return;
        }
        entry.closing = true;
        self.open -= 1;
        if entry.trusted {
            self.trusted -= 1;
        } else if let Some(address) = self.addresses.get_mut(&entry.address) {
            address.untrusted -= 1;
        }
        let address = entry.address;
        if self
            .addresses
            .get(&address)
            .is_some_and(|a| a.untrusted == 0 && a.sheddable.is_empty())
        {
            self.addresses.remove(&address);
        }
    }

    /// Closes `id`: released, and its task told.
    fn close(&mut self, id: u64) {
        self.release(id);
        if let Some(entry) = self.entries.get(&id) {
            entry.close.notify_one();
        }
    }
}

/// The connections of one root: admission, phases, trust, timeouts.
#[derive(Debug)]
pub struct Connections {
    limits: ConnectionLimits,
    registry: Mutex<Registry>,
    /// Wakes the accept loop when a connection is gone.
    gone: Notify,
    accepted: AtomicU64,
    closed: [AtomicU64; 5],
    refused: [AtomicU64; 2],
    /// When shedding was last logged.
    warned: Mutex<Option<Instant>>,
}

impl Connections {
    /// Connections admitted and timed by `limits`.
    pub fn new(limits: ConnectionLimits) -> Arc<Self> {
        Arc::new(Self {
            limits,
            registry: Mutex::new(Registry::default()),
            gone: Notify::new(),
            accepted: AtomicU64::new(0),
            closed: Default::default(),
            refused: Default::default(),
            warned: Mutex::new(None),
        })
    }

    /// The limits in force.
    pub fn limits(&self) -> ConnectionLimits {
        self.limits
    }

    fn lock(&self) -> MutexGuard<'_, Registry> {
        // The registry is plain bookkeeping; a panic elsewhere while it was
        // held leaves it usable.
        self.registry
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Waits until the root may hold one more socket: fewer than
    /// `max_connections` + [`SHED_SLACK`], closing ones included.
    pub async fn room(&self) {
        loop {
            let gone = self.gone.notified();
            if self.lock().entries.len() < self.limits.max_connections + SHED_SLACK {
                return;
            }
            gone.await;
        }
    }

    /// Admits a new connection from `address` at `now`, shedding another
    /// if a limit is reached; `Err` when it must be closed at once.
    pub fn admit(
        self: &Arc<Self>,
        address: IpAddr,
        now: Instant,
    ) -> Result<Arc<Connection>, Refusal> {
        let mut shed = None;
        let mut r = self.lock();
        let held = r.addresses.get(&address).map_or(0, |a| a.untrusted);
        if held >= self.limits.max_per_address {
            let victim = r.addresses.get(&address).and_then(|a| {
                let (_, &id) = a.sheddable.first_key_value()?;
                Some(id)
            });
            let Some(victim) = victim else {
                drop(r);
                return Err(self.refuse(Refusal::PerAddress));
            };
            r.close(victim);
            shed = Some(CloseReason::ShedPerAddress);
        }
        if r.open >= self.limits.max_connections {
            let Some(victim) = r.victim() else {
                drop(r);
                return Err(self.refuse(Refusal::Full));
            };
            r.close(victim);
            shed = Some(CloseReason::ShedFull);
        }
        r.next_id += 1;
        let id = r.next_id;
        let stamp = r.stamp();
        let close = Arc::new(Notify::new());
        r.entries.insert(
            id,
            Entry {
                address,
                trusted: false,
                phase: Phase::Head,
                stamp,
                deadline: None,
                closing: false,
                close: Arc::clone(&close),
            },
        );
        r.open += 1;
        r.addresses.entry(address).or_default().untrusted += 1;
        r.set_deadline(id, Some(now + self.limits.header_timeout));
        r.list(id);
        let open = r.open;
        drop(r);
        self.accepted.fetch_add(1, Ordering::Relaxed);
        if let Some(reason) = shed {
            self.count(reason);
            self.warn_shedding(reason, open);
        }
        Ok(Arc::new(Connection {
            id,
            connections: Arc::clone(self),
            close,
            idle: AtomicBool::new(false),
        }))
    }

    fn refuse(&self, why: Refusal) -> Refusal {
        self.refused[why as usize].fetch_add(1, Ordering::Relaxed);
        self.warn_shedding_refused(why);
        why
    }

    fn count(&self, reason: CloseReason) {
        self.closed[reason as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// Logs, at most every [`WARN_EVERY`], that connections are shed.
    fn warn_shedding(&self, reason: CloseReason, open: usize) {
        if self.warn_due() {
            tracing::warn!(
                reason = reason.label(),
                open,
                max_connections = self.limits.max_connections,
                max_connections_per_address = self.limits.max_per_address,
                "connection limit reached: closing the least recently active \
                 unauthenticated idle connections for new ones"
            );
        }
    }

    fn warn_shedding_refused(&self, why: Refusal) {
        if self.warn_due() {
            tracing::warn!(
                reason = why.label(),
                max_connections = self.limits.max_connections,
                max_connections_per_address = self.limits.max_per_address,
                "connection limit reached and nothing to shed: closing new connections"
            );
        }
    }

    fn warn_due(&self) -> bool {
        let mut warned = self
            .warned
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let now = Instant::now();
        if warned.is_some_and(|t| now.duration_since(t) < WARN_EVERY) {
            return false;
        }
        *warned = Some(now);
        true
    }

    /// Closes every connection whose deadline passed by `now`; returns how
    /// many.
    pub fn sweep(&self, now: Instant) -> usize {
        let mut r = self.lock();
        let mut expired = Vec::new();
        while let Some(&(deadline, id)) = r.deadlines.first() {
            if deadline > now {
                break;
            }
            let reason = match r.entries.get(&id).map(|e| e.phase) {
                Some(Phase::Head) => CloseReason::HeaderTimeout,
                Some(Phase::Idle) => CloseReason::IdleTimeout,
                _ => CloseReason::SendTimeout,
            };
            r.close(id);
            expired.push(reason);
        }
        drop(r);
        for &reason in &expired {
            self.count(reason);
        }
        expired.len()
    }

    /// Closes every connection (shutdown after the grace period).
    pub fn close_all(&self) {
        let mut r = self.lock();
        let ids: Vec<u64> = r.entries.keys().copied().collect();
        for id in ids {
            r.close(id);
        }
    }

    /// Sockets held, closing ones included.
    pub fn held(&self) -> usize {
        self.lock().entries.len()
    }

    /// Counts for `/metrics`.
    pub fn stats(&self) -> ConnectionStats {
        let (open, trusted) = {
            let r = self.lock();
            (r.open, r.trusted)
        };
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        ConnectionStats {
            open,
            trusted,
            accepted: get(&self.accepted),
            closed: self.closed.each_ref().map(get),
            refused: self.refused.each_ref().map(get),
        }
    }
}

/// One admitted connection; dropping the last handle unregisters it.
#[derive(Debug)]
pub struct Connection {
    id: u64,
    connections: Arc<Connections>,
    /// Notified when the root wants it closed.
    close: Arc<Notify>,
    /// Idle with no byte of a next request yet: the next read moves it to
    /// the head phase (an atomic, so reads take the lock once per request).
    idle: AtomicBool,
}

impl Connection {
    /// Completes when the root wants this connection closed (shed or
    /// timed out).
    pub async fn closed(&self) {
        self.close.notified().await;
    }

    /// Bytes arrived: if it was idle, its next request's head has begun.
    pub fn bytes_arrived(&self) {
        if self.idle.load(Ordering::Relaxed) && self.idle.swap(false, Ordering::AcqRel) {
            let limits = self.connections.limits;
            let mut r = self.connections.lock();
            if r.entries
                .get(&self.id)
                .is_some_and(|e| e.phase == Phase::Idle)
            {
                r.enter(
                    self.id,
                    Phase::Head,
                    Some(Instant::now() + limits.header_timeout),
                );
            }
        }
    }

    /// A request's head is complete and it is being handled; the returned
    /// guard follows it until its response is sent.
    pub fn request_started(self: &Arc<Self>) -> InFlight {
        self.idle.store(false, Ordering::Release);
        self.connections
            .lock()
            .enter(self.id, Phase::Handling, None);
        InFlight {
            connection: Arc::clone(self),
        }
    }

    /// A token was presented and checked: never shed this connection.
    pub fn trust(&self) {
        let mut r = self.connections.lock();
        r.unlist(self.id);
        let Some(entry) = r.entries.get_mut(&self.id) else {
            return;
        };
        if entry.trusted || entry.closing {
            return;
        }
        entry.trusted = true;
        let address = entry.address;
        r.trusted += 1;
        if let Some(a) = r.addresses.get_mut(&address) {
            a.untrusted -= 1;
            if a.untrusted == 0 && a.sheddable.is_empty() {
                r.addresses.remove(&address);
            }
        }
        r.list(self.id);
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        {
            let mut r = self.connections.lock();
            r.release(self.id);
            r.entries.remove(&self.id);
        }
        self.connections.gone.notify_one();
    }
}

/// A request in progress on a [`Connection`]; dropped when its response
/// has been sent (or abandoned), which makes the connection idle.
#[derive(Debug)]
pub struct InFlight {
    connection: Arc<Connection>,
}

impl InFlight {
    /// The handler answered; the response body is being sent.
    pub fn sending(&self) {
        let c = &self.connection;
        let deadline = Instant::now() + c.connections.limits.send_timeout;
        c.connections
            .lock()
            .enter(c.id, Phase::Sending, Some(deadline));
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let c = &self.connection;
        let deadline = Instant::now() + c.connections.limits.idle_timeout;
        let mut r = c.connections.lock();
        r.enter(c.id, Phase::Idle, Some(deadline));
        // Under the lock: a read that sees the flag finds the entry idle.
        c.idle.store(true, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(max: usize, per_address: usize) -> ConnectionLimits {
        ConnectionLimits {
            max_connections: max,
            max_per_address: per_address,
            header_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(60),
            send_timeout: Duration::from_secs(30),
        }
    }

    fn ip(last: u8) -> IpAddr {
        IpAddr::from([10, 0, 0, last])
    }

    /// True once the root asked `c` to close.
    fn told_to_close(c: &Connection) -> bool {
        c.connections
            .lock()
            .entries
            .get(&c.id)
            .is_some_and(|e| e.closing)
    }

    #[test]
    fn an_address_at_its_limit_sheds_its_own_least_recently_active() {
        let cs = Connections::new(limits(100, 2));
        let now = Instant::now();
        let a1 = cs.admit(ip(1), now).unwrap();
        let a2 = cs.admit(ip(1), now).unwrap();
        let b1 = cs.admit(ip(2), now).unwrap();
        let a3 = cs.admit(ip(1), now).unwrap();
        assert!(told_to_close(&a1));
        assert!(!told_to_close(&a2) && !told_to_close(&b1) && !told_to_close(&a3));
        let stats = cs.stats();
        assert_eq!(stats.open, 3);
        assert_eq!(stats.closed[CloseReason::ShedPerAddress as usize], 1);
    }

    #[test]
    fn busy_connections_and_trusted_ones_not_idle_are_never_shed() {
        let cs = Connections::new(limits(2, 2));
        let now = Instant::now();
        let busy = cs.admit(ip(1), now).unwrap();
        let _request = busy.request_started();
        let trusted = cs.admit(ip(1), now).unwrap();
        trusted.trust();
        // Full, nothing sheddable: the newcomer is refused.
        assert_eq!(cs.admit(ip(3), now).unwrap_err(), Refusal::Full);
        assert!(!told_to_close(&busy) && !told_to_close(&trusted));
        assert_eq!(cs.stats().refused[Refusal::Full as usize], 1);
        assert_eq!(cs.stats().trusted, 1);
    }

    #[test]
    fn at_the_global_limit_the_least_recently_active_goes_first() {
        let cs = Connections::new(limits(3, 3));
        let now = Instant::now();
        let first = cs.admit(ip(1), now).unwrap();
        let second = cs.admit(ip(2), now).unwrap();
        let third = cs.admit(ip(3), now).unwrap();
        // `first` served a request since: it is now the most recent.
        drop(first.request_started());
        let fourth = cs.admit(ip(4), now).unwrap();
        assert!(told_to_close(&second));
        assert!(!told_to_close(&first) && !told_to_close(&third) && !told_to_close(&fourth));
    }

    #[test]
    fn idle_trusted_connections_are_shed_only_when_nothing_untrusted_can_be() {
        let cs = Connections::new(limits(3, 3));
        let now = Instant::now();
        let limiter = cs.admit(ip(1), now).unwrap();
        limiter.trust();
        drop(limiter.request_started()); // answered: idle
        let parked = cs.admit(ip(2), now).unwrap();
        parked.trust();
        drop(parked.request_started());
        let stranger = cs.admit(ip(3), now).unwrap();
        // Full: the untrusted one goes first, though it is the newest.
        let first = cs.admit(ip(4), now).unwrap();
        assert!(told_to_close(&stranger));
        assert!(!told_to_close(&limiter) && !told_to_close(&parked));
        // `first` is busy now; the limiter syncs again (most recent).
        let _busy = first.request_started();
        drop(limiter.request_started());
        let _second = cs.admit(ip(5), now).unwrap();
        assert!(
            told_to_close(&parked),
            "the least recently active trusted one"
        );
        assert!(!told_to_close(&limiter));
        assert_eq!(cs.stats().closed[CloseReason::ShedFull as usize], 2);
    }

    #[test]
    fn trusted_connections_leave_their_address_room() {
        let cs = Connections::new(limits(10, 1));
        let now = Instant::now();
        let limiter = cs.admit(ip(1), now).unwrap();
        limiter.trust();
        let probe = cs.admit(ip(1), now).unwrap();
        assert!(!told_to_close(&limiter) && !told_to_close(&probe));
        // Busy and alone at the address limit: a third is refused.
        let _request = probe.request_started();
        assert_eq!(cs.admit(ip(1), now).unwrap_err(), Refusal::PerAddress);
    }

    #[test]
    fn deadlines_close_by_phase() {
        let cs = Connections::new(limits(10, 10));
        let t0 = Instant::now();
        let silent = cs.admit(ip(1), t0).unwrap();
        let served = cs.admit(ip(1), t0).unwrap();
        drop(served.request_started()); // idle from now: 60 s
        let sending = cs.admit(ip(1), t0).unwrap();
        let request = sending.request_started();
        request.sending();
        assert_eq!(cs.sweep(t0 + Duration::from_secs(9)), 0);
        assert_eq!(cs.sweep(t0 + Duration::from_secs(11)), 1);
        assert!(told_to_close(&silent));
        assert_eq!(cs.sweep(t0 + Duration::from_secs(31)), 1);
        assert!(told_to_close(&sending));
        assert_eq!(cs.sweep(t0 + Duration::from_secs(61)), 1);
        assert!(told_to_close(&served));
        let closed = cs.stats().closed;
        assert_eq!(closed[CloseReason::HeaderTimeout as usize], 1);
        assert_eq!(closed[CloseReason::SendTimeout as usize], 1);
        assert_eq!(closed[CloseReason::IdleTimeout as usize], 1);
    }

    #[test]
    fn bytes_after_an_idle_spell_start_the_header_clock() {
        let cs = Connections::new(limits(10, 10));
        let c = cs.admit(ip(1), Instant::now()).unwrap();
        drop(c.request_started());
        c.bytes_arrived();
        let r = cs.lock();
        let entry = &r.entries[&c.id];
        assert_eq!(entry.phase, Phase::Head);
        let left = entry.deadline.unwrap() - Instant::now();
        assert!(left <= Duration::from_secs(10), "{left:?}");
    }

    #[test]
    fn dropping_a_connection_forgets_it() {
        let cs = Connections::new(limits(10, 10));
        let c = cs.admit(ip(1), Instant::now()).unwrap();
        c.trust();
        drop(c);
        let r = cs.lock();
        assert!(r.entries.is_empty() && r.sheddable.is_empty() && r.deadlines.is_empty());
        assert!(r.sheddable_last.is_empty());
        assert!(r.addresses.is_empty());
        assert_eq!((r.open, r.trusted), (0, 0));
    }
}
