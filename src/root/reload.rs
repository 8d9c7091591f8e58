//! The reload task: rereads changed quotas every interval (and the
//! limiter tokens file when it changed).
//!
//! The same loop is the root's connection to the database: on start it
//! keeps trying (migrating the schema on first contact) until the quotas are
//! loaded, and during an outage each tick is a reconnection attempt, so
//! the root recovers by itself.

use std::sync::Arc;

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
