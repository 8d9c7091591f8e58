//! `sluice quota list`, `get`, `set` and `delete`: quotas one at a time.

use reqwest::header::{HeaderName, IF_MATCH, IF_NONE_MATCH};
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

use sluice::core::spec::QuotaPatch;
use sluice::core::terms::{parse_rate, Rate};
use sluice::core::tier::PenaltyTime;
use sluice::core::Window;

use super::client::{CliError, Client, Reply};
use super::output::{number, per_key, terms, text, window, Table};
use super::{check_name, to_json};

/// `sluice quota list`.
#[derive(Debug, clap::Args)]
pub(super) struct ListArgs {
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
}

/// `sluice quota get` and `delete`: a quota by name.
#[derive(Debug, clap::Args)]
pub(super) struct NameArgs {
    /// Quota name.
    name: String,
}

/// `sluice quota set`.
#[derive(Debug, clap::Args)]
pub(super) struct SetArgs {
    /// Quota name.
    name: String,
    /// Leak rate: units per second, or with a unit as nginx writes rates
    /// (10/m, 100/h, 5/s; 10r/m too); a window quota's count per window,
    /// an in-flight quota's requests at once. Bursts left at their
    /// defaults follow it.
    #[arg(long, allow_negative_numbers = true)]
    limit: Option<String>,
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
    /// 1s, 10s, 1m, 1h, 1d, 7d (from Monday), month (calendar), or
    /// epoch_week, 30d, 365d (from the Unix epoch, as envoyproxy/ratelimit
    /// counts its week, month and year); `none` makes the quota a leaky
    /// bucket again.
    #[arg(long, value_parser = parse_window_flag)]
    window: Option<OrNone<Window>>,
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
    penalty: Option<OrNone<PenaltyTime>>,
    /// An in-flight quota: at most `--limit` requests at once, each
    /// holding a slot until it ends (nginx's limit_conn, fleet-wide);
    /// its bursts go back to the limit unless given.
    #[arg(long, conflicts_with = "counting")]
    in_flight: bool,
    /// An in-flight quota counts units again (a leaky bucket, or
    /// with `--window` a window quota).
    #[arg(long)]
    counting: bool,
    /// Create the quota if no quota has this name (without it, a name
    /// that does not exist is an error: a typo is not a new quota).
    #[arg(long)]
    create: bool,
}

/// `sluice quota list`: a page of quotas in name order, or every page.
pub(super) async fn list(client: &Client, args: ListArgs, json: bool) -> Result<String, CliError> {
    let ListArgs {
        prefix,
        mut after,
        limit,
        all,
    } = args;
    let limit = limit.to_string();
    let mut quotas: Vec<Value> = Vec::new();
    let next = loop {
        let query = [
            ("prefix", Some(prefix.as_str())),
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

/// `sluice quota get`: one quota with its live level, fill rate and
/// recent limiters.
pub(super) async fn get(client: &Client, args: NameArgs, json: bool) -> Result<String, CliError> {
    let NameArgs { name } = args;
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

/// `sluice quota delete`.
pub(super) async fn delete(
    client: &Client,
    args: NameArgs,
    json: bool,
) -> Result<String, CliError> {
    let NameArgs { name } = args;
    check_name(&name)?;
    let url = client.url("v1/quotas", &[&name], &[])?;
    let reply = client.send(Method::DELETE, url, None).await?;
    Ok(if json {
        to_json(&reply.body)
    } else {
        format!("deleted {name} (epoch {})\n", number(&reply.body["epoch"]))
    })
}

/// `sluice quota set`: the flags given become a patch of the quota.
pub(super) async fn set(client: &Client, args: SetArgs, json: bool) -> Result<String, CliError> {
    let SetArgs {
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
        create,
    } = args;
    let limit = limit.as_deref().map(limit_flag).transpose()?;
    if let Some(unit) = limit.and_then(|l| l.unit) {
        if window.is_some_and(|w| w.0.is_some()) || in_flight {
            return Err(CliError::new(format!(
                "--limit with a rate per {} is a leaky bucket's: a window quota's limit is a \
                 count per window, an in-flight quota's a number of requests at once; give a \
                 number",
                unit.letter()
            )));
        }
    }
    let limit = limit.map(|l| l.per_second);
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
    let mut patch = change.into_patch();
    // The quota as it is, when its bursts may follow a new limit; the
    // patch then holds only if nothing changed it meanwhile.
    let mut read_at = None;
    if patch.limit.is_some() && (patch.low_burst.is_none() || patch.high_burst.is_none()) {
        let url = client.url("v1/quotas", &[&name], &[])?;
        match client.send(Method::GET, url, None).await {
            Ok(reply) => {
                follow_bursts(&mut patch, &reply.body);
                read_at = reply.body["epoch"].as_u64();
            }
            Err(e) if e.status == Some(StatusCode::NOT_FOUND) => {}
            Err(e) => return Err(e),
        }
    }
    send_patch(client, &name, &patch, create, read_at, json).await
}

/// Bursts left at their defaults follow a new limit: a low burst equal to
/// the quota's limit follows it, and a high burst equal to that low burst
/// follows along (`null`: back to the default). The root keeps bursts as
/// numbers, with no mark of which were given, so a burst equal to its
/// default is taken for one; bursts given on the command line, or set
/// apart from their defaults, stay as they are.
fn follow_bursts(patch: &mut QuotaPatch, current: &Value) {
    let numbers = (
        patch.limit,
        current["limit"].as_f64(),
        current["low_burst"].as_f64(),
        current["high_burst"].as_f64(),
    );
    let (Some(limit), Some(old_limit), Some(low), Some(high)) = numbers else {
        return;
    };
    if limit == old_limit || patch.low_burst.is_some() || low != old_limit {
        return;
    }
    patch.low_burst = Some(None);
    if patch.high_burst.is_none() && high == low {
        patch.high_burst = Some(None);
    }
}

/// `--limit`: a number (any number: [`check_numbers`] says what is wrong
/// with a negative or infinite one), or a rate with its unit (`10/m`).
fn limit_flag(text: &str) -> Result<Rate, CliError> {
    if let Ok(number) = text.parse::<f64>() {
        return Ok(Rate {
            per_second: number,
            unit: None,
        });
    }
    parse_rate(text).map_err(|why| CliError::new(format!("--limit: {why}")))
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
pub(super) struct Change {
    pub(super) limit: Option<f64>,
    pub(super) low_burst: Option<f64>,
    pub(super) high_burst: Option<f64>,
    /// `Some(None)` makes the quota top-level.
    pub(super) parent: Option<Option<String>>,
    /// `Some(true)` makes it a per-key template, `Some(false)` a plain
    /// quota.
    pub(super) per_key: Option<bool>,
    /// `Some(Some(w))` makes it a window quota, `Some(None)` a leaky one.
    pub(super) window: Option<Option<Window>>,
    /// `Some(true)` makes the window sliding, `Some(false)` fixed.
    pub(super) sliding: Option<bool>,
    /// `Some(Some(p))` sets a penalty, `Some(None)` takes it away.
    pub(super) penalty: Option<Option<PenaltyTime>>,
    /// `Some(true)` makes it an in-flight quota, `Some(false)` a counting
    /// one.
    pub(super) in_flight: Option<bool>,
}

/// A flag's value, or `none` to take it away (`--penalty`, `--window`).
#[derive(Clone, Copy, Debug)]
struct OrNone<T>(Option<T>);

impl<T> OrNone<T> {
    fn parse(text: &str, value: impl FnOnce(&str) -> Result<T, String>) -> Result<Self, String> {
        if text == "none" {
            return Ok(Self(None));
        }
        value(text).map(|v| Self(Some(v)))
    }
}

/// `--penalty`: a duration, or `none`.
fn parse_penalty_flag(text: &str) -> Result<OrNone<PenaltyTime>, String> {
    OrNone::parse(text, |t| PenaltyTime::parse(t).map_err(|e| e.message))
}

/// `--window`: a window, or `none`.
fn parse_window_flag(text: &str) -> Result<OrNone<Window>, String> {
    OrNone::parse(text, |t| {
        Window::parse(t).ok_or_else(|| {
            let names: Vec<&str> = Window::ALL.iter().map(|w| w.name()).collect();
            format!("must be one of {} or none", names.join(", "))
        })
    })
}

impl Change {
    /// No change at all.
    pub(super) fn none() -> Self {
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
async fn send_patch(
    client: &Client,
    name: &str,
    patch: &QuotaPatch,
    create: bool,
    read_at: Option<u64>,
    json: bool,
) -> Result<String, CliError> {
    let url = client.url("v1/quotas", &[name], &[])?;
    let body = serde_json::to_vec(patch).map_err(CliError::new)?;
    let epoch = read_at.map(|e| format!("\"{e}\""));
    let expect: Vec<(HeaderName, &str)> = epoch.iter().map(|e| (IF_MATCH, e.as_str())).collect();
    let mut reply = client
        .send_with(Method::PATCH, url.clone(), Some(body.clone()), &expect)
        .await;
    if reply
        .as_ref()
        .is_err_and(|e| e.status == Some(StatusCode::PRECONDITION_FAILED))
    {
        return Err(CliError::new(format!(
            "quota {name:?} changed while it was read (another edit): run the command again"
        )));
    }
    if reply
        .as_ref()
        .is_err_and(|e| e.status == Some(StatusCode::NOT_FOUND))
    {
        if !create {
            // A typo must not become a new quota.
            return Err(CliError::new(format!(
                "no quota is named {name:?} (`sluice quota list` shows them): to create it, \
                 add --create"
            )));
        }
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

/// Refuses what the root could only misread: a non-finite number (JSON
/// has none; `inf` would become `null`, "use the default") or a negative
/// one, as the flag that carried it.
pub(super) fn check_numbers(change: &Change) -> Result<(), CliError> {
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

    /// The case: `quota set NAME --limit 5` on a quota stored with
    /// the bursts a limit of 10 gave it was refused (a window quota's
    /// bursts must lie within its limit).
    #[test]
    fn bursts_at_their_defaults_follow_a_new_limit() {
        let patch = |body: Value| -> QuotaPatch { serde_json::from_value(body).unwrap() };
        let stored = json!({"limit": 10.0, "low_burst": 10.0, "high_burst": 10.0, "epoch": 3});
        let mut p = patch(json!({"limit": 5.0}));
        follow_bursts(&mut p, &stored);
        assert_eq!((p.low_burst, p.high_burst), (Some(None), Some(None)));
        // A high burst of its own stays; bursts set apart stay both.
        let banded = json!({"limit": 10.0, "low_burst": 10.0, "high_burst": 30.0});
        let mut p = patch(json!({"limit": 5.0}));
        follow_bursts(&mut p, &banded);
        assert_eq!((p.low_burst, p.high_burst), (Some(None), None));
        let apart = json!({"limit": 10.0, "low_burst": 20.0, "high_burst": 20.0});
        let mut p = patch(json!({"limit": 5.0}));
        follow_bursts(&mut p, &apart);
        assert_eq!((p.low_burst, p.high_burst), (None, None));
        // Given bursts, or an unchanged limit, change nothing.
        let mut p = patch(json!({"limit": 5.0, "low_burst": 7.0}));
        follow_bursts(&mut p, &stored);
        assert_eq!((p.low_burst, p.high_burst), (Some(Some(7.0)), None));
        let mut p = patch(json!({"limit": 10.0}));
        follow_bursts(&mut p, &stored);
        assert_eq!((p.low_burst, p.high_burst), (None, None));
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
        for name in ["epoch_week", "30d", "365d"] {
            assert!(parse_window_flag(name).is_ok(), "{name}");
        }
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
}
