//! `arc-rec eval`'s library side: which of a run's held-out prompts and models are evaluated,
//! with which graders and baselines, and the report it leaves in the run directory (`eval.json`,
//! `eval.png`, optionally every graded sample).

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use serde::Serialize;

use super::baselines::{Baselines, baselines};
use super::evaluation::{
    CriterionFigures, EvalSettings, ModelReport, RunModel, evaluate, fill_gap_closed,
    gap_reference, load_run_model, run_models,
};
use super::rollout::tokenize_prompts;
use super::run_dir::{read_run_data, read_settings, run_grader, write_atomically};
use super::selection::{HeldOutMenus, SelectionPoint};
use super::settings::TrainSettings;
use crate::export::Split;
use crate::plot::{Panel, Series, write_png};
use crate::rft::{Grader, GraderKind, RftDataset, RftPrompt};
use trainer::chat_policy::ChatPolicy;

/// Where `eval` writes its figures in the run directory.
pub const EVAL_JSON_FILE: &str = "eval.json";
/// Where `eval` draws pass@k against k.
pub const EVAL_PLOT_FILE: &str = "eval.png";

/// What `eval.json` holds.
#[derive(Debug, Serialize)]
pub struct EvalReport {
    pub run: PathBuf,
    pub data: PathBuf,
    pub split: &'static str,
    pub grader: GraderKind,
    pub n: usize,
    /// The run's k (the table's pass@k and maj@k column).
    pub k: usize,
    pub temperature: f64,
    pub seed: u64,
    pub models: Vec<ModelReport>,
    /// World grader: the logged heuristic, a random pick from the menu and the menu oracle on
    /// the same prompts (`null` with the logged grader: it knows no true acceptance).
    pub baselines: Option<Baselines>,
}

/// A run's data read and its held-out prompts chosen.
#[derive(Debug)]
pub struct EvalRun {
    pub dir: PathBuf,
    pub settings: TrainSettings,
    pub dataset: RftDataset,
}

impl EvalRun {
    pub fn open(dir: &Path) -> anyhow::Result<Self> {
        let settings = read_settings(dir, "--run")?;
        let dataset = read_run_data(dir, &settings)?;
        Ok(Self {
            dir: dir.to_path_buf(),
            settings,
            dataset,
        })
    }

    /// The prompts of the split figures are reported on ([`RftDataset::reported_split`]), the
    /// first `max_prompts` of them when given.
    pub fn held_out(&self, max_prompts: Option<usize>) -> anyhow::Result<Vec<&RftPrompt>> {
        let mut held_out = self.dataset.split(self.dataset.reported_split());
        if held_out.is_empty() {
            bail!(
                "{}: no test or validation prompt to evaluate on ({} prompts, all in train); export with held-out shares (--test-percent, --validation-percent)",
                self.settings.data.display(),
                self.dataset.prompts.len()
            );
        }
        if let Some(max) = max_prompts {
            if max == 0 {
                bail!("--max-prompts must be at least 1");
            }
            held_out.truncate(max);
        }
        Ok(held_out)
    }

    /// The grader of kind `kind` over `held_out`.
    pub fn grader(&self, kind: GraderKind, held_out: &[&RftPrompt]) -> anyhow::Result<Grader> {
        run_grader(
            &self.dir,
            "--run",
            &self.settings,
            &self.dataset,
            kind,
            held_out.iter().copied(),
        )
    }

    /// The floors and ceiling on `held_out`, judged with the grader's own world truths (none
    /// without a world). Computed before any model loads, so a world that does not match the
    /// data fails fast.
    pub fn baselines(
        &self,
        grader: &Grader,
        held_out: &[&RftPrompt],
    ) -> anyhow::Result<Option<Baselines>> {
        grader
            .world_truths()
            .map(|truths| baselines(truths, held_out))
            .transpose()
            .context("the evaluation's baselines")
    }

    /// A learned-grader run judged by the world: its reward model also ranks each prompt's
    /// samples, to measure it as a chooser against the truth (`learned_pick_of`).
    pub fn reward_model(
        &self,
        kind: GraderKind,
        held_out: &[&RftPrompt],
    ) -> anyhow::Result<Option<Grader>> {
        (kind == GraderKind::World && self.settings.grader == GraderKind::Learned)
            .then(|| self.grader(GraderKind::Learned, held_out))
            .transpose()
            .context("the run's learned grader, to rank the samples beside the world's verdicts")
    }

    /// The run's models to evaluate: `wanted` (all it has when empty), each with its path; an
    /// error names a wanted model the run lacks.
    pub fn models(&self, wanted: &[RunModel]) -> anyhow::Result<Vec<(RunModel, PathBuf)>> {
        let mut models = run_models(&self.settings, &self.dir);
        if wanted.is_empty() {
            return Ok(models);
        }
        if let Some(missing) = wanted
            .iter()
            .find(|wanted| !models.iter().any(|(m, _)| m == *wanted))
        {
            bail!(
                "--models: run {} has no {} model (it has {})",
                self.dir.display(),
                missing.label(),
                models
                    .iter()
                    .map(|(m, _)| m.label())
                    .collect::<Vec<_>>()
                    .join(", ")
            );
        }
        models.retain(|(m, _)| wanted.contains(m));
        Ok(models)
    }

    /// One model's figures on `held_out`; `progress` gets the prompts done after each batch.
    pub fn evaluate_model(
        &self,
        (which, path): (RunModel, &Path),
        held_out: &[&RftPrompt],
        grader: &Grader,
        runtime: trainer::device::Runtime,
        settings: EvalSettings<'_>,
        progress: &mut dyn FnMut(usize),
    ) -> anyhow::Result<ModelReport> {
        let policy = load_run_model(which, &self.settings, &self.dir, runtime)?;
        let prompts = tokenize_prompts(&policy, &self.dataset, held_out)?;
        let mut report = evaluate(which, path, &policy, &prompts, grader, settings, progress)
            .with_context(|| format!("evaluating the {} model", which.label()))?;
        report.held_out_criterion = self
            .criterion(&policy)
            .with_context(|| format!("the {} model's held-out criterion", which.label()))?;
        Ok(report)
    }

    /// `policy`'s figures by the checkpoint criterion on the validation split, scored as `train`
    /// scores its checkpoints (at the run's sampling temperature).
    fn criterion(&self, policy: &ChatPolicy) -> anyhow::Result<Option<CriterionFigures>> {
        let validation = self.dataset.split(Split::Validation);
        let prompts = tokenize_prompts(policy, &self.dataset, &validation)?;
        let menus = HeldOutMenus::new(policy, prompts)?;
        if menus.contexts() == 0 {
            return Ok(None);
        }
        let scored = menus.score(policy, self.settings.temperature)?;
        let point = SelectionPoint::new(0, 0, scored, None, 0.0);
        Ok(Some(CriterionFigures {
            menu_acceptance: point.menu_acceptance,
            pair_accuracy: point.pair_accuracy,
            logprob_margin: None,
            contexts: point.contexts,
            scored: point.scored,
        }))
    }

    /// The report of the models' figures: each model's share of the gap to the menu oracle is
    /// filled in against the reference model (the warm-up, or the base without one).
    pub fn report(
        &self,
        grader: GraderKind,
        settings: EvalSettings<'_>,
        mut models: Vec<ModelReport>,
        baselines: Option<Baselines>,
    ) -> EvalReport {
        let evaluated: Vec<RunModel> = models.iter().map(|r| r.model).collect();
        if let (Some(baselines), Some(reference)) = (
            &baselines,
            gap_reference(self.settings.sft_steps, &evaluated),
        ) {
            fill_gap_closed(&mut models, reference, baselines.menu_oracle);
        }
        fill_logprob_margins(&mut models);
        EvalReport {
            run: self.dir.clone(),
            data: self.settings.data.clone(),
            split: self.dataset.reported_split().name(),
            grader,
            n: settings.n,
            k: self.settings.k.min(settings.n),
            temperature: settings.temperature,
            seed: settings.seed,
            models,
            baselines,
        }
    }
}

/// Each model's log-probability margin over the warm-up model's, when the warm-up was
/// evaluated too (the margin is a change since the warm-up: it has no value of its own).
fn fill_logprob_margins(models: &mut [ModelReport]) {
    let Some(warmup) = models
        .iter()
        .find(|m| m.model == RunModel::Warmup)
        .and_then(|m| m.held_out_criterion.as_ref())
        .map(|c| c.scored.clone())
    else {
        return;
    };
    for model in models.iter_mut().filter(|m| m.model != RunModel::Base) {
        if let Some(criterion) = &mut model.held_out_criterion {
            criterion.logprob_margin = criterion.scored.margin_over(&warmup).map(|(m, _)| m);
        }
    }
}

/// Where [`write_report`] put the figures.
#[derive(Debug)]
pub struct WrittenReport {
    /// `eval.json`'s text.
    pub json: String,
    pub json_path: PathBuf,
    pub plot_path: PathBuf,
}

/// Writes `eval.json` and `eval.png` into the run directory, and every graded sample to
/// `samples_out` when given (one JSON line each).
pub fn write_report(
    report: &EvalReport,
    samples_out: Option<&Path>,
) -> anyhow::Result<WrittenReport> {
    let json = serde_json::to_string_pretty(report)?;
    let json_path = report.run.join(EVAL_JSON_FILE);
    write_atomically(&json_path, json.as_bytes())?;
    let plot_path = report.run.join(EVAL_PLOT_FILE);
    write_png(&plot_path, &panels(report), 3)?;
    if let Some(path) = samples_out {
        let mut lines = Vec::new();
        for sample in report.models.iter().flat_map(|m| &m.samples) {
            serde_json::to_writer(&mut lines, sample)?;
            lines.push(b'\n');
        }
        write_atomically(path, &lines)
            .with_context(|| format!("--samples-out {}", path.display()))?;
    }
    Ok(WrittenReport {
        json,
        json_path,
        plot_path,
    })
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
