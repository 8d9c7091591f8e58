//! `sluice quota ...` and `sluice top`: the admin CLI, a thin client of the
//! root's admin API.
//!
//! Tables by default, the root's JSON with `--json`; on failure one line
//! `sluice: <reason>` on stderr and exit status 1.
//!
//! # Layout
//!
//! - `client.rs` — HTTP requests and error lines.
//! - `output.rs` — tables and number formatting.
//! - `quota.rs` — `list`, `get`, `set`, `delete`: quotas one at a time.
//! - `apply.rs` — `apply`: a quota file in one transaction.
//! - `keys.rs` — `keys`, `key`, `hash`, `override`, `overrides`: the keys
//!   of per-key quotas and their overrides.
//! - `top.rs` — `sluice top`: the root's overview in a terminal.

#![forbid(unsafe_code)]

mod apply;
mod client;
mod keys;
mod output;
mod quota;
pub mod top;

pub use top::TopArgs;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use serde_json::Value;

use sluice::core::quota::validate_name;
use sluice::root::config::parse_duration;

use client::{CliError, Client};

/// How to reach a root: the flags `sluice quota` and `sluice top` share.
#[derive(Debug, clap::Args)]
pub struct Connection {
    /// Base URL of the root.
    #[arg(
        long,
        env = "SLUICE_ROOT",
        default_value = "http://127.0.0.1:7070",
        global = true
    )]
    root: String,
    /// Admin token.
    #[arg(
        long,
        env = "SLUICE_ADMIN_TOKEN",
        hide_env_values = true,
        global = true
    )]
    token: Option<String>,
    /// File holding the admin token (used when --token is not given).
    #[arg(
        long,
        env = "SLUICE_ADMIN_TOKEN_FILE",
        value_name = "FILE",
        global = true
    )]
    token_file: Option<PathBuf>,
    /// Give up on the root after this long.
    #[arg(long, default_value = "30s", value_parser = parse_duration, global = true)]
    timeout: Duration,
}

impl Connection {
    /// A client of the root, with the token from --token (or its env
    /// var), else from --token-file.
    fn client(&self) -> Result<Client, CliError> {
        let token = match (&self.token, &self.token_file) {
            (Some(token), _) => Some(token.trim().to_string()),
            (None, Some(path)) => {
                let text = std::fs::read_to_string(path).map_err(|e| {
                    CliError::new(format!("cannot read token file {}: {e}", path.display()))
                })?;
                Some(text.trim().to_string())
            }
            (None, None) => None,
        };
        Client::new(&self.root, token, self.timeout)
    }
}

/// `sluice quota` and its shared flags.
#[derive(Debug, clap::Args)]
pub struct QuotaArgs {
    #[command(flatten)]
    connection: Connection,
    /// Print the root's JSON replies instead of tables.
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    command: QuotaCommand,
}

/// The quota commands.
#[derive(Debug, clap::Subcommand)]
enum QuotaCommand {
    /// List quotas in name order.
    List(quota::ListArgs),
    /// Show one quota with its live level, fill rate and recent limiters.
    Get(quota::NameArgs),
    /// Create a quota or change one: only the options given change (the
    /// root merges them into the quota as it is); a new quota needs
    /// --limit.
    Set(quota::SetArgs),
    /// Delete a quota (refused while it has children).
    Delete(quota::NameArgs),
    /// List the busiest keys of a per-key quota, by hash.
    Keys(keys::KeysArgs),
    /// Show one key of a per-key quota: give the key itself (hashed here
    /// with the fleet's secret, never sent) or its hash.
    Key(keys::KeyArgs),
    /// Print a key's hash (16 hex digits), as overrides, listings, logs
    /// and metrics name the key: hashed here, nothing is sent.
    Hash(keys::HashArgs),
    /// Override a per-key template for one key: other numbers, never
    /// limited (--allow), always rejected (--deny), or remove the
    /// override (--remove). The key is hashed here with the fleet's
    /// secret and never sent.
    Override(keys::OverrideArgs),
    /// List a per-key template's overrides and its keys' penalties.
    Overrides(keys::OverridesArgs),
    /// Apply a quota file (JSON; TOML when the name ends in .toml;
    /// envoyproxy/ratelimit's YAML for .yaml, .yml or a directory) in one
    /// transaction.
    Apply(apply::ApplyArgs),
}

/// Runs a quota command; prints the result or one error line.
pub fn run(args: QuotaArgs) -> ExitCode {
    let runtime = match runtime() {
        Ok(runtime) => runtime,
        Err(e) => return fail(&e),
    };
    match runtime.block_on(execute(args)) {
        Ok(output) => {
            print!("{output}");
            ExitCode::SUCCESS
        }
        Err(error) => fail(&error),
    }
}

/// The CLI's runtime: one thread, one request at a time.
fn runtime() -> Result<tokio::runtime::Runtime, CliError> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| CliError::new(format!("cannot start the runtime: {e}")))
}

fn fail(error: &CliError) -> ExitCode {
    eprintln!("sluice: {error}");
    ExitCode::FAILURE
}

/// Runs one quota command; what it prints, or why it failed.
async fn execute(args: QuotaArgs) -> Result<String, CliError> {
    let QuotaArgs {
        connection,
        json,
        command,
    } = args;
    let command = match command {
        // No root involved: no connection needed.
        QuotaCommand::Hash(hash) => return keys::hash(hash, json),
        command => command,
    };
    let client = connection.client()?;
    match command {
        QuotaCommand::Hash(_) => unreachable!("answered above"),
        QuotaCommand::List(list) => quota::list(&client, list, json).await,
        QuotaCommand::Get(get) => quota::get(&client, get, json).await,
        QuotaCommand::Set(set) => quota::set(&client, set, json).await,
        QuotaCommand::Delete(delete) => quota::delete(&client, delete, json).await,
        QuotaCommand::Apply(apply) => apply::apply(&client, apply, json).await,
        QuotaCommand::Keys(keys) => keys::keys(&client, keys, json).await,
        QuotaCommand::Key(key) => keys::key(&client, key, json).await,
        QuotaCommand::Override(o) => keys::set_override(&client, o, json).await,
        QuotaCommand::Overrides(o) => keys::overrides(&client, o, json).await,
    }
}

/// A reply as pretty JSON (`--json`).
fn to_json(value: &Value) -> String {
    let mut text = serde_json::to_string_pretty(value).unwrap_or_default();
    text.push('\n');
    text
}

/// Refuses a quota name the root would refuse, before it goes into a URL
/// (where `.` and `..` would be resolved away to another path).
fn check_name(name: &str) -> Result<(), CliError> {
    validate_name(name)
        .map_err(|e| CliError::new(format!("invalid quota name {name:?}: {}", e.message)))
}
