//! Watching the monotonic clock for a step back.
//!
//! The networked loop's timers are tokio's, set on deadlines of the
//! monotonic clock. Stepped back (a VM's clock, a faked one: the fault
//! suite's libfaketime), tokio holds its time where it was until the clock
//! catches up: a cycle waits the step out (30 s back: 30 s without a
//! sync), and every timer set meanwhile (a request's timeout) is already
//! past and fires at once. A thread that only ever sleeps for a duration
//! (`nanosleep`, which no clock step moves) reads the clock every
//! [`LOOK_EVERY`] and says when it went back; the loop then starts over
//! on a new runtime, whose timers count from the clock as it is (see
//! `networked.rs`). A step forward needs nothing of the kind: the timers
//! it passes fire, once.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use crate::core::Nanos;

/// How often the watch reads the clock: a step back is seen this long
/// after it at most, and the watch stops this long after being asked.
const LOOK_EVERY: Duration = Duration::from_millis(50);

/// A clock that goes back by more than this between two looks has
/// stepped: the coarse monotonic clock never goes back by itself.
pub(super) const BACK_STEP: Nanos = 50_000_000;

/// What the watch and the loop share.
struct Watched {
    /// Set to stop the watch.
    stop: AtomicBool,
    /// Nanoseconds the clock last went back by (unread).
    back_by: AtomicU64,
    /// Wakes the loop when the clock went back (the permit is kept when
    /// the loop is not waiting).
    stepped: tokio::sync::Notify,
}

/// A thread watching a clock for steps back; stopped when dropped.
pub(super) struct ClockWatch {
    watched: Arc<Watched>,
    thread: Option<JoinHandle<()>>,
}

impl ClockWatch {
    /// Starts watching `clock` (the sync thread's: the monotonic clock and
    /// its configured skew).
    pub(super) fn start(clock: impl Fn() -> Nanos + Send + 'static) -> std::io::Result<Self> {
        let watched = Arc::new(Watched {
            stop: AtomicBool::new(false),
            back_by: AtomicU64::new(0),
            stepped: tokio::sync::Notify::new(),
        });
        let w = Arc::clone(&watched);
        let thread = std::thread::Builder::new()
            .name("sluice-clock".into())
            .spawn(move || {
                let mut last = clock();
                while !w.stop.load(Ordering::Acquire) {
                    std::thread::sleep(LOOK_EVERY);
                    let now = clock();
                    if now.saturating_add(BACK_STEP) < last {
                        w.back_by.store(last - now, Ordering::Release);
                        w.stepped.notify_one();
                    }
                    last = now;
                }
            })?;
        Ok(Self {
            watched,
            thread: Some(thread),
        })
    }

    /// Waits until the clock goes back (at once if it went back since the
    /// last call); returns by how much.
    pub(super) async fn stepped_back(&self) -> Nanos {
        self.watched.stepped.notified().await;
        self.watched.back_by.swap(0, Ordering::AcqRel)
    }
}

impl Drop for ClockWatch {
    fn drop(&mut self) {
        self.watched.stop.store(true, Ordering::Release);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicI64;

    #[test]
    fn a_clock_stepped_back_is_said_and_one_going_on_is_not() {
        let offset = Arc::new(AtomicI64::new(0));
        let o = Arc::clone(&offset);
        let clock = move || crate::clock::now().saturating_add_signed(o.load(Ordering::Relaxed));
        let watch = ClockWatch::start(clock).unwrap();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async {
            // Going on as clocks do: nothing said for a few looks.
            let quiet = tokio::time::timeout(Duration::from_millis(300), watch.stepped_back());
            assert!(quiet.await.is_err());
            // Forward: nothing either (timers catch up by themselves).
            offset.store(30_000_000_000, Ordering::Relaxed);
            let quiet = tokio::time::timeout(Duration::from_millis(300), watch.stepped_back());
            assert!(quiet.await.is_err());
            // Back 30 s: said, with how far.
            offset.store(0, Ordering::Relaxed);
            let back = watch.stepped_back().await;
            assert!((29_000_000_000..=30_500_000_000).contains(&back), "{back}");
        });
        // Stops when dropped (the test would hang otherwise).
        drop(watch);
    }
}
