//! `arc-rec bench paper-bandit`: the paper's Figure 1 (Tang et al. 2025, §3.3) rerun: exact
//! mean reward, pass@k and KL of mean, pass@k and biased pass@k policy gradients on a
//! 100-armed Gaussian bandit, averaged over seeds, as tables, JSON and a PNG. No database, no
//! libtorch.

use std::path::PathBuf;

use clap::Args;
use objectives::paper_bandit::{self, BanditConfig, Curve, Findings, Point};
use serde::Serialize;

use crate::plot::{Panel, Series, write_png};

/// Arguments of `arc-rec bench paper-bandit`.
#[derive(Debug, Args)]
pub struct BenchPaperBanditArgs {
    /// Independent runs (each with its own rewards and samples) to average.
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..=100_000))]
    pub seeds: u64,
    /// The first seed (runs use FIRST_SEED .. FIRST_SEED + SEEDS).
    #[arg(long, default_value_t = 0)]
    pub first_seed: u64,
    /// Policy-gradient updates per run.
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    pub steps: u64,
    /// Samples per update, and the k of the reported pass@k.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u64).range(2..=512))]
    pub k: u64,
    /// Number of actions, each with a fixed reward drawn from N(0, 1).
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u64).range(2..=100_000))]
    pub actions: u64,
    /// Step size of the gradient ascent on the logits.
    #[arg(long, default_value_t = 1.0)]
    pub learning_rate: f64,
    /// Record the exact metrics every this many steps (the JSON and the chart).
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    pub every: u64,
    /// Rows of the printed tables every this many steps.
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    pub table_every: u64,
    /// Where to write the chart (mean reward and pass@k against steps and against KL).
    #[arg(long, default_value = "out/paper-bandit.png")]
    pub plot: PathBuf,
    /// Print one JSON object instead of tables.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Serialize)]
struct Report<'a> {
    config: &'a BanditConfig,
    curves: &'a [Curve],
    findings: &'a Findings,
    plot: String,
}

/// Runs the experiment, prints it and draws the chart.
pub fn run(args: &BenchPaperBanditArgs) -> anyhow::Result<()> {
    let config = BanditConfig {
        actions: usize::try_from(args.actions)?,
        k: usize::try_from(args.k)?,
        learning_rate: args.learning_rate,
        steps: usize::try_from(args.steps)?,
        every: usize::try_from(args.every)?,
        seeds: args.seeds,
        first_seed: args.first_seed,
    };
    let experiment = paper_bandit::run(&config).map_err(|e| anyhow::anyhow!("--{e}"))?;
    let (curves, findings) = (&experiment.curves, &experiment.findings);
    write_png(&args.plot, &panels(&experiment.dense, config.k), 2)?;
    if args.json {
        let report = Report {
            config: &config,
            curves,
            findings,
            plot: args.plot.display().to_string(),
        };
        println!("{}", serde_json::to_string(&report)?);
        return Ok(());
    }
    print_tables(
        &config,
        curves,
        findings,
        usize::try_from(args.table_every)?,
    );
    println!("chart: {}", args.plot.display());
    Ok(())
}

fn print_tables(config: &BanditConfig, curves: &[Curve], findings: &Findings, table_every: usize) {
    println!(
        "paper bandit (Tang et al. 2025, Fig. 1): {} actions with rewards ~ N(0,1), softmax policy from zero logits, k = {}, learning rate {}, {} steps, mean over {} seeds ({}..{})",
        config.actions,
        config.k,
        config.learning_rate,
        config.steps,
        config.seeds,
        config.first_seed,
        config.first_seed + config.seeds - 1
    );
    print_metric_tables(config, curves, table_every);
    print_equal_kl(config.k, curves, findings);
    print_claims(config.k, curves, findings);
}

/// A header line: `first`, then each curve's label.
fn header(first: &str, curves: &[Curve]) -> String {
    let mut line = format!("{first:>8}");
    for curve in curves {
        line.push_str(&format!(" {:>20}", curve.label));
    }
    line
}

/// One table per exact metric: every `table_every` steps (and the last), each curve's value.
fn print_metric_tables(config: &BanditConfig, curves: &[Curve], table_every: usize) {
    let k = config.k;
    type Metric = fn(&Point) -> f64;
    let metrics: [(String, Metric); 3] = [
        ("exact mean reward E_π[r]".to_owned(), |p| p.mean_reward),
        (format!("exact pass@{k} (expected max of {k} draws)"), |p| {
            p.pass_at_k
        }),
        ("KL(π ‖ π₀)".to_owned(), |p| p.kl),
    ];
    for (title, value) in &metrics {
        println!();
        println!("{title}");
        println!("{}", header("step", curves));
        for (index, point) in curves[0].points.iter().enumerate() {
            if point.step % table_every != 0 && point.step != config.steps {
                continue;
            }
            let mut line = format!("{:>8}", point.step);
            for curve in curves {
                line.push_str(&format!(" {:>20.4}", value(&curve.points[index])));
            }
            println!("{line}");
        }
    }
}

/// Each curve's pass@k at the common KL levels.
fn print_equal_kl(k: usize, curves: &[Curve], findings: &Findings) {
    println!();
    println!(
        "pass@{k} at equal KL (read off every step, interpolated between consecutive ones; - = never reached)"
    );
    println!("{}", header("KL", curves));
    for level in &findings.equal_kl {
        let mut line = format!("{:>8.2}", level.kl);
        for value in &level.pass_at_k {
            match value {
                Some(v) => line.push_str(&format!(" {v:>20.4}")),
                None => line.push_str(&format!(" {:>20}", "-")),
            }
        }
        println!("{line}");
    }
}

/// The paper's two claims, checked.
fn print_claims(k: usize, curves: &[Curve], findings: &Findings) {
    println!();
    let yes = |b: bool| if b { "yes" } else { "NO" };
    let early: Vec<String> = curves
        .iter()
        .zip(&findings.early_mean_reward)
        .map(|(c, r)| format!("{} {r:.3}", c.label))
        .collect();
    println!(
        "mean reward at step {}: {}",
        findings.early_step,
        early.join(", ")
    );
    println!(
        "claim 1, mean PG raises the mean reward fastest in the first steps: {} (fastest: {})",
        yes(findings.mean_fastest_early),
        findings.fastest_early.label()
    );
    for versus in &findings.versus_mean {
        let verdict = match versus.higher_from_kl {
            Some(kl) if versus.k_sample_higher.iter().all(|&h| h) => {
                format!("yes, at every common KL level (from {kl:.2})")
            }
            Some(kl) => format!("from KL {kl:.2} on; NO below it"),
            None => "NO, not even at the largest common KL".to_owned(),
        };
        println!(
            "claim 2, both pass@k variants reach a higher pass@{k} than {} at equal KL: {verdict}",
            versus.mean_method.label()
        );
    }
}

fn panels(curves: &[Curve], k: usize) -> Vec<Panel> {
    let series = |x: fn(&Point) -> f64, y: fn(&Point) -> f64| {
        curves
            .iter()
            .map(|c| Series {
                name: c.label.to_owned(),
                points: c.points.iter().map(|p| (x(p), y(p))).collect(),
            })
            .collect::<Vec<_>>()
    };
    let step = |p: &Point| p.step as f64;
    let kl = |p: &Point| p.kl;
    let mean = |p: &Point| p.mean_reward;
    let pass = |p: &Point| p.pass_at_k;
    let pass_label = format!("exact pass@{k}");
    vec![
        Panel {
            title: "mean reward against steps".into(),
            x_label: "step".into(),
            y_label: "exact mean reward".into(),
            series: series(step, mean),
        },
        Panel {
            title: "mean reward against KL".into(),
            x_label: "KL(π ‖ π₀)".into(),
            y_label: "exact mean reward".into(),
            series: series(kl, mean),
        },
        Panel {
            title: format!("pass@{k} against steps"),
            x_label: "step".into(),
            y_label: pass_label.clone(),
            series: series(step, pass),
        },
        Panel {
            title: format!("pass@{k} against KL"),
            x_label: "KL(π ‖ π₀)".into(),
            y_label: pass_label,
            series: series(kl, pass),
        },
    ]
}
