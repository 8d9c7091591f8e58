//! What the custom-harness benchmarks (`root_sync`, `sync_cycle`,
//! `root_admission`) share:
//! sizes from the environment, and the choice between a full run (`cargo
//! bench`) and a small smoke run (`cargo test --all-targets`, which runs
//! bench binaries without `--bench` to check that they still work); and
//! the measurements of `measure.rs`; the root process of `root.rs`.

// Not every bench binary measures processes or latencies, or runs a root.
#[allow(dead_code)]
pub mod measure;
#[allow(dead_code)]
pub mod root;

/// A size from the environment variable `name`, or `default`.
pub fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// How the bench binary `bench` was asked to run: `None` when a filter
/// names another bench (skip), `Some(true)` for a full `cargo bench` run,
/// `Some(false)` for the smoke run.
pub fn full_run(bench: &str) -> Option<bool> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args
        .iter()
        .any(|a| !a.starts_with('-') && !bench.contains(a.as_str()))
    {
        return None;
    }
    Some(args.iter().any(|a| a == "--bench"))
}

/// The sizes bench `bench` runs with: `from_env` for a full run, `smoke`
/// for the smoke run, `None` when a filter names another bench.
pub fn sizes<S>(bench: &str, smoke: impl FnOnce() -> S, from_env: impl FnOnce() -> S) -> Option<S> {
    let full = full_run(bench)?;
    Some(if full { from_env() } else { smoke() })
}

/// Runs an async bench on a two-thread tokio runtime.
#[allow(dead_code)]
pub fn block_on<F: std::future::Future>(bench: F) -> F::Output {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
        .block_on(bench)
}
