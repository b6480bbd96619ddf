//! `arc-rec report --out DIR`: a period's acceptance, drift alarms and training runs as a
//! one-page HTML summary (`index.html`, the dashboard's sections after the drift alarms) with
//! every chart also written as SVG and PNG, from the dashboard's own figures
//! (`dashboard::Dashboard::load`).

use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::Args;

use super::analytics::ScopeArgs;
use crate::dashboard::{self, Chart, Dashboard, Filters, drift};
use crate::plot::{IntervalRow, Panel, Series};
use crate::storage::Database;
use crate::storage::analytics::{self, GroupBy};

/// `arc-rec report`.
#[derive(Debug, Args)]
pub struct ReportArgs {
    /// Directory to write `index.html` and the charts (`*.svg`, `*.png`) into; created if
    /// missing, files of an earlier report replaced.
    #[arg(long)]
    pub out: PathBuf,
    #[command(flatten)]
    pub scope: ScopeArgs,
}

/// Writes the report and prints where, with the number of drift alarms.
pub async fn run(args: &ReportArgs, database: &Database) -> anyhow::Result<()> {
    let scope = args.scope.scope()?;
    let filters = Filters {
        period: scope.period,
        cluster: args.scope.cluster.clone(),
    };
    let pool = database.pool();
    let (figures, by_day_and_cluster) = tokio::try_join!(
        Dashboard::load(pool, scope.org, filters),
        analytics::acceptance_by_day(pool, scope, GroupBy::Cluster),
    )?;
    let drift = drift::drift(&by_day_and_cluster);
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("--out: cannot create {}", args.out.display()))?;
    let mut charts: Vec<Chart> = figures.acceptance_charts().into();
    charts.extend(figures.off_policy.as_ref().map(dashboard::OffPolicy::chart));
    charts.extend(dashboard::run_curves(&figures.runs, 1));
    let mut files = Vec::new();
    for chart in &charts {
        for name in write_chart(&args.out, chart)? {
            files.push(name);
        }
    }
    let index = args.out.join("index.html");
    write_atomically(&index, &dashboard::report_page(&figures, &drift, &files))?;
    let total = figures.total();
    let alarms: Vec<&str> = drift
        .tested
        .iter()
        .filter(|c| c.alarm)
        .map(|c| c.cluster.as_str())
        .collect();
    println!(
        "wrote {} and {} chart files: {} of {} shown recommendations accepted ({:.1} %); drift alarms: {}",
        index.display(),
        files.len(),
        total.accepted,
        total.shown,
        100.0 * total.rate(),
        if alarms.is_empty() {
            format!("none among {} clusters tested", drift.tested.len())
        } else {
            alarms.join(", ")
        }
    );
    Ok(())
}

/// Writes `chart` as `STEM.svg` and `STEM.png` into `dir`; returns the file names.
fn write_chart(dir: &Path, chart: &Chart) -> anyhow::Result<Vec<String>> {
    let stem = file_stem(chart.stem());
    let svg = format!("{stem}.svg");
    write_atomically(&dir.join(&svg), &chart.svg())?;
    let png = format!("{stem}.png");
    match chart {
        Chart::Bars { title, bars, .. } => {
            let rows: Vec<IntervalRow> = bars
                .iter()
                .map(|b| IntervalRow {
                    label: format!("{} (n {})", b.label, b.count),
                    estimate: b.rate,
                    low: b.ci95[0],
                    high: b.ci95[1],
                })
                .collect();
            crate::plot::write_interval_png(&dir.join(&png), title, "rate (95 % interval)", &rows)?;
        }
        Chart::Lines {
            title, x, lines, ..
        } => {
            let panel = Panel {
                title: title.clone(),
                x_label: match (x.first(), x.last()) {
                    (Some(first), Some(last)) if first != last => {
                        format!("point (0 = {first}, {} = {last})", x.len() - 1)
                    }
                    _ => "point".to_owned(),
                },
                y_label: "rate".to_owned(),
                // Each line, then its interval's bounds as lines of their own (PNG has no bands).
                series: lines
                    .iter()
                    .flat_map(|line| {
                        let series = |name: String, pick: fn(f64, [f64; 2]) -> f64| Series {
                            name,
                            points: line
                                .points
                                .iter()
                                .map(|&(i, rate, ci, _)| (i as f64, pick(rate, ci)))
                                .collect(),
                        };
                        let banded = line.points.iter().any(|&(_, _, ci, _)| ci[0] < ci[1]);
                        let mut all = vec![series(line.label.clone(), |rate, _| rate)];
                        if banded {
                            all.push(series(format!("{} 95 % low", line.label), |_, ci| ci[0]));
                            all.push(series(format!("{} 95 % high", line.label), |_, ci| ci[1]));
                        }
                        all
                    })
                    .collect(),
            };
            crate::plot::write_png(&dir.join(&png), &[panel], 1)?;
        }
    }
    Ok(vec![svg, png])
}

/// A chart stem safe as a file name (run ids and the like keep their letters, digits, `-`, `_`).
fn file_stem(stem: &str) -> String {
    stem.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

fn write_atomically(path: &Path, text: &str) -> anyhow::Result<()> {
    let partial = path.with_extension("partial");
    std::fs::write(&partial, text)
        .and_then(|()| std::fs::rename(&partial, path))
        .with_context(|| format!("cannot write {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stems_become_plain_file_names() {
        assert_eq!(file_stem("run-rft-01a2/../x y"), "run-rft-01a2____x_y");
        assert_eq!(file_stem("acceptance-by-type"), "acceptance-by-type");
    }
}
