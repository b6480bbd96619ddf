//! `arc-rec grade serve --run RUN_DIR`: a run's grader as a long-lived process, for a trainer
//! outside arc-rec (verl's `compute_score` in `integrations/verl/`): one JSON request per line on
//! stdin, one JSON answer per line on stdout, in order. The graders stay in Rust, so a reward
//! computed through verl is the reward `arc-rec train` and `arc-rec eval` compute.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, BufWriter, Write};
use std::path::PathBuf;

use anyhow::Context;
use clap::{Args, Subcommand};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::domain::agent_config::canonical_json;
use crate::rft::verl_rows::DATA_SOURCE;
use crate::rft::{Grader, GraderKind, RftPrompt};
use crate::training::run_dir::{read_run_data, read_settings, run_grader};

/// `arc-rec grade ...`.
#[derive(Debug, Subcommand)]
pub enum GradeCommand {
    /// Grade completions for a run's prompts, as a long-lived process: each line of stdin is a
    /// request `{"id", "prompt_id", "completion", "draw"?, "data_source"?, "organization"?,
    /// "configuration_id"?, "current_configuration"?}` (the optional fields are checked
    /// against the run's prompt: they come from the row `export --format verl` wrote), each line
    /// of stdout its answer `{"id", "reward", "format_valid", "accepted", "answer", ...,
    /// "has_truth"}` (the grader's whole verdict) or `{"id", "error"}`; a bad line gets an error answer and the
    /// process goes on. Ends at the end of stdin.
    Serve(GradeServeArgs),
}

/// Arguments of `arc-rec grade serve`.
#[derive(Debug, Args)]
pub struct GradeServeArgs {
    /// The run directory `arc-rec train` wrote: its data, grader settings (world, reward, format
    /// bonus) and, for the learned grader, its fit.
    #[arg(long, value_name = "RUN_DIR")]
    pub run: PathBuf,
    /// Where verdicts come from; the run's grader by default.
    #[arg(long, value_enum)]
    pub grader: Option<GraderKind>,
    /// The key of the world's (or learned grader's) acceptance draw for requests that give no
    /// `draw`; `arc-rec eval --seed` keys its draws the same way (the same key, prompt and
    /// answer give the same verdict).
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
}

/// One request line.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Request {
    #[serde(default)]
    id: Value,
    prompt_id: String,
    completion: String,
    draw: Option<u64>,
    data_source: Option<String>,
    organization: Option<String>,
    configuration_id: Option<String>,
    /// The configuration as `export --format verl` wrote it (canonical JSON text).
    current_configuration: Option<String>,
}

/// Runs `arc-rec grade`.
pub fn run(command: &GradeCommand) -> anyhow::Result<()> {
    match command {
        GradeCommand::Serve(args) => serve(args),
    }
}

fn serve(args: &GradeServeArgs) -> anyhow::Result<()> {
    let settings = read_settings(&args.run, "--run")?;
    let dataset = read_run_data(&args.run, &settings)?;
    let kind = args.grader.unwrap_or(settings.grader);
    let grader = run_grader(
        &args.run,
        "--run",
        &settings,
        &dataset,
        kind,
        dataset.prompts.iter(),
    )?;
    let prompts: HashMap<&str, &RftPrompt> =
        dataset.prompts.iter().map(|p| (p.id.as_str(), p)).collect();
    eprintln!(
        "grading with the {} grader of run {} ({} prompts); one JSON request per line",
        kind.as_str(),
        args.run.display(),
        prompts.len()
    );
    // Our own buffer: its `buffer()` says whether a read would wait for the client.
    let mut input = BufReader::new(std::io::stdin().lock());
    let mut output = BufWriter::new(std::io::stdout().lock());
    let mut line = String::new();
    loop {
        // Answers of a pipelined batch go out in one write: flush before a read could block,
        // i.e. when nothing read is left in the buffer.
        if input.buffer().is_empty() {
            output.flush().context("cannot write stdout")?;
        }
        line.clear();
        if input.read_line(&mut line).context("cannot read stdin")? == 0 {
            break;
        }
        if line.trim().is_empty() {
            continue;
        }
        let answer = answer(&line, &prompts, &grader, args.seed);
        serde_json::to_writer(&mut output, &answer).context("cannot write stdout")?;
        output.write_all(b"\n").context("cannot write stdout")?;
    }
    output.flush().context("cannot write stdout")?;
    Ok(())
}

/// The answer line of one request line.
fn answer(
    line: &str,
    prompts: &HashMap<&str, &RftPrompt>,
    grader: &Grader,
    default_draw: u64,
) -> Value {
    let request: Request = match serde_json::from_str(line) {
        Ok(request) => request,
        Err(err) => {
            // Echo the id when the line is JSON with one, so a client can match the error.
            let id = serde_json::from_str::<Value>(line)
                .ok()
                .and_then(|v| v.get("id").cloned())
                .unwrap_or(Value::Null);
            return json!({"id": id, "error": format!("bad request: {err}")});
        }
    };
    match grade(&request, prompts, grader, default_draw) {
        Ok(mut verdict) => {
            verdict["id"] = request.id;
            // Whether acceptance_probability is the world's truth (null for a malformed
            // completion) or absent because this grader knows none.
            verdict["has_truth"] = Value::Bool(grader.world_truths().is_some());
            verdict
        }
        Err(error) => json!({"id": request.id, "error": error}),
    }
}

fn grade(
    request: &Request,
    prompts: &HashMap<&str, &RftPrompt>,
    grader: &Grader,
    default_draw: u64,
) -> Result<Value, String> {
    let prompt = prompts.get(request.prompt_id.as_str()).ok_or_else(|| {
        format!(
            "prompt_id {:?}: not a prompt of the run's data (export the rows from the data the run trained on)",
            request.prompt_id
        )
    })?;
    if let Some(source) = request.data_source.as_deref().filter(|s| *s != DATA_SOURCE) {
        return Err(format!(
            "data_source {source:?}: arc-rec grades rows of data_source {DATA_SOURCE:?}"
        ));
    }
    let mismatch = |field: &str, row: &str, run: &str| {
        format!(
            "{field}: the row says {row:?}, the run's prompt {} has {run:?} (the rows come from other data than the run's)",
            prompt.id
        )
    };
    if let Some(org) = request.organization.as_deref().filter(|o| *o != prompt.org) {
        return Err(mismatch("organization", org, &prompt.org));
    }
    if let Some(config) = request
        .configuration_id
        .as_deref()
        .filter(|c| *c != prompt.config_id)
    {
        return Err(mismatch("configuration_id", config, &prompt.config_id));
    }
    if let Some(config) = &request.current_configuration {
        let run = canonical_json(&prompt.current_config);
        if *config != run {
            return Err(mismatch("current_configuration", config, &run));
        }
    }
    let verdict = grader.grade(
        prompt,
        &request.completion,
        request.draw.unwrap_or(default_draw),
    );
    serde_json::to_value(&verdict).map_err(|e| format!("cannot encode the verdict: {e}"))
}
