//! What a running `sluice rls` holds and what its servers share: the
//! decision engine, the sync thread, and the Prometheus text of both.

use std::sync::{Arc, Mutex};

use super::decide::Engine;
use super::metrics::prometheus;
use crate::sync::SyncHandle;

/// What a running `sluice rls` holds.
pub struct Server {
    /// The decision engine.
    pub engine: Arc<Engine>,
    /// The sync thread.
    sync: Mutex<Option<SyncHandle>>,
    /// Roots are configured.
    has_roots: bool,
}

impl Server {
    /// A server over `engine`, with its sync thread (none: tests).
    pub fn new(engine: Arc<Engine>, sync: Option<SyncHandle>, has_roots: bool) -> Server {
        Server {
            engine,
            sync: Mutex::new(sync),
            has_roots,
        }
    }

    /// The Prometheus text of the decisions and the sync.
    pub fn prometheus(&self) -> String {
        let sync = self
            .sync
            .lock()
            .ok()
            .and_then(|s| s.as_ref().map(SyncHandle::metrics))
            .unwrap_or_default();
        prometheus(
            &self.engine.configured_stats(),
            &self.engine.detailed,
            &self.engine.requests,
            &sync,
            self.has_roots,
            self.engine.table().len(),
        )
    }

    /// Stops the sync thread.
    pub fn stop(&self) {
        if let Some(sync) = self.sync.lock().ok().and_then(|mut s| s.take()) {
            sync.stop();
        }
    }
}
