//! `arc-rec bench model`: generation tokens/s (batch 1 and k samples), LoRA training-step tokens/s
//! and one RL step (k sampled completions, then a policy-gradient step on them) of our tch model,
//! each next to PyTorch + transformers + peft doing the same work on the same device in the same
//! run (`bench/model_reference.py`), with the ratio. Needs no database. The measurements and the
//! comparison are `training::model_bench`'s; this command resolves the arguments, decides where
//! our side runs and prints.
//!
//! When the reference runs, our side is measured in a child process (this binary again, with
//! `--no-reference --json`): libtorch's CUDA caching allocator keeps what it reserved until the
//! process exits and tch cannot empty it, so a 7B run in this process would leave the reference
//! without room. The child exits before the reference starts, so the two never share the device.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::Context;
use clap::Args;
use serde_json::Value;
use trainer::bench_model::{run_reference_bench, use_torch_threads};
use trainer::device::Runtime;

pub use crate::training::DeviceChoice;
use crate::training::model_bench::{
    Checkpointing, ConstrainedFigures, ConstrainedRlStepFigures, GOAL_RATIO, MeasurePlan,
    ModelShape, OurFigures, Phase, Report, RlStepFigures, Settings, Sizes, Sources, compare,
    device_flag, measure, name_the_preset, reference_args, write_tiny_preset,
};

/// Arguments of `arc-rec bench model`.
#[derive(Debug, Args)]
pub struct BenchModelArgs {
    /// Which model to measure.
    #[arg(long, value_enum, default_value_t = ModelShape::Tiny, conflicts_with = "checkpoint")]
    pub shape: ModelShape,
    /// Measure this Hugging Face checkpoint directory instead of a built-in shape (the
    /// reference loads the same directory).
    #[arg(long)]
    pub checkpoint: Option<PathBuf>,
    /// Where to run (CUDA runs bf16, the CPU f32).
    #[arg(long, value_enum, default_value_t = DeviceChoice::Auto)]
    pub device: DeviceChoice,
    /// Prompt length of the generation phases and the RL step [default: 64].
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    pub prompt_tokens: Option<u32>,
    /// New tokens per generated sequence [default: 32 for tiny, 64 for qwen2.5-0.5b, 512 for
    /// qwen2.5-7b].
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    pub new_tokens: Option<u32>,
    /// Samples of the one prompt in the k-sample phase and the RL step (one shared prefill).
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..))]
    pub samples: u32,
    /// Sequences per training step [default: --samples].
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    pub train_batch: Option<u32>,
    /// Tokens per training sequence of lora_train_step [default: 128 for tiny, prompt + new for
    /// the qwen2.5 shapes].
    #[arg(long, value_parser = clap::value_parser!(u32).range(2..))]
    pub train_seq: Option<u32>,
    /// Timed repetitions of each phase, the median is reported [default: 10 for tiny, whose
    /// phases take tens of milliseconds and jitter with the machine's load; 3 otherwise].
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=100))]
    pub repeats: Option<u32>,
    /// Untimed repetitions before timing.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(0..=100))]
    pub warmup: u32,
    /// Run the PyTorch reference and fail when it cannot run (default: run it, and when it
    /// cannot, report our figures and why the ratios are missing).
    #[arg(long, overrides_with = "no_reference")]
    pub reference: bool,
    /// Measure only arc-rec.
    #[arg(long, overrides_with = "reference")]
    pub no_reference: bool,
    /// Python with torch, transformers and peft [default: $ARC_REC_PYTHON, else .venv/bin/python
    /// of the repository].
    #[arg(long)]
    pub python: Option<PathBuf>,
    /// The reference script [default: bench/model_reference.py of the repository].
    #[arg(long)]
    pub reference_script: Option<PathBuf>,
    /// Torch CPU threads, for both sides [default: libtorch's choice, the physical cores].
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub threads: Option<u32>,
    /// Seed of the random prompt, training batch, samples and (qwen2.5 shapes) weights.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Phases to run, comma-separated [default: all of them].
    #[arg(long, value_enum, value_delimiter = ',', num_args = 1..)]
    pub phases: Vec<Phase>,
    /// Recompute each decoder layer in the backward pass of lora_train_step and rl_step, on both
    /// sides (auto: on above 1B parameters, as the reference decides by itself).
    #[arg(long, value_enum, default_value_t = Checkpointing::Auto)]
    pub gradient_checkpointing: Checkpointing,
    /// The tokenizer directory (tokenizer.json, tokenizer_config.json) the
    /// generate_k_constrained phase compiles the recommendation grammar over [default: the
    /// checkpoint's; for the qwen2.5 shapes the tiny preset's, whose 1,024 tokens make the mask
    /// cheaper than Qwen2.5's 151,665 would: pass a Qwen2.5 checkpoint's directory for its cost].
    #[arg(long)]
    pub tokenizer: Option<PathBuf>,
    /// rl_step_constrained's passes over each step's samples (μ; `train --update-epochs`).
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub update_epochs: u32,
    /// rl_step_constrained's minibatches of samples per pass, one optimizer step each (at most
    /// --samples).
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub minibatches: u32,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// The sizes after defaults.
fn sizes(args: &BenchModelArgs) -> Sizes {
    let shape = if args.checkpoint.is_none() {
        args.shape
    } else {
        ModelShape::Tiny
    };
    let large = shape != ModelShape::Tiny;
    let prompt_tokens = args.prompt_tokens.unwrap_or(64);
    let new_tokens = args.new_tokens.unwrap_or(match shape {
        ModelShape::Tiny => 32,
        ModelShape::Qwen2_5_0_5b => 64,
        ModelShape::Qwen2_5_7b => 512,
    });
    Sizes {
        prompt_tokens,
        new_tokens,
        samples: args.samples,
        train_batch: args.train_batch.unwrap_or(args.samples),
        train_seq: args.train_seq.unwrap_or(if large {
            prompt_tokens + new_tokens
        } else {
            128
        }),
        repeats: args.repeats.unwrap_or(if large { 3 } else { 10 }),
    }
}

/// The phases `--phases` names, in report order (all of them when it names none).
fn selected_phases(args: &BenchModelArgs) -> Vec<Phase> {
    Phase::ALL
        .into_iter()
        .filter(|phase| args.phases.is_empty() || args.phases.contains(phase))
        .collect()
}

/// Runs `arc-rec bench model`.
pub fn run(args: &BenchModelArgs) -> anyhow::Result<()> {
    let threads = use_torch_threads(args.threads);
    let runtime = Runtime::select(args.device.request())?;
    if args.checkpoint.is_none()
        && args.shape == ModelShape::Qwen2_5_7b
        && !runtime.device.is_cuda()
    {
        anyhow::bail!(
            "refusing qwen2.5-7b on the CPU: its 7.6 billion parameters are 30 GB in f32 and every phase would take hours; run it on a CUDA machine (--device cuda), or use --shape tiny here"
        );
    }
    let sizes = sizes(args);
    let phases = selected_phases(args);
    let reference_wanted = !args.no_reference && phases.iter().any(|phase| phase.has_reference());

    // The tiny preset lives in a temporary directory both sides load.
    let scratch = tempfile::tempdir().context("cannot create a scratch directory")?;
    let (checkpoint, tokenizer) = model_sources(args, &phases, scratch.path())?;
    let sources = Sources {
        checkpoint: checkpoint.as_deref(),
        tokenizer: tokenizer.as_deref(),
    };
    let (mut settings, mut ours) = if reference_wanted {
        measure_in_child(args, runtime, threads, sizes, sources)?
    } else {
        let plan = MeasurePlan {
            shape: args.shape,
            named_checkpoint: args.checkpoint.is_some(),
            sources,
            runtime,
            threads,
            sizes,
            phases: &phases,
            warmup: args.warmup,
            seed: args.seed,
            gradient_checkpointing: args.gradient_checkpointing,
            update_epochs: args.update_epochs,
            minibatches: args.minibatches,
        };
        measure(&plan, &progress)?
    };
    // The measuring code saw a directory; name the preset instead of a temporary path.
    if args.checkpoint.is_none() {
        name_the_preset(
            &mut settings,
            &mut ours,
            args.shape,
            args.tokenizer.is_none(),
        );
    }
    let report = report_with_reference(
        args,
        settings,
        ours,
        runtime,
        checkpoint.as_deref(),
        reference_wanted,
    )?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print_table(&report);
    }
    if args.reference
        && let Some(reason) = &report.reference_error
    {
        anyhow::bail!("--reference was asked for but the PyTorch reference did not run: {reason}");
    }
    Ok(())
}

/// The checkpoint to measure (`--checkpoint`, else the tiny preset written under `scratch`,
/// else none: a random shape) and the tokenizer of the grammar phases (when they run).
fn model_sources(
    args: &BenchModelArgs,
    phases: &[Phase],
    scratch: &Path,
) -> anyhow::Result<(Option<PathBuf>, Option<PathBuf>)> {
    let checkpoint = match (&args.checkpoint, args.shape) {
        (Some(dir), _) => Some(dir.clone()),
        (None, ModelShape::Tiny) => Some(write_tiny_preset(&scratch.join("tiny"), &progress)?),
        (None, _) => None,
    };
    // The grammar of generate_k_constrained needs a tokenizer; the random shapes have none.
    let tokenizer = match (&args.tokenizer, &checkpoint) {
        _ if !phases.iter().any(|phase| phase.needs_grammar()) => None,
        (Some(dir), _) => Some(dir.clone()),
        (None, Some(dir)) => Some(dir.clone()),
        (None, None) => Some(write_tiny_preset(
            &scratch.join("tiny-tokenizer"),
            &progress,
        )?),
    };
    Ok((checkpoint, tokenizer))
}

/// Our figures beside the reference's (run when `reference_wanted`, else why not) and the
/// ratios.
fn report_with_reference(
    args: &BenchModelArgs,
    settings: Settings,
    ours: OurFigures,
    runtime: Runtime,
    checkpoint: Option<&Path>,
    reference_wanted: bool,
) -> anyhow::Result<Report> {
    let (reference, reference_error) = if reference_wanted {
        match run_reference(args, &settings, runtime, checkpoint) {
            Ok(value) => (Some(value), None),
            Err(err) => (None, Some(format!("{err:#}"))),
        }
    } else if args.no_reference {
        (None, Some("not run (--no-reference)".to_owned()))
    } else {
        (
            None,
            Some("not run: none of the phases asked for has a PyTorch counterpart".to_owned()),
        )
    };
    let comparison = match &reference {
        Some(reference) => compare(&settings, &ours, reference)?,
        None => Vec::new(),
    };
    Ok(Report {
        settings,
        arc_rec: ours,
        reference,
        reference_error,
        comparison,
    })
}

fn progress(message: &str) {
    eprintln!("bench model: {message}");
}

/// Measures our side in a child process (see the module docs) and reads back its JSON.
fn measure_in_child(
    args: &BenchModelArgs,
    runtime: Runtime,
    threads: u32,
    sizes: Sizes,
    sources: Sources<'_>,
) -> anyhow::Result<(Settings, OurFigures)> {
    let exe = std::env::current_exe().context("cannot find this executable to re-run it")?;
    let mut command = Command::new(&exe);
    command.args(["bench", "model", "--no-reference", "--json"]);
    match sources.checkpoint {
        Some(dir) => command.arg("--checkpoint").arg(dir),
        None => command.args(["--shape", args.shape.name()]),
    };
    if let Some(dir) = sources.tokenizer {
        command.arg("--tokenizer").arg(dir);
    }
    let phases: Vec<&str> = selected_phases(args).into_iter().map(Phase::name).collect();
    command.arg("--phases").arg(phases.join(","));
    command.args([
        "--gradient-checkpointing",
        match args.gradient_checkpointing {
            Checkpointing::Auto => "auto",
            Checkpointing::On => "on",
            Checkpointing::Off => "off",
        },
    ]);
    let device = device_flag(runtime);
    let numbers = [
        ("--prompt-tokens", u64::from(sizes.prompt_tokens)),
        ("--new-tokens", u64::from(sizes.new_tokens)),
        ("--samples", u64::from(sizes.samples)),
        ("--train-batch", u64::from(sizes.train_batch)),
        ("--train-seq", u64::from(sizes.train_seq)),
        ("--repeats", u64::from(sizes.repeats)),
        ("--warmup", u64::from(args.warmup)),
        ("--threads", u64::from(threads)),
        ("--seed", args.seed),
        ("--update-epochs", u64::from(args.update_epochs)),
        ("--minibatches", u64::from(args.minibatches)),
    ];
    command.args(["--device", device]);
    for (flag, value) in numbers {
        command.arg(flag).arg(value.to_string());
    }
    // Progress goes straight to our stderr; stdout is the JSON report.
    let output = command
        .stderr(std::process::Stdio::inherit())
        .output()
        .with_context(|| format!("cannot run {}", exe.display()))?;
    anyhow::ensure!(
        output.status.success(),
        "measuring arc-rec in a child process failed ({})",
        output.status
    );
    let report: Report = serde_json::from_slice(&output.stdout)
        .context("the child process printed no report JSON")?;
    Ok((report.settings, report.arc_rec))
}

/// The interpreter: `--python`, else $ARC_REC_PYTHON, else the repository's `.venv`.
fn python_path(args: &BenchModelArgs) -> PathBuf {
    if let Some(python) = &args.python {
        return python.clone();
    }
    if let Some(python) = std::env::var_os("ARC_REC_PYTHON") {
        return PathBuf::from(python);
    }
    repository_file(".venv/bin/python")
}

/// `relative` under the working directory when it exists there (a checkout the binary was
/// copied into), else under the source tree this binary was built from.
fn repository_file(relative: &str) -> PathBuf {
    let here = Path::new(relative);
    if here.exists() {
        return here.to_path_buf();
    }
    Path::new(env!("CARGO_MANIFEST_DIR")).join(relative)
}

/// Runs `bench/model_reference.py` on the same model, device, sizes and thread count.
fn run_reference(
    args: &BenchModelArgs,
    settings: &Settings,
    runtime: Runtime,
    checkpoint: Option<&Path>,
) -> anyhow::Result<Value> {
    let python = python_path(args);
    let script = args
        .reference_script
        .clone()
        .unwrap_or_else(|| repository_file("bench/model_reference.py"));
    anyhow::ensure!(
        python.exists(),
        "no python at {} (pass --python or set ARC_REC_PYTHON)",
        python.display()
    );
    anyhow::ensure!(
        script.exists(),
        "no reference script at {} (pass --reference-script)",
        script.display()
    );
    let owned = reference_args(settings, runtime, checkpoint)?;
    let borrowed: Vec<&str> = owned.iter().map(String::as_str).collect();
    progress(&format!(
        "running the PyTorch reference: {} {} {}",
        python.display(),
        script.display(),
        owned.join(" ")
    ));
    Ok(run_reference_bench(&python, &script, &borrowed)?)
}

fn gib(bytes: Option<u64>) -> String {
    bytes.map_or_else(
        || "n/a".to_owned(),
        |bytes| format!("{:.2} GiB", bytes as f64 / f64::from(1u32 << 30)),
    )
}

fn print_table(report: &Report) {
    print_settings(&report.settings);
    print_phases(report);
    if let Some(rl) = &report.arc_rec.rl_step {
        print_rl_parts(rl, report.reference.as_ref());
    }
    if let Some(constrained) = &report.arc_rec.generate_k_constrained {
        print_constrained(constrained, report);
    }
    if let Some(rl) = &report.arc_rec.rl_step_constrained {
        print_rl_constrained(rl, &report.settings);
    }
    print_memory(report);
    if let Some(reference) = &report.reference {
        print_reference(reference, &report.settings);
    }
    if let Some(reason) = &report.reference_error {
        println!("no ratios: the PyTorch reference did not run: {reason}");
    }
}

/// The model, the device and the work both sides did.
fn print_settings(settings: &Settings) {
    println!(
        "model: {} ({:.2}M parameters) on {} ({}), {} torch CPU threads on both sides",
        settings.model,
        settings.parameters as f64 / 1e6,
        settings.device,
        settings.dtype,
        settings.torch_threads
    );
    println!(
        "work: prompt {} tokens, {} new tokens per sequence, k={} samples; training {} × {} tokens; RL step = k samples + a policy-gradient step on them (tokens: generated k·new + trained k·(prompt+new)); LoRA r={} alpha={} on {}; gradient checkpointing {}; median of {} after {} warm-up",
        settings.prompt_tokens,
        settings.new_tokens,
        settings.samples,
        settings.train_batch,
        settings.train_seq,
        settings.lora_r,
        settings.lora_alpha,
        settings.lora_targets.join(","),
        if settings.gradient_checkpointing {
            "on"
        } else {
            "off"
        },
        settings.repeats,
        settings.warmup
    );
}

/// One line per phase run: both sides' seconds and tokens/s, the ratio and the goal.
fn print_phases(report: &Report) {
    println!(
        "{:<22} {:>12} {:>12} {:>16} {:>16} {:>8}  goal",
        "phase", "arc-rec s", "PyTorch s", "arc-rec tok/s", "PyTorch tok/s", "ratio"
    );
    for which in Phase::ALL {
        let phase = which.name();
        let Some(mine) = report.arc_rec.phase(phase) else {
            continue;
        };
        match report.comparison.iter().find(|row| row.phase == phase) {
            Some(row) => println!(
                "{phase:<22} {:>12.4} {:>12.4} {:>16.1} {:>16.1} {:>7.2}×  ≥ {:.1}× {}",
                mine.seconds_median,
                row.reference_seconds,
                row.arc_rec_tokens_per_s,
                row.reference_tokens_per_s,
                row.ratio,
                row.goal,
                if row.meets_goal { "met" } else { "NOT met" }
            ),
            None => println!(
                "{phase:<22} {:>12.4} {:>12} {:>16.1} {:>16} {:>8}  {}",
                mine.seconds_median,
                "-",
                mine.tokens_per_s,
                "-",
                "-",
                if which.has_reference() {
                    format!("≥ {GOAL_RATIO:.1}×")
                } else {
                    "(no reference; mask share below)".to_owned()
                }
            ),
        }
    }
}

/// The RL step's generation and training parts, on both sides.
fn print_rl_parts(rl: &RlStepFigures, reference: Option<&Value>) {
    let theirs = reference.and_then(|reference| {
        let part = |name: &str| {
            reference
                .pointer(&format!("/rl_step/{name}_seconds_median"))
                .and_then(Value::as_f64)
        };
        Some((part("generate")?, part("train")?))
    });
    println!(
        "rl_step parts (median s): arc-rec generate {:.4} + train {:.4}; PyTorch {}",
        rl.generate_seconds_median,
        rl.train_seconds_median,
        theirs.map_or_else(
            || "-".to_owned(),
            |(generate, train)| format!("generate {generate:.4} + train {train:.4}")
        )
    );
}

/// What the grammar cost constrained generation, beside and after the forward.
fn print_constrained(constrained: &ConstrainedFigures, report: &Report) {
    let free = report.arc_rec.generate_k.as_ref().map_or_else(
        || "-".to_owned(),
        |free| {
            format!(
                "{:.4}",
                1e3 * free.seconds_median / free.tokens_per_run as f64
            )
        },
    );
    let per_token = 1e3 / constrained.generation.tokens_per_s;
    let after = constrained.after_forward.as_ref().map_or_else(
        || "-".to_owned(),
        |after| {
            format!(
                "{:.4} ms per token with the grammar after the forward ({:.4} ms, {:.1}% of it)",
                1e3 / after.generation.tokens_per_s,
                after.mask_ms_per_token,
                100.0 * after.mask_share,
            )
        },
    );
    println!(
        "generate_k_constrained: with the grammar beside the forward it cost the decode loop {:.4} ms per token, {:.1}% of generation time (goal < 10%), {:.4} ms more ran beside the forward; {per_token:.4} ms per token constrained, {after}, {free} unconstrained (generate_k); the default here: {}; {} of {} samples completed the grammar; tokenizer {} ({} tokens)",
        constrained.mask_ms_per_token,
        100.0 * constrained.mask_share,
        constrained.beside_forward_ms_per_token,
        constrained.default_schedule,
        constrained.completed,
        report.settings.samples as usize * constrained.mask_seconds.len(),
        constrained.tokenizer,
        constrained.tokenizer_vocab,
    );
}

/// The constrained RL step's parts and what its update saw.
fn print_rl_constrained(rl: &ConstrainedRlStepFigures, settings: &Settings) {
    let mean = |values: &[i64]| values.iter().sum::<i64>() as f64 / values.len().max(1) as f64;
    println!(
        "rl_step_constrained (median s): generate {:.4} (grammar {:.1}% of it) + reference {:.4} + update {:.4} ({} passes × {} minibatches = {} optimizer steps); mean {:.0} sampled and {:.0} trained tokens a step; {} of {} samples completed the grammar; first-minibatch |log ρ| ≤ {:.2e}{}; tokenizer {} ({} tokens)",
        rl.generate_seconds_median,
        100.0 * rl.mask_share_of_generation,
        rl.reference_seconds_median,
        rl.update_seconds_median,
        rl.update_epochs,
        rl.minibatches,
        rl.optimizer_steps,
        mean(&rl.generated_tokens),
        mean(&rl.trained_tokens),
        rl.completed,
        u64::from(settings.samples) * rl.generated_tokens.len() as u64,
        rl.first_max_abs_log_ratios
            .iter()
            .copied()
            .fold(0.0, f64::max),
        if rl.sampler_gaps.is_empty() {
            String::new()
        } else {
            format!(
                " (sampler vs trainer |Δ log p| ≤ {:.2e}, replaced by the trainer's)",
                rl.sampler_gaps.iter().copied().fold(0.0, f64::max)
            )
        },
        rl.tokenizer,
        rl.tokenizer_vocab,
    );
}

/// Peak device memory of both sides (ours is not readable through tch).
fn print_memory(report: &Report) {
    let our_peak = Phase::ALL
        .iter()
        .filter_map(|phase| report.arc_rec.phase(phase.name()))
        .filter_map(|figures| figures.peak_memory_bytes)
        .max();
    let their_peak = report
        .reference
        .as_ref()
        .and_then(|reference| reference.get("max_memory_allocated_bytes"))
        .and_then(Value::as_u64);
    let their_rl_peak = report
        .reference
        .as_ref()
        .and_then(|reference| reference.pointer("/rl_step/max_memory_allocated_bytes"))
        .and_then(Value::as_u64);
    println!(
        "peak device memory: arc-rec {} (tch exposes no CUDA allocator statistics), PyTorch {} (rl_step {})",
        gib(our_peak),
        gib(their_peak),
        gib(their_rl_peak)
    );
}

/// The reference's library versions and checkpointing, and a warning when its threads differ.
fn print_reference(reference: &Value, settings: &Settings) {
    let checkpointing = ["lora_train_step", "rl_step"].iter().any(|phase| {
        reference
            .pointer(&format!("/{phase}/gradient_checkpointing"))
            .and_then(Value::as_bool)
            .unwrap_or(false)
    });
    let versions = ["torch", "transformers", "peft"]
        .map(|name| {
            let version = reference
                .pointer(&format!("/settings/{name}"))
                .and_then(Value::as_str)
                .unwrap_or("?");
            format!("{name} {version}")
        })
        .join(", ");
    println!(
        "reference: {versions}; gradient checkpointing {}",
        if checkpointing { "on" } else { "off" }
    );
    let their_threads = reference
        .pointer("/settings/cpu_threads")
        .and_then(Value::as_u64);
    if their_threads != Some(u64::from(settings.torch_threads)) {
        println!(
            "warning: the reference ran {their_threads:?} torch threads, arc-rec {}",
            settings.torch_threads
        );
    }
}
