//! A small hand-made SVG line-chart writer for scenario 9's curves: panels of cost against keys,
//! the x-axis logarithmic, the y-axis linear from zero (a flat curve must look flat, not be
//! stretched to fill the panel). A few dozen lines of text instead of a plotting crate and its
//! font and image dependencies, for four panels of three points.

use std::fmt::Write as _;

/// One curve: a name, a colour, points `(keys, value)`.
pub struct Series {
    /// Legend text.
    pub name: String,
    /// CSS colour.
    pub color: &'static str,
    /// Dashed (a reference line) instead of solid.
    pub dashed: bool,
    /// `(x, y)`, x > 0.
    pub points: Vec<(f64, f64)>,
}

/// One panel.
pub struct Panel {
    /// Title above the panel.
    pub title: String,
    /// Unit of the y-axis.
    pub unit: String,
    /// Its curves.
    pub series: Vec<Series>,
}

const PANEL_W: f64 = 460.0;
const PANEL_H: f64 = 290.0;
const LEFT: f64 = 64.0;
const RIGHT: f64 = 16.0;
const TOP: f64 = 34.0;
const BOTTOM: f64 = 92.0;

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// A "nice" step (1, 2 or 5 × 10^k) giving about `ticks` intervals up to `max`.
fn nice_step(max: f64, ticks: f64) -> f64 {
    let raw = (max / ticks).max(f64::MIN_POSITIVE);
    let magnitude = 10f64.powf(raw.log10().floor());
    let fraction = raw / magnitude;
    let nice = if fraction <= 1.0 {
        1.0
    } else if fraction <= 2.0 {
        2.0
    } else if fraction <= 5.0 {
        5.0
    } else {
        10.0
    };
    nice * magnitude
}

/// `1M`, `10M`, `500k`.
pub fn keys_label(x: f64) -> String {
    if x >= 1e6 {
        format!("{}M", x / 1e6)
    } else {
        format!("{}k", x / 1e3)
    }
}

fn number_label(y: f64) -> String {
    if y == 0.0 {
        "0".to_owned()
    } else if y.abs() >= 100.0 || y.fract() == 0.0 {
        format!("{y:.0}")
    } else if y.abs() >= 1.0 {
        format!("{y:.1}")
    } else {
        format!("{y:.2}")
    }
}

fn panel(out: &mut String, p: &Panel, ox: f64, oy: f64) {
    let (w, h) = (PANEL_W - LEFT - RIGHT, PANEL_H - TOP - BOTTOM);
    let xs: Vec<f64> = p
        .series
        .iter()
        .flat_map(|s| s.points.iter().map(|(x, _)| *x))
        .filter(|x| *x > 0.0)
        .collect();
    let (mut x0, mut x1) = (
        xs.iter().copied().fold(f64::INFINITY, f64::min),
        xs.iter().copied().fold(0.0, f64::max),
    );
    if !x0.is_finite() {
        (x0, x1) = (1e6, 1e7);
    }
    // A decade at least, so one point still sits on a readable axis.
    let (lx0, mut lx1) = (x0.log10() - 0.05, x1.log10() + 0.05);
    if lx1 - lx0 < 1.0 {
        lx1 = lx0 + 1.0;
    }
    let ymax = p
        .series
        .iter()
        .flat_map(|s| s.points.iter().map(|(_, y)| *y))
        .filter(|y| y.is_finite())
        .fold(0.0, f64::max);
    let step = nice_step(if ymax > 0.0 { ymax * 1.15 } else { 1.0 }, 5.0);
    let ytop = ((ymax * 1.15) / step).ceil().max(1.0) * step;
    let px = |x: f64| ox + LEFT + (x.log10() - lx0) / (lx1 - lx0) * w;
    let py = |y: f64| oy + TOP + h - y / ytop * h;

    let _ = writeln!(
        out,
        r##"<text x="{:.1}" y="{:.1}" font-size="14" font-weight="bold">{}</text>"##,
        ox + LEFT,
        oy + 20.0,
        escape(&p.title)
    );
    // y grid and labels
    let mut y = 0.0;
    while y <= ytop + step / 2.0 {
        let _ = writeln!(
            out,
            r##"<line x1="{:.1}" y1="{:.1}" x2="{:.1}" y2="{:.1}" stroke="#ddd"/><text x="{:.1}" y="{:.1}" font-size="11" text-anchor="end">{}</text>"##,
            ox + LEFT,
            py(y),
            ox + LEFT + w,
            py(y),
            ox + LEFT - 6.0,
            py(y) + 4.0,
            number_label(y)
        );
        y += step;
    }
    let _ = writeln!(
        out,
        r##"<text x="{:.1}" y="{:.1}" font-size="11" transform="rotate(-90 {:.1} {:.1})" text-anchor="middle">{}</text>"##,
        ox + 14.0,
        oy + TOP + h / 2.0,
        ox + 14.0,
        oy + TOP + h / 2.0,
        escape(&p.unit)
    );
    // x ticks: 1, 2, 5 × 10^k inside the range
    let mut decade = 10f64.powf(lx0.floor());
    while decade <= 10f64.powf(lx1) {
        for m in [1.0, 2.0, 5.0] {
            let x = decade * m;
            if x.log10() >= lx0 && x.log10() <= lx1 {
                let _ = writeln!(
                    out,
                    r##"<line x1="{:.1}" y1="{:.1}" x2="{:.1}" y2="{:.1}" stroke="#eee"/><text x="{:.1}" y="{:.1}" font-size="11" text-anchor="middle">{}</text>"##,
                    px(x),
                    oy + TOP,
                    px(x),
                    oy + TOP + h,
                    px(x),
                    oy + TOP + h + 16.0,
                    keys_label(x)
                );
            }
        }
        decade *= 10.0;
    }
    let _ = writeln!(
        out,
        r##"<rect x="{:.1}" y="{:.1}" width="{w:.1}" height="{h:.1}" fill="none" stroke="#444"/><text x="{:.1}" y="{:.1}" font-size="11" text-anchor="middle">keys in the table (log scale)</text>"##,
        ox + LEFT,
        oy + TOP,
        ox + LEFT + w / 2.0,
        oy + TOP + h + 32.0
    );
    for (k, s) in p.series.iter().enumerate() {
        let points: Vec<String> = s
            .points
            .iter()
            .filter(|(x, y)| *x > 0.0 && y.is_finite())
            .map(|(x, y)| format!("{:.1},{:.1}", px(*x), py(*y)))
            .collect();
        let dash = if s.dashed {
            r#" stroke-dasharray="6 4""#
        } else {
            ""
        };
        let _ = writeln!(
            out,
            r##"<polyline points="{}" fill="none" stroke="{}" stroke-width="2"{dash}/>"##,
            points.join(" "),
            s.color
        );
        if !s.dashed {
            for pt in &points {
                let (cx, cy) = pt.split_once(',').unwrap_or(("0", "0"));
                let _ = writeln!(
                    out,
                    r##"<circle cx="{cx}" cy="{cy}" r="3.5" fill="{}"/>"##,
                    s.color
                );
            }
        }
        // legend, two columns under the axis label
        let lx = ox + LEFT + (k % 2) as f64 * (w / 2.0);
        let ly = oy + TOP + h + 50.0 + (k / 2) as f64 * 16.0;
        let _ = writeln!(
            out,
            r##"<line x1="{lx:.1}" y1="{:.1}" x2="{:.1}" y2="{:.1}" stroke="{}" stroke-width="2"{dash}/><text x="{:.1}" y="{:.1}" font-size="11">{}</text>"##,
            ly - 4.0,
            lx + 18.0,
            ly - 4.0,
            s.color,
            lx + 24.0,
            ly,
            escape(&s.name)
        );
    }
}

/// The panels in a grid of `columns`, with a title and a footnote.
pub fn render(title: &str, note: &str, panels: &[Panel], columns: usize) -> String {
    let columns = columns.max(1);
    let rows = panels.len().div_ceil(columns);
    let (width, height) = (PANEL_W * columns as f64, PANEL_H * rows as f64 + 56.0);
    let mut out = String::new();
    let _ = writeln!(
        out,
        r##"<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0}" height="{height:.0}" viewBox="0 0 {width:.0} {height:.0}" font-family="sans-serif">"##
    );
    let _ = writeln!(
        out,
        r##"<rect width="100%" height="100%" fill="white"/><text x="16" y="24" font-size="16" font-weight="bold">{}</text>"##,
        escape(title)
    );
    for (i, p) in panels.iter().enumerate() {
        let (c, r) = (i % columns, i / columns);
        panel(&mut out, p, c as f64 * PANEL_W, 30.0 + r as f64 * PANEL_H);
    }
    let _ = writeln!(
        out,
        r##"<text x="16" y="{:.0}" font-size="11" fill="#555">{}</text>"##,
        height - 10.0,
        escape(note)
    );
    out.push_str("</svg>\n");
    out
}
