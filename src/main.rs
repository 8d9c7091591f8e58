//! The `sluice` binary.
//!
//! - `sluice root` — run a quota root ([`sluice::root`]).
//! - `sluice quota list|get|set|delete|apply` — administer quotas on a root
//!   (`cli/`).
//! - `sluice top` — the root's busiest quotas, rates and limiters in a
//!   terminal (`cli/top.rs`).
//! - `sluice rls` — an Envoy rate limit service ([`sluice::rls`], cargo
//!   feature `rls`).
//! - `sluice sim` — the cluster simulator (`sluice::sim`, cargo feature
//!   `sim`).
//!
//! Thin on purpose: parse flags, set up logging, hand over.

mod cli;

use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};
use sluice::root::{RootArgs, RootConfig};

/// A distributed rate limiter that decides locally.
#[derive(Debug, Parser)]
#[command(name = "sluice", version)]
struct Cli {
    /// Log line format (logs go to stderr; RUST_LOG filters them, default
    /// info).
    #[arg(long, value_enum, default_value_t = LogFormat::Text, global = true)]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run a quota root: database, sync endpoint, admin API, metrics.
    Root(RootArgs),
    /// Administer quotas on a root.
    Quota(cli::QuotaArgs),
    /// Watch a root: busiest quotas, rates, rejections, limiters.
    Top(cli::TopArgs),
    /// Simulate a cluster of limiters and roots from scenario files.
    #[cfg(feature = "sim")]
    Sim(sluice::sim::SimArgs),
    /// Serve Envoy's rate limit service (RLS v3) from envoyproxy/ratelimit's
    /// YAML, deciding locally and sharing limits through the roots.
    #[cfg(feature = "rls")]
    Rls(sluice::rls::server::RlsArgs),
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

fn main() -> ExitCode {
    unblock_stop_signals();
    let args = Cli::parse();
    match args.command {
        Command::Root(root) => {
            init_logging(args.log_format, "info");
            run_root(&root)
        }
        Command::Quota(quota) => {
            init_logging(args.log_format, "warn");
            cli::run(quota)
        }
        Command::Top(top) => {
            init_logging(args.log_format, "warn");
            cli::top::run(top)
        }
        #[cfg(feature = "rls")]
        Command::Rls(rls) => {
            init_logging(args.log_format, "info");
            use sluice::rls::server::{settings, start};
            serve("sluice rls", settings(&rls), |settings| {
                start(&rls, settings, shutdown_signal())
            })
        }
        #[cfg(feature = "sim")]
        Command::Sim(sim) => match sluice::sim::run(&sim) {
            Ok(()) => ExitCode::SUCCESS,
            Err(error) => {
                eprintln!("sluice sim: {error}");
                ExitCode::FAILURE
            }
        },
    }
}

/// Unblocks SIGINT and SIGTERM, which `sluice root` and `sluice top` stop
/// on. A signal mask is inherited across exec, and some supervisors and CI
/// runners start their children with these blocked: the signal would then
/// stay pending forever and Ctrl-C would do nothing. Called before any
/// thread starts, so every thread inherits the unblocked mask.
fn unblock_stop_signals() {
    // SAFETY: `set` is a local, initialised by sigemptyset before use; the
    // calls only read it and change this thread's mask.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::pthread_sigmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
    }
}

fn init_logging(format: LogFormat, default: &str) {
    use std::io::IsTerminal;
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default));
    // Colours only for a person at a terminal: a log file (`make run`'s
    // run/logs/root.log, a service's journal) gets plain text. NO_COLOR
    // (no-color.org) turns them off at a terminal too.
    let colour = std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none();
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(colour)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}

fn run_root(args: &RootArgs) -> ExitCode {
    serve("sluice root", RootConfig::load(args), |config| async {
        sluice::root::bind_and_run(config, shutdown_signal())
            .await
            .inspect_err(|error| tracing::error!(%error, "quota root failed"))
    })
}

/// Runs a server (`start`, given its configuration `loaded`) on a
/// multi-thread runtime until it ends. Exit code 2 for a bad
/// configuration or flag (nothing served), 1 for a runtime that does not
/// start or a server that fails.
fn serve<C, E: std::fmt::Display, F: std::future::Future<Output = Result<(), E>>>(
    program: &str,
    loaded: Result<C, impl std::fmt::Display>,
    start: impl FnOnce(C) -> F,
) -> ExitCode {
    let config = match loaded {
        Ok(config) => config,
        Err(error) => {
            eprintln!("{program}: {error}");
            return ExitCode::from(2);
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("{program}: cannot start the runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(start(config)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("{program}: {error}");
            ExitCode::FAILURE
        }
    }
}

/// Completes on SIGINT or SIGTERM.
async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let terminate = async {
        match signal(SignalKind::terminate()) {
            Ok(mut stream) => {
                stream.recv().await;
            }
            Err(error) => {
                tracing::warn!(%error, "cannot watch SIGTERM; only Ctrl-C stops the root");
                std::future::pending::<()>().await;
            }
        }
    };
    let interrupt = async {
        if let Err(error) = tokio::signal::ctrl_c().await {
            tracing::warn!(%error, "cannot watch SIGINT");
            std::future::pending::<()>().await;
        }
    };
    tokio::select! {
        _ = interrupt => tracing::info!("SIGINT received"),
        _ = terminate => tracing::info!("SIGTERM received"),
    }
}
