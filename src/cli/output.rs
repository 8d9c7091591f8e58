//! Human-readable output: aligned tables, compact numbers and a quota's
//! limit in its own terms.

use serde_json::Value;

use sluice::core::{Terms, Window};

/// A table with a header row; columns are padded to their widest cell,
/// numbers right-aligned.
#[derive(Debug, Default)]
pub struct Table {
    /// Column titles.
    header: Vec<&'static str>,
    /// Cells, row by row.
    rows: Vec<Vec<String>>,
}

impl Table {
    /// A table with these column titles.
    pub fn new(header: &[&'static str]) -> Self {
        Self {
            header: header.to_vec(),
            rows: Vec::new(),
        }
    }

    /// Appends a row.
    pub fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    /// The table as text, one line per row, no trailing spaces.
    pub fn render(&self) -> String {
        let widths: Vec<usize> = (0..self.header.len())
            .map(|c| {
                let cells = self
                    .rows
                    .iter()
                    .filter_map(|r| r.get(c))
                    .map(|s| s.chars().count());
                cells.chain([self.header[c].len()]).max().unwrap_or(0)
            })
            .collect();
        let numeric: Vec<bool> = (0..self.header.len())
            .map(|c| {
                !self.rows.is_empty()
                    && self
                        .rows
                        .iter()
                        .all(|r| r.get(c).is_none_or(|s| is_number(s)))
            })
            .collect();
        let mut out = String::new();
        let header: Vec<String> = self.header.iter().map(|h| h.to_string()).collect();
        for row in std::iter::once(&header).chain(&self.rows) {
            let mut line = String::new();
            for (c, width) in widths.iter().enumerate() {
                let cell = row.get(c).map_or("", String::as_str);
                if c > 0 {
                    line.push_str("  ");
                }
                if numeric[c] {
                    line.push_str(&format!("{cell:>width$}"));
                } else {
                    line.push_str(&format!("{cell:<width$}"));
                }
            }
            out.push_str(line.trim_end());
            out.push('\n');
        }
        out
    }
}

fn is_number(cell: &str) -> bool {
    cell == "-" || cell.parse::<f64>().is_ok()
}

/// A JSON number for humans: integers without a fraction, others with at
/// most two decimals; `-` for anything else.
pub fn number(value: &Value) -> String {
    let Some(x) = value.as_f64() else {
        return "-".into();
    };
    if x.fract() == 0.0 && x.abs() < 1e15 {
        return format!("{x:.0}");
    }
    let text = format!("{x:.2}");
    text.trim_end_matches('0').trim_end_matches('.').to_string()
}

/// A JSON string, or `-` for null and anything else.
pub fn text(value: &Value) -> String {
    value.as_str().map_or_else(|| "-".into(), str::to_string)
}

/// A quota's limit in its own terms ([`Terms`]: `1000 / day`, `15 /s per
/// key`) from its fields as the admin API shows them, so a root that
/// predates the `terms` field is shown the same; `-` without a limit.
pub fn terms(quota: &Value) -> String {
    let Some(limit) = quota["limit"].as_f64() else {
        return "-".into();
    };
    Terms {
        limit,
        window: quota["window"].as_str().and_then(Window::parse),
        sliding: quota["sliding"].as_bool().unwrap_or(false),
        per_key: quota["per_key"].as_bool().unwrap_or(false),
        in_flight: quota["in_flight"].as_bool().unwrap_or(false),
    }
    .to_string()
}

/// A quota's window as a column: `1d`, `1m sliding`, or `-` for a leaky
/// bucket.
pub fn window(quota: &Value) -> String {
    match (quota["window"].as_str(), quota["sliding"].as_bool()) {
        (Some(w), Some(true)) => format!("{w} sliding"),
        (Some(w), _) => w.to_string(),
        (None, _) => "-".to_string(),
    }
}

/// Whether a quota is a per-key template, as a column: `yes` or `-`.
pub fn per_key(quota: &Value) -> String {
    if quota["per_key"].as_bool() == Some(true) {
        "yes".into()
    } else {
        "-".into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_quota_is_shown_in_its_own_terms() {
        let day = json!({"limit": 1000.0, "window": "1d"});
        assert_eq!(
            (terms(&day), window(&day), per_key(&day)),
            ("1000 / day".into(), "1d".into(), "-".into())
        );
        let minute = json!({"limit": 10.0, "window": "1m", "sliding": true});
        assert_eq!(
            (terms(&minute), window(&minute)),
            ("10 / min sliding".into(), "1m sliding".into())
        );
        let user = json!({"limit": 15.0, "per_key": true});
        assert_eq!(
            (terms(&user), window(&user), per_key(&user)),
            ("15 /s per key".into(), "-".into(), "yes".into())
        );
        assert_eq!(terms(&json!({})), "-");
    }

    #[test]
    fn numbers_are_compact() {
        assert_eq!(number(&json!(10.0)), "10");
        assert_eq!(number(&json!(12.3456)), "12.35");
        assert_eq!(number(&json!(0.5)), "0.5");
        assert_eq!(number(&json!(null)), "-");
        assert_eq!(text(&json!(null)), "-");
    }

    #[test]
    fn tables_align_text_left_and_numbers_right() {
        let mut t = Table::new(&["NAME", "LIMIT"]);
        t.row(vec!["a".into(), "5".into()]);
        t.row(vec!["long_name".into(), "1000".into()]);
        assert_eq!(
            t.render(),
            "NAME       LIMIT\na              5\nlong_name   1000\n"
        );
    }
}
