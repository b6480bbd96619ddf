//! `arc-rec eval`: a run's base, warm-up and RL models side by side on the held-out prompts of
//! its data (the test split; the validation split for an export without one): pass@k and maj@k
//! for k = 1..n, format validity, and with the world grader the true acceptance of the greedy
//! recommendation and of the best of k, between the floors and
//! the ceiling of [`crate::training::baselines`] on the same prompts (logged heuristic, random
//! pick from the menu, menu oracle) with the share of the gap to the oracle each model closes,
//! and for a learned-grader run the truth of what its learned grader picks among k samples.
//! Prints a table (or JSON, with every prompt's figures) and writes `RUN_DIR/eval.json` and
//! `RUN_DIR/eval.png`.

use std::io::IsTerminal;
use std::path::PathBuf;

use anyhow::bail;
use clap::Args;

use crate::export::Split;
use crate::rft::GraderKind;
use crate::training::baselines::Baselines;
use crate::training::eval_run::{EvalReport, EvalRun, write_report};
use crate::training::evaluation::{EvalSettings, RunModel, gap_k};
use crate::training::{Constrained, DeviceChoice};

/// Arguments of `arc-rec eval`.
#[derive(Debug, Args)]
pub struct EvalArgs {
    /// The run directory `arc-rec train` wrote (its config.json names the data and base model).
    #[arg(long, value_name = "RUN_DIR")]
    pub run: PathBuf,
    /// Samples per held-out prompt: pass@k and maj@k are reported for k = 1..n.
    #[arg(long, default_value_t = 16)]
    pub n: usize,
    /// Where verdicts come from; the run's grader by default.
    #[arg(long, value_enum)]
    pub grader: Option<GraderKind>,
    /// Which of the run's models to evaluate, comma-separated (all it has by default). An RL run
    /// started from another run's warm-up model has that model as its base.
    #[arg(long, value_enum, value_delimiter = ',')]
    pub models: Vec<RunModel>,
    /// Evaluate the first this many held-out prompts only (all by default).
    #[arg(long)]
    pub max_prompts: Option<usize>,
    /// Sampling temperature of the n samples (the greedy completion is always temperature 0).
    #[arg(long, default_value_t = 1.0)]
    pub temperature: f64,
    /// Seeds the samples and the world's acceptance draws.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Prompts per generation batch (memory against speed).
    #[arg(long, default_value_t = 8)]
    pub batch_prompts: usize,
    /// Draw every completion (sampled and greedy) under the recommendation's JSON grammar, as
    /// `train` and `candidates` do by default; `off` measures the model's unconstrained validity.
    #[arg(long, value_enum, default_value_t = Constrained::On)]
    pub constrained: Constrained,
    /// Also write every graded completion (each model's samples and greedy completion, with the
    /// prompt id, the draw key and the reward) to this JSON-lines file: what an outside grader
    /// (`arc-rec grade serve`, verl's `compute_score`) is checked against.
    #[arg(long, value_name = "FILE")]
    pub samples_out: Option<PathBuf>,
    /// Print the figures as JSON instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Where to run: CUDA (bf16) when available, or the CPU (f32).
    #[arg(long, value_enum, default_value_t = DeviceChoice::Auto)]
    pub device: DeviceChoice,
}

/// Runs `arc-rec eval`.
pub fn run(args: &EvalArgs) -> anyhow::Result<()> {
    args.validate()?;
    let run = EvalRun::open(&args.run)?;
    let held_out = run.held_out(args.max_prompts)?;
    let split = run.dataset.reported_split();
    if split == Split::Validation && !args.json {
        println!(
            "note: {} has no test split (exported before `export --test-percent` existed): reporting on validation, which checkpoint selection may have looked at",
            run.settings.data.display()
        );
    }
    let grader_kind = args.grader.unwrap_or(run.settings.grader);
    let grader = run.grader(grader_kind, &held_out)?;
    let baselines = run.baselines(&grader, &held_out)?;
    let reward_model = run.reward_model(grader_kind, &held_out)?;
    let runtime = trainer::device::Runtime::select(args.device.request())?;
    let catalogues = run.dataset.catalogues();
    let settings = EvalSettings {
        catalogues: &catalogues,
        n: args.n,
        max_new_tokens: run.settings.max_new_tokens,
        temperature: args.temperature,
        seed: args.seed,
        batch_prompts: args.batch_prompts,
        constrained: args.constrained.is_on(),
        keep_samples: args.samples_out.is_some(),
        reward_model: reward_model.as_ref(),
    };
    let models = run.models(&args.models)?;
    if !args.json {
        let labels: Vec<&str> = models.iter().map(|(m, _)| m.label()).collect();
        announce(
            args,
            &labels,
            held_out.len(),
            split,
            &run,
            grader_kind,
            runtime,
        );
    }
    let mut reports = Vec::with_capacity(models.len());
    for (which, path) in &models {
        let bar = (std::io::stderr().is_terminal() && !args.json)
            .then(|| crate::progress::bar(held_out.len() as u64, which.label(), false));
        let report = run.evaluate_model(
            (*which, path),
            &held_out,
            &grader,
            runtime,
            settings,
            &mut |done| {
                if let Some(bar) = &bar {
                    bar.set_position(done as u64);
                }
            },
        )?;
        if let Some(bar) = bar {
            bar.finish_and_clear();
        }
        if !args.json {
            println!(
                "{}: {:.0} s, {:.0} tokens/s",
                which.label(),
                report.seconds,
                report.new_tokens as f64 / report.seconds.max(1e-9)
            );
        }
        reports.push(report);
    }
    let report = run.report(grader_kind, settings, reports, baselines);
    let written = write_report(&report, args.samples_out.as_deref())?;
    if args.json {
        println!("{}", written.json);
    } else {
        print_table(&report);
        println!(
            "figures in {}, plot in {}",
            written.json_path.display(),
            written.plot_path.display()
        );
    }
    Ok(())
}

/// The line that says what is about to be evaluated.
fn announce(
    args: &EvalArgs,
    models: &[&str],
    prompts: usize,
    split: Split,
    run: &EvalRun,
    grader: GraderKind,
    runtime: trainer::device::Runtime,
) {
    println!(
        "evaluating {} of run {} on {prompts} {} prompts of {} (n = {}, grader {}) on {}",
        models.join(", "),
        args.run.display(),
        split.name(),
        run.settings.data.display(),
        args.n,
        grader.as_str(),
        runtime.describe()
    );
}

impl EvalArgs {
    fn validate(&self) -> anyhow::Result<()> {
        if self.n == 0 {
            bail!("--n must be at least 1");
        }
        if !(self.temperature.is_finite() && self.temperature > 0.0) {
            bail!(
                "--temperature must be positive (the greedy completion is evaluated separately), got {}",
                self.temperature
            );
        }
        if self.batch_prompts == 0 {
            bail!("--batch-prompts must be at least 1");
        }
        Ok(())
    }
}

fn print_table(report: &EvalReport) {
    let reference = print_models(report);
    if let Some(baselines) = &report.baselines {
        print_baselines(baselines);
    }
    print_legend(report, reference);
    print_learned_picks(report);
    print_criterion(report);
    print_format_errors(report);
}

/// Each model's world-free checkpoint criterion on the validation split, beside the truth above.
fn print_criterion(report: &EvalReport) {
    for model in &report.models {
        if let Some(criterion) = &model.held_out_criterion {
            let margin = criterion
                .logprob_margin
                .map(|m| format!("log-probability margin over the warm-up {m:+.3}, "))
                .unwrap_or_default();
            println!(
                "{}: held-out criterion (validation, no world): {margin}menu acceptance {:.3}, pair accuracy {:.3} on {} contexts",
                model.model.label(),
                criterion.menu_acceptance,
                criterion.pair_accuracy,
                criterion.contexts
            );
        }
    }
}

/// The figure at k (1-based) of a curve over k; NaN past its end.
fn at_k(values: &[f64], k: usize) -> f64 {
    values.get(k - 1).copied().unwrap_or(f64::NAN)
}

/// The header and one row per model; returns the model the gap shares are measured from.
fn print_models(report: &EvalReport) -> Option<RunModel> {
    let k = report.k;
    let n = report.n;
    let gap_k = gap_k(n);
    let world = report.grader == GraderKind::World;
    let mut header = format!(
        "{:<8} {:>6} {:>7} {:>7} {:>7} {:>7} {:>8} {:>8}",
        "model",
        "valid",
        "pass@1",
        format!("pass@{k}"),
        format!("pass@{n}"),
        format!("maj@{k}"),
        "greedy✓",
        "greedy ok"
    );
    if world {
        header.push_str(&format!(
            " {:>10} {:>9} {:>10} {:>8} {:>8}",
            "P(acc) top",
            format!("P(acc) b{k}"),
            "Δ reliab.",
            "gap top",
            format!("gap b{gap_k}")
        ));
    }
    println!("{header}");
    let reference = report
        .models
        .iter()
        .find_map(|m| m.gap_closed.as_ref().map(|g| g.reference));
    let share =
        |value: Option<f64>| value.map_or("-".to_owned(), |v| format!("{:+.1}%", 100.0 * v));
    for model in &report.models {
        let mut line = format!(
            "{:<8} {:>6.3} {:>7.3} {:>7.3} {:>7.3} {:>7.3} {:>8.3} {:>8.3}",
            model.model.label(),
            model.format_validity,
            at_k(&model.pass_at, 1),
            at_k(&model.pass_at, k),
            at_k(&model.pass_at, n),
            at_k(&model.maj_at, k),
            model.greedy.format_validity,
            model.greedy.accepted,
        );
        if world {
            let (gap_top, gap_best) = match &model.gap_closed {
                Some(gap) => (share(gap.greedy), share(gap.best_of)),
                None if reference == Some(model.model) => ("ref".to_owned(), "ref".to_owned()),
                None => ("-".to_owned(), "-".to_owned()),
            };
            line.push_str(&format!(
                " {:>10.3} {:>9.3} {:>+10.4} {:>8} {:>8}",
                model.greedy.acceptance_probability.unwrap_or(f64::NAN),
                model
                    .best_of
                    .as_deref()
                    .map_or(f64::NAN, |best| at_k(best, k)),
                model.reliability_gain.unwrap_or(f64::NAN),
                gap_top,
                gap_best,
            ));
        }
        println!("{line}");
    }
    reference
}

fn print_baselines(baselines: &Baselines) {
    let dash = "-";
    let rows = [
        ("logged", baselines.logged_heuristic, None),
        ("random", Some(baselines.random_from_menu), None),
        (
            "oracle",
            Some(baselines.menu_oracle),
            Some(baselines.menu_oracle),
        ),
    ];
    for (name, one_pick, best_of) in rows {
        let figure = |value: Option<f64>, width: usize| {
            value.map_or(format!("{dash:>width$}"), |v| format!("{v:>width$.3}"))
        };
        println!(
            "{name:<8} {dash:>6} {dash:>7} {dash:>7} {dash:>7} {dash:>7} {dash:>8} {dash:>8} {} {} {dash:>10} {dash:>8} {dash:>8}",
            figure(one_pick, 10),
            figure(best_of, 9),
        );
    }
}

fn print_legend(report: &EvalReport, reference: Option<RunModel>) {
    let gap_k = gap_k(report.n);
    let world = report.grader == GraderKind::World;
    println!(
        "valid: well-formed samples; pass@k / maj@k: accepted; greedy✓ / greedy ok: the temperature-0 answer well formed / accepted{}",
        if world {
            "; P(acc) top: its true acceptance probability; P(acc) bk: expected true acceptance of the best of k samples; Δ reliab.: mean true reliability gain of a sample"
        } else {
            ""
        }
    );
    if let Some(baselines) = &report.baselines {
        println!(
            "menu: the world's candidate fixes for each prompt's context plus its logged diffs ({:.1} distinct answers on average); \
             logged: the platform's proposals there, weighted by how often each was proposed; random: a uniform pick from the menu; \
             oracle: the menu's best",
            baselines.mean_menu_size
        );
        if let Some(reference) = reference {
            println!(
                "gap top / gap b{gap_k}: the share of the gap from the {} model to the oracle closed, by the greedy answer / the best of {gap_k} samples",
                reference.label()
            );
        }
    }
}

/// What the run's learned grader picks among k samples, against the truth.
fn print_learned_picks(report: &EvalReport) {
    let k = report.k;
    for model in &report.models {
        let (Some(picks), Some(best)) = (&model.learned_pick_of, &model.best_of) else {
            continue;
        };
        let (sample, pick, best) = (at_k(picks, 1), at_k(picks, k), at_k(best, k));
        let recovered = if best > sample {
            format!("{:.0}%", 100.0 * (pick - sample) / (best - sample))
        } else {
            "-".to_owned()
        };
        println!(
            "{}: the learned grader's pick of {k} samples has true acceptance {pick:.3} (a sample {sample:.3}, the truth's best of {k} {best:.3}: it recovers {recovered} of the gain)",
            model.model.label()
        );
    }
}

fn print_format_errors(report: &EvalReport) {
    for model in &report.models {
        if !model.format_errors.is_empty() {
            let reasons: Vec<String> = model
                .format_errors
                .iter()
                .map(|(reason, count)| format!("{reason} {count}"))
                .collect();
            println!(
                "{}: malformed samples by reason: {}",
                model.model.label(),
                reasons.join(", ")
            );
            for (reason, message) in &model.format_error_examples {
                println!("  first {reason}: {message}");
            }
        }
    }
}
