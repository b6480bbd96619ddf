//! `arc-rec model init --preset tiny --out DIR`: write a small random-initialised Qwen2 checkpoint
//! whose tokenizer is trained on the synthetic world's recommendation text. Needs no database.

use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::{Args, Subcommand, ValueEnum};

use crate::export::tokenizer_corpus::tokenizer_corpus;

/// `arc-rec model ...`.
#[derive(Debug, Subcommand)]
pub enum ModelCommand {
    /// Write a preset checkpoint (config, safetensors weights, tokenizer, chat template).
    Init(InitArgs),
}

/// Checkpoints `model init` can write.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Preset {
    /// Qwen2 architecture, ~1M parameters, byte-level BPE of ~1k tokens: CPU tests and demos.
    Tiny,
}

/// Arguments of `arc-rec model init`.
#[derive(Debug, Args)]
pub struct InitArgs {
    /// Which checkpoint to write.
    #[arg(long, value_enum, default_value_t = Preset::Tiny)]
    pub preset: Preset,
    /// Directory to write into (created if missing; must be empty unless --force).
    #[arg(long)]
    pub out: PathBuf,
    /// Seed of the weights and of the synthetic world the tokenizer corpus comes from: the same
    /// seed writes byte-identical files.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Outcomes of the synthetic world whose recommendations make up the tokenizer corpus.
    #[arg(long, default_value_t = 3_000)]
    pub corpus_outcomes: usize,
    /// Write into a non-empty directory, replacing files of the same names.
    #[arg(long)]
    pub force: bool,
}

/// Runs `arc-rec model ...`.
pub fn run(command: &ModelCommand) -> anyhow::Result<()> {
    match command {
        ModelCommand::Init(args) => init(args),
    }
}

fn init(args: &InitArgs) -> anyhow::Result<()> {
    refuse_non_empty(&args.out, args.force)?;
    let corpus = tokenizer_corpus(args.seed, args.corpus_outcomes)
        .context("invalid synthetic world parameters")?;
    let corpus_bytes: usize = corpus.iter().map(String::len).sum();
    let written = match args.preset {
        Preset::Tiny => trainer::preset::write_tiny_checkpoint(&args.out, args.seed, &corpus),
    }
    .with_context(|| format!("cannot write the checkpoint to {}", args.out.display()))?;
    println!(
        "wrote the {} preset (seed {}) to {}",
        args.preset
            .to_possible_value()
            .map_or_else(String::new, |v| v.get_name().to_owned()),
        args.seed,
        written.dir.display()
    );
    for file in &written.files {
        println!("  {:<24} {:>10} bytes", file.name, file.bytes);
    }
    println!(
        "parameters: {}; vocabulary: {} tokens, trained in {:.2} s on {} lines ({} bytes) of synthetic recommendation text",
        written.parameter_count,
        written.vocab_size,
        written.tokenizer_training.as_secs_f64(),
        written.corpus_lines,
        corpus_bytes
    );
    Ok(())
}

/// Fails when `out` exists and is a file, or a directory with entries, unless `force`.
fn refuse_non_empty(out: &Path, force: bool) -> anyhow::Result<()> {
    if out.is_file() {
        anyhow::bail!("{} is a file, not a directory", out.display());
    }
    if force || !out.exists() {
        return Ok(());
    }
    let mut entries =
        std::fs::read_dir(out).with_context(|| format!("cannot read {}", out.display()))?;
    if entries.next().is_some() {
        anyhow::bail!(
            "{} is not empty; pass --force to write into it anyway",
            out.display()
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_a_non_empty_directory_without_force() {
        let dir = tempfile::tempdir().unwrap();
        refuse_non_empty(dir.path(), false).unwrap();
        refuse_non_empty(&dir.path().join("missing"), false).unwrap();
        std::fs::write(dir.path().join("x"), "x").unwrap();
        let message = refuse_non_empty(dir.path(), false).unwrap_err().to_string();
        assert!(message.contains("--force"), "{message}");
        refuse_non_empty(dir.path(), true).unwrap();
        assert!(refuse_non_empty(&dir.path().join("x"), true).is_err());
    }
}
