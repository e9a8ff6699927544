//! The benchmark report of `sandbox-bench` (and of `scripts/bench.sh`): rows of samples with
//! their baseline from the same run, printed as one table (median and p95 of each, the
//! ratio), written as JSON (the samples included, so the chart can be drawn again) and drawn
//! as a PNG of the latency distributions. Text in the chart is drawn from an embedded 8x8
//! bitmap font, so nothing depends on the host's fonts.

use std::path::Path;

use plotters::prelude::*;
use serde_json::{json, Value};

/// How a row's figure is set against its baseline.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Compare {
    /// median / baseline median.
    Ratio,
    /// median - baseline median, in the row's unit.
    Difference,
    /// No baseline (a size, a count).
    None,
}

impl Compare {
    fn name(self) -> &'static str {
        match self {
            Compare::Ratio => "ratio",
            Compare::Difference => "difference",
            Compare::None => "none",
        }
    }

    fn parse(text: &str) -> Compare {
        match text {
            "ratio" => Compare::Ratio,
            "difference" => Compare::Difference,
            _ => Compare::None,
        }
    }
}

/// One line of the table.
#[derive(Clone, Debug)]
pub struct Row {
    pub what: String,
    /// "ms" or "MiB".
    pub unit: String,
    pub samples: Vec<f64>,
    pub baseline: String,
    pub baseline_samples: Vec<f64>,
    pub compare: Compare,
    pub goal: String,
    /// Why a row has no figure ("not available: ..."), or a breakdown.
    pub note: String,
}

impl Row {
    /// A timed row against a timed baseline, both in milliseconds.
    pub fn timed(what: &str, ours: Vec<f64>, baseline: &str, theirs: Vec<f64>) -> Row {
        Row {
            what: what.into(),
            unit: "ms".into(),
            samples: ours,
            baseline: baseline.into(),
            baseline_samples: theirs,
            compare: Compare::Ratio,
            goal: String::new(),
            note: String::new(),
        }
    }

    /// A row without a baseline.
    pub fn single(what: &str, unit: &str, samples: Vec<f64>) -> Row {
        Row {
            compare: Compare::None,
            unit: unit.into(),
            ..Row::timed(what, samples, "", Vec::new())
        }
    }

    /// A row that could not be measured here, saying why.
    pub fn missing(what: &str, why: &str) -> Row {
        Row {
            note: why.into(),
            ..Row::single(what, "ms", Vec::new())
        }
    }

    pub fn goal(mut self, goal: &str) -> Row {
        self.goal = goal.into();
        self
    }

    pub fn note(mut self, note: impl Into<String>) -> Row {
        self.note = note.into();
        self
    }

    pub fn difference(mut self) -> Row {
        self.compare = Compare::Difference;
        self
    }

    /// The figure against its baseline, as the table shows it.
    pub fn versus(&self) -> String {
        let (Some(ours), Some(theirs)) = (median(&self.samples), median(&self.baseline_samples))
        else {
            return "-".into();
        };
        match self.compare {
            Compare::Ratio => format!("{:.2}x", ours / theirs.max(1e-9)),
            Compare::Difference => format!("{:+.2} {}", ours - theirs, self.unit),
            Compare::None => "-".into(),
        }
    }

    fn to_json(&self) -> Value {
        json!({
            "what": self.what,
            "unit": self.unit,
            "median": median(&self.samples),
            "p95": p95(&self.samples),
            "baseline": self.baseline,
            "baseline_median": median(&self.baseline_samples),
            "baseline_p95": p95(&self.baseline_samples),
            "compare": self.compare.name(),
            "versus": self.versus(),
            "goal": self.goal,
            "note": self.note,
            "samples": self.samples,
            "baseline_samples": self.baseline_samples,
        })
    }

    fn from_json(value: &Value) -> Option<Row> {
        let numbers = |key: &str| -> Vec<f64> {
            value[key]
                .as_array()
                .map(|a| a.iter().filter_map(Value::as_f64).collect())
                .unwrap_or_default()
        };
        let text = |key: &str| value[key].as_str().unwrap_or_default().to_string();
        Some(Row {
            what: value["what"].as_str()?.to_string(),
            unit: text("unit"),
            samples: numbers("samples"),
            baseline: text("baseline"),
            baseline_samples: numbers("baseline_samples"),
            compare: Compare::parse(value["compare"].as_str().unwrap_or_default()),
            goal: text("goal"),
            note: text("note"),
        })
    }
}

fn sorted(samples: &[f64]) -> Vec<f64> {
    let mut v = samples.to_vec();
    v.sort_by(f64::total_cmp);
    v
}

/// The sample at quantile `q` (nearest rank).
pub fn quantile(samples: &[f64], q: f64) -> Option<f64> {
    let v = sorted(samples);
    if v.is_empty() {
        return None;
    }
    let rank = ((q * v.len() as f64).ceil() as usize).clamp(1, v.len());
    Some(v[rank - 1])
}

pub fn median(samples: &[f64]) -> Option<f64> {
    let v = sorted(samples);
    v.get(v.len() / 2).copied()
}

pub fn p95(samples: &[f64]) -> Option<f64> {
    quantile(samples, 0.95)
}

fn figure(value: Option<f64>) -> String {
    value.map_or("-".into(), |v| {
        if v >= 100.0 {
            format!("{v:.0}")
        } else {
            format!("{v:.2}")
        }
    })
}

/// The table, as Markdown.
pub fn table(title: &str, rows: &[Row]) -> String {
    let mut out = format!("{title}\n\n");
    out.push_str(
        "| measurement | median | p95 | baseline (same run) | median | p95 | vs baseline | goal | notes |\n",
    );
    out.push_str("|---|---:|---:|---|---:|---:|---:|---|---|\n");
    for row in rows {
        let unit = |v: Option<f64>| match v {
            Some(_) => format!("{} {}", figure(v), row.unit),
            None => "-".into(),
        };
        out.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} |\n",
            row.what,
            unit(median(&row.samples)),
            unit(p95(&row.samples)),
            if row.baseline.is_empty() {
                "-"
            } else {
                &row.baseline
            },
            unit(median(&row.baseline_samples)),
            unit(p95(&row.baseline_samples)),
            row.versus(),
            if row.goal.is_empty() { "-" } else { &row.goal },
            row.note,
        ));
    }
    out
}

pub fn to_json(title: &str, rows: &[Row]) -> Value {
    json!({
        "title": title,
        "rows": rows.iter().map(Row::to_json).collect::<Vec<_>>(),
    })
}

/// Rows written by [`to_json`] (or a bare array of rows), e.g. another bench's.
pub fn rows_from_json(value: &Value) -> Vec<Row> {
    let rows = value["rows"].as_array().or_else(|| value.as_array());
    rows.map(|rows| rows.iter().filter_map(Row::from_json).collect())
        .unwrap_or_default()
}

const WIDTH: u32 = 1400;
const ROW_HEIGHT: u32 = 64;
const TOP: u32 = 72;
const LABEL_WIDTH: i32 = 560;
const RIGHT: i32 = 130;
const INK: RGBColor = RGBColor(30, 30, 30);
const OURS: RGBColor = RGBColor(31, 119, 180);
const THEIRS: RGBColor = RGBColor(150, 150, 150);

/// Draws `text` at (x, y) from the embedded 8x8 font, each dot `scale` pixels wide.
fn text<DB: DrawingBackend>(
    area: &DrawingArea<DB, plotters::coord::Shift>,
    x: i32,
    y: i32,
    scale: i32,
    color: &RGBColor,
    text: &str,
) {
    use font8x8::UnicodeFonts;
    let mut pen = x;
    for c in text.chars() {
        let glyph = font8x8::BASIC_FONTS
            .get(c)
            .or_else(|| font8x8::LATIN_FONTS.get(c))
            .unwrap_or([0; 8]);
        for (dy, bits) in glyph.iter().enumerate() {
            for dx in 0..8 {
                if bits & (1 << dx) != 0 {
                    let (px, py) = (pen + dx * scale, y + dy as i32 * scale);
                    let _ = area.draw(&Rectangle::new(
                        [(px, py), (px + scale, py + scale)],
                        color.filled(),
                    ));
                }
            }
        }
        pen += 8 * scale;
    }
}

/// One distribution as a box: whiskers min..p95, box p25..p75, a bar at the median, and the
/// samples beyond p95 as dots.
fn boxplot<DB: DrawingBackend>(
    area: &DrawingArea<DB, plotters::coord::Shift>,
    samples: &[f64],
    x: &dyn Fn(f64) -> i32,
    (top, bottom): (i32, i32),
    color: &RGBColor,
) {
    let q = |p| quantile(samples, p).unwrap_or(0.0);
    let (low, q1, mid, q3, high) = (q(0.0), q(0.25), q(0.5), q(0.75), q(0.95));
    let centre = (top + bottom) / 2;
    let line = color.stroke_width(2);
    let _ = area.draw(&PathElement::new(
        vec![(x(low), centre), (x(high), centre)],
        line,
    ));
    for end in [low, high] {
        let _ = area.draw(&PathElement::new(
            vec![(x(end), top + 3), (x(end), bottom - 3)],
            line,
        ));
    }
    let _ = area.draw(&Rectangle::new(
        [(x(q1), top), (x(q3).max(x(q1) + 2), bottom)],
        color.mix(0.35).filled(),
    ));
    let _ = area.draw(&Rectangle::new(
        [(x(q1), top), (x(q3).max(x(q1) + 2), bottom)],
        line,
    ));
    let _ = area.draw(&PathElement::new(
        vec![(x(mid), top - 2), (x(mid), bottom + 2)],
        INK.stroke_width(3),
    ));
    for &s in samples.iter().filter(|&&s| s > high) {
        let _ = area.draw(&Circle::new((x(s), centre), 3, color.filled()));
    }
}

/// The chart: one band per row with its samples and its baseline's, each row on its own
/// linear scale from 0 (the rows span microseconds to seconds).
pub fn draw_png(path: &Path, title: &str, rows: &[Row]) -> Result<(), String> {
    let height = TOP + ROW_HEIGHT * rows.len().max(1) as u32 + 24;
    let root = BitMapBackend::new(path, (WIDTH, height)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    text(&root, 16, 14, 2, &INK, title);
    text(
        &root,
        16,
        44,
        1,
        &INK,
        "blue: ours   grey: baseline (same run)   box p25-p75, black bar median, whiskers min-p95, dots beyond p95; each row scaled 0..its right label",
    );
    let plot_left = LABEL_WIDTH;
    let plot_right = WIDTH as i32 - RIGHT;
    for (i, row) in rows.iter().enumerate() {
        let y = (TOP + ROW_HEIGHT * i as u32) as i32;
        if i % 2 == 0 {
            let _ = root.draw(&Rectangle::new(
                [(0, y), (WIDTH as i32, y + ROW_HEIGHT as i32 - 1)],
                RGBColor(244, 246, 250).filled(),
            ));
        }
        let label: String = row.what.chars().take(34).collect();
        text(&root, 16, y + 10, 2, &INK, &label);
        let summary = match (median(&row.samples), median(&row.baseline_samples)) {
            (Some(m), Some(b)) => format!(
                "median {} vs {} {} = {}   ({})",
                figure(Some(m)),
                figure(Some(b)),
                row.unit,
                row.versus(),
                row.baseline.chars().take(40).collect::<String>()
            ),
            (Some(m), None) => format!("median {} {}", figure(Some(m)), row.unit),
            _ => row.note.chars().take(66).collect(),
        };
        text(&root, 16, y + 36, 1, &INK, &summary);
        let all: Vec<f64> = row
            .samples
            .iter()
            .chain(&row.baseline_samples)
            .copied()
            .collect();
        if all.is_empty() {
            continue;
        }
        // The scale reaches past the larger p95, so one outlier does not squash the boxes.
        let reach = [&row.samples, &row.baseline_samples]
            .iter()
            .filter_map(|s| p95(s))
            .fold(0.0, f64::max)
            * 1.15;
        let reach = if reach > 0.0 { reach } else { 1.0 };
        let x = |v: f64| {
            let v = v.clamp(0.0, reach);
            plot_left + ((v / reach) * (plot_right - plot_left) as f64) as i32
        };
        let _ = root.draw(&PathElement::new(
            vec![(plot_left, y + 6), (plot_left, y + ROW_HEIGHT as i32 - 6)],
            INK.stroke_width(1),
        ));
        if !row.baseline_samples.is_empty() {
            boxplot(&root, &row.baseline_samples, &x, (y + 8, y + 26), &THEIRS);
        }
        boxplot(&root, &row.samples, &x, (y + 36, y + 56), &OURS);
        text(
            &root,
            plot_left - 12,
            y + ROW_HEIGHT as i32 - 12,
            1,
            &INK,
            "0",
        );
        text(
            &root,
            plot_right + 14,
            y + 26,
            1,
            &INK,
            &format!("{} {}", figure(Some(reach)), row.unit),
        );
    }
    root.present().map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_ratios_and_json_round_trip() {
        let samples: Vec<f64> = (1..=20).map(f64::from).collect();
        assert_eq!(median(&samples), Some(11.0));
        assert_eq!(p95(&samples), Some(19.0));
        assert_eq!(quantile(&[3.0], 0.95), Some(3.0));
        assert_eq!(median(&[]), None);
        let row = Row::timed("x", vec![2.0, 4.0, 6.0], "base", vec![1.0, 2.0, 3.0]);
        assert_eq!(row.versus(), "2.00x");
        assert_eq!(row.clone().difference().versus(), "+2.00 ms");
        assert_eq!(Row::missing("y", "not available: why").versus(), "-");
        let rows = vec![row, Row::single("rss", "MiB", vec![12.5]).goal("< 30 MiB")];
        let back = rows_from_json(&to_json("t", &rows));
        assert_eq!(back.len(), 2);
        assert_eq!(back[0].samples, rows[0].samples);
        assert_eq!(back[1].compare, Compare::None);
        let printed = table("t", &rows);
        assert!(printed.contains("| x | 4.00 ms | 6.00 ms | base | 2.00 ms | 3.00 ms | 2.00x |"));
        let dir = tempfile::tempdir().unwrap();
        let png = dir.path().join("chart.png");
        draw_png(&png, "t", &back).unwrap();
        let bytes = std::fs::read(&png).unwrap();
        assert_eq!(&bytes[1..4], b"PNG");
    }
}
