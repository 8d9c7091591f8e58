//! `sluice top`: the root's overview (`GET /v1/overview`, the same data as
//! the web console) in a terminal, refreshing: the busiest quotas with
//! their levels, fill rates and rejections, the busiest keys of per-key
//! quotas (by hash), their tiers (overrides, penalties) and the
//! penalties in force, fleet rates, the limiters that synced last with
//! their clock offsets, the database.
//!
//! On a terminal each refresh redraws the screen (the alternate screen,
//! left on Ctrl-C); piped, frames follow each other. `--once` prints one
//! frame and exits (status 1 with one line if the root cannot be read);
//! `--json` prints the root's JSON instead, one object per refresh.

use std::io::{IsTerminal, Write};
use std::process::ExitCode;
use std::time::Duration;

use reqwest::Method;
use serde_json::Value;
use tokio::signal::unix::{signal, SignalKind};

use sluice::root::config::parse_duration;

use super::client::{CliError, Client};
use super::output::{number, terms, text, Table};
use super::{fail, runtime, Connection};

/// Shortest refresh interval (the root samples once a second anyway).
const MIN_INTERVAL: Duration = Duration::from_millis(250);
/// Longest refresh interval.
const MAX_INTERVAL: Duration = Duration::from_secs(3600);

/// Enter the alternate screen and hide the cursor.
const SCREEN_ENTER: &str = "\x1b[?1049h\x1b[?25l";
/// Show the cursor and leave the alternate screen.
const SCREEN_LEAVE: &str = "\x1b[?25h\x1b[?1049l";
/// Cursor home, clear the screen.
const SCREEN_CLEAR: &str = "\x1b[H\x1b[2J";

/// `sluice top`.
#[derive(Debug, clap::Args)]
pub struct TopArgs {
    #[command(flatten)]
    connection: Connection,
    /// Time between refreshes (0.25s to 1h).
    #[arg(long, default_value = "2s", value_parser = parse_duration)]
    interval: Duration,
    /// Busiest quotas shown (1 to 100).
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u16).range(1..=100))]
    top: u16,
    /// Print one frame and exit.
    #[arg(long)]
    once: bool,
    /// Print the root's JSON (one object per line when refreshing).
    #[arg(long)]
    json: bool,
}

/// Runs `sluice top` until Ctrl-C (or once).
pub fn run(args: TopArgs) -> ExitCode {
    if !(MIN_INTERVAL..=MAX_INTERVAL).contains(&args.interval) {
        return fail(&CliError::new("--interval must be between 250ms and 1h"));
    }
    let runtime = match runtime() {
        Ok(runtime) => runtime,
        Err(e) => return fail(&e),
    };
    let client = match args.connection.client() {
        Ok(client) => client,
        Err(e) => return fail(&e),
    };
    runtime.block_on(async {
        if args.once {
            return match frame(&client, &args).await {
                Ok(text) => {
                    print!("{text}");
                    ExitCode::SUCCESS
                }
                Err(e) => fail(&e),
            };
        }
        refresh(&client, &args).await
    })
}

/// One frame: the overview as text, or as JSON with `--json`.
async fn frame(client: &Client, args: &TopArgs) -> Result<String, CliError> {
    let top = args.top.to_string();
    let url = client.url("v1/overview", &[], &[("top", Some(top.as_str()))])?;
    let reply = client.send(Method::GET, url, None).await?;
    Ok(if args.json {
        let mut text = if args.once {
            serde_json::to_string_pretty(&reply.body)
        } else {
            serde_json::to_string(&reply.body)
        }
        .map_err(CliError::new)?;
        text.push('\n');
        text
    } else {
        render(client.base(), &reply.body)
    })
}

/// Redraws every interval until Ctrl-C; a root that cannot be read is
/// shown as such and tried again.
async fn refresh(client: &Client, args: &TopArgs) -> ExitCode {
    let screen = !args.json && std::io::stdout().is_terminal();
    let mut out = std::io::stdout();
    if screen {
        let _ = write!(out, "{SCREEN_ENTER}");
    }
    // Watched before the first frame, so a Ctrl-C at any moment counts.
    let mut stop = match signal(SignalKind::interrupt()) {
        Ok(stream) => Some(stream),
        Err(e) => {
            eprintln!("sluice top: cannot watch Ctrl-C ({e}); stop it with SIGTERM");
            None
        }
    };
    loop {
        let text = match frame(client, args).await {
            Ok(text) => text,
            Err(e) if args.json => {
                eprintln!("sluice: {e}");
                String::new()
            }
            Err(e) => format!(
                "sluice top: {}\n\nsluice: {e}\n(trying again every {:?})\n",
                client.base(),
                args.interval
            ),
        };
        if screen {
            let _ = write!(out, "{SCREEN_CLEAR}{text}");
        } else if args.json {
            let _ = write!(out, "{text}");
        } else {
            // A blank line between frames.
            let _ = writeln!(out, "{text}");
        }
        let _ = out.flush();
        tokio::select! {
            _ = tokio::time::sleep(args.interval) => {}
            _ = async {
                match stop.as_mut() {
                    Some(stream) => stream.recv().await,
                    None => std::future::pending().await,
                }
            } => break,
        }
    }
    if screen {
        let _ = write!(out, "{SCREEN_LEAVE}");
        let _ = out.flush();
    }
    ExitCode::SUCCESS
}

/// The overview as text.
pub fn render(root: &str, ov: &Value) -> String {
    let r = &ov["root"];
    let db = &ov["db"];
    let t = &ov["totals"];
    let mut out = format!(
        "sluice root {root}  {}  v{}  instance {}\n",
        text(&r["status"]),
        text(&r["version"]),
        text(&r["instance"])
    );
    let db_state = if db["up"].as_bool() == Some(true) {
        "up".to_string()
    } else {
        format!("DOWN for {} s", number(&db["down_seconds"]))
    };
    out.push_str(&format!(
        "db {} {db_state}, epoch {}, reloaded {} s ago, {} failures{}\n",
        text(&db["backend"]),
        number(&db["epoch"]),
        number(&db["reload_age_seconds"]),
        number(&db["failures"]),
        db["error"]
            .as_str()
            .map(|e| format!(": {e}"))
            .unwrap_or_default()
    ));
    out.push_str(&format!(
        "quotas {} ({} with a counter)  limiters {} active, {} seen  syncs {}/s  rejected {}/s  rejecting {} quotas ({} full)\n",
        number(&t["quotas"]),
        number(&t["counters"]),
        number(&t["limiters_active"]),
        number(&t["limiters_seen"]),
        number(&t["syncs_per_second"]),
        number(&t["rejected_per_second"]),
        number(&t["quotas_rejecting"]),
        number(&t["quotas_full"]),
    ));
    if ov["access"] != "admin" {
        out.push_str(
            "\nquota and limiter names need the admin token (--token, SLUICE_ADMIN_TOKEN or --token-file)\n",
        );
        return out;
    }
    let quotas = ov["quotas"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default();
    out.push('\n');
    if quotas.is_empty() {
        out.push_str("no quota has received weight recently\n");
    } else {
        // The tiers column only when some quota has tiers.
        let tiered = quotas.iter().any(|q| tiers(q) != "-");
        let mut columns = vec![
            "QUOTA", "PARENT", "LEVEL", "HIGH", "FULL%", "FILL/S", "LIMIT", "REJECT%", "REJ/S",
        ];
        if tiered {
            columns.push("TIERS");
        }
        let mut table = Table::new(&columns);
        for q in quotas {
            let mut row = vec![
                text(&q["name"]),
                text(&q["parent"]),
                number(&q["level"]),
                number(&q["high_burst"]),
                percent(&q["fullness"]),
                number(&q["fill_rate"]),
                terms(q),
                percent(&q["rejecting"]),
                number(&q["rejected_rate"]),
            ];
            if tiered {
                row.push(tiers(q));
            }
            table.row(row);
        }
        out.push_str(&table.render());
        if ov["sampled"]["counters_complete"] == false {
            out.push_str(&format!(
                "(ranked the {} most recently updated counters)\n",
                number(&ov["sampled"]["counters_scanned"])
            ));
        }
    }
    render_keys(&mut out, ov);
    render_penalties(&mut out, ov);
    let limiters = ov["limiters"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default();
    out.push('\n');
    if limiters.is_empty() {
        out.push_str("no limiter synced in the last 5 minutes\n");
    } else {
        let mut table = Table::new(&["LIMITER", "LAST SYNC S", "SYNCS", "OFFSET MS", "RTT MS"]);
        for l in limiters {
            table.row(vec![
                text(&l["id"]),
                number(&l["last_sync_seconds_ago"]),
                number(&l["syncs"]),
                millis(&l["clock_offset_seconds"]),
                millis(&l["round_trip_seconds"]),
            ]);
        }
        out.push_str(&table.render());
    }
    out
}

/// The busiest keys of per-key quotas, by hash, ranked as the quotas are
/// (the overview has them only when some key's counter was ranked).
fn render_keys(out: &mut String, ov: &Value) {
    let keys = ov["keys"].as_array().map(Vec::as_slice).unwrap_or_default();
    if keys.is_empty() {
        return;
    }
    out.push('\n');
    let mut table = Table::new(&[
        "PER-KEY QUOTA",
        "KEY",
        "LEVEL",
        "FULL%",
        "FILL/S",
        "REJECT%",
    ]);
    for k in keys {
        table.row(vec![
            text(&k["quota"]),
            text(&k["key"]),
            number(&k["level"]),
            percent(&k["fullness"]),
            number(&k["fill_rate"]),
            percent(&k["rejecting"]),
        ]);
    }
    out.push_str(&table.render());
}

/// A quota's tiers in a few words: `2 overrides, penalty 15m, 1 in
/// force`, or `-`.
fn tiers(q: &Value) -> String {
    let mut parts = Vec::new();
    match q["overrides"].as_u64() {
        Some(1) => parts.push("1 override".to_string()),
        Some(n) if n > 1 => parts.push(format!("{n} overrides")),
        _ => {}
    }
    if let Some(p) = q["penalty"].as_str() {
        parts.push(format!("penalty {p}"));
    }
    if let Some(n) = q["penalties"].as_u64().filter(|&n| n > 0) {
        parts.push(format!("{n} in force"));
    }
    if parts.is_empty() {
        "-".into()
    } else {
        parts.join(", ")
    }
}

/// The penalties in force, latest end first (the overview has them only
/// when some are).
fn render_penalties(out: &mut String, ov: &Value) {
    let penalties = ov["penalties"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default();
    if penalties.is_empty() {
        return;
    }
    out.push('\n');
    let mut table = Table::new(&["PENALIZED QUOTA", "KEY", "ENDS IN S"]);
    for p in penalties {
        table.row(vec![
            text(&p["quota"]),
            p["key"].as_str().unwrap_or("(the quota)").to_string(),
            number(&p["seconds_left"]),
        ]);
    }
    out.push_str(&table.render());
}

fn percent(fraction: &Value) -> String {
    number(
        &fraction
            .as_f64()
            .map_or(Value::Null, |f| (f * 100.0).into()),
    )
}

fn millis(seconds: &Value) -> String {
    number(&seconds.as_f64().map_or(Value::Null, |s| (s * 1e3).into()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn overview(access: &str) -> Value {
        json!({
            "access": access, "token_required": true,
            "root": {"version": "0.1.0", "instance": "00000000000000ab", "status": "ok", "ready": true},
            "db": {"backend": "sqlite", "up": true, "down_seconds": null, "reload_age_seconds": 0.5,
                   "failures": 0, "epoch": 7},
            "totals": {"quotas": 6, "counters": 4, "limiters_seen": 2, "limiters_active": 1,
                       "syncs_per_second": 5.0,
                       "rejected_per_second": 3.25,
                       "quotas_rejecting": 1, "quotas_full": 0},
            "sampled": {"age_seconds": 0.1, "rate_window_seconds": 1.0,
                        "counters_scanned": 4, "counters_complete": true},
            "quotas": [{"name": "s3_photos_read", "parent": "s3_photos", "limit": 15.0,
                        "low_burst": 15.0, "high_burst": 30.0, "level": 22.09, "fill_rate": 13.85,
                        "rejected_rate": 3.25, "fullness": 0.7363, "rejecting": 0.5363}],
            "limiters": [{"id": "edge-1", "last_sync_seconds_ago": 0.06, "syncs": 40,
                          "clock_offset_seconds": 0.000078, "round_trip_seconds": 0.000406}],
        })
    }

    #[test]
    fn a_frame_shows_totals_the_busiest_quotas_and_the_limiters() {
        let text = render("http://r:7070/", &overview("admin"));
        let expected = "\
sluice root http://r:7070/  ok  v0.1.0  instance 00000000000000ab
db sqlite up, epoch 7, reloaded 0.5 s ago, 0 failures
quotas 6 (4 with a counter)  limiters 1 active, 2 seen  syncs 5/s  rejected 3.25/s  rejecting 1 quotas (0 full)

QUOTA           PARENT     LEVEL  HIGH  FULL%  FILL/S  LIMIT  REJECT%  REJ/S
s3_photos_read  s3_photos  22.09    30  73.63   13.85  15 /s    53.63   3.25

LIMITER  LAST SYNC S  SYNCS  OFFSET MS  RTT MS
edge-1          0.06     40       0.08    0.41
";
        assert_eq!(text, expected);
    }

    /// The console had a busiest-keys view and `sluice top` none.
    #[test]
    fn a_frame_shows_the_busiest_keys_by_hash_when_there_are_some() {
        let mut ov = overview("admin");
        ov["keys"] = json!([
            {"quota": "api_user", "key": "00000000000000ab", "level": 31.0, "fill_rate": 16.2,
             "limit": 15.0, "fullness": 1.0, "rejecting": 1.0},
            {"quota": "api_user", "key": "00000000000000cd", "level": 3.5, "fill_rate": 0.25,
             "limit": 15.0, "fullness": 0.1167, "rejecting": 0.0},
        ]);
        let text = render("http://r:7070/", &ov);
        let expected = "\
PER-KEY QUOTA  KEY               LEVEL  FULL%  FILL/S  REJECT%
api_user       00000000000000ab     31    100    16.2      100
api_user       00000000000000cd    3.5  11.67    0.25        0

LIMITER";
        assert!(text.contains(expected), "{text}");
        // Without keys ranked there is no such table.
        assert!(!render("http://r:7070/", &overview("admin")).contains("PER-KEY QUOTA"));
    }

    #[test]
    fn a_frame_shows_tiers_beside_their_quota_and_the_penalties_in_force() {
        let mut ov = overview("admin");
        ov["quotas"][0]["per_key"] = json!(true);
        ov["quotas"][0]["overrides"] = json!(2);
        ov["quotas"][0]["penalty"] = json!("15m");
        ov["quotas"][0]["penalties"] = json!(1);
        ov["penalties"] = json!([
            {"quota": "s3_photos_read", "key": "0000000000000bad", "seconds_left": 899.5},
            {"quota": "login", "seconds_left": 12.0},
        ]);
        let text = render("http://r:7070/", &ov);
        let row = text
            .lines()
            .find(|l| l.starts_with("s3_photos_read "))
            .unwrap();
        assert!(
            row.ends_with("2 overrides, penalty 15m, 1 in force"),
            "{text}"
        );
        let expected = "\
PENALIZED QUOTA  KEY               ENDS IN S
s3_photos_read   0000000000000bad      899.5
login            (the quota)              12
";
        assert!(text.contains(expected), "{text}");
        // Without tiers, no column and no table.
        let plain = render("http://r:7070/", &overview("admin"));
        assert!(!plain.contains("TIERS") && !plain.contains("PENALIZED"));
    }

    #[test]
    fn window_and_per_key_quotas_show_their_limit_in_their_own_terms() {
        let mut ov = overview("admin");
        ov["quotas"] = json!([
            {"name": "plan_day", "parent": null, "limit": 1000.0, "window": "1d",
             "low_burst": 1000.0, "high_burst": 1000.0, "level": 990.0, "fill_rate": 0.5,
             "rejected_rate": 0.25, "fullness": 0.99, "rejecting": 0.0},
            {"name": "api_user", "parent": "api", "limit": 15.0, "per_key": true,
             "low_burst": 15.0, "high_burst": 30.0, "level": 31.0, "fill_rate": 40.0,
             "rejected_rate": 3.78, "fullness": 1.03, "rejecting": 1.0,
             "keys": {"count": 12, "busiest": ["00000000000000ab"]}},
        ]);
        let text = render("http://r:7070/", &ov);
        let row = |name: &str| {
            text.lines()
                .find(|l| l.starts_with(name))
                .unwrap()
                .to_string()
        };
        assert!(row("plan_day").contains(" 1000 / day "), "{text}");
        assert!(row("api_user").contains(" 15 /s per key "), "{text}");
        assert!(!text.contains("LIMIT/S"), "{text}");
    }

    #[test]
    fn without_the_token_a_frame_says_what_is_missing() {
        let mut ov = overview("public");
        ov.as_object_mut().unwrap().remove("quotas");
        ov.as_object_mut().unwrap().remove("limiters");
        let text = render("http://r:7070/", &ov);
        assert!(text.contains("quotas 6 "), "{text}");
        assert!(
            text.ends_with("need the admin token (--token, SLUICE_ADMIN_TOKEN or --token-file)\n")
        );
        assert!(!text.contains("QUOTA"));
    }

    #[test]
    fn a_database_down_is_shown_with_its_error() {
        let mut ov = overview("admin");
        ov["db"] = json!({"backend": "postgres", "up": false, "down_seconds": 12.5,
                          "reload_age_seconds": 14.0, "failures": 3, "epoch": 7,
                          "error": "connection refused"});
        let text = render("http://r:7070/", &ov);
        assert!(
            text.contains("db postgres DOWN for 12.5 s, epoch 7, reloaded 14 s ago, 3 failures: connection refused\n"),
            "{text}"
        );
    }
}
