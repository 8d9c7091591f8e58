//! `sluice quota apply`: a quota file in one transaction.

use std::path::{Path, PathBuf};

use reqwest::Method;
use serde_json::{json, Value};

use sluice::core::spec::{specs_from_json, specs_from_toml, FileFormat};

use super::client::{CliError, Client};
use super::output::{number, text};
use super::to_json;

/// `sluice quota apply`.
#[derive(Debug, clap::Args)]
pub(super) struct ApplyArgs {
    /// The quota file: {"quotas": [...]} or a bare array; or
    /// envoyproxy/ratelimit's YAML (a .yaml/.yml file or a directory of
    /// them), each limit as the quota `sluice rls` counts it in.
    #[arg(short = 'f', long = "file", value_name = "FILE")]
    file: PathBuf,
    /// Show what would change, change nothing.
    #[arg(long)]
    dry_run: bool,
    /// Also delete quotas missing from the file.
    #[arg(long)]
    prune: bool,
}

/// `sluice quota apply`: sends the file's quotas; prints what changed
/// (or would, with `--dry-run`).
pub(super) async fn apply(
    client: &Client,
    args: ApplyArgs,
    json: bool,
) -> Result<String, CliError> {
    let ApplyArgs {
        file,
        dry_run,
        prune,
    } = args;
    let payload = read_quota_file(&file)?;
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
    #[cfg(feature = "rls")]
    if let Some(specs) = sluice::rls::config::specs_of_path(file) {
        let specs = specs.map_err(CliError::new)?;
        return serde_json::to_vec(&json!({ "quotas": specs })).map_err(CliError::new);
    }
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
