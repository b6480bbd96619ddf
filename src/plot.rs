//! PNG line charts for reports (training curves, pass@k against k, the paper's bandit), drawn
//! with plotters and the DejaVu Sans that the `dejavu` crate embeds, so no system font is needed.
//! A chart is written to a temporary file beside its path and renamed when complete.

use std::path::{Path, PathBuf};
use std::sync::Once;

use plotters::prelude::*;

/// One line of a panel.
#[derive(Debug, Clone)]
pub struct Series {
    pub name: String,
    pub points: Vec<(f64, f64)>,
}

/// One chart of a figure.
#[derive(Debug, Clone)]
pub struct Panel {
    pub title: String,
    pub x_label: String,
    pub y_label: String,
    pub series: Vec<Series>,
}

/// A chart could not be written.
#[derive(Debug, thiserror::Error)]
#[error("cannot write the chart {}: {message}", path.display())]
pub struct PlotError {
    pub path: PathBuf,
    pub message: String,
}

const PANEL_WIDTH: u32 = 640;
const PANEL_HEIGHT: u32 = 440;
const FONT: &str = "sans-serif";

/// Distinguishable line colours (Tableau 10), one per series in order.
const PALETTE: [RGBColor; 8] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
];

fn register_fonts() {
    static FONTS: Once = Once::new();
    FONTS.call_once(|| {
        // The embedded font always parses; were it not to, text would be missing, not the chart.
        let _ = plotters::style::register_font(FONT, FontStyle::Normal, dejavu::sans::regular());
        let _ = plotters::style::register_font(FONT, FontStyle::Bold, dejavu::sans::bold());
    });
}

/// Draws `panels` in a grid `columns` wide into the PNG file `path` (its directory is created).
pub fn write_png(path: &Path, panels: &[Panel], columns: usize) -> Result<(), PlotError> {
    write_atomically(path, |partial| draw(partial, panels, columns.max(1)))
}

/// Creates `path`'s directory, has `draw` write a temporary file beside it and renames that
/// into place, so a reader never sees half a chart.
fn write_atomically(
    path: &Path,
    draw: impl FnOnce(&Path) -> Result<(), String>,
) -> Result<(), PlotError> {
    let fail = |message: String| PlotError {
        path: path.to_owned(),
        message,
    };
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|e| fail(e.to_string()))?;
    }
    let name = path
        .file_name()
        .ok_or_else(|| fail("the path names no file".to_owned()))?;
    // The encoder picks the format from the extension, so the temporary name keeps `.png`.
    let partial = path.with_file_name(format!(".{}.partial.png", name.to_string_lossy()));
    draw(&partial).map_err(|e| {
        let _ = std::fs::remove_file(&partial);
        fail(e)
    })?;
    std::fs::rename(&partial, path).map_err(|e| fail(e.to_string()))
}

fn draw(path: &Path, panels: &[Panel], columns: usize) -> Result<(), String> {
    register_fonts();
    let columns = columns.min(panels.len().max(1));
    let rows = panels.len().div_ceil(columns).max(1);
    let size = (PANEL_WIDTH * columns as u32, PANEL_HEIGHT * rows as u32);
    let root = BitMapBackend::new(path, size).into_drawing_area();
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    let areas = root.split_evenly((rows, columns));
    for (panel, area) in panels.iter().zip(&areas) {
        draw_panel(panel, area)?;
    }
    root.present().map_err(|e| e.to_string())
}

fn draw_panel(
    panel: &Panel,
    area: &DrawingArea<BitMapBackend<'_>, plotters::coord::Shift>,
) -> Result<(), String> {
    let (x_range, y_range) = ranges(panel);
    let mut chart = ChartBuilder::on(area)
        .caption(&panel.title, (FONT, 18))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(56)
        .build_cartesian_2d(x_range, y_range)
        .map_err(|e| e.to_string())?;
    chart
        .configure_mesh()
        .x_desc(&panel.x_label)
        .y_desc(&panel.y_label)
        .label_style((FONT, 13))
        .x_label_formatter(&|v| tick(*v))
        .y_label_formatter(&|v| tick(*v))
        .axis_desc_style((FONT, 14))
        .light_line_style(RGBColor(235, 235, 235))
        .draw()
        .map_err(|e| e.to_string())?;
    for (series, colour) in panel.series.iter().zip(PALETTE.iter().cycle()) {
        let points: Vec<(f64, f64)> = series
            .points
            .iter()
            .copied()
            .filter(|(x, y)| x.is_finite() && y.is_finite())
            .collect();
        let style = colour.stroke_width(2);
        chart
            .draw_series(LineSeries::new(points.clone(), style))
            .map_err(|e| e.to_string())?
            .label(series.name.clone())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], style));
        if points.len() <= 32 {
            chart
                .draw_series(points.iter().map(|&p| Circle::new(p, 3, colour.filled())))
                .map_err(|e| e.to_string())?;
        }
    }
    if panel.series.iter().any(|s| !s.name.is_empty()) {
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.85))
            .border_style(RGBColor(200, 200, 200))
            .label_font((FONT, 13))
            .position(SeriesLabelPosition::LowerRight)
            .draw()
            .map_err(|e| e.to_string())?;
    }
    Ok(())
}

/// An axis label: whole numbers without decimals, others with as few as show the step.
fn tick(value: f64) -> String {
    if value.fract().abs() < 1e-9 && value.abs() < 1e15 {
        format!("{value:.0}")
    } else if value.abs() >= 10.0 {
        format!("{value:.1}")
    } else {
        let text = format!("{value:.3}");
        text.trim_end_matches('0').to_owned()
    }
}

/// The finite data's extent, padded by 5% in y (and widened when flat).
fn ranges(panel: &Panel) -> (std::ops::Range<f64>, std::ops::Range<f64>) {
    let finite = || {
        panel
            .series
            .iter()
            .flat_map(|s| s.points.iter().copied())
            .filter(|(x, y)| x.is_finite() && y.is_finite())
    };
    let extent = |values: &mut dyn Iterator<Item = f64>| {
        values.fold(None, |acc: Option<(f64, f64)>, v| {
            Some(acc.map_or((v, v), |(lo, hi)| (lo.min(v), hi.max(v))))
        })
    };
    let widen = |(lo, hi): (f64, f64), pad: f64| {
        if hi - lo < 1e-12 {
            (lo - 0.5, hi + 0.5)
        } else {
            let margin = (hi - lo) * pad;
            (lo - margin, hi + margin)
        }
    };
    let (x0, x1) = widen(
        extent(&mut finite().map(|p| p.0)).unwrap_or((0.0, 1.0)),
        0.0,
    );
    let (y0, y1) = widen(
        extent(&mut finite().map(|p| p.1)).unwrap_or((0.0, 1.0)),
        0.05,
    );
    (x0..x1, y0..y1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_a_png_and_leaves_no_partial_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("charts/curves.png");
        let panel = Panel {
            title: "reward".into(),
            x_label: "step".into(),
            y_label: "mean".into(),
            series: vec![
                Series {
                    name: "a".into(),
                    points: vec![(0.0, 0.0), (1.0, 0.5), (2.0, f64::NAN), (3.0, 0.7)],
                },
                Series {
                    name: "flat".into(),
                    points: vec![(0.0, 0.2), (3.0, 0.2)],
                },
            ],
        };
        write_png(&path, &[panel.clone(), panel], 2).unwrap();
        let bytes = std::fs::read(&path).unwrap();
        assert_eq!(&bytes[1..4], b"PNG");
        let names: Vec<_> = std::fs::read_dir(path.parent().unwrap())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, vec![std::ffi::OsString::from("curves.png")]);
    }

    #[test]
    fn an_unwritable_path_is_an_error_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let blocker = dir.path().join("file");
        std::fs::write(&blocker, "x").unwrap();
        let err = write_png(&blocker.join("chart.png"), &[], 1).unwrap_err();
        assert!(err.to_string().contains("chart.png"), "{err}");
    }
}

/// One row of an interval chart: a label, an estimate and its interval.
#[derive(Debug, Clone, PartialEq)]
pub struct IntervalRow {
    pub label: String,
    pub estimate: f64,
    pub low: f64,
    pub high: f64,
}

/// Draws `rows` as points with horizontal interval whiskers, one row each, top to bottom, on an
/// x axis from 0 to 1, into the PNG file `path` (its directory is created).
pub fn write_interval_png(
    path: &Path,
    title: &str,
    x_label: &str,
    rows: &[IntervalRow],
) -> Result<(), PlotError> {
    write_atomically(path, |partial| {
        draw_intervals(partial, title, x_label, rows)
    })
}

fn draw_intervals(
    path: &Path,
    title: &str,
    x_label: &str,
    rows: &[IntervalRow],
) -> Result<(), String> {
    register_fonts();
    let n = rows.len().max(1);
    let height = 110 + 26 * n as u32;
    let root = BitMapBackend::new(path, (PANEL_WIDTH + 260, height)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    // Row i is drawn at y = n − 1 − i so the first row is on top.
    let y_of = |i: usize| (n - 1 - i) as f64;
    let labels: Vec<String> = rows
        .iter()
        .map(|r| {
            let mut label: String = r.label.chars().take(36).collect();
            if r.label.chars().count() > 36 {
                label.push('…');
            }
            label
        })
        .collect();
    let mut chart = ChartBuilder::on(&root)
        .caption(title, (FONT, 18))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(250)
        .build_cartesian_2d(0f64..1f64, -0.5f64..(n as f64 - 0.5))
        .map_err(|e| e.to_string())?;
    chart
        .configure_mesh()
        .x_desc(x_label)
        .label_style((FONT, 13))
        .axis_desc_style((FONT, 14))
        .y_labels(n)
        .y_label_formatter(&|y| {
            let row = n as f64 - 1.0 - y.round();
            if (y - y.round()).abs() > 1e-6 || row < 0.0 {
                return String::new();
            }
            labels.get(row as usize).cloned().unwrap_or_default()
        })
        .x_label_formatter(&|v| tick(*v))
        .light_line_style(RGBColor(235, 235, 235))
        .draw()
        .map_err(|e| e.to_string())?;
    let colour = PALETTE[0];
    for (i, row) in rows.iter().enumerate() {
        let y = y_of(i);
        let clamp = |v: f64| {
            if v.is_finite() {
                v.clamp(0.0, 1.0)
            } else {
                0.0
            }
        };
        chart
            .draw_series(std::iter::once(PathElement::new(
                vec![(clamp(row.low), y), (clamp(row.high), y)],
                BLACK.stroke_width(2),
            )))
            .map_err(|e| e.to_string())?;
        chart
            .draw_series(std::iter::once(Circle::new(
                (clamp(row.estimate), y),
                5,
                colour.filled(),
            )))
            .map_err(|e| e.to_string())?;
    }
    root.present().map_err(|e| e.to_string())
}
