//! Running a root: bind, serve, reload, shut down gracefully.
//!
//! [`run`] is what the binary calls and what the tests call on
//! `127.0.0.1:0`: it serves until the `shutdown` future completes, then
//! stops accepting, lets in-flight requests finish (for at most
//! [`SHUTDOWN_GRACE`]), stops the reload task and closes the database.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::watch;

use super::config::{ConfigError, RootConfig};
use super::listener::BoundedListener;
use super::state::RootState;
use super::store::{redact_url, StoreError};
use super::{api, reload};

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

/// Tells background tasks that the root is shutting down.
#[derive(Clone, Debug)]
pub struct Shutdown {
    /// Becomes `true` once.
    signal: watch::Receiver<bool>,
}

impl Shutdown {
    /// Completes once shutdown has begun.
    pub async fn wait(&mut self) {
        // An error means the sender is gone, which also means shutdown.
        let _ = self.signal.wait_for(|&down| down).await;
    }
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
    let state = Arc::new(RootState::new(config)?);
    let (notify, signal) = watch::channel(false);
    let address = listener.local_addr()?;
    tracing::info!(
        %address,
        db = redact_url(&state.config.db),
        instance = format!("{:016x}", state.instance),
        reload_interval_ms = state.config.reload_interval.as_millis() as u64,
        admin_token = state.config.admin_token.is_some(),
        sync_token = state.config.sync_token.is_some(),
        "quota root listening"
    );
    let reloader = tokio::spawn(reload::run(
        Arc::clone(&state),
        Shutdown {
            signal: signal.clone(),
        },
    ));
    let listener = BoundedListener::new(listener, state.config.max_connections);
    let app = api::router(Arc::clone(&state));
    let graceful_notify = notify.clone();
    let server = axum::serve(listener, app).with_graceful_shutdown(async move {
        shutdown.await;
        tracing::info!("shutting down: no new connections, finishing open requests");
        let _ = graceful_notify.send(true);
    });
    let result = {
        let mut deadline = Shutdown { signal };
        tokio::select! {
            result = server => result,
            _ = async { deadline.wait().await; tokio::time::sleep(SHUTDOWN_GRACE).await } => {
                tracing::warn!(grace_secs = SHUTDOWN_GRACE.as_secs(), "requests still open; closing");
                Ok(())
            }
        }
    };
    let _ = notify.send(true);
    let _ = reloader.await;
    state.store.close().await;
    tracing::info!("quota root stopped");
    result.map_err(RootError::from)
}
