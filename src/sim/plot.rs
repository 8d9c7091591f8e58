//! SVG plots of a run, in the style of YARL's graphs: per quota, offered
//! load, admitted (2xx) and rejected (429) per second against the limit,
//! and below it the true cluster level against the hosts' estimates.
//! Each panel's legend stands right of its plot, never over the data.
//!
//! A window quota's limit is units per window, not per second: its upper
//! panel counts each window's units from the window's start, against the
//! limit in its own terms (`6000 / min`), instead of rates per second.
//!
//! plotters' SVG backend writes text as `<text>` elements, so no font is
//! needed (the crate is built without a font backend; plotters then sizes
//! labels with a built-in estimate).

use plotters::coord::types::RangedCoordf64;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use super::series::{QuotaSeries, Series};

const OFFERED: RGBColor = RGBColor(0x1f, 0x77, 0xb4);
const ADMITTED: RGBColor = RGBColor(0x2c, 0xa0, 0x2c);
const REJECTED: RGBColor = RGBColor(0xd6, 0x27, 0x28);
const IDEAL: RGBColor = RGBColor(0x7f, 0x7f, 0x7f);
const TRUTH: RGBColor = RGBColor(0x00, 0x00, 0x00);
const ESTIMATE: RGBColor = RGBColor(0xff, 0x7f, 0x0e);
const LOW_BURST: RGBColor = RGBColor(0x17, 0x8a, 0x9e);
const HIGH_BURST: RGBColor = RGBColor(0x94, 0x67, 0xbd);

/// Width of the image, pixels.
const WIDTH: u32 = 1160;
/// Width kept right of each panel's plot for its legend, pixels: the
/// legend never covers data.
const LEGEND: u32 = 200;
/// Height of one legend line, pixels.
const LEGEND_ROW: i32 = 16;
/// Height of one panel, pixels.
const PANEL: u32 = 250;

/// Renders `series` as an SVG document titled `title`.
pub fn svg(series: &Series, title: &str) -> Result<String, String> {
    let mut out = String::new();
    {
        let height = 40 + PANEL * 2 * series.quotas.len() as u32;
        let root = SVGBackend::with_string(&mut out, (WIDTH, height)).into_drawing_area();
        root.fill(&WHITE).map_err(err)?;
        let root = root.titled(title, ("sans-serif", 22)).map_err(err)?;
        let panels = root.split_evenly((2 * series.quotas.len(), 1));
        for (q, pair) in series.quotas.iter().zip(panels.chunks(2)) {
            rates(&pair[0], q, series.seconds)?;
            levels(&pair[1], q, series.seconds)?;
        }
        root.present().map_err(err)?;
    }
    Ok(out)
}

fn err(e: impl std::fmt::Display) -> String {
    format!("plot: {e}")
}

/// Reads one number out of a bin.
type BinField = fn(&super::series::Bin) -> u64;

type Area<'a> = DrawingArea<SVGBackend<'a>, plotters::coord::Shift>;

/// A panel's chart: seconds along x, a linear y.
type Chart<'a, 'b> = ChartContext<'a, SVGBackend<'b>, Cartesian2d<RangedCoordf64, RangedCoordf64>>;

/// A panel's chart on `area`, in the look every panel shares: `caption`
/// above, `seconds` along x and `y_desc` from 0 to `top` up.
fn chart<'a, 'b>(
    area: &'a Area<'b>,
    caption: String,
    y_desc: &str,
    seconds: usize,
    top: f64,
) -> Result<Chart<'a, 'b>, String> {
    let mut chart = ChartBuilder::on(area)
        .caption(caption, ("sans-serif", 16))
        .margin(8)
        .margin_right(LEGEND)
        .x_label_area_size(28)
        .y_label_area_size(56)
        .build_cartesian_2d(0f64..seconds as f64, 0f64..top)
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_desc("seconds")
        .y_desc(y_desc)
        .x_label_formatter(&|x| format!("{x:.0}"))
        .y_label_formatter(&|y| format!("{y:.0}"))
        .light_line_style(WHITE.mix(0.0))
        .draw()
        .map_err(err)?;
    Ok(chart)
}

/// A line of a legend: what it names and how that is drawn.
struct Entry {
    label: String,
    style: ShapeStyle,
    dashed: bool,
}

impl Entry {
    fn solid(label: impl Into<String>, style: ShapeStyle) -> Self {
        Self {
            label: label.into(),
            style,
            dashed: false,
        }
    }

    fn dashed(label: impl Into<String>, style: ShapeStyle) -> Self {
        Self {
            label: label.into(),
            style,
            dashed: true,
        }
    }
}

/// Draws a panel's legend right of its plot, in the room [`chart`] keeps
/// there, so it never covers data. Drawn on the panel itself: plotters'
/// own legend is clipped to the plot.
fn legend(area: &Area, chart: &Chart, entries: &[Entry]) -> Result<(), String> {
    let (xs, ys) = chart.plotting_area().get_pixel_range();
    let (base_x, base_y) = area.get_base_pixel();
    let (x, y) = (xs.end - base_x + 12, ys.start - base_y);
    let height = entries.len() as i32 * LEGEND_ROW + 8;
    area.draw(&Rectangle::new(
        [(x, y), (x + LEGEND as i32 - 24, y + height)],
        BLACK.mix(0.3),
    ))
    .map_err(err)?;
    for (i, e) in entries.iter().enumerate() {
        let mid = y + 4 + i as i32 * LEGEND_ROW + LEGEND_ROW / 2;
        let segments: &[(i32, i32)] = if e.dashed {
            &[(6, 12), (16, 22)]
        } else {
            &[(6, 22)]
        };
        for &(from, to) in segments {
            area.draw(&PathElement::new(
                vec![(x + from, mid), (x + to, mid)],
                e.style,
            ))
            .map_err(err)?;
        }
        area.draw(&Text::new(
            e.label.as_str(),
            (x + 28, mid),
            ("sans-serif", 12)
                .into_font()
                .into_text_style(area)
                .pos(Pos::new(HPos::Left, VPos::Center)),
        ))
        .map_err(err)?;
    }
    Ok(())
}

/// Offered, admitted and rejected per second, with the limit and what the
/// ideal limiter admitted. A window quota's are counted from the start of
/// each window instead (windows start at 0, as the simulation's UTC
/// does), against its limit per window.
fn rates(area: &Area, q: &QuotaSeries, seconds: usize) -> Result<(), String> {
    let per_second: Vec<_> = (0..seconds).map(|s| q.second(s)).collect();
    let line = |f: BinField| match q.window {
        // A second's count is drawn at its middle, so a step at a whole
        // second is drawn crossing that second.
        None => per_second
            .iter()
            .enumerate()
            .map(|(s, b)| (s as f64 + 0.5, f(b) as f64))
            .collect::<Vec<_>>(),
        Some(length) => window_counts(&per_second, f, length),
    };
    let (caption, y_desc) = match q.window {
        None => (
            format!("{} ({}): requests per second", q.name, q.terms),
            "units / s".to_string(),
        ),
        Some(_) => (
            format!("{} ({}): units counted in each window", q.name, q.terms),
            format!("units this window (/ {})", q.terms.per()),
        ),
    };
    let top = line(|b| b.offered)
        .iter()
        .map(|p| p.1)
        .fold(q.limit * 1.2, f64::max)
        * 1.05;
    let mut chart = chart(area, caption, &y_desc, seconds, top)?;
    let series: [(&str, RGBColor, BinField); 3] = [
        ("offered", OFFERED, |b| b.offered),
        ("admitted (2xx)", ADMITTED, |b| b.admitted),
        ("rejected (429)", REJECTED, |b| b.rejected),
    ];
    let mut entries = Vec::new();
    for (name, color, f) in series {
        chart
            .draw_series(LineSeries::new(line(f), color.stroke_width(2)))
            .map_err(err)?;
        entries.push(Entry::solid(name, color.stroke_width(2)));
    }
    chart
        .draw_series(DashedLineSeries::new(
            line(|b| b.ideal),
            4,
            3,
            IDEAL.stroke_width(1),
        ))
        .map_err(err)?;
    entries.push(Entry::dashed(
        "ideal limiter admitted",
        IDEAL.stroke_width(1),
    ));
    chart
        .draw_series(DashedLineSeries::new(
            [(0.0, q.limit), (seconds as f64, q.limit)],
            8,
            4,
            BLACK.stroke_width(1),
        ))
        .map_err(err)?;
    entries.push(Entry::dashed(
        format!("limit {}", q.terms),
        BLACK.stroke_width(1),
    ));
    legend(area, &chart, &entries)
}

/// A field of `per_second`'s bins counted from the start of each window
/// of `length` seconds, at the end of every second, with a 0 at each
/// window's start so the line drops there instead of sloping.
fn window_counts(per_second: &[super::series::Bin], f: BinField, length: f64) -> Vec<(f64, f64)> {
    let mut points = Vec::with_capacity(per_second.len() * 2);
    let mut sum = 0u64;
    let mut window = -1i64;
    for (s, bin) in per_second.iter().enumerate() {
        let index = (s as f64 / length).floor() as i64;
        if index != window {
            window = index;
            sum = 0;
            points.push((s as f64, 0.0));
        }
        sum += f(bin);
        points.push(((s + 1) as f64, sum as f64));
    }
    points
}

/// The true cluster level and the hosts' estimates (mean, min, max).
fn levels(area: &Area, q: &QuotaSeries, seconds: usize) -> Result<(), String> {
    let top = q
        .levels
        .iter()
        .map(|l| l.truth.max(l.est_max))
        .fold(q.high_burst * 1.1, f64::max)
        * 1.05;
    let caption = if q.window.is_some() {
        format!("{}: count in the window", q.name)
    } else {
        format!("{}: bucket level", q.name)
    };
    let mut chart = chart(area, caption, "units", seconds, top)?;
    // Levels are sampled at the end of each second.
    let at = |f: fn(&super::series::LevelSample) -> f64| {
        q.levels
            .iter()
            .enumerate()
            .map(move |(s, l)| ((s + 1) as f64, f(l)))
            .collect::<Vec<_>>()
    };
    chart
        .draw_series(LineSeries::new(at(|l| l.truth), TRUTH.stroke_width(2)))
        .map_err(err)?;
    chart
        .draw_series(LineSeries::new(
            at(|l| l.est_mean),
            ESTIMATE.stroke_width(2),
        ))
        .map_err(err)?;
    let spread = ESTIMATE.mix(0.4).stroke_width(1);
    let bounds: [fn(&super::series::LevelSample) -> f64; 2] = [|l| l.est_min, |l| l.est_max];
    for f in bounds {
        chart
            .draw_series(LineSeries::new(at(f), spread))
            .map_err(err)?;
    }
    let mut entries = vec![
        Entry::solid("true cluster level", TRUTH.stroke_width(2)),
        Entry::solid("hosts' estimate (mean)", ESTIMATE.stroke_width(2)),
        Entry::solid("hosts' estimates (min, max)", spread),
    ];
    for (name, y, color) in [
        ("low_burst", q.low_burst, LOW_BURST),
        ("high_burst", q.high_burst, HIGH_BURST),
    ] {
        chart
            .draw_series(DashedLineSeries::new(
                [(0.0, y), (seconds as f64, y)],
                8,
                4,
                color.stroke_width(1),
            ))
            .map_err(err)?;
        entries.push(Entry::dashed(name, color.stroke_width(1)));
    }
    legend(area, &chart, &entries)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::series::BINS_PER_SEC;

    #[test]
    fn a_plot_has_axis_labels_and_a_legend() {
        let mut s = Series::new(3, &crate::sim::series::tests::quotas(&["q"]));
        s.quotas[0].bins[5].offered = 20;
        s.quotas[0].bins[5].admitted = 10;
        let doc = svg(&s, "test").unwrap();
        assert!(doc.starts_with("<svg"));
        for text in [
            "seconds",
            "units / s",
            "admitted (2xx)",
            "rejected (429)",
            "limit",
            "q: bucket level",
        ] {
            assert!(doc.contains(text), "missing {text:?}");
        }
    }

    #[test]
    fn a_window_quota_is_plotted_per_window_against_its_limit_per_window() {
        let quota = crate::core::Quota::new(1, "plan", 6000.0, 6000.0, 6000.0)
            .windowed(crate::core::Window::Minute, false);
        let mut s = Series::new(120, &[quota]);
        let q = &mut s.quotas[0];
        // 200 admitted a second: the window's count reaches 6000 in 30 s.
        for second in 0..120 {
            q.bins[second * BINS_PER_SEC].admitted = if second % 60 < 30 { 200 } else { 0 };
        }
        let doc = svg(&s, "window").unwrap();
        for text in [
            "plan (6000 / min): units counted in each window",
            "units this window (/ min)",
            "limit 6000 / min",
            "plan: count in the window",
        ] {
            assert!(doc.contains(text), "missing {text:?}");
        }
        assert!(
            !doc.contains("units / s"),
            "a window quota's axis is not per second"
        );
    }

    /// The x where the text ending in `label` starts.
    fn text_x(doc: &str, label: &str) -> i32 {
        let end = doc
            .find(&format!("{label}\n</text>"))
            .unwrap_or_else(|| panic!("no {label:?}"));
        let start = doc[..end].rfind("<text").unwrap();
        let x = &doc[start..end][doc[start..end].find("x=\"").unwrap() + 3..];
        x[..x.find('"').unwrap()].parse().unwrap()
    }

    /// The x of every point of the lines drawn in `color`.
    fn line_xs(doc: &str, color: RGBColor) -> Vec<i32> {
        let stroke = format!("stroke=\"#{:02X}{:02X}{:02X}\"", color.0, color.1, color.2);
        doc.lines()
            .filter(|l| l.starts_with("<polyline") && l.contains(&stroke))
            .flat_map(|l| {
                let points = &l[l.find("points=\"").unwrap() + 8..];
                points[..points.find('"').unwrap()]
                    .split_whitespace()
                    .filter_map(|p| p.split(',').next()?.parse().ok())
                    .collect::<Vec<i32>>()
            })
            .collect()
    }

    /// The three complaints: the legend covered data, low and
    /// high burst shared one grey, and the hosts' spread was not named.
    #[test]
    fn the_legend_is_beside_the_data_and_names_every_line_in_its_own_colour() {
        let mut s = Series::new(60, &crate::sim::series::tests::quotas(&["q"]));
        for b in &mut s.quotas[0].bins {
            (b.offered, b.admitted) = (30, 20);
        }
        let doc = svg(&s, "test").unwrap();
        // The offered line runs across the plot, to its right edge; the
        // legend's sample of it and every label are right of that.
        let offered = line_xs(&doc, OFFERED);
        let plot_right = offered.iter().copied().filter(|&x| x < 900).max().unwrap();
        assert!(offered.len() > 60, "{offered:?}");
        let limit = format!("\nlimit {}", s.quotas[0].terms);
        for label in [
            "offered",
            limit.as_str(),
            "true cluster level",
            "estimates (min, max)",
        ] {
            assert!(text_x(&doc, label) > plot_right, "{label} over the data");
        }
        assert!(text_x(&doc, "low_burst") > plot_right && text_x(&doc, "high_burst") > plot_right);
        // Two colours for the two bursts, each drawn (line and sample).
        let (low, high) = (line_xs(&doc, LOW_BURST), line_xs(&doc, HIGH_BURST));
        assert!(!low.is_empty() && !high.is_empty());
        assert_ne!(LOW_BURST, HIGH_BURST);
    }
}
