//! Inline SVG charts for the dashboard and reports: rates with their intervals as horizontal
//! bars, and rates over time as lines with bands. Plain strings, no IO; every number a chart
//! shows is also written in a text label (and in a `<title>` a browser shows on hover), so a
//! reader, a screen reader and a test can all read it.

use std::fmt::Write as _;

use super::escape;

/// Series colours (Okabe–Ito, distinguishable with colour-vision deficiencies).
const PALETTE: [&str; 8] = [
    "#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#F0E442", "#000000",
];

/// The colour of series `i`.
pub fn colour(i: usize) -> &'static str {
    PALETTE[i % PALETTE.len()]
}

/// One bar: a rate in [0, 1] with its 95 % interval and the count behind it.
#[derive(Debug, Clone, PartialEq)]
pub struct Bar {
    pub label: String,
    pub rate: f64,
    pub ci95: [f64; 2],
    pub count: i64,
}

/// Longest label drawn in full; longer ones are cut (the full label stays in the `<title>`).
const LABEL_CHARS: usize = 32;

/// Horizontal bars of rates with interval whiskers, one row per bar in the given order, each
/// labelled `rate [low, high] · n <count_noun>`. Empty input draws a "no data" note.
pub fn bar_chart(title: &str, bars: &[Bar], count_noun: &str) -> String {
    const ROW: f64 = 22.0;
    const LEFT: f64 = 260.0;
    const WIDTH: f64 = 300.0;
    const TOTAL: f64 = 880.0;
    let height = 40.0 + ROW * bars.len().max(1) as f64 + 24.0;
    let mut svg = open(title, TOTAL, height);
    if bars.is_empty() {
        no_data(&mut svg, 40.0);
    }
    for (i, bar) in bars.iter().enumerate() {
        let y = 34.0 + ROW * i as f64;
        let x = |rate: f64| LEFT + WIDTH * rate.clamp(0.0, 1.0);
        let figures = format!(
            "{} [{}, {}] · n {} {count_noun}",
            percent(bar.rate),
            percent(bar.ci95[0]),
            percent(bar.ci95[1]),
            bar.count
        );
        let _ = write!(
            svg,
            r##"<g class="bar" data-key="{key}" data-rate="{rate:.6}" data-count="{count}"><title>{key}: {figures}</title><text x="{lx}" y="{ty}" text-anchor="end">{short}</text><rect x="{LEFT}" y="{by}" width="{bw:.1}" height="14" fill="{fill}"/><line x1="{lo:.1}" x2="{hi:.1}" y1="{wy}" y2="{wy}" stroke="#222" stroke-width="1.5"/><line x1="{lo:.1}" x2="{lo:.1}" y1="{wy0}" y2="{wy1}" stroke="#222"/><line x1="{hi:.1}" x2="{hi:.1}" y1="{wy0}" y2="{wy1}" stroke="#222"/><text x="{fx}" y="{ty}">{figures}</text></g>"##,
            key = escape(&bar.label),
            rate = bar.rate,
            count = bar.count,
            lx = LEFT - 8.0,
            ty = y + 11.0,
            short = escape(&shorten(&bar.label)),
            by = y,
            bw = WIDTH * bar.rate.clamp(0.0, 1.0),
            fill = colour(0),
            lo = x(bar.ci95[0]),
            hi = x(bar.ci95[1]),
            wy = y + 7.0,
            wy0 = y + 3.0,
            wy1 = y + 11.0,
            fx = LEFT + WIDTH + 10.0,
        );
    }
    let axis_y = 34.0 + ROW * bars.len().max(1) as f64 + 4.0;
    for tick in [0.0, 0.25, 0.5, 0.75, 1.0] {
        let x = LEFT + WIDTH * tick;
        let _ = write!(
            svg,
            r##"<line x1="{x}" x2="{x}" y1="30" y2="{axis_y}" stroke="#ddd"/><text x="{x}" y="{ty}" text-anchor="middle" class="tick">{label}</text>"##,
            ty = axis_y + 14.0,
            label = percent(tick),
        );
    }
    svg.push_str("</svg>");
    svg
}

/// One line over days: its label and, per day, the rate with its interval and count.
#[derive(Debug, Clone, PartialEq)]
pub struct Line {
    pub label: String,
    /// (day index on the shared axis, rate, interval, count), in day order.
    pub points: Vec<(usize, f64, [f64; 2], i64)>,
}

/// Rates over `days` (the x axis: one label per point, days or steps, shown sparsely) as lines
/// with shaded 95 % bands, one per [`Line`], with a legend giving each line's last point.
pub fn line_chart(title: &str, days: &[String], lines: &[Line]) -> String {
    const LEFT: f64 = 60.0;
    const TOP: f64 = 34.0;
    const WIDTH: f64 = 640.0;
    const HEIGHT: f64 = 220.0;
    const TOTAL: f64 = 760.0;
    let legend_rows = lines.len().max(1);
    let total_height = TOP + HEIGHT + 40.0 + 18.0 * legend_rows as f64;
    let mut svg = open(title, TOTAL, total_height);
    let x = |i: usize| {
        if days.len() <= 1 {
            LEFT + WIDTH / 2.0
        } else {
            LEFT + WIDTH * i as f64 / (days.len() - 1) as f64
        }
    };
    let y = |rate: f64| TOP + HEIGHT * (1.0 - rate.clamp(0.0, 1.0));
    for tick in [0.0, 0.25, 0.5, 0.75, 1.0] {
        let _ = write!(
            svg,
            r##"<line x1="{LEFT}" x2="{x2}" y1="{ty:.1}" y2="{ty:.1}" stroke="#ddd"/><text x="{lx}" y="{ly:.1}" text-anchor="end" class="tick">{label}</text>"##,
            x2 = LEFT + WIDTH,
            ty = y(tick),
            lx = LEFT - 6.0,
            ly = y(tick) + 4.0,
            label = percent(tick),
        );
    }
    // At most ~8 day labels, always the first and the last.
    let every = days.len().div_ceil(8).max(1);
    for (i, day) in days.iter().enumerate() {
        if i % every == 0 || i + 1 == days.len() {
            let _ = write!(
                svg,
                r#"<text x="{dx:.1}" y="{dy}" text-anchor="middle" class="tick">{day}</text>"#,
                dx = x(i),
                dy = TOP + HEIGHT + 16.0,
                day = escape(day),
            );
        }
    }
    if lines.iter().all(|l| l.points.is_empty()) {
        no_data(&mut svg, TOP + HEIGHT / 2.0);
    }
    for (l, line) in lines.iter().enumerate() {
        let colour = colour(l);
        if line.points.len() > 1 {
            let upper = line
                .points
                .iter()
                .map(|&(i, _, ci, _)| format!("{:.1},{:.1}", x(i), y(ci[1])));
            let lower = line
                .points
                .iter()
                .rev()
                .map(|&(i, _, ci, _)| format!("{:.1},{:.1}", x(i), y(ci[0])));
            let band: Vec<String> = upper.chain(lower).collect();
            let path: Vec<String> = line
                .points
                .iter()
                .map(|&(i, rate, _, _)| format!("{:.1},{:.1}", x(i), y(rate)))
                .collect();
            let _ = write!(
                svg,
                r#"<polygon points="{}" fill="{colour}" fill-opacity="0.15" stroke="none"/><polyline points="{}" fill="none" stroke="{colour}" stroke-width="2"/>"#,
                band.join(" "),
                path.join(" ")
            );
        }
        for &(i, rate, ci, count) in &line.points {
            let day = days.get(i).map_or("", String::as_str);
            let _ = write!(
                svg,
                r#"<circle cx="{cx:.1}" cy="{cy:.1}" r="3" fill="{colour}" data-series="{series}" data-day="{day}" data-rate="{rate:.6}"><title>{series} {day}: {}</title></circle>"#,
                figures(rate, ci, count),
                cx = x(i),
                cy = y(rate),
                series = escape(&line.label),
                day = escape(day),
            );
        }
        let last = line.points.last();
        let summary = last.map_or(String::new(), |&(i, rate, ci, count)| {
            format!(
                " — at {}: {}",
                days.get(i).map_or("", String::as_str),
                figures(rate, ci, count)
            )
        });
        let ly = TOP + HEIGHT + 36.0 + 18.0 * l as f64;
        let _ = write!(
            svg,
            r#"<g class="legend"><rect x="{LEFT}" y="{ry:.1}" width="12" height="12" fill="{colour}"/><text x="{tx}" y="{ly:.1}">{}{}</text></g>"#,
            escape(&shorten_to(&line.label, 60)),
            escape(&summary),
            ry = ly - 10.0,
            tx = LEFT + 18.0,
        );
    }
    svg.push_str("</svg>");
    svg
}

/// `rate [low, high] · n count`; the interval is left out where it is a point (a curve without
/// one) and the count where it is not positive.
fn figures(rate: f64, ci: [f64; 2], count: i64) -> String {
    let mut text = percent(rate);
    if ci[0] < ci[1] {
        let _ = write!(text, " [{}, {}]", percent(ci[0]), percent(ci[1]));
    }
    if count > 0 {
        let _ = write!(text, " · n {count}");
    }
    text
}

/// `12.3 %` (one decimal).
pub fn percent(rate: f64) -> String {
    format!("{:.1} %", 100.0 * rate)
}

fn open(title: &str, width: f64, height: f64) -> String {
    format!(
        r#"<svg xmlns="http://www.w3.org/2000/svg" class="chart" role="img" width="{width}" height="{height}" viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="12"><title>{t}</title><text x="8" y="18" font-size="14" font-weight="bold" class="chart-title">{t}</text>"#,
        t = escape(title)
    )
}

fn no_data(svg: &mut String, y: f64) {
    let _ = write!(
        svg,
        r##"<text x="240" y="{y}" fill="#777" class="no-data">no data in this period</text>"##
    );
}

fn shorten(label: &str) -> String {
    shorten_to(label, LABEL_CHARS)
}

fn shorten_to(label: &str, chars: usize) -> String {
    if label.chars().count() <= chars {
        label.to_owned()
    } else {
        let cut: String = label.chars().take(chars.saturating_sub(1)).collect();
        format!("{cut}…")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bars_label_rate_interval_and_count_and_escape_keys() {
        let svg = bar_chart(
            "By <type>",
            &[Bar {
                label: "model:v1 & <b>".to_owned(),
                rate: 0.5,
                ci95: [0.25, 0.75],
                count: 8,
            }],
            "shown",
        );
        assert!(svg.contains("50.0 % [25.0 %, 75.0 %] · n 8 shown"), "{svg}");
        assert!(svg.contains("model:v1 &amp; &lt;b&gt;"), "{svg}");
        assert!(!svg.contains("<b>"), "{svg}");
        assert!(
            svg.contains(r#"width="150.0""#),
            "half of the 300-px scale: {svg}"
        );
        assert!(svg.starts_with("<svg") && svg.ends_with("</svg>"));
    }

    #[test]
    fn an_empty_chart_says_so() {
        assert!(bar_chart("t", &[], "shown").contains("no data"));
        assert!(line_chart("t", &[], &[]).contains("no data"));
    }

    #[test]
    fn lines_place_points_by_day_and_rate_with_a_band() {
        let days = vec!["2026-06-01".to_owned(), "2026-06-02".to_owned()];
        let svg = line_chart(
            "over time",
            &days,
            &[Line {
                label: "policy-1".to_owned(),
                points: vec![(0, 1.0, [0.5, 1.0], 4), (1, 0.0, [0.0, 0.5], 2)],
            }],
        );
        // Rate 1 at the top (y = 34), rate 0 at the bottom (y = 254); first day left, last right.
        assert!(svg.contains(r#"cx="60.0" cy="34.0""#), "{svg}");
        assert!(svg.contains(r#"cx="700.0" cy="254.0""#), "{svg}");
        assert!(svg.contains("<polygon"), "{svg}");
        assert!(
            svg.contains("at 2026-06-02: 0.0 % [0.0 %, 50.0 %] · n 2"),
            "{svg}"
        );
    }

    #[test]
    fn long_labels_are_cut_but_kept_whole_in_the_title() {
        let label = "x".repeat(80);
        let svg = bar_chart(
            "t",
            &[Bar {
                label: label.clone(),
                rate: 0.1,
                ci95: [0.0, 0.2],
                count: 1,
            }],
            "shown",
        );
        assert!(svg.contains(&format!("<title>{label}:")));
        assert!(svg.contains(&format!("{}…", "x".repeat(LABEL_CHARS - 1))));
    }
}
