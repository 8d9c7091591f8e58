//! What `sluice rls` counts: decisions by domain, descriptor and code, and
//! the answers to whole requests, in atomics the request path adds to
//! without a lock; written as Prometheus text by `/metrics`.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::sync::SyncMetrics;

/// The counters of one descriptor label (a configured descriptor's full
/// key, or with `detailed_metric` / `value_to_metric` one with the
/// request's values).
#[derive(Debug, Default)]
pub struct Stats {
    /// Hits counted (the sum of the hits added).
    pub hits: AtomicU64,
    /// Descriptors answered OK.
    pub ok: AtomicU64,
    /// Descriptors answered OVER_LIMIT.
    pub over_limit: AtomicU64,
    /// Over the limit but answered OK: `shadow_mode`.
    pub shadow_mode: AtomicU64,
    /// Over the limit but answered OK: `quota_mode`.
    pub quota_mode: AtomicU64,
}

impl Stats {
    /// Adds one to `counter`.
    pub fn bump(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }
}

/// Most labels made from request values (`detailed_metric`,
/// `value_to_metric`) kept at once; later ones are counted under the
/// configured descriptor's label, so a client cannot grow the metrics
/// without bound.
pub const MAX_DETAILED_LABELS: usize = 10_000;

/// The counters of labels made from request values. A map behind a lock:
/// only descriptors configured with `detailed_metric` or
/// `value_to_metric` come here.
#[derive(Debug, Default)]
pub struct DetailedStats {
    by_label: Mutex<BTreeMap<(String, String), Arc<Stats>>>,
}

impl DetailedStats {
    /// The counters of `(domain, label)`, made on first use; `None` when
    /// [`MAX_DETAILED_LABELS`] are held already.
    pub fn get(&self, domain: &str, label: &str) -> Option<Arc<Stats>> {
        let mut map = self.by_label.lock().ok()?;
        if let Some(stats) = map.get(&(domain.to_string(), label.to_string())) {
            return Some(Arc::clone(stats));
        }
        if map.len() >= MAX_DETAILED_LABELS {
            return None;
        }
        let stats = Arc::new(Stats::default());
        map.insert((domain.to_string(), label.to_string()), Arc::clone(&stats));
        Some(stats)
    }

    fn snapshot(&self) -> Vec<((String, String), Arc<Stats>)> {
        self.by_label
            .lock()
            .map(|m| m.iter().map(|(k, v)| (k.clone(), Arc::clone(v))).collect())
            .unwrap_or_default()
    }
}

/// Answers to whole requests.
#[derive(Debug, Default)]
pub struct RequestStats {
    /// Answered OK.
    pub ok: AtomicU64,
    /// Answered OVER_LIMIT.
    pub over_limit: AtomicU64,
    /// Refused as malformed (no domain, no descriptors).
    pub invalid: AtomicU64,
    /// Configuration loads that failed (the last good one kept).
    pub config_errors: AtomicU64,
    /// Configuration loads that succeeded.
    pub config_loads: AtomicU64,
}

/// Escapes a Prometheus label value.
fn label(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// The Prometheus text of everything: `configured` are the configured
/// descriptors' counters `((domain, label), stats)`.
pub fn prometheus(
    configured: &[((String, String), Arc<Stats>)],
    detailed: &DetailedStats,
    requests: &RequestStats,
    sync: &SyncMetrics,
    has_roots: bool,
    quotas: u32,
) -> String {
    let mut out = String::new();
    let load = |c: &AtomicU64| c.load(Ordering::Relaxed);
    let mut all: Vec<((String, String), Arc<Stats>)> = configured.to_vec();
    all.extend(detailed.snapshot());
    all.sort_by(|a, b| a.0.cmp(&b.0));
    let _ = writeln!(
        out,
        "# HELP sluice_rls_decisions_total Descriptors answered, by domain, descriptor and code.\n\
         # TYPE sluice_rls_decisions_total counter"
    );
    for ((domain, descriptor), stats) in &all {
        for (code, counter) in [("OK", &stats.ok), ("OVER_LIMIT", &stats.over_limit)] {
            let _ = writeln!(
                out,
                "sluice_rls_decisions_total{{domain=\"{}\",descriptor=\"{}\",code=\"{code}\"}} {}",
                label(domain),
                label(descriptor),
                load(counter)
            );
        }
    }
    for (metric, help, pick) in [
        (
            "sluice_rls_hits_total",
            "Hits counted, by domain and descriptor.",
            (|s: &Stats| &s.hits) as fn(&Stats) -> &AtomicU64,
        ),
        (
            "sluice_rls_shadow_mode_total",
            "Descriptors over their limit answered OK by shadow_mode.",
            |s: &Stats| &s.shadow_mode,
        ),
        (
            "sluice_rls_quota_mode_total",
            "Descriptors over their limit answered OK by quota_mode.",
            |s: &Stats| &s.quota_mode,
        ),
    ] {
        let _ = writeln!(out, "# HELP {metric} {help}\n# TYPE {metric} counter");
        for ((domain, descriptor), stats) in &all {
            let _ = writeln!(
                out,
                "{metric}{{domain=\"{}\",descriptor=\"{}\"}} {}",
                label(domain),
                label(descriptor),
                load(pick(stats))
            );
        }
    }
    let _ = writeln!(
        out,
        "# HELP sluice_rls_requests_total ShouldRateLimit requests, by overall code.\n\
         # TYPE sluice_rls_requests_total counter\n\
         sluice_rls_requests_total{{code=\"OK\"}} {}\n\
         sluice_rls_requests_total{{code=\"OVER_LIMIT\"}} {}\n\
         sluice_rls_requests_total{{code=\"INVALID\"}} {}",
        load(&requests.ok),
        load(&requests.over_limit),
        load(&requests.invalid)
    );
    let _ = writeln!(
        out,
        "# HELP sluice_rls_config_loads_total Configuration loads, by result (a failed one keeps the last good configuration).\n\
         # TYPE sluice_rls_config_loads_total counter\n\
         sluice_rls_config_loads_total{{result=\"ok\"}} {}\n\
         sluice_rls_config_loads_total{{result=\"error\"}} {}",
        load(&requests.config_loads),
        load(&requests.config_errors)
    );
    let _ = writeln!(
        out,
        "# HELP sluice_rls_quotas Quotas in the table.\n# TYPE sluice_rls_quotas gauge\nsluice_rls_quotas {quotas}"
    );
    let standalone = u8::from(!has_roots || sync.all_roots_down);
    let _ = writeln!(
        out,
        "# HELP sluice_rls_limiting_per_host 1 while limits are this host's alone: no roots configured, or every root down.\n\
         # TYPE sluice_rls_limiting_per_host gauge\nsluice_rls_limiting_per_host {standalone}\n\
         # HELP sluice_rls_sync_cycles_total Sync cycles run.\n# TYPE sluice_rls_sync_cycles_total counter\n\
         sluice_rls_sync_cycles_total {}",
        sync.cycles
    );
    let _ = writeln!(
        out,
        "# HELP sluice_rls_root_up 1 when the root answered its last sync.\n# TYPE sluice_rls_root_up gauge"
    );
    for root in &sync.roots {
        let _ = writeln!(
            out,
            "sluice_rls_root_up{{root=\"{}\"}} {}",
            label(&root.url),
            u8::from(root.up)
        );
    }
    let _ = writeln!(
        out,
        "# HELP sluice_rls_root_syncs_total Syncs with each root, by result.\n# TYPE sluice_rls_root_syncs_total counter"
    );
    for root in &sync.roots {
        let _ = writeln!(
            out,
            "sluice_rls_root_syncs_total{{root=\"{}\",result=\"ok\"}} {}\n\
             sluice_rls_root_syncs_total{{root=\"{}\",result=\"error\"}} {}",
            label(&root.url),
            root.syncs,
            label(&root.url),
            root.errors
        );
    }
    out
}
