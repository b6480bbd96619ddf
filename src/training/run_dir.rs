//! The run directory's layout and its crash-safe writes.
//!
//! ```text
//! RUN_DIR/config.json          resolved settings (written once, read on --resume)
//! RUN_DIR/grader.json          --grader learned: the reward model's fit (written once)
//! RUN_DIR/metrics.jsonl        one line per step or rollback
//! RUN_DIR/checkpoints/step-N/  state.json + the trainer's adapter and optimizer files
//! RUN_DIR/warmup-model/        the model after the warm-up (Hugging Face layout): RL's base
//! RUN_DIR/adapter/             the final PEFT adapter
//! RUN_DIR/summary.json         final figures; RUN_DIR/curves.png the main curves
//! RUN_DIR/overoptimisation.png --grader learned on a world's data: learned reward vs truth
//! ```
//!
//! Invariant: every `checkpoints/step-N` directory is complete. A checkpoint is written into
//! `checkpoints/.tmp-step-N`, every file and the directory are synced, and only then renamed; a
//! crash leaves at worst a `.tmp-*` directory, removed on resume. `state.json` records how many
//! lines `metrics.jsonl` had (synced before the rename), so resuming truncates the lines of steps
//! that will be redone.

use std::fs::{self, File, OpenOptions};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use serde::{Deserialize, Serialize};

use super::guard::GuardState;
use super::metrics::MetricsLine;
use super::settings::TrainSettings;
use crate::export::Split;
use crate::rft::learned_grader::data_sha256;
use crate::rft::{Grader, GraderKind, LearnedGrader, LearnedGraderFile, RftDataset, RftPrompt};

pub const CONFIG_FILE: &str = "config.json";
pub const METRICS_FILE: &str = "metrics.jsonl";
pub const SUMMARY_FILE: &str = "summary.json";
pub const CURVES_FILE: &str = "curves.png";
/// `--grader learned` on a world's data: learned reward against true acceptance.
pub const OVEROPTIMISATION_FILE: &str = "overoptimisation.png";
pub const CHECKPOINTS_DIR: &str = "checkpoints";
pub const WARMUP_MODEL_DIR: &str = "warmup-model";
pub const FINAL_ADAPTER_DIR: &str = "adapter";
/// The learned grader's fit (`--grader learned`), written when the run is created.
pub const LEARNED_GRADER_FILE: &str = "grader.json";
/// The run's id (`training_runs.run_id`, `model_versions.model_version_id`).
pub const RUN_ID_FILE: &str = "run_id";
const STATE_FILE: &str = "state.json";
const TEMP_PREFIX: &str = ".tmp-";
/// Checkpoints kept; older ones are deleted once a newer one is in place.
const KEEP_CHECKPOINTS: usize = 2;

/// Where a checkpoint leaves the run.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct CheckpointState {
    /// The next step to run.
    pub step: u64,
    /// Factor on the learning rate (halved by each rollback).
    pub lr_scale: f64,
    pub rollbacks: u32,
    /// Lines of `metrics.jsonl` that belong to the steps before `step`.
    pub metrics_lines: u64,
    /// Salt of the random streams (bumped by each rollback; absent in older runs: 0).
    #[serde(default)]
    pub salt: u32,
    /// The KL controller's and the divergence guard's state (absent before the RL phase and in
    /// older runs: the configured β, no average yet).
    #[serde(default)]
    pub guard: Option<GuardState>,
    /// Position in the RL prompt order of the next prompt to draw (absent in older runs: the
    /// fixed `prompts_per_step` a step they drew).
    #[serde(default)]
    pub prompt_cursor: Option<u64>,
}

impl CheckpointState {
    /// A run that has not stepped yet.
    pub fn start() -> Self {
        Self {
            step: 0,
            lr_scale: 1.0,
            rollbacks: 0,
            metrics_lines: 0,
            salt: 0,
            guard: None,
            prompt_cursor: None,
        }
    }
}

/// A complete checkpoint: its directory and where it leaves the run.
pub type Checkpoint = (PathBuf, CheckpointState);

/// An open run directory.
#[derive(Debug)]
pub struct RunDir {
    root: PathBuf,
    metrics: File,
    metrics_lines: u64,
    /// `--max-kl`, when calm checkpoints are kept ([`GuardState::is_calm`]): the newest calm
    /// one is kept beside the last [`KEEP_CHECKPOINTS`], as the divergence guard's rollback
    /// target.
    calm_under_max_kl: Option<f64>,
}

impl RunDir {
    /// Creates a new run in `root`, which must not exist or be empty, and writes its settings.
    pub fn create(root: &Path, settings: &TrainSettings) -> anyhow::Result<Self> {
        if root.is_file() {
            bail!("--out {} is a file, not a directory", root.display());
        }
        if root.exists() {
            let mut entries = fs::read_dir(root)
                .with_context(|| format!("cannot read --out {}", root.display()))?;
            if entries.next().is_some() {
                bail!(
                    "--out {} is not empty; continue that run with `arc-rec train --resume {}` or pick a new directory",
                    root.display(),
                    root.display()
                );
            }
        }
        fs::create_dir_all(root.join(CHECKPOINTS_DIR))
            .with_context(|| format!("cannot create {}", root.display()))?;
        let json = serde_json::to_vec_pretty(settings)?;
        write_atomically(&root.join(CONFIG_FILE), &json)?;
        Self::open_metrics(root, 0)
    }

    /// Opens an existing run for resuming: its settings and the latest complete checkpoint
    /// (`None`: the run never checkpointed and starts over). `metrics.jsonl` is cut back to the
    /// checkpoint's lines.
    pub fn resume(root: &Path) -> anyhow::Result<(Self, TrainSettings, Option<Checkpoint>)> {
        let settings = read_settings(root, "--resume")?;
        let checkpoints = root.join(CHECKPOINTS_DIR);
        fs::create_dir_all(&checkpoints)?;
        let latest = latest_checkpoint(&checkpoints)?;
        let lines = latest.as_ref().map_or(0, |(_, state)| state.metrics_lines);
        truncate_lines(&root.join(METRICS_FILE), lines)?;
        let run = Self::open_metrics(root, lines)?;
        Ok((run, settings, latest))
    }

    fn open_metrics(root: &Path, lines: u64) -> anyhow::Result<Self> {
        let path = root.join(METRICS_FILE);
        let metrics = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .with_context(|| format!("cannot open {}", path.display()))?;
        Ok(Self {
            root: root.to_path_buf(),
            metrics,
            metrics_lines: lines,
            calm_under_max_kl: None,
        })
    }

    /// From now on keep the newest checkpoint that is calm under `max_kl` (its guard's KL
    /// moving average at most [`super::guard::CALM_KL_SHARE`] of it and its newest step's KL
    /// within it, or no KL seen yet: the warm-up, the first RL steps; see
    /// [`GuardState::is_calm`]), and let
    /// [`Self::calm_checkpoint_at_or_before`] find it. Rolling back to the newest checkpoint
    /// fails when KL drifted up over many steps: that checkpoint is already near the limit, and a
    /// halved learning rate cannot bring KL back down before the guard trips again.
    pub fn keep_calm_checkpoints(&mut self, max_kl: f64) {
        self.calm_under_max_kl = Some(max_kl);
    }

    fn is_calm(&self, state: &CheckpointState) -> bool {
        match (self.calm_under_max_kl, state.guard) {
            (Some(max_kl), Some(guard)) => guard.is_calm(max_kl),
            _ => true,
        }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Appends one line to `metrics.jsonl`.
    pub fn append(&mut self, line: &MetricsLine) -> anyhow::Result<()> {
        let mut text = serde_json::to_string(line)?;
        text.push('\n');
        self.metrics
            .write_all(text.as_bytes())
            .context("cannot append to metrics.jsonl")?;
        self.metrics_lines += 1;
        Ok(())
    }

    /// Lines in `metrics.jsonl` so far.
    pub fn metrics_lines(&self) -> u64 {
        self.metrics_lines
    }

    /// Writes a checkpoint for `state`: `write_files` fills a temporary directory, which is
    /// synced and renamed to `checkpoints/step-N`. Older checkpoints beyond the last
    /// [`KEEP_CHECKPOINTS`] are then removed.
    pub fn checkpoint(
        &mut self,
        state: &CheckpointState,
        write_files: impl FnOnce(&Path) -> anyhow::Result<()>,
    ) -> anyhow::Result<PathBuf> {
        self.metrics
            .sync_all()
            .context("cannot sync metrics.jsonl")?;
        let checkpoints = self.root.join(CHECKPOINTS_DIR);
        let name = checkpoint_name(state.step);
        let temp = checkpoints.join(format!("{TEMP_PREFIX}{name}"));
        let target = checkpoints.join(&name);
        remove_if_present(&temp)?;
        let written = (|| {
            fs::create_dir_all(&temp)
                .with_context(|| format!("cannot create {}", temp.display()))?;
            write_files(&temp)?;
            fs::write(temp.join(STATE_FILE), serde_json::to_vec_pretty(state)?)
                .with_context(|| format!("cannot write {}", temp.join(STATE_FILE).display()))?;
            sync_tree(&temp)
        })();
        if let Err(err) = written {
            // A full disk (or any failed write) leaves no partial checkpoint behind, only the
            // previous ones.
            let _ = fs::remove_dir_all(&temp);
            return Err(err);
        }
        // A rollback re-reaches steps it checkpointed before: the newer state replaces it.
        remove_if_present(&target)?;
        fs::rename(&temp, &target)
            .with_context(|| format!("cannot rename {} to {}", temp.display(), target.display()))?;
        File::open(&checkpoints)?.sync_all()?;
        let mut steps = checkpoint_steps(&checkpoints)?;
        steps.sort_unstable();
        let older: Vec<u64> = steps
            .iter()
            .copied()
            .filter(|&step| step < state.step)
            .rev()
            .skip(KEEP_CHECKPOINTS - 1)
            .collect();
        // The newest calm checkpoint stays, unless one of those kept is calm already.
        let mut calm_kept = self.is_calm(state)
            || steps
                .iter()
                .filter(|&&step| step < state.step)
                .rev()
                .take(KEEP_CHECKPOINTS - 1)
                .any(|&step| {
                    read_checkpoint(&checkpoints.join(checkpoint_name(step)))
                        .is_ok_and(|(_, kept)| self.is_calm(&kept))
                });
        for old in older {
            let dir = checkpoints.join(checkpoint_name(old));
            if !calm_kept && read_checkpoint(&dir).is_ok_and(|(_, old)| self.is_calm(&old)) {
                calm_kept = true;
                continue;
            }
            remove_if_present(&dir)?;
        }
        Ok(target)
    }

    /// The newest calm checkpoint at or before `step` (see [`Self::keep_calm_checkpoints`]; every
    /// checkpoint is calm without a threshold), for the divergence guard's rollbacks.
    pub fn calm_checkpoint_at_or_before(&self, step: u64) -> anyhow::Result<Option<Checkpoint>> {
        let checkpoints = self.root.join(CHECKPOINTS_DIR);
        let mut steps: Vec<u64> = checkpoint_steps(&checkpoints)?
            .into_iter()
            .filter(|&s| s <= step)
            .collect();
        steps.sort_unstable();
        for &candidate in steps.iter().rev() {
            let checkpoint = read_checkpoint(&checkpoints.join(checkpoint_name(candidate)))?;
            if self.is_calm(&checkpoint.1) {
                return Ok(Some(checkpoint));
            }
        }
        Ok(None)
    }

    /// Removes the checkpoints after `step`: a rollback past them abandons their branch, and a
    /// resume must not find them.
    pub fn remove_checkpoints_after(&self, step: u64) -> anyhow::Result<()> {
        let checkpoints = self.root.join(CHECKPOINTS_DIR);
        for later in checkpoint_steps(&checkpoints)?
            .into_iter()
            .filter(|&s| s > step)
        {
            remove_if_present(&checkpoints.join(checkpoint_name(later)))?;
        }
        File::open(&checkpoints)?.sync_all()?;
        Ok(())
    }

    /// Cuts `metrics.jsonl` back to `lines` lines (a rollback forgets nothing: it appends its
    /// own line after the cut, so the failed steps stay out of the curves but the event stays in).
    pub fn truncate_metrics(&mut self, lines: u64) -> anyhow::Result<()> {
        self.metrics.sync_all()?;
        truncate_lines(&self.root.join(METRICS_FILE), lines)?;
        let calm_under_max_kl = self.calm_under_max_kl;
        *self = Self::open_metrics(&self.root, lines)?;
        self.calm_under_max_kl = calm_under_max_kl;
        Ok(())
    }

    /// Replaces `RUN_DIR/name` with what `write_files` puts into a fresh temporary directory.
    pub fn replace_dir(
        &self,
        name: &str,
        write_files: impl FnOnce(&Path) -> anyhow::Result<()>,
    ) -> anyhow::Result<PathBuf> {
        let temp = self.root.join(format!("{TEMP_PREFIX}{name}"));
        let target = self.root.join(name);
        remove_if_present(&temp)?;
        fs::create_dir_all(&temp)?;
        write_files(&temp)?;
        sync_tree(&temp)?;
        remove_if_present(&target)?;
        fs::rename(&temp, &target)
            .with_context(|| format!("cannot rename {} to {}", temp.display(), target.display()))?;
        Ok(target)
    }

    /// Writes `RUN_DIR/name` atomically.
    pub fn write_file(&self, name: &str, bytes: &[u8]) -> anyhow::Result<PathBuf> {
        let path = self.root.join(name);
        write_atomically(&path, bytes)?;
        Ok(path)
    }
}

/// Every line of a run's `metrics.jsonl`.
pub fn read_metrics(root: &Path) -> anyhow::Result<Vec<MetricsLine>> {
    let path = root.join(METRICS_FILE);
    let file = File::open(&path).with_context(|| format!("cannot open {}", path.display()))?;
    BufReader::new(file)
        .lines()
        .enumerate()
        .map(|(index, line)| {
            let line = line?;
            serde_json::from_str(&line).with_context(|| {
                format!("{} line {}: not a metrics line", path.display(), index + 1)
            })
        })
        .collect()
}

fn checkpoint_name(step: u64) -> String {
    format!("step-{step:08}")
}

fn checkpoint_steps(checkpoints: &Path) -> anyhow::Result<Vec<u64>> {
    let mut steps = Vec::new();
    for entry in fs::read_dir(checkpoints)
        .with_context(|| format!("cannot read {}", checkpoints.display()))?
    {
        let name = entry?.file_name();
        if let Some(step) = name
            .to_str()
            .and_then(|name| name.strip_prefix("step-"))
            .and_then(|digits| digits.parse().ok())
        {
            steps.push(step);
        }
    }
    Ok(steps)
}

fn read_checkpoint(dir: &Path) -> anyhow::Result<Checkpoint> {
    let path = dir.join(STATE_FILE);
    let bytes = fs::read(&path).with_context(|| format!("cannot read {}", path.display()))?;
    let state = serde_json::from_slice(&bytes)
        .with_context(|| format!("{} is not a checkpoint state", path.display()))?;
    Ok((dir.to_path_buf(), state))
}

/// The highest complete checkpoint; leftover temporary directories of a crash are removed.
fn latest_checkpoint(checkpoints: &Path) -> anyhow::Result<Option<Checkpoint>> {
    for entry in fs::read_dir(checkpoints)? {
        let entry = entry?;
        if entry.file_name().to_string_lossy().starts_with(TEMP_PREFIX) {
            remove_if_present(&entry.path())?;
        }
    }
    checkpoint_steps(checkpoints)?
        .into_iter()
        .max()
        .map(|step| read_checkpoint(&checkpoints.join(checkpoint_name(step))))
        .transpose()
}

fn truncate_lines(path: &Path, lines: u64) -> anyhow::Result<()> {
    let Ok(bytes) = fs::read(path) else {
        if lines == 0 {
            return Ok(());
        }
        bail!(
            "{} is missing but the checkpoint counts {lines} lines",
            path.display()
        );
    };
    let mut seen = 0u64;
    let mut cut = 0usize;
    for (index, &byte) in bytes.iter().enumerate() {
        if seen == lines {
            break;
        }
        if byte == b'\n' {
            seen += 1;
            cut = index + 1;
        }
    }
    if seen < lines {
        bail!(
            "{} has {seen} complete lines but the checkpoint counts {lines}",
            path.display()
        );
    }
    let file = OpenOptions::new().write(true).open(path)?;
    file.set_len(cut as u64)?;
    file.sync_all()?;
    Ok(())
}

/// The run's id (`run_id`, written when `arc-rec train` creates the run); `flag` names the
/// option the directory came from in errors.
pub fn read_run_id(root: &Path, flag: &str) -> anyhow::Result<String> {
    let run_id = fs::read_to_string(root.join(RUN_ID_FILE))
        .with_context(|| {
            format!(
                "{flag} {}: no {RUN_ID_FILE} file; not a run directory of `arc-rec train`",
                root.display()
            )
        })?
        .trim()
        .to_owned();
    if run_id.is_empty() {
        bail!("{flag} {}: its {RUN_ID_FILE} file is empty", root.display());
    }
    Ok(run_id)
}

/// The settings a run directory was created with; `flag` names the argument that gave `root`.
pub fn read_settings(root: &Path, flag: &str) -> anyhow::Result<TrainSettings> {
    let config_path = root.join(CONFIG_FILE);
    if !config_path.is_file() {
        bail!(
            "{flag} {}: no {CONFIG_FILE}; not a run directory of `arc-rec train`",
            root.display()
        );
    }
    let bytes =
        fs::read(&config_path).with_context(|| format!("cannot read {}", config_path.display()))?;
    serde_json::from_slice(&bytes)
        .with_context(|| format!("{} is not a valid run configuration", config_path.display()))
}

/// The examples the run in `root` was trained on (its configuration's `data`); errors name the
/// run as `--run`'s.
pub fn read_run_data(root: &Path, settings: &TrainSettings) -> anyhow::Result<RftDataset> {
    RftDataset::load(&settings.data).with_context(|| {
        format!(
            "--run {}: its data {}",
            root.display(),
            settings.data.display()
        )
    })
}

/// The `kind` grader of the run in `root` for `prompts`: for `--grader learned` the run's fit
/// ([`read_learned_grader`]); errors name the run as `flag`'s.
pub fn run_grader<'a>(
    root: &Path,
    flag: &str,
    settings: &TrainSettings,
    dataset: &RftDataset,
    kind: GraderKind,
    prompts: impl IntoIterator<Item = &'a RftPrompt> + Clone,
) -> anyhow::Result<Grader> {
    let learned = match kind {
        GraderKind::Learned => Some(read_learned_grader(root, flag, settings, dataset)?),
        GraderKind::Logged | GraderKind::World => None,
    };
    Ok(settings.grader(kind, prompts, learned)?)
}

/// The learned grader of the run in `root`, refitted on its data and checked against
/// `grader.json` (errors name the run as `flag`'s).
pub fn read_learned_grader(
    root: &Path,
    flag: &str,
    settings: &TrainSettings,
    dataset: &RftDataset,
) -> anyhow::Result<std::sync::Arc<LearnedGrader>> {
    let path = root.join(LEARNED_GRADER_FILE);
    if !path.is_file() {
        bail!(
            "{flag} {}: no {LEARNED_GRADER_FILE}; the run trained with --grader {}, not learned",
            root.display(),
            settings.grader.as_str()
        );
    }
    let bytes = fs::read(&path).with_context(|| format!("cannot read {}", path.display()))?;
    let file: LearnedGraderFile = serde_json::from_slice(&bytes)
        .with_context(|| format!("{} is not a learned grader", path.display()))?;
    let sha = data_sha256(&settings.data)
        .with_context(|| format!("cannot read {}", settings.data.display()))?;
    let grader = LearnedGrader::load(file, dataset.split(Split::Train), &settings.data, sha)
        .with_context(|| format!("{flag} {}", root.display()))?;
    Ok(std::sync::Arc::new(grader))
}

pub use crate::atomic_file::write_atomically;

fn remove_if_present(path: &Path) -> anyhow::Result<()> {
    match fs::remove_dir_all(path) {
        Ok(()) => Ok(()),
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(err) => Err(err).with_context(|| format!("cannot remove {}", path.display())),
    }
}

fn sync_tree(dir: &Path) -> anyhow::Result<()> {
    for entry in fs::read_dir(dir)? {
        let path = entry?.path();
        if path.is_dir() {
            sync_tree(&path)?;
        } else {
            File::open(&path)?.sync_all()?;
        }
    }
    File::open(dir)?.sync_all()?;
    Ok(())
}

/// `path` made absolute against the working directory, as paths are stored with a run and its
/// model version (a later command may run elsewhere); unchanged if the working directory is gone.
pub fn absolute(path: &Path) -> PathBuf {
    std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::training::metrics::Rollback;

    fn rollback(step: u64) -> MetricsLine {
        MetricsLine::Rollback(Rollback {
            at_step: step,
            to_step: 0,
            reason: "test".into(),
            lr_scale: 0.5,
            salt: 1,
            kl_coef: Some(0.02),
        })
    }

    #[test]
    fn resume_cuts_metrics_to_the_latest_complete_checkpoint() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("run");
        let settings = crate::training::settings::tests::sample();
        let mut run = RunDir::create(&root, &settings).unwrap();
        for step in 0..3 {
            run.append(&rollback(step)).unwrap();
        }
        let state = CheckpointState {
            step: 3,
            metrics_lines: run.metrics_lines(),
            ..CheckpointState::start()
        };
        run.checkpoint(&state, |dir| Ok(fs::write(dir.join("x"), b"1")?))
            .unwrap();
        run.append(&rollback(3)).unwrap();
        // A crash in the middle of the next checkpoint leaves a temporary directory behind.
        fs::create_dir_all(root.join(CHECKPOINTS_DIR).join(".tmp-step-00000004")).unwrap();
        drop(run);
        assert!(RunDir::create(&root, &settings).is_err());

        let (_, resumed_settings, latest) = RunDir::resume(&root).unwrap();
        assert_eq!(resumed_settings, settings);
        let (path, resumed_state) = latest.unwrap();
        assert_eq!(resumed_state, state);
        assert!(path.join("x").is_file());
        assert_eq!(read_metrics(&root).unwrap().len(), 3);
        assert!(
            !root
                .join(CHECKPOINTS_DIR)
                .join(".tmp-step-00000004")
                .exists()
        );
    }

    #[test]
    fn only_the_last_checkpoints_are_kept() {
        let dir = tempfile::tempdir().unwrap();
        let mut run =
            RunDir::create(dir.path(), &crate::training::settings::tests::sample()).unwrap();
        for step in [2, 4, 6] {
            let state = CheckpointState {
                step,
                ..CheckpointState::start()
            };
            run.checkpoint(&state, |_| Ok(())).unwrap();
        }
        let mut steps = checkpoint_steps(&dir.path().join(CHECKPOINTS_DIR)).unwrap();
        steps.sort_unstable();
        assert_eq!(steps, [4, 6]);
        let (_, state) = run.calm_checkpoint_at_or_before(5).unwrap().unwrap();
        assert_eq!(
            state.step, 4,
            "without a threshold every checkpoint is calm"
        );
    }

    /// With a threshold the newest calm checkpoint outlives the last two, a rollback finds it,
    /// and the abandoned branch's checkpoints can be removed.
    #[test]
    fn the_newest_calm_checkpoint_is_kept_for_rollbacks() {
        let (dir, mut run) = run_keeping_calm_checkpoints(2.0);
        let steps_on_disk = || {
            let mut steps = checkpoint_steps(&dir.path().join(CHECKPOINTS_DIR)).unwrap();
            steps.sort_unstable();
            steps
        };
        for (step, average) in [(5, 0.2), (10, 0.9), (15, 1.4), (20, 1.7), (25, 1.9)] {
            run.checkpoint(&state_with_kl(step, average, average), |_| Ok(()))
                .unwrap();
        }
        assert_eq!(
            steps_on_disk(),
            [10, 20, 25],
            "the last two and the newest calm one"
        );
        let (_, calm) = run.calm_checkpoint_at_or_before(24).unwrap().unwrap();
        assert_eq!(calm.step, 10);
        assert_eq!(run.calm_checkpoint_at_or_before(9).unwrap(), None);
        run.remove_checkpoints_after(10).unwrap();
        assert_eq!(steps_on_disk(), [10]);
        // Calm again: the older calm one is no longer needed.
        for step in [15, 20] {
            let state = CheckpointState {
                step,
                ..CheckpointState::start()
            };
            run.checkpoint(&state, |_| Ok(())).unwrap();
        }
        assert_eq!(steps_on_disk(), [15, 20]);
    }

    /// A checkpoint written right after a step past `--max-kl` is passed over, however calm its
    /// average: the rollback goes to the one before.
    #[test]
    fn a_rollback_skips_a_checkpoint_whose_newest_step_was_past_the_limit() {
        let (_dir, mut run) = run_keeping_calm_checkpoints(2.0);
        for (step, average, last) in [(20, 0.05, 0.06), (30, 0.87, 2.47)] {
            run.checkpoint(&state_with_kl(step, average, last), |_| Ok(()))
                .unwrap();
        }
        let (_, calm) = run.calm_checkpoint_at_or_before(31).unwrap().unwrap();
        assert_eq!(calm.step, 20);
    }

    /// A checkpoint at `step` whose guard has seen a KL moving average of `average` and a
    /// newest step's KL of `last`.
    fn state_with_kl(step: u64, average: f64, last: f64) -> CheckpointState {
        CheckpointState {
            step,
            guard: Some(crate::training::guard::GuardState {
                kl_coef: 0.0,
                kl_average: Some(average),
                kl_last: Some(last),
            }),
            ..CheckpointState::start()
        }
    }

    /// A new run in a temporary directory that keeps calm checkpoints under `max_kl`.
    fn run_keeping_calm_checkpoints(max_kl: f64) -> (tempfile::TempDir, RunDir) {
        let dir = tempfile::tempdir().unwrap();
        let mut run =
            RunDir::create(dir.path(), &crate::training::settings::tests::sample()).unwrap();
        run.keep_calm_checkpoints(max_kl);
        (dir, run)
    }
}
