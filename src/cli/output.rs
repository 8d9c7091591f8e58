//! Human-readable output: aligned tables and compact numbers.

use serde_json::Value;

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

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

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
