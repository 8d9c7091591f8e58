//! `sluice quota keys`, `key`, `hash`, `override` and `overrides`: the
//! keys of per-key quotas, hashed here (a key is never sent), and their
//! overrides.

use std::path::{Path, PathBuf};

use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

use sluice::core::key::{check_named_key, format_hash, parse_hash, KeySecret};
use sluice::core::tier::OverrideSpec;

use super::client::{CliError, Client};
use super::output::{number, text, Table};
use super::quota::{check_numbers, Change};
use super::{check_name, to_json};

/// `sluice quota keys`.
#[derive(Debug, clap::Args)]
pub(super) struct KeysArgs {
    /// The per-key quota's name.
    name: String,
    /// How many keys.
    #[arg(long, default_value_t = 20)]
    top: usize,
}

/// A key of a per-key quota, as `key` and `override` take it: the key
/// itself (hashed here, never sent) or its hash.
#[derive(Debug, clap::Args)]
pub(super) struct GivenKey {
    /// The key (a token, an address...), hashed locally.
    #[arg(long, conflicts_with = "hash", required_unless_present = "hash")]
    key: Option<String>,
    /// The file with the fleet's key secret (nginx's
    /// `sluice_key_secret_file`); without it, the built-in secret.
    #[arg(long, value_name = "FILE", requires = "key")]
    secret_file: Option<PathBuf>,
    /// The key's hash (16 hex digits) instead of the key, as logs and
    /// listings show it.
    #[arg(long)]
    hash: Option<String>,
}

impl GivenKey {
    /// The key was given and will be hashed with the built-in secret (no
    /// `--secret-file`).
    fn built_in(&self) -> bool {
        self.key.is_some() && self.secret_file.is_none()
    }

    /// The key's hash as the root knows it: the key hashed here with the
    /// secret in `--secret-file`, or the hash as given.
    fn hash(self) -> Result<String, CliError> {
        match (self.key, self.hash) {
            (Some(key), _) => hash_key(&key, self.secret_file.as_deref()),
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
}

/// `sluice quota key`.
#[derive(Debug, clap::Args)]
pub(super) struct KeyArgs {
    /// The per-key quota's name.
    name: String,
    #[command(flatten)]
    key: GivenKey,
}

/// `sluice quota hash`.
#[derive(Debug, clap::Args)]
pub(super) struct HashArgs {
    /// The key (a token, an address...).
    #[arg(long)]
    key: String,
    /// The file with the fleet's key secret (nginx's
    /// `sluice_key_secret_file`); without it, the built-in secret.
    #[arg(long, value_name = "FILE")]
    secret_file: Option<PathBuf>,
}

/// `sluice quota override`.
#[derive(Debug, clap::Args)]
pub(super) struct OverrideArgs {
    /// The per-key template's name.
    name: String,
    #[command(flatten)]
    key: GivenKey,
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
}

/// `sluice quota overrides`.
#[derive(Debug, clap::Args)]
pub(super) struct OverridesArgs {
    /// The per-key template's name.
    name: String,
    /// Start after this key hash.
    #[arg(long)]
    after: Option<String>,
    /// Overrides per page.
    #[arg(long, default_value_t = 1000)]
    limit: usize,
}

/// `sluice quota hash`: a key's hash, computed here; no root involved.
pub(super) fn hash(args: HashArgs, json: bool) -> Result<String, CliError> {
    let HashArgs { key, secret_file } = args;
    let hash = hash_key(&key, secret_file.as_deref())?;
    Ok(if json {
        to_json(&json!({ "key_hash": hash }))
    } else {
        format!("{hash}\n")
    })
}

/// `sluice quota keys`: the busiest keys of a per-key quota.
pub(super) async fn keys(client: &Client, args: KeysArgs, json: bool) -> Result<String, CliError> {
    let KeysArgs { name, top } = args;
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

/// `sluice quota key`: one key of a per-key quota.
pub(super) async fn key(client: &Client, args: KeyArgs, json: bool) -> Result<String, CliError> {
    let KeyArgs { name, key } = args;
    check_name(&name)?;
    // A key hashed with the built-in secret finds nothing in a
    // fleet that has its own: say which secret was used.
    let built_in = key.built_in();
    let hash = key.hash()?;
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

/// `sluice quota override`: sets or removes the override of one key.
pub(super) async fn set_override(
    client: &Client,
    args: OverrideArgs,
    json: bool,
) -> Result<String, CliError> {
    let OverrideArgs {
        name,
        key,
        limit,
        low_burst,
        high_burst,
        allow,
        deny,
        remove,
        expires,
        note,
    } = args;
    check_name(&name)?;
    let hash = key.hash()?;
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

/// `sluice quota overrides`: a per-key template's overrides and its keys'
/// penalties.
pub(super) async fn overrides(
    client: &Client,
    args: OverridesArgs,
    json: bool,
) -> Result<String, CliError> {
    let OverridesArgs { name, after, limit } = args;
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

/// `key` hashed here with the secret in `secret_file` (the built-in one
/// without), as the root and nginx name it; the key is never sent.
fn hash_key(key: &str, secret_file: Option<&Path>) -> Result<String, CliError> {
    check_named_key(key.as_bytes())
        .map_err(|why| CliError::new(format!("invalid --key: {why}")))?;
    Ok(format_hash(key_secret(secret_file)?.hash(key.as_bytes())))
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
