//! The rejections of per-key templates.
//!
//! A limiter reports a keyed check's rejection under its template (the
//! quota the check named), but a template has no counter at a root: its
//! keys do. So a template's rejection rate is kept here, per template,
//! measured by the same meter as a counter's, and the admin API and the
//! overview show it as the template's `rejected_rate`.

use rustc_hash::FxHashMap;

use crate::core::Nanos;

use super::rules::FillMeter;

/// Rejection rates of per-key templates, by template id. Only templates
/// the quota set holds are noted (the ledger checks), so it holds at most
/// one meter per template.
#[derive(Clone, Debug, Default)]
pub struct TemplateRejections {
    meters: FxHashMap<u64, FillMeter>,
}

impl TemplateRejections {
    /// Records `count` checks of template `id` rejected by a limiter.
    pub fn note(&mut self, id: u64, count: u64, now: Nanos) {
        self.meters
            .entry(id)
            .or_insert_with(|| FillMeter::new(now))
            .record(now, count as f64);
    }

    /// Checks of template `id` rejected per second, smoothed as a
    /// counter's rejection rate is (0 for a template never noted).
    pub fn rate(&self, id: u64, now: Nanos) -> f64 {
        self.meters.get(&id).map_or(0.0, |m| m.rate_at(now))
    }

    /// Every template noted, with its rate at `now`.
    pub fn rates(&self, now: Nanos) -> impl Iterator<Item = (u64, f64)> + '_ {
        self.meters.iter().map(move |(&id, m)| (id, m.rate_at(now)))
    }

    /// Forgets template `id` (deleted).
    pub fn remove(&mut self, id: u64) {
        self.meters.remove(&id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SEC: Nanos = 1_000_000_000;

    #[test]
    fn a_template_rate_is_measured_like_a_counters_and_forgotten_on_delete() {
        let mut t = TemplateRejections::default();
        assert_eq!(t.rate(7, 0), 0.0);
        for s in 0..20 {
            t.note(7, 10, s * SEC);
        }
        let rate = t.rate(7, 20 * SEC);
        assert!((5.0..=10.5).contains(&rate), "{rate}");
        assert_eq!(t.rates(20 * SEC).count(), 1);
        t.remove(7);
        assert_eq!(t.rate(7, 20 * SEC), 0.0);
    }
}
