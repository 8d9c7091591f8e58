//! Running a root: bind, serve, reload, shut down gracefully.
//!
//! [`run`] is what the binary calls and what the tests call on
//! `127.0.0.1:0`: it raises the open-file limit (a root holds one file per
//! connection), serves until the `shutdown` future completes, then stops
//! accepting, lets in-flight requests finish (for at most
//! [`SHUTDOWN_GRACE`]), stops the reload task and closes the database.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;

use super::config::{ConfigError, RootConfig};
use super::connections::SHED_SLACK;
use super::credentials::Credentials;
use super::shutdown;
use super::state::RootState;
use super::store::{redact_url, StoreError};
use super::{api, listener, reload};

/// Longest wait for open requests after the shutdown signal.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

/// Why a root could not start or stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum RootError {
    /// Unusable configuration.
    #[error("{0}")]
    Config(#[from] ConfigError),
    /// Unusable database settings.
    #[error("{0}")]
    Store(#[from] StoreError),
    /// Binding or serving failed.
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

/// Binds `config.listen` and runs until `shutdown` completes.
pub async fn bind_and_run(
    config: RootConfig,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), RootError> {
    let listener = TcpListener::bind(config.listen).await.map_err(|e| {
        std::io::Error::new(e.kind(), format!("cannot listen on {}: {e}", config.listen))
    })?;
    run(listener, config, shutdown).await
}

/// Serves a root on `listener` until `shutdown` completes.
pub async fn run(
    listener: TcpListener,
    config: RootConfig,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), RootError> {
    let open_files = crate::host::raise_open_file_limit();
    check_open_file_limit(config.max_connections, open_files)?;
    let credentials = Credentials::load(
        config.sync_token.clone(),
        config.limiter_tokens_file.clone(),
    )
    .map_err(|e| ConfigError(e.to_string()))?;
    let state = Arc::new(RootState::new(config, credentials)?);
    let (trigger, signal) = shutdown::channel();
    let address = listener.local_addr()?;
    let c = &state.config;
    tracing::info!(
        %address,
        db = redact_url(&c.db),
        instance = format!("{:016x}", state.instance),
        reload_interval_ms = c.reload_interval.as_millis() as u64,
        admin_token = c.admin_token.is_some(),
        sync_token = c.sync_token.is_some(),
        limiter_tokens = c.limiter_tokens_file.as_ref().map(|_| state.credentials.limiters()),
        max_connections = c.max_connections,
        max_connections_per_address = c.max_connections_per_address,
        open_file_limit = open_files,
        "quota root listening"
    );
    let reloader = tokio::spawn(reload::run(Arc::clone(&state), signal.clone()));
    let leases = tokio::spawn(reload::expire_leases(Arc::clone(&state), signal.clone()));
    let app = api::router(Arc::clone(&state));
    let connections = Arc::clone(&state.connections);
    let server = tokio::spawn(listener::serve(
        listener,
        app,
        Arc::clone(&connections),
        signal,
    ));
    shutdown.await;
    tracing::info!("shutting down: no new connections, finishing open requests");
    trigger.fire();
    let _ = server.await;
    let drained = tokio::time::timeout(SHUTDOWN_GRACE, async {
        while connections.held() > 0 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    if drained.is_err() {
        tracing::warn!(
            grace_secs = SHUTDOWN_GRACE.as_secs(),
            "requests still open; closing"
        );
        connections.close_all();
    }
    let _ = reloader.await;
    let _ = leases.await;
    state.store.close().await;
    tracing::info!("quota root stopped");
    Ok(())
}

/// Descriptors a root needs besides its client connections: the database
/// pool, the listener, logs, the runtime.
const OTHER_FILES: u64 = 64;

/// Refuses a `max_connections` the open-file limit cannot hold: at the
/// limit `accept` would fail instead of admission shedding connections.
fn check_open_file_limit(max_connections: usize, limit: Option<u64>) -> Result<(), ConfigError> {
    let Some(limit) = limit else {
        return Ok(());
    };
    let needed = (max_connections + SHED_SLACK) as u64 + OTHER_FILES;
    if needed > limit {
        return Err(ConfigError(format!(
            "max_connections {max_connections} needs about {needed} open files but the \
             limit is {limit}: lower max_connections or raise the limit (ulimit -n, \
             systemd LimitNOFILE)"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn max_connections_must_fit_the_open_file_limit() {
        assert!(check_open_file_limit(1024, Some(4096)).is_ok());
        assert!(check_open_file_limit(1024, None).is_ok());
        let error = check_open_file_limit(10_000, Some(4096)).unwrap_err();
        assert!(error.0.contains("max_connections 10000"), "{error}");
    }
}
