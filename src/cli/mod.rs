//! `sluice quota ...` and `sluice top`: the admin CLI, a thin client of the
//! root's admin API.
//!
//! Tables by default, the root's JSON with `--json`; on failure one line
//! `sluice: <reason>` on stderr and exit status 1.
//!
//! - `client.rs` — HTTP requests and error lines.
//! - `output.rs` — tables and number formatting.
//! - `top.rs` — `sluice top`: the root's overview in a terminal.

#![forbid(unsafe_code)]

mod client;
mod output;
pub mod top;

pub use top::TopArgs;

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use reqwest::header::IF_NONE_MATCH;
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

use sluice::core::key::{check_named_key, format_hash, parse_hash, KeySecret};
use sluice::core::quota::validate_name;
use sluice::core::spec::{specs_from_json, specs_from_toml, FileFormat, QuotaPatch};
use sluice::core::tier::{OverrideSpec, PenaltyTime};
use sluice::core::Window;
use sluice::root::config::parse_duration;

use client::{CliError, Client, Reply};
use output::{number, per_key, terms, text, window, Table};

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
    List {
        /// Only names starting with this.
        #[arg(long, default_value = "")]
        prefix: String,
        /// Start after this name.
        #[arg(long)]
        after: Option<String>,
        /// Quotas per page.
        #[arg(long, default_value_t = 100)]
        limit: usize,
        /// Fetch every page, not just the first.
        #[arg(long)]
        all: bool,
    },
    /// Show one quota with its live level, fill rate and recent limiters.
    Get {
        /// Quota name.
        name: String,
    },
    /// Create a quota or change one: only the options given change (the
    /// root merges them into the quota as it is); a new quota needs
    /// --limit.
    Set {
        /// Quota name.
        name: String,
        /// Leak rate, units per second.
        #[arg(long, allow_negative_numbers = true)]
        limit: Option<f64>,
        /// Level up to which everything passes [new quota: the limit].
        #[arg(long, allow_negative_numbers = true)]
        low_burst: Option<f64>,
        /// Level from which everything is rejected [new quota: low burst].
        #[arg(long, allow_negative_numbers = true)]
        high_burst: Option<f64>,
        /// Parent quota's name.
        #[arg(long, conflicts_with = "no_parent")]
        parent: Option<String>,
        /// Make the quota top-level.
        #[arg(long)]
        no_parent: bool,
        /// Make the quota a per-key template: every key (`key=` in nginx,
        /// `sluice_check_key` in the C ABI) gets a counter of its own.
        #[arg(long, conflicts_with = "shared")]
        per_key: bool,
        /// Make a per-key template a plain quota again.
        #[arg(long)]
        shared: bool,
        /// Count `--limit` units per UTC-aligned window instead of leaking:
        /// 1s, 10s, 1m, 1h, 1d, 7d or month; `none` makes the quota a leaky
        /// bucket again.
        #[arg(long, value_parser = parse_window_flag)]
        window: Option<WindowFlag>,
        /// A sliding window: the previous window counts too, weighted by
        /// what is left of it.
        #[arg(long, conflicts_with = "fixed")]
        sliding: bool,
        /// A fixed window again (not sliding).
        #[arg(long)]
        fixed: bool,
        /// Bar the quota (a per-key template: the key) for this long once
        /// a request is rejected at its high burst: 90s, 15m, 1h, 1d (at
        /// most 30d); `none` takes the penalty away.
        #[arg(long, value_parser = parse_penalty_flag)]
        penalty: Option<PenaltyFlag>,
        /// An in-flight quota: at most `--limit` requests at once, each
        /// holding a slot until it ends (nginx's limit_conn, fleet-wide);
        /// its bursts go back to the limit unless given.
        #[arg(long, conflicts_with = "counting")]
        in_flight: bool,
        /// An in-flight quota counts units again (a leaky bucket, or
        /// with `--window` a window quota).
        #[arg(long)]
        counting: bool,
    },
    /// Delete a quota (refused while it has children).
    Delete {
        /// Quota name.
        name: String,
    },
    /// List the busiest keys of a per-key quota, by hash.
    Keys {
        /// The per-key quota's name.
        name: String,
        /// How many keys.
        #[arg(long, default_value_t = 20)]
        top: usize,
    },
    /// Show one key of a per-key quota: give the key itself (hashed here
    /// with the fleet's secret, never sent) or its hash.
    Key {
        /// The per-key quota's name.
        name: String,
        /// The key (a token, an address...), hashed locally.
        #[arg(long, conflicts_with = "hash", required_unless_present = "hash")]
        key: Option<String>,
        /// The file with the fleet's key secret (nginx's
        /// `sluice_key_secret_file`); without it, the built-in secret.
        #[arg(long, value_name = "FILE", requires = "key")]
        secret_file: Option<PathBuf>,
        /// The key's hash (16 hex digits), as logs and listings show it.
        #[arg(long)]
        hash: Option<String>,
    },
    /// Print a key's hash (16 hex digits), as overrides, listings, logs
    /// and metrics name the key: hashed here, nothing is sent.
    Hash {
        /// The key (a token, an address...).
        #[arg(long)]
        key: String,
        /// The file with the fleet's key secret (nginx's
        /// `sluice_key_secret_file`); without it, the built-in secret.
        #[arg(long, value_name = "FILE")]
        secret_file: Option<PathBuf>,
    },
    /// Override a per-key template for one key: other numbers, never
    /// limited (--allow), always rejected (--deny), or remove the
    /// override (--remove). The key is hashed here with the fleet's
    /// secret and never sent.
    Override {
        /// The per-key template's name.
        name: String,
        /// The key (a token, an address...), hashed locally.
        #[arg(long, conflicts_with = "hash", required_unless_present = "hash")]
        key: Option<String>,
        /// The file with the fleet's key secret (nginx's
        /// `sluice_key_secret_file`); without it, the built-in secret.
        #[arg(long, value_name = "FILE", requires = "key")]
        secret_file: Option<PathBuf>,
        /// The key's hash (16 hex digits) instead of the key.
        #[arg(long)]
        hash: Option<String>,
        /// Leak rate (or units per window) for this key.
        #[arg(long, allow_negative_numbers = true, group = "rule")]
        limit: Option<f64>,
        /// Its low burst [default: the limit].
        #[arg(long, allow_negative_numbers = true, requires = "limit")]
        low_burst: Option<f64>,
        /// Its high burst [default: the low burst].
        #[arg(long, allow_negative_numbers = true, requires = "limit")]
        high_burst: Option<f64>,
        /// Never limited by the template (still counted).
        #[arg(long, group = "rule")]
        allow: bool,
        /// Always rejected.
        #[arg(long, group = "rule")]
        deny: bool,
        /// Remove the key's override.
        #[arg(long, group = "rule", conflicts_with_all = ["expires", "note"])]
        remove: bool,
        /// When it stops applying: a duration from now (24h, 7d) or an
        /// RFC 3339 time (2026-12-31T00:00:00Z).
        #[arg(long)]
        expires: Option<String>,
        /// A note for operators (who asked, a ticket).
        #[arg(long)]
        note: Option<String>,
    },
    /// List a per-key template's overrides and its keys' penalties.
    Overrides {
        /// The per-key template's name.
        name: String,
        /// Start after this key hash.
        #[arg(long)]
        after: Option<String>,
        /// Overrides per page.
        #[arg(long, default_value_t = 1000)]
        limit: usize,
    },
    /// Apply a quota file (JSON; TOML when the name ends in .toml; YAML is
    /// refused) in one transaction.
    Apply {
        /// The quota file: {"quotas": [...]} or a bare array.
        #[arg(short = 'f', long = "file", value_name = "FILE")]
        file: PathBuf,
        /// Show what would change, change nothing.
        #[arg(long)]
        dry_run: bool,
        /// Also delete quotas missing from the file.
        #[arg(long)]
        prune: bool,
    },
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

async fn execute(args: QuotaArgs) -> Result<String, CliError> {
    if let QuotaCommand::Hash { key, secret_file } = &args.command {
        // No root involved: no connection needed.
        let hash = hash_key(key, secret_file.as_deref())?;
        return Ok(if args.json {
            to_json(&json!({ "key_hash": hash }))
        } else {
            format!("{hash}\n")
        });
    }
    let client = args.connection.client()?;
    let json = args.json;
    match args.command {
        QuotaCommand::Hash { .. } => unreachable!("answered above"),
        QuotaCommand::List {
            prefix,
            after,
            limit,
            all,
        } => list(&client, &prefix, after, limit, all, json).await,
        QuotaCommand::Get { name } => {
            check_name(&name)?;
            let reply = client
                .send(Method::GET, client.url("v1/quotas", &[&name], &[])?, None)
                .await?;
            Ok(if json {
                to_json(&reply.body)
            } else {
                show_quota(&reply.body)
            })
        }
        QuotaCommand::Set {
            name,
            limit,
            low_burst,
            high_burst,
            parent,
            no_parent,
            per_key,
            shared,
            window,
            sliding,
            fixed,
            penalty,
            in_flight,
            counting,
        } => {
            let parent = if no_parent {
                Some(None)
            } else {
                parent.map(Some)
            };
            let change = Change {
                limit,
                low_burst,
                high_burst,
                parent,
                per_key: (per_key || shared).then_some(per_key),
                window: window.map(|w| w.0),
                sliding: (sliding || fixed).then_some(sliding),
                penalty: penalty.map(|p| p.0),
                in_flight: (in_flight || counting).then_some(in_flight),
            };
            check_name(&name)?;
            check_numbers(&change)?;
            set(&client, &name, &change.into_patch(), json).await
        }
        QuotaCommand::Delete { name } => {
            check_name(&name)?;
            let url = client.url("v1/quotas", &[&name], &[])?;
            let reply = client.send(Method::DELETE, url, None).await?;
            Ok(if json {
                to_json(&reply.body)
            } else {
                format!("deleted {name} (epoch {})\n", number(&reply.body["epoch"]))
            })
        }
        QuotaCommand::Apply {
            file,
            dry_run,
            prune,
        } => apply(&client, &file, dry_run, prune, json).await,
        QuotaCommand::Keys { name, top } => {
            check_name(&name)?;
            let top = top.to_string();
            let url = client.url("v1/quotas", &[&name, "keys"], &[("top", Some(&top))])?;
            let reply = client.send(Method::GET, url, None).await?;
            Ok(if json {
                to_json(&reply.body)
            } else {
                show_keys(&reply.body)
            })
        }
        QuotaCommand::Override {
            name,
            key,
            secret_file,
            hash,
            limit,
            low_burst,
            high_burst,
            allow,
            deny,
            remove,
            expires,
            note,
        } => {
            check_name(&name)?;
            let hash = key_hash(key, secret_file.as_deref(), hash)?;
            let url = client.url("v1/quotas", &[&name, "overrides", &hash], &[])?;
            if remove {
                let reply = client.send(Method::DELETE, url, None).await?;
                return Ok(if json {
                    to_json(&reply.body)
                } else {
                    format!(
                        "removed the override of {hash} on {name} (epoch {})\n",
                        number(&reply.body["epoch"])
                    )
                });
            }
            let change = Change {
                limit,
                low_burst,
                high_burst,
                ..Change::none()
            };
            check_numbers(&change)?;
            if !(allow || deny || limit.is_some()) {
                return Err(CliError::new("give --limit N, --allow, --deny or --remove"));
            }
            let spec = OverrideSpec {
                limit,
                low_burst,
                high_burst,
                allow,
                deny,
                note,
                expires,
                key_hash: None,
            };
            let body = serde_json::to_vec(&spec).map_err(CliError::new)?;
            let reply = client.send(Method::PUT, url, Some(body)).await?;
            Ok(if json {
                to_json(&reply.body)
            } else {
                let verb = match (reply.status, reply.body["changed"].as_bool()) {
                    (StatusCode::CREATED, _) => "created",
                    (_, Some(false)) => "unchanged",
                    _ => "updated",
                };
                format!(
                    "{verb} the override of {hash} on {name}: {} (epoch {})\n",
                    describe_override(&reply.body["override"]),
                    number(&reply.body["override"]["epoch"])
                )
            })
        }
        QuotaCommand::Overrides { name, after, limit } => {
            check_name(&name)?;
            let limit = limit.to_string();
            let query = [("after", after.as_deref()), ("limit", Some(limit.as_str()))];
            let url = client.url("v1/quotas", &[&name, "overrides"], &query)?;
            let reply = client.send(Method::GET, url, None).await?;
            Ok(if json {
                to_json(&reply.body)
            } else {
                show_overrides(&reply.body)
            })
        }
        QuotaCommand::Key {
            name,
            key,
            secret_file,
            hash,
        } => {
            check_name(&name)?;
            // A key hashed with the built-in secret finds nothing in a
            // fleet that has its own: say which secret was used.
            let built_in = key.is_some() && secret_file.is_none();
            let hash = key_hash(key, secret_file.as_deref(), hash)?;
            let url = client.url("v1/quotas", &[&name, "keys", &hash], &[])?;
            let reply = client.send(Method::GET, url, None).await.map_err(|mut e| {
                if built_in && e.status == Some(StatusCode::NOT_FOUND) {
                    e.message.push_str(&format!(
                        " (the key was hashed with the built-in secret, to {hash}: if the \
                             fleet's nginx has sluice_key_secret_file, pass that file with \
                             --secret-file)"
                    ));
                }
                e
            })?;
            if built_in {
                eprintln!(
                    "sluice: note: the key was hashed with the built-in secret (no \
                     --secret-file), as a fleet without sluice_key_secret_file hashes it"
                );
            }
            Ok(if json {
                to_json(&reply.body)
            } else {
                let mut table = Table::new(&["KEY", "LEVEL", "FILL_RATE"]);
                table.row(vec![
                    text(&reply.body["key"]),
                    number(&reply.body["level"]),
                    number(&reply.body["fill_rate"]),
                ]);
                table.render()
            })
        }
    }
}

/// `key` hashed here with the secret in `secret_file` (the built-in one
/// without), as the root and nginx name it; the key is never sent.
fn hash_key(key: &str, secret_file: Option<&Path>) -> Result<String, CliError> {
    check_named_key(key.as_bytes())
        .map_err(|why| CliError::new(format!("invalid --key: {why}")))?;
    Ok(format_hash(key_secret(secret_file)?.hash(key.as_bytes())))
}

/// A key's hash as the root knows it: the key hashed here with the
/// secret in `secret_file` (never sent), or a hash as given.
fn key_hash(
    key: Option<String>,
    secret_file: Option<&Path>,
    hash: Option<String>,
) -> Result<String, CliError> {
    match (key, hash) {
        (Some(key), _) => hash_key(&key, secret_file),
        (None, Some(hash)) => {
            parse_hash(&hash).ok_or_else(|| {
                CliError::new(format!(
                    "invalid --hash {hash:?}: a key's hash is 16 hex digits, as listings \
                     show it"
                ))
            })?;
            Ok(hash)
        }
        (None, None) => Err(CliError::new("give --key or --hash")),
    }
}

/// What an override does, in a few words, with its expiry.
fn describe_override(o: &Value) -> String {
    let what = describe_rule(o);
    match o["expires"].as_str() {
        Some(at) => format!("{what}, until {at}"),
        None => what,
    }
}

/// An override's rule: `allow`, `deny` or its numbers.
fn describe_rule(o: &Value) -> String {
    match o["kind"].as_str() {
        Some("allow") => "allow".to_string(),
        Some("deny") => "deny".to_string(),
        _ => format!(
            "limit {} (bursts {}..{})",
            number(&o["limit"]),
            number(&o["low_burst"]),
            number(&o["high_burst"])
        ),
    }
}

fn show_overrides(reply: &Value) -> String {
    let mut table = Table::new(&["KEY", "RULE", "EXPIRES", "EPOCH", "NOTE"]);
    let list = |key: &str| -> Vec<Value> { reply[key].as_array().cloned().unwrap_or_default() };
    for o in list("overrides") {
        table.row(vec![
            text(&o["key_hash"]),
            describe_rule(&o),
            text(&o["expires"]),
            number(&o["epoch"]),
            text(&o["note"]),
        ]);
    }
    let mut out = table.render();
    out.push_str(&format!(
        "({} overrides of {})\n",
        number(&reply["count"]),
        text(&reply["quota"])
    ));
    if let Some(next) = reply["next"].as_str() {
        out.push_str(&format!("(more: --after {next})\n"));
    }
    let penalties = list("penalties");
    if !penalties.is_empty() {
        let mut table = Table::new(&["PENALIZED KEY", "UNTIL", "SECONDS LEFT"]);
        for p in &penalties {
            table.row(vec![
                text(&p["key_hash"]),
                text(&p["until"]),
                number(&p["seconds_left"]),
            ]);
        }
        out.push('\n');
        out.push_str(&table.render());
    }
    out
}

/// The fleet's key secret from `path`, or the built-in one.
fn key_secret(path: Option<&Path>) -> Result<KeySecret, CliError> {
    let Some(path) = path else {
        return Ok(KeySecret::built_in());
    };
    let contents = std::fs::read(path)
        .map_err(|e| CliError::new(format!("cannot read {}: {e}", path.display())))?;
    KeySecret::from_file_contents(&contents)
        .map_err(|why| CliError::new(format!("secret file {} {why}", path.display())))
}

fn show_keys(reply: &Value) -> String {
    let mut table = Table::new(&["KEY", "LEVEL", "FILL_RATE"]);
    for k in reply["keys"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default()
    {
        table.row(vec![
            text(&k["key"]),
            number(&k["level"]),
            number(&k["fill_rate"]),
        ]);
    }
    let mut out = table.render();
    out.push_str(&format!(
        "({} keys of {} held at this root)\n",
        number(&reply["keys_held"]),
        text(&reply["quota"])
    ));
    out
}

fn to_json(value: &Value) -> String {
    let mut text = serde_json::to_string_pretty(value).unwrap_or_default();
    text.push('\n');
    text
}

async fn list(
    client: &Client,
    prefix: &str,
    mut after: Option<String>,
    limit: usize,
    all: bool,
    json: bool,
) -> Result<String, CliError> {
    let limit = limit.to_string();
    let mut quotas: Vec<Value> = Vec::new();
    let next = loop {
        let query = [
            ("prefix", Some(prefix)),
            ("after", after.as_deref()),
            ("limit", Some(limit.as_str())),
        ];
        let reply = client
            .send(Method::GET, client.url("v1/quotas", &[], &query)?, None)
            .await?;
        if let Some(page) = reply.body["quotas"].as_array() {
            quotas.extend(page.iter().cloned());
        }
        let next = reply.body["next"].as_str().map(str::to_string);
        match next {
            Some(name) if all => after = Some(name),
            other => break other,
        }
    };
    if json {
        return Ok(to_json(&json!({ "quotas": quotas, "next": next })));
    }
    let mut table = Table::new(&[
        "NAME", "PARENT", "LIMIT", "WINDOW", "PER KEY", "LOW", "HIGH", "LEVEL", "EPOCH",
    ]);
    for q in &quotas {
        table.row(vec![
            text(&q["name"]),
            text(&q["parent"]),
            terms(q),
            window(q),
            per_key(q),
            number(&q["low_burst"]),
            number(&q["high_burst"]),
            number(&q["level"]),
            number(&q["epoch"]),
        ]);
    }
    let mut out = table.render();
    if let Some(next) = next {
        out.push_str(&format!("(more: --after {next}, or --all)\n"));
    }
    Ok(out)
}

fn show_quota(q: &Value) -> String {
    let mut table = Table::new(&["FIELD", "VALUE"]);
    let fields = [
        ("name", text(&q["name"])),
        ("id", number(&q["id"])),
        ("parent", text(&q["parent"])),
        ("limit", terms(q)),
        ("low_burst", number(&q["low_burst"])),
        ("high_burst", number(&q["high_burst"])),
        (
            "per_key",
            q["per_key"].as_bool().unwrap_or(false).to_string(),
        ),
        ("window", window(q)),
        ("epoch", number(&q["epoch"])),
        ("level", number(&q["level"])),
        ("fill_rate", number(&q["fill_rate"])),
    ];
    for (field, value) in fields {
        table.row(vec![field.to_string(), value]);
    }
    let mut out = table.render();
    let limiters = q["limiters"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default();
    if !limiters.is_empty() {
        let mut seen = Table::new(&["LIMITER", "SECONDS AGO"]);
        for l in limiters {
            seen.row(vec![text(&l["limiter"]), number(&l["seconds_ago"])]);
        }
        out.push('\n');
        out.push_str(&seen.render());
    }
    out
}

/// What `set` changes, from its flags; `None` keeps the current value.
#[derive(Debug)]
struct Change {
    limit: Option<f64>,
    low_burst: Option<f64>,
    high_burst: Option<f64>,
    /// `Some(None)` makes the quota top-level.
    parent: Option<Option<String>>,
    /// `Some(true)` makes it a per-key template, `Some(false)` a plain
    /// quota.
    per_key: Option<bool>,
    /// `Some(Some(w))` makes it a window quota, `Some(None)` a leaky one.
    window: Option<Option<Window>>,
    /// `Some(true)` makes the window sliding, `Some(false)` fixed.
    sliding: Option<bool>,
    /// `Some(Some(p))` sets a penalty, `Some(None)` takes it away.
    penalty: Option<Option<PenaltyTime>>,
    /// `Some(true)` makes it an in-flight quota, `Some(false)` a counting
    /// one.
    in_flight: Option<bool>,
}

/// `--penalty`: a duration, or `none`.
#[derive(Clone, Copy, Debug)]
struct PenaltyFlag(Option<PenaltyTime>);

fn parse_penalty_flag(text: &str) -> Result<PenaltyFlag, String> {
    if text == "none" {
        return Ok(PenaltyFlag(None));
    }
    PenaltyTime::parse(text)
        .map(|p| PenaltyFlag(Some(p)))
        .map_err(|e| e.message)
}

/// `--window`: a window, or `none`.
#[derive(Clone, Copy, Debug)]
struct WindowFlag(Option<Window>);

fn parse_window_flag(text: &str) -> Result<WindowFlag, String> {
    if text == "none" {
        return Ok(WindowFlag(None));
    }
    Window::parse(text)
        .map(|w| WindowFlag(Some(w)))
        .ok_or_else(|| {
            let names: Vec<&str> = Window::ALL.iter().map(|w| w.name()).collect();
            format!("must be one of {} or none", names.join(", "))
        })
}

impl Change {
    /// No change at all.
    fn none() -> Self {
        Self {
            limit: None,
            low_burst: None,
            high_burst: None,
            parent: None,
            per_key: None,
            window: None,
            sliding: None,
            penalty: None,
            in_flight: None,
        }
    }

    /// The patch the root merges. `--window none` alone also makes the
    /// window fixed: a leaky bucket has nothing to slide. `--in-flight`
    /// without bursts puts them back to their default, the limit (an
    /// in-flight quota's only bursts).
    fn into_patch(self) -> QuotaPatch {
        let sliding = match (self.window, self.sliding) {
            (Some(None), None) => Some(false),
            (_, sliding) => sliding,
        };
        let burst = |given: Option<f64>| match (given, self.in_flight) {
            (None, Some(true)) => Some(None),
            (given, _) => given.map(Some),
        };
        QuotaPatch {
            name: None,
            parent: self.parent,
            limit: self.limit,
            low_burst: burst(self.low_burst),
            high_burst: burst(self.high_burst),
            per_key: self.per_key,
            window: self.window,
            sliding,
            penalty: self.penalty,
            in_flight: self.in_flight,
        }
    }
}

/// Changes the quota `name` with a PATCH (the root keeps what `patch`
/// leaves out, as the quota is when it writes); creates it with a PUT
/// when it does not exist, refused if it appeared meanwhile (then
/// patched).
async fn set(
    client: &Client,
    name: &str,
    patch: &QuotaPatch,
    json: bool,
) -> Result<String, CliError> {
    let url = client.url("v1/quotas", &[name], &[])?;
    let body = serde_json::to_vec(patch).map_err(CliError::new)?;
    let mut reply = client
        .send(Method::PATCH, url.clone(), Some(body.clone()))
        .await;
    if reply
        .as_ref()
        .is_err_and(|e| e.status == Some(StatusCode::NOT_FOUND))
    {
        if patch.limit.is_none() {
            return Err(CliError::new(format!(
                "quota {name:?} does not exist yet: --limit is required to create it"
            )));
        }
        let create_only = [(IF_NONE_MATCH, "*")];
        reply = client
            .send_with(Method::PUT, url.clone(), Some(body.clone()), &create_only)
            .await;
        if reply
            .as_ref()
            .is_err_and(|e| e.status == Some(StatusCode::PRECONDITION_FAILED))
        {
            reply = client.send(Method::PATCH, url, Some(body)).await;
        }
    }
    let Reply { status, body } = reply?;
    if json {
        return Ok(to_json(&body));
    }
    let verb = match (status, body["changed"].as_bool()) {
        (StatusCode::CREATED, _) => "created",
        (_, Some(false)) => "unchanged",
        _ => "updated",
    };
    Ok(format!(
        "{verb} {name} (epoch {})\n",
        number(&body["epoch"])
    ))
}

async fn apply(
    client: &Client,
    file: &Path,
    dry_run: bool,
    prune: bool,
    json: bool,
) -> Result<String, CliError> {
    let payload = read_quota_file(file)?;
    let flag = |on: bool| Some(if on { "true" } else { "false" });
    let url = client.url(
        "v1/apply",
        &[],
        &[("dry_run", flag(dry_run)), ("prune", flag(prune))],
    )?;
    let reply = client.send(Method::POST, url, Some(payload)).await?;
    Ok(if json {
        to_json(&reply.body)
    } else {
        show_diff(&reply.body)
    })
}

/// The quota file as JSON bytes (TOML files converted), checked for shape
/// here so that an error names this file, the quota, the field and the
/// line (the root checks the values).
fn read_quota_file(file: &Path) -> Result<Vec<u8>, CliError> {
    let format = FileFormat::for_path(file, true).map_err(CliError::new)?;
    let text = std::fs::read_to_string(file)
        .map_err(|e| CliError::new(format!("cannot read {}: {e}", file.display())))?;
    let in_file = |e: &dyn std::fmt::Display| CliError::new(format!("{}: {e}", file.display()));
    if format == FileFormat::Toml {
        let specs = specs_from_toml(&text).map_err(|e| in_file(&e))?;
        return serde_json::to_vec(&json!({ "quotas": specs })).map_err(CliError::new);
    }
    specs_from_json(&text).map_err(|e| in_file(&e))?;
    Ok(text.into_bytes())
}

/// Refuses what the root could only misread: a non-finite number (JSON
/// has none; `inf` would become `null`, "use the default") or a negative
/// one, as the flag that carried it.
fn check_numbers(change: &Change) -> Result<(), CliError> {
    let flags = [
        ("--limit", change.limit),
        ("--low-burst", change.low_burst),
        ("--high-burst", change.high_burst),
    ];
    for (flag, value) in flags {
        if let Some(v) = value.filter(|v| !v.is_finite() || *v < 0.0) {
            return Err(CliError::new(format!(
                "{flag} {v}: must be a finite number, zero or more"
            )));
        }
    }
    Ok(())
}

/// Refuses a quota name the root would refuse, before it goes into a URL
/// (where `.` and `..` would be resolved away to another path).
fn check_name(name: &str) -> Result<(), CliError> {
    validate_name(name)
        .map_err(|e| CliError::new(format!("invalid quota name {name:?}: {}", e.message)))
}

fn show_diff(reply: &Value) -> String {
    let counts = &reply["counts"];
    let dry = reply["dry_run"].as_bool().unwrap_or(false);
    let mut out = String::new();
    let names = |key: &str| -> Vec<String> {
        reply[key]
            .as_array()
            .map(|a| a.iter().map(text).collect())
            .unwrap_or_default()
    };
    for name in names("created") {
        out.push_str(&format!("+ {name}\n"));
    }
    for update in reply["updated"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default()
    {
        let changes: Vec<String> = update["changes"]
            .as_array()
            .map(Vec::as_slice)
            .unwrap_or_default()
            .iter()
            .map(|c| {
                format!(
                    "{} {} -> {}",
                    text(&c["field"]),
                    shown(&c["from"]),
                    shown(&c["to"])
                )
            })
            .collect();
        out.push_str(&format!(
            "~ {}: {}\n",
            text(&update["name"]),
            changes.join(", ")
        ));
    }
    for name in names("deleted") {
        out.push_str(&format!("- {name}\n"));
    }
    if reply["truncated"].as_bool() == Some(true) {
        out.push_str("(lists cut short; see --json for the counts)\n");
    }
    let summary = format!(
        "{} created, {} updated, {} deleted, {} unchanged",
        number(&counts["created"]),
        number(&counts["updated"]),
        number(&counts["deleted"]),
        number(&counts["unchanged"])
    );
    let line = match (dry, reply["epoch"].as_u64()) {
        (true, _) => format!("dry run: would have {summary}\n"),
        (false, Some(epoch)) => format!("applied at epoch {epoch}: {summary}\n"),
        (false, None) => format!("nothing to change: {summary}\n"),
    };
    out.push_str(&line);
    out
}

fn shown(value: &Value) -> String {
    match value {
        Value::Number(_) => number(value),
        Value::String(s) => s.clone(),
        _ => "none".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn change() -> Change {
        Change::none()
    }

    #[test]
    fn in_flight_puts_the_bursts_back_to_the_limit_unless_given() {
        let body = serde_json::to_value(
            Change {
                limit: Some(100.0),
                in_flight: Some(true),
                ..change()
            }
            .into_patch(),
        )
        .unwrap();
        assert_eq!(
            body,
            json!({"limit": 100.0, "in_flight": true, "low_burst": null, "high_burst": null})
        );
        let patch = Change {
            in_flight: Some(false),
            ..change()
        }
        .into_patch();
        assert_eq!((patch.in_flight, patch.low_burst), (Some(false), None));
    }

    #[test]
    fn set_sends_only_the_flags_given() {
        let body = serde_json::to_value(
            Change {
                limit: Some(5.0),
                ..change()
            }
            .into_patch(),
        )
        .unwrap();
        assert_eq!(body, json!({"limit": 5.0}));
        let body = serde_json::to_value(
            Change {
                parent: Some(None),
                per_key: Some(false),
                window: Some(Some(Window::Day)),
                sliding: Some(true),
                high_burst: Some(2.0),
                ..change()
            }
            .into_patch(),
        )
        .unwrap();
        assert_eq!(
            body,
            json!({"parent": null, "per_key": false, "window": "1d", "sliding": true,
                   "high_burst": 2.0})
        );
    }

    #[test]
    fn a_window_set_to_none_is_fixed_too() {
        let patch = Change {
            window: Some(None),
            ..change()
        }
        .into_patch();
        assert_eq!((patch.window, patch.sliding), (Some(None), Some(false)));
        let patch = Change {
            window: Some(None),
            sliding: Some(true),
            ..change()
        }
        .into_patch();
        assert_eq!(patch.sliding, Some(true), "the root says why not");
        assert!(parse_window_flag("month").is_ok() && parse_window_flag("none").is_ok());
        assert!(parse_window_flag("2m").unwrap_err().contains("1s, 10s, 1m"));
    }

    #[test]
    fn a_penalty_is_a_duration_or_none() {
        let patch = Change {
            penalty: Some(parse_penalty_flag("15m").unwrap().0),
            ..change()
        }
        .into_patch();
        assert_eq!(
            serde_json::to_value(&patch).unwrap(),
            json!({"penalty": "15m"})
        );
        let patch = Change {
            penalty: Some(parse_penalty_flag("none").unwrap().0),
            ..change()
        }
        .into_patch();
        assert_eq!(
            serde_json::to_value(&patch).unwrap(),
            json!({"penalty": null})
        );
        assert!(parse_penalty_flag("31d").is_err());
    }

    #[test]
    fn non_finite_and_negative_numbers_are_refused_by_flag() {
        let change = |high_burst| Change {
            limit: Some(1.0),
            low_burst: None,
            high_burst: Some(high_burst),
            parent: None,
            per_key: None,
            window: None,
            sliding: None,
            penalty: None,
            in_flight: None,
        };
        assert!(check_numbers(&change(2.0)).is_ok());
        assert!(check_numbers(&change(0.0)).is_ok());
        for bad in [f64::INFINITY, f64::NEG_INFINITY, f64::NAN, -1.0] {
            let error = check_numbers(&change(bad)).unwrap_err();
            assert!(
                error.message.starts_with("--high-burst "),
                "{}",
                error.message
            );
        }
    }

    #[test]
    fn diffs_read_as_plus_tilde_minus() {
        let reply = json!({
            "dry_run": true, "epoch": null,
            "counts": {"created": 1, "updated": 1, "deleted": 1, "unchanged": 2},
            "created": ["a"], "deleted": ["c"], "truncated": false,
            "updated": [{"name": "b", "changes": [{"field": "limit", "from": 1.0, "to": 2.0}]}],
        });
        assert_eq!(
            show_diff(&reply),
            "+ a\n~ b: limit 1 -> 2\n- c\ndry run: would have 1 created, 1 updated, 1 deleted, 2 unchanged\n"
        );
    }
}
