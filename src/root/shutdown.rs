//! The signal that tells a root's background tasks to stop.
//!
//! [`super::server::run`] makes one with [`channel`] and hands clones of
//! the [`Shutdown`] side to the tasks it starts (the reload loop); they
//! select on [`Shutdown::wait`] beside their work.

use tokio::sync::watch;

/// Starts shutdown for every [`Shutdown`] made from its channel.
#[derive(Debug)]
pub struct Trigger(watch::Sender<bool>);

impl Trigger {
    /// Begins shutdown (idempotent).
    pub fn fire(&self) {
        let _ = self.0.send(true);
    }
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

/// A trigger and the signal it fires.
pub fn channel() -> (Trigger, Shutdown) {
    let (sender, signal) = watch::channel(false);
    (Trigger(sender), Shutdown { signal })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn every_clone_sees_the_trigger_even_when_it_waits_later() {
        let (trigger, mut early) = channel();
        let mut late = early.clone();
        trigger.fire();
        early.wait().await;
        late.wait().await;
    }
}
