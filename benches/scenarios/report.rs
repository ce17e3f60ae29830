//! What a run reports: one table row per measurement (medians, ratio, range, target) for people,
//! and every number behind it in `results.json`.

use std::fmt::Write as _;

use serde::Serialize;

/// One line of the human table.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    /// Scenario number.
    pub scenario: u8,
    /// What was measured.
    pub metric: String,
    /// The baseline's median (formatted), or empty.
    pub baseline: String,
    /// tombstoned's median (formatted).
    pub tombstoned: String,
    /// Ratio of the medians (formatted), or empty.
    pub ratio: String,
    /// Median of the per-repetition ratios (formatted), or empty.
    pub pair_ratio: String,
    /// min–max of tombstoned's repetitions (the noise), or empty.
    pub range: String,
    /// The target, or empty.
    pub target: String,
    /// "met", "MISSED", "n/a (quick)" or empty.
    pub verdict: String,
}

impl Row {
    /// `measured` against `baseline`, repetition by repetition: both medians, the ratio of the
    /// medians, the median of the per-repetition ratios and `range` (the noise, in the scenario's
    /// words); no target.
    pub fn compared(
        scenario: u8,
        metric: String,
        baseline: &[f64],
        measured: &[f64],
        decimals: usize,
        range: String,
    ) -> Row {
        let (mb, mm) = (
            crate::stats::median(baseline).unwrap_or(f64::NAN),
            crate::stats::median(measured).unwrap_or(f64::NAN),
        );
        Row {
            scenario,
            metric,
            baseline: num(mb, decimals),
            tombstoned: num(mm, decimals),
            ratio: num(crate::stats::ratio(mm, mb), 2),
            pair_ratio: num(
                crate::stats::median_of_pair_ratios(measured, baseline).unwrap_or(f64::NAN),
                2,
            ),
            range,
            target: String::new(),
            verdict: String::new(),
        }
    }
}

/// A target checked against a measured value.
#[derive(Debug, Clone, Serialize)]
pub struct Check {
    /// Scenario number.
    pub scenario: u8,
    /// What is checked.
    pub name: String,
    /// The measured value.
    pub value: f64,
    /// The target, in words (`>= 0.85`).
    pub target: String,
    /// Whether the value meets it.
    pub met: bool,
}

/// One scenario's outcome.
#[derive(Debug, Clone, Serialize)]
pub struct ScenarioResult {
    /// 1-5.
    pub id: u8,
    /// Title.
    pub title: String,
    /// Table rows.
    pub rows: Vec<Row>,
    /// Targets.
    pub checks: Vec<Check>,
    /// Every trial and profile, for results.json.
    pub details: serde_json::Value,
    /// Wall time of the scenario, seconds (seeding its data included).
    pub seconds: f64,
}

/// Formats a number with a fixed number of decimals, or "-" for NaN.
pub fn num(x: f64, decimals: usize) -> String {
    if x.is_finite() {
        format!("{x:.decimals$}")
    } else {
        "-".to_owned()
    }
}

/// `min–max` with a unit.
pub fn range(values: &[f64], decimals: usize, unit: &str) -> String {
    match crate::stats::min_max(values) {
        Some((lo, hi)) => format!("{}–{}{unit}", num(lo, decimals), num(hi, decimals)),
        None => String::new(),
    }
}

/// A check, and its verdict text for the table (targets are not gated at `--quick` scale).
pub fn check(
    checks: &mut Vec<Check>,
    scenario: u8,
    name: &str,
    value: f64,
    target: &str,
    met: bool,
    quick: bool,
) -> String {
    checks.push(Check {
        scenario,
        name: name.to_owned(),
        value,
        target: target.to_owned(),
        met,
    });
    match (quick, met) {
        (true, _) => format!("{} (quick: not gated)", if met { "met" } else { "missed" }),
        (false, true) => "met".to_owned(),
        (false, false) => "MISSED".to_owned(),
    }
}

/// The table, as fixed-width text.
pub fn render(results: &[ScenarioResult]) -> String {
    let header = [
        "#",
        "measurement",
        "baseline",
        "tombstoned",
        "ratio",
        "pair ratio",
        "range",
        "target",
        "verdict",
    ];
    let mut lines: Vec<[String; 9]> = vec![header.map(str::to_owned)];
    for r in results {
        for row in &r.rows {
            lines.push([
                row.scenario.to_string(),
                row.metric.clone(),
                row.baseline.clone(),
                row.tombstoned.clone(),
                row.ratio.clone(),
                row.pair_ratio.clone(),
                row.range.clone(),
                row.target.clone(),
                row.verdict.clone(),
            ]);
        }
    }
    let mut widths = [0usize; 9];
    for line in &lines {
        for (w, cell) in widths.iter_mut().zip(line) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    for (n, line) in lines.iter().enumerate() {
        let mut text = String::new();
        for (i, (cell, w)) in line.iter().zip(widths).enumerate() {
            let pad = w - cell.chars().count();
            if i == 1 {
                let _ = write!(text, "{cell}{} ", " ".repeat(pad));
            } else {
                let _ = write!(text, "{}{cell} ", " ".repeat(pad));
            }
        }
        out.push_str(text.trim_end());
        out.push('\n');
        if n == 0 {
            out.push_str(&"-".repeat(widths.iter().sum::<usize>() + widths.len() - 1));
            out.push('\n');
        }
    }
    out
}

/// The table as Markdown (pasted into BENCHMARKS.md).
pub fn render_markdown(results: &[ScenarioResult]) -> String {
    let mut out = String::from(
        "| # | measurement | baseline | tombstoned | ratio | pair ratio | range | target | verdict |\n\
         |---|---|---|---|---|---|---|---|---|\n",
    );
    for r in results {
        for row in &r.rows {
            let _ = writeln!(
                out,
                "| {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                row.scenario,
                row.metric,
                row.baseline,
                row.tombstoned,
                row.ratio,
                row.pair_ratio,
                row.range,
                row.target,
                row.verdict
            );
        }
    }
    out
}
