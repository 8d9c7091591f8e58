//! One sync thread per nginx: started in worker 0 (or the single process)
//! by `init_process`, stopped by `exit_process`. When nginx respawns a
//! crashed worker 0 the new process starts it again; during a reload the
//! old and the new worker 0 overlap for a while, which is safe because
//! deltas leave the shared table atomically (each increment is collected
//! by exactly one thread).
//!
//! The sync thread never calls into nginx: its log lines go to a bounded
//! queue that a timer in the worker's own event loop writes to the error
//! log.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use ngx::ffi::{
    ngx_add_timer, ngx_cycle_t, ngx_event_t, ngx_exiting, ngx_log_t, ngx_pcalloc, ngx_process,
    ngx_uint_t, ngx_worker, NGX_LOG_ERR, NGX_LOG_INFO, NGX_LOG_NOTICE, NGX_LOG_WARN,
    NGX_PROCESS_SINGLE, NGX_PROCESS_WORKER,
};
use ngx::http::HttpModuleMainConf;

use super::util::{log, runtime_boundary};
use super::Module;
use crate::sync::{LogLevel, SyncConfig, SyncHandle};

/// Lines the sync thread may queue before new ones are dropped (counted).
const MAX_QUEUED_LINES: usize = 1000;
/// How often the worker writes queued lines to the error log.
const DRAIN_EVERY_MS: ngx_uint_t = 200;

/// Log lines from the sync thread waiting for the worker.
#[derive(Default)]
struct LogQueue {
    lines: Mutex<VecDeque<(LogLevel, String)>>,
    dropped: AtomicU64,
}

impl LogQueue {
    fn push(&self, level: LogLevel, line: &str) {
        if let Ok(mut lines) = self.lines.lock() {
            if lines.len() < MAX_QUEUED_LINES {
                lines.push_back((level, line.to_string()));
                return;
            }
        }
        self.dropped.fetch_add(1, Ordering::Relaxed);
    }

    /// Writes every queued line to `log_to`.
    fn drain(&self, log_to: *mut ngx_log_t) {
        let lines = match self.lines.lock() {
            Ok(mut lines) => std::mem::take(&mut *lines),
            Err(_) => return,
        };
        for (level, line) in lines {
            let level = match level {
                LogLevel::Info => NGX_LOG_INFO,
                LogLevel::Warn => NGX_LOG_WARN,
                LogLevel::Error => NGX_LOG_ERR,
            };
            // SAFETY: the cycle's log, from the worker's own thread.
            unsafe { log(level as ngx_uint_t, log_to, format_args!("sluice: {line}")) };
        }
        let dropped = self.dropped.swap(0, Ordering::Relaxed);
        if dropped > 0 {
            // SAFETY: as above.
            unsafe {
                log(
                    NGX_LOG_WARN as ngx_uint_t,
                    log_to,
                    format_args!("sluice: {dropped} sync log lines dropped (queue full)"),
                )
            };
        }
    }
}

/// What this process runs for sluice.
struct WorkerSync {
    handle: SyncHandle,
    logs: Arc<LogQueue>,
    log_to: *mut ngx_log_t,
}

// SAFETY: `log_to` is only used from the worker's main thread (the timer
// and exit_process); the mutex below is never touched by the sync thread.
unsafe impl Send for WorkerSync {}

static WORKER: Mutex<Option<WorkerSync>> = Mutex::new(None);

/// True in the one process per nginx that runs the sync thread.
fn runs_sync() -> bool {
    // SAFETY: plain reads of nginx globals set before init_process.
    unsafe {
        let process = ngx_process as u32;
        process == NGX_PROCESS_SINGLE || (process == NGX_PROCESS_WORKER && ngx_worker == 0)
    }
}

/// `init_process`: starts the sync thread in worker 0.
pub(crate) fn start(cycle: &mut ngx_cycle_t) -> Result<(), String> {
    super::in_flight::set_owner();
    if !runs_sync() {
        return Ok(());
    }
    let Some(mcf) = Module::main_conf(cycle) else {
        return Ok(());
    };
    let Some(table) = mcf.table.clone() else {
        return Ok(());
    };
    let logs = Arc::new(LogQueue::default());
    let sink = Arc::clone(&logs);
    let config = SyncConfig {
        log: Arc::new(move |level, line| sink.push(level, line)),
        ..mcf.sync_config()
    };
    let summary = if config.roots.is_empty() {
        "standalone: no quota roots, counting locally".to_string()
    } else {
        format!(
            "{} quota root(s), every {} ms, as \"{}\"",
            config.roots.len(),
            config.interval.as_millis(),
            config.limiter_id
        )
    };
    let handle = with_signals_blocked(|| SyncHandle::start(Arc::clone(&table), config))
        .map_err(|e| format!("sluice: cannot start the sync thread: {e}"))?;
    // SAFETY: plain read of the cycle's log.
    unsafe {
        log(
            NGX_LOG_NOTICE as ngx_uint_t,
            cycle.log,
            format_args!("sluice: sync thread started ({summary})"),
        )
    };
    if let Ok(mut w) = WORKER.lock() {
        *w = Some(WorkerSync {
            handle,
            logs,
            log_to: cycle.log,
        });
    }
    arm_timer(cycle)
}

/// `exit_process`: stops the sync thread and writes its last lines.
pub(crate) fn stop() {
    let Some(w) = WORKER.lock().ok().and_then(|mut w| w.take()) else {
        return;
    };
    w.handle.stop();
    w.logs.drain(w.log_to);
}

/// Starts `f` with every signal blocked, so a thread it spawns inherits a
/// full mask and nginx's signals keep going to the worker's own thread.
fn with_signals_blocked<T>(f: impl FnOnce() -> T) -> T {
    // SAFETY: sigset_t values are plain data initialised by sigfillset and
    // pthread_sigmask before use; the old mask is restored after `f`.
    unsafe {
        let mut all: libc::sigset_t = std::mem::zeroed();
        let mut old: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut all);
        let blocked = libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut old) == 0;
        let out = f();
        if blocked {
            libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut());
        }
        out
    }
}

fn arm_timer(cycle: &mut ngx_cycle_t) -> Result<(), String> {
    // SAFETY: the event is allocated from the cycle pool, which lives as
    // long as this worker; nginx owns it once the timer is added.
    unsafe {
        let ev = ngx_pcalloc(cycle.pool, std::mem::size_of::<ngx_event_t>()).cast::<ngx_event_t>();
        if ev.is_null() {
            return Err("sluice: out of memory for the sync log timer".into());
        }
        (*ev).handler = Some(on_timer);
        (*ev).log = cycle.log;
        // Never keeps a gracefully exiting worker alive.
        (*ev).set_cancelable(1);
        ngx_add_timer(ev, DRAIN_EVERY_MS as _);
    }
    Ok(())
}

/// # Safety
///
/// nginx calls it on the worker's event loop with the timer event this
/// module armed.
unsafe extern "C" fn on_timer(ev: *mut ngx_event_t) {
    // SAFETY: nginx passes the event armed in `arm_timer`.
    let log_to = unsafe { (*ev).log };
    runtime_boundary(log_to, "the sync log timer", (), || {
        if let Ok(mut guard) = WORKER.lock() {
            if let Some(w) = guard.as_mut() {
                w.logs.drain(log_to);
            }
        }
        // SAFETY: plain read of nginx's flag; the event is still ours.
        unsafe {
            if ngx_exiting == 0 {
                ngx_add_timer(ev, DRAIN_EVERY_MS as _);
            }
        }
    });
}
