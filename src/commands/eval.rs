//! `arc-rec eval`: a run's base, warm-up and RL models side by side on the held-out (validation)
//! prompts of its data: pass@k and maj@k for k = 1..n, format validity, and with the world grader
//! the true acceptance of the greedy recommendation and of the best of k, between the floors and
//! the ceiling of [`crate::training::baselines`] on the same prompts (logged heuristic, random
//! pick from the menu, menu oracle) with the share of the gap to the oracle each model closes,
//! and for a learned-grader run the truth of what its learned grader picks among k samples.
//! Prints a table (or JSON, with every prompt's figures) and writes `RUN_DIR/eval.json` and
//! `RUN_DIR/eval.png`.

use std::io::IsTerminal;
use std::path::PathBuf;

use anyhow::{Context, bail};
use clap::Args;
use serde::Serialize;

use crate::export::Split;
use crate::plot::{Panel, Series, write_png};
use crate::rft::GraderKind;
use crate::training::baselines::{Baselines, baselines};
use crate::training::evaluation::{
    EvalSettings, ModelReport, RunModel, evaluate, fill_gap_closed, gap_k, gap_reference,
    load_run_model, run_models,
};
use crate::training::rollout::tokenize_prompts;
use crate::training::run_dir::{read_run_data, read_settings, run_grader, write_atomically};
use crate::training::{Constrained, DeviceChoice};

/// Where `eval` writes its figures inside the run directory.
pub const EVAL_JSON_FILE: &str = "eval.json";
/// Where `eval` draws pass@k against k.
pub const EVAL_PLOT_FILE: &str = "eval.png";

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

/// What `eval.json` holds.
#[derive(Debug, Serialize)]
struct EvalReport {
    run: PathBuf,
    data: PathBuf,
    split: &'static str,
    grader: GraderKind,
    n: usize,
    /// The run's k (the table's pass@k and maj@k column).
    k: usize,
    temperature: f64,
    seed: u64,
    models: Vec<ModelReport>,
    /// World grader: the logged heuristic, a random pick from the menu and the menu oracle on
    /// the same prompts (`null` with the logged grader: it knows no true acceptance).
    baselines: Option<Baselines>,
}

/// Runs `arc-rec eval`.
pub fn run(args: &EvalArgs) -> anyhow::Result<()> {
    if args.n == 0 {
        bail!("--n must be at least 1");
    }
    if !(args.temperature.is_finite() && args.temperature > 0.0) {
        bail!(
            "--temperature must be positive (the greedy completion is evaluated separately), got {}",
            args.temperature
        );
    }
    if args.batch_prompts == 0 {
        bail!("--batch-prompts must be at least 1");
    }
    let settings = read_settings(&args.run, "--run")?;
    let dataset = read_run_data(&args.run, &settings)?;
    let mut held_out = dataset.split(Split::Validation);
    if held_out.is_empty() {
        bail!(
            "{}: no validation prompt to evaluate on ({} prompts, all in train); export with a validation share",
            settings.data.display(),
            dataset.prompts.len()
        );
    }
    if let Some(max) = args.max_prompts {
        if max == 0 {
            bail!("--max-prompts must be at least 1");
        }
        held_out.truncate(max);
    }
    let grader_kind = args.grader.unwrap_or(settings.grader);
    let grader = run_grader(
        &args.run,
        "--run",
        &settings,
        &dataset,
        grader_kind,
        held_out.iter().copied(),
    )?;
    // Before any model loads, so a world that does not match the data fails fast; judged with
    // the grader's own world truths.
    let baselines = grader
        .world_truths()
        .map(|truths| baselines(truths, &held_out))
        .transpose()
        .context("the evaluation's baselines")?;
    // A learned-grader run judged by the world: its reward model also ranks each prompt's
    // samples, to measure it as a chooser against the truth (`learned_pick_of`).
    let reward_model = (grader_kind == GraderKind::World && settings.grader == GraderKind::Learned)
        .then(|| {
            run_grader(
                &args.run,
                "--run",
                &settings,
                &dataset,
                GraderKind::Learned,
                held_out.iter().copied(),
            )
        })
        .transpose()
        .context("the run's learned grader, to rank the samples beside the world's verdicts")?;
    let runtime = trainer::device::Runtime::select(args.device.request())?;
    let eval_settings = EvalSettings {
        n: args.n,
        max_new_tokens: settings.max_new_tokens,
        temperature: args.temperature,
        seed: args.seed,
        batch_prompts: args.batch_prompts,
        constrained: args.constrained.is_on(),
        keep_samples: args.samples_out.is_some(),
        reward_model: reward_model.as_ref(),
    };
    let mut models = run_models(&settings, &args.run);
    if !args.models.is_empty() {
        if let Some(missing) = args
            .models
            .iter()
            .find(|wanted| !models.iter().any(|(m, _)| m == *wanted))
        {
            bail!(
                "--models: run {} has no {} model (it has {})",
                args.run.display(),
                missing.label(),
                models
                    .iter()
                    .map(|(m, _)| m.label())
                    .collect::<Vec<_>>()
                    .join(", ")
            );
        }
        models.retain(|(m, _)| args.models.contains(m));
    }
    if !args.json {
        println!(
            "evaluating {} of run {} on {} held-out prompts of {} (n = {}, grader {}) on {}",
            models
                .iter()
                .map(|(m, _)| m.label())
                .collect::<Vec<_>>()
                .join(", "),
            args.run.display(),
            held_out.len(),
            settings.data.display(),
            args.n,
            grader_kind.as_str(),
            runtime.describe()
        );
    }
    let mut reports = Vec::with_capacity(models.len());
    for (which, path) in models {
        let policy = load_run_model(which, &settings, &args.run, runtime)?;
        let prompts = tokenize_prompts(&policy, &dataset, &held_out)?;
        let bar = (std::io::stderr().is_terminal() && !args.json)
            .then(|| crate::progress::bar(prompts.len() as u64, which.label(), false));
        let report = evaluate(
            which,
            &path,
            &policy,
            &prompts,
            &grader,
            eval_settings,
            &mut |done| {
                if let Some(bar) = &bar {
                    bar.set_position(done as u64);
                }
            },
        )
        .with_context(|| format!("evaluating the {} model", which.label()))?;
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
    let evaluated: Vec<RunModel> = reports.iter().map(|r| r.model).collect();
    if let (Some(baselines), Some(reference)) =
        (&baselines, gap_reference(settings.sft_steps, &evaluated))
    {
        fill_gap_closed(&mut reports, reference, baselines.menu_oracle);
    }
    let report = EvalReport {
        run: args.run.clone(),
        data: settings.data.clone(),
        split: "validation",
        grader: grader_kind,
        n: args.n,
        k: settings.k.min(args.n),
        temperature: args.temperature,
        seed: args.seed,
        models: reports,
        baselines,
    };
    let text = serde_json::to_string_pretty(&report)?;
    let json_path = args.run.join(EVAL_JSON_FILE);
    write_atomically(&json_path, text.as_bytes())?;
    let plot_path = args.run.join(EVAL_PLOT_FILE);
    write_png(&plot_path, &panels(&report), 3)?;
    if let Some(path) = &args.samples_out {
        let mut lines = Vec::new();
        for sample in report.models.iter().flat_map(|m| &m.samples) {
            serde_json::to_writer(&mut lines, sample)?;
            lines.push(b'\n');
        }
        write_atomically(path, &lines)
            .with_context(|| format!("--samples-out {}", path.display()))?;
    }
    if args.json {
        println!("{text}");
    } else {
        print_table(&report);
        println!(
            "figures in {}, plot in {}",
            json_path.display(),
            plot_path.display()
        );
    }
    Ok(())
}

fn print_table(report: &EvalReport) {
    let k = report.k;
    let n = report.n;
    let gap_k = gap_k(n);
    let world = report.grader == GraderKind::World;
    let pass = |values: &[f64], k: usize| values.get(k - 1).copied().unwrap_or(f64::NAN);
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
            pass(&model.pass_at, 1),
            pass(&model.pass_at, k),
            pass(&model.pass_at, n),
            pass(&model.maj_at, k),
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
                    .map_or(f64::NAN, |best| pass(best, k)),
                model.reliability_gain.unwrap_or(f64::NAN),
                gap_top,
                gap_best,
            ));
        }
        println!("{line}");
    }
    if let Some(baselines) = &report.baselines {
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
    for model in &report.models {
        let (Some(picks), Some(best)) = (&model.learned_pick_of, &model.best_of) else {
            continue;
        };
        let (sample, pick, best) = (pass(picks, 1), pass(picks, k), pass(best, k));
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

fn panels(report: &EvalReport) -> Vec<Panel> {
    let curve = |values: &[f64]| {
        values
            .iter()
            .enumerate()
            .map(|(i, &v)| ((i + 1) as f64, v))
            .collect::<Vec<_>>()
    };
    let panel =
        |title: &str, y_label: &str, value: &dyn Fn(&ModelReport) -> Option<Vec<f64>>| Panel {
            title: title.to_owned(),
            x_label: "k".to_owned(),
            y_label: y_label.to_owned(),
            series: report
                .models
                .iter()
                .filter_map(|m| {
                    value(m).map(|values| Series {
                        name: m.model.label().to_owned(),
                        points: curve(&values),
                    })
                })
                .collect(),
        };
    let mut panels = vec![
        panel("pass@k (held out)", "accepted", &|m| {
            Some(m.pass_at.clone())
        }),
        panel("maj@k (held out)", "accepted", &|m| Some(m.maj_at.clone())),
    ];
    if report.grader == GraderKind::World {
        let mut best_of = panel("True acceptance of the best of k", "probability", &|m| {
            m.best_of.clone()
        });
        // What the run's learned grader picks among k, beside the truth's best of k.
        for model in &report.models {
            if let Some(picks) = &model.learned_pick_of {
                best_of.series.push(Series {
                    name: format!("{}: learned grader's pick", model.model.label()),
                    points: curve(picks),
                });
            }
        }
        // The floors and the ceiling, one pick each: flat across k.
        if let Some(baselines) = &report.baselines {
            let flat = |name: &str, value: f64| Series {
                name: name.to_owned(),
                points: vec![(1.0, value), (report.n.max(1) as f64, value)],
            };
            best_of
                .series
                .push(flat("menu oracle", baselines.menu_oracle));
            if let Some(logged) = baselines.logged_heuristic {
                best_of.series.push(flat("logged heuristic", logged));
            }
            best_of
                .series
                .push(flat("random from menu", baselines.random_from_menu));
        }
        panels.push(best_of);
    }
    panels
}
