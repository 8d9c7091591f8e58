//! The reload task: rereads changed quotas every interval (and the
//! limiter tokens file when it changed), and the in-flight lease sweep.
//!
//! The same loop is the root's connection to the database: on start it
//! keeps trying (migrating the schema on first contact) until the quotas are
//! loaded, and during an outage each tick is a reconnection attempt, so
//! the root recovers by itself.

use std::sync::Arc;

use super::in_flight::Wakefulness;
use super::shutdown::Shutdown;
use super::state::RootState;

/// Reloads every `config.reload_interval` until shutdown.
pub async fn run(state: Arc<RootState>, mut shutdown: Shutdown) {
    let interval = state.config.reload_interval;
    loop {
        tokio::select! {
            _ = state.reload() => {}
            _ = shutdown.wait() => break,
        }
        state.expire_overrides().await;
        state.forget_drained_keys();
        state.forget_ended_penalties();
        state.credentials.reload_if_changed();
        tokio::select! {
            _ = tokio::time::sleep(interval) => {}
            _ = shutdown.wait() => break,
        }
    }
    tracing::debug!("reload task stopped");
}

/// Takes the in-flight slots of limiters past their lease off the
/// counters, four times a lease, until shutdown: a task of its own, so a
/// slow database reload never delays it. A stall of the root itself
/// (stopped, paused, starved) longer than two of its periods starts every
/// lease again from its end ([`Wakefulness`]).
pub async fn expire_leases(state: Arc<RootState>, mut shutdown: Shutdown) {
    let every = (state.config.in_flight_lease / 4).max(std::time::Duration::from_millis(50));
    let mut awake = Wakefulness::new(every.as_nanos() as crate::core::Nanos, state.now());
    loop {
        tokio::select! {
            _ = tokio::time::sleep(every) => {}
            _ = shutdown.wait() => break,
        }
        let now = state.now();
        let awake_since = awake.look(now);
        if awake_since == now {
            tracing::warn!(
                "this root was stalled (stopped or starved) for more than two lease sweeps: every in-flight lease runs again from now"
            );
        }
        let dropped = state.ledger().expire_leases_awake(now, awake_since);
        if dropped > 0.0 {
            tracing::info!(
                slots = dropped,
                "in-flight slots of limiters past their lease dropped"
            );
        }
    }
}
