//! What the custom-harness benchmarks (`root_sync`, `sync_cycle`) share:
//! sizes from the environment, and the choice between a full run (`cargo
//! bench`) and a small smoke run (`cargo test --all-targets`, which runs
//! bench binaries without `--bench` to check that they still work).

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
