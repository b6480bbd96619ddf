//! The verl integration's Rust side through the binary: `export --format verl` writes one row per
//! RFT prompt with what the grader checks, `grade serve` answers as the run's grader and names bad
//! requests, and verl's `compute_score` (integrations/verl, through the grader process) gives the
//! rewards `arc-rec eval` gave the same completions.

use std::collections::HashMap;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde_json::{Value, json};

use crate::helpers::{arc_rec, fresh_database, run, training_world, world_grader_args};

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The project's virtualenv python (the test command's setup installs it).
fn python() -> PathBuf {
    let python = repo().join(".venv/bin/python");
    assert!(
        python.is_file(),
        "{} is missing: run scripts/setup.sh (the test command does)",
        python.display()
    );
    python
}

fn lines(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// Sends `requests` to `grade serve --run RUN` in one pipelined batch; returns the answers.
fn grade(url: &str, run_dir: &Path, requests: &[String]) -> Vec<Value> {
    let binary = assert_cmd::cargo::cargo_bin("arc-rec");
    let mut child = Command::new(binary)
        .env("DATABASE_URL", url)
        .args(["grade", "serve", "--run"])
        .arg(run_dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    for request in requests {
        writeln!(stdin, "{request}").unwrap();
    }
    drop(stdin);
    let output = child.wait_with_output().unwrap();
    assert!(output.status.success(), "{output:?}");
    String::from_utf8(output.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn verl_rows_and_the_grader_process_give_eval_s_rewards() {
    let db = fresh_database().await;
    let dir = tempfile::tempdir().unwrap();
    training_world(&db.url, dir.path(), None);
    let run_dir = dir.path().join("run");
    run(arc_rec(&db.url)
        .arg("train")
        .arg("--data")
        .arg(dir.path().join("examples.jsonl"))
        .arg("--model")
        .arg(dir.path().join("tiny"))
        .arg("--out")
        .arg(&run_dir)
        .args(world_grader_args())
        .args(["--sft-steps", "2", "--sft-batch", "4", "--steps", "1"])
        .args(["--k", "2", "--n", "2", "--prompts-per-step", "1"])
        // Room for a few free tokens before the sampler closes the JSON (within 32 tokens of the
        // limit it takes the grammar's shortest way out): at 24 every sample of this barely
        // trained model was that one shortest answer, and every reward the same.
        .args(["--max-new-tokens", "64", "--device", "cpu", "--no-record"]));

    // The rows: one per prompt of the run's data, in its order, with the ids the grader checks.
    let rows_path = dir.path().join("rows.jsonl");
    let [_, seed, _, outcomes] = world_grader_args();
    run(arc_rec(&db.url)
        .args(["export", "--format", "verl", "--world-seed", seed])
        .args(["--world-outcomes", outcomes, "--out"])
        .arg(&rows_path));
    let rows = lines(&rows_path);
    let dataset = arc_rec::rft::RftDataset::load(&dir.path().join("examples.jsonl")).unwrap();
    assert_eq!(rows.len(), dataset.prompts.len());
    for (row, prompt) in rows.iter().zip(&dataset.prompts) {
        assert_eq!(row["extra_info"]["prompt_id"], prompt.id.as_str());
        assert_eq!(row["prompt"][1]["content"], prompt.user_turn.as_str());
        assert_eq!(row["extra_info"]["world_seed"].to_string(), seed);
    }
    let validation_path = dir.path().join("validation.jsonl");
    run(arc_rec(&db.url)
        .args([
            "export",
            "--format",
            "verl",
            "--split",
            "validation",
            "--out",
        ])
        .arg(&validation_path));
    let validation = lines(&validation_path);
    assert_eq!(
        validation.len(),
        dataset.split(arc_rec::export::Split::Validation).len()
    );
    assert!(
        validation
            .iter()
            .all(|r| r["extra_info"]["split"] == "validation")
    );

    // verl's own RLHFDataset reads the rows with the tiny model's tokenizer (where verl is
    // installed: scripts/verl/setup.sh).
    let verl_python = repo().join(".venv-verl/bin/python");
    if verl_python.is_file() {
        let output = Command::new(&verl_python)
            .arg(repo().join("integrations/verl/tests/check_dataset.py"))
            .arg("--rows")
            .arg(&rows_path)
            .arg("--model")
            .arg(dir.path().join("tiny"))
            .output()
            .unwrap();
        assert!(output.status.success(), "{output:?}");
        // verl prints its own progress lines; the summary is the last.
        let stdout = String::from_utf8(output.stdout).unwrap();
        let summary: Value = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
        assert_eq!(summary["loaded"], rows.len());
    } else {
        eprintln!(
            "skipped: verl's RLHFDataset check needs {} (scripts/verl/setup.sh)",
            verl_python.display()
        );
    }

    // eval's graded completions, then the same completions through verl's compute_score.
    let samples_path = dir.path().join("samples.jsonl");
    run(arc_rec(&db.url)
        .args(["eval", "--run"])
        .arg(&run_dir)
        .args(["--n", "3", "--max-prompts", "4", "--models", "warmup,rl"])
        .args(["--device", "cpu", "--seed", "5", "--json", "--samples-out"])
        .arg(&samples_path));
    let samples = lines(&samples_path);
    // eval samples the split it reports on: test.
    let held_out = dataset.split(dataset.reported_split()).len().min(4);
    assert_eq!(
        samples.len(),
        2 * held_out * (3 + 1),
        "2 models × {held_out} prompts × (3 samples + greedy)"
    );
    assert!(samples.iter().all(|s| s["draw"] == 5));
    // Under `timeout`: a grader process that stopped answering fails the test, not hangs it.
    let output = Command::new("timeout")
        .arg("300")
        .arg(python())
        .current_dir(repo().join("integrations/verl"))
        .env("ARC_REC_RUN", &run_dir)
        .env("ARC_REC_BIN", assert_cmd::cargo::cargo_bin("arc-rec"))
        .env("DATABASE_URL", &db.url)
        .args(["-m", "arc_rec_verl.reward", "--rows"])
        .arg(&rows_path)
        .arg("--samples")
        .arg(&samples_path)
        .output()
        .unwrap();
    assert!(output.status.success(), "{output:?}");
    let scored: Vec<Value> = String::from_utf8(output.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(scored.len(), samples.len());
    let mut rewards: HashMap<String, usize> = HashMap::new();
    for (sample, score) in samples.iter().zip(&scored) {
        assert_eq!(score["prompt_id"], sample["prompt_id"]);
        assert_eq!(
            score["score"].as_f64(),
            sample["reward"].as_f64(),
            "{sample} scored {score}"
        );
        assert_eq!(
            score["accepted"].as_f64().unwrap() > 0.5,
            sample["accepted"] == true
        );
        assert!(
            score["true_acceptance"].is_f64(),
            "the world grader knows the truth"
        );
        *rewards.entry(score["score"].to_string()).or_default() += 1;
    }
    // The completions are graded, not waved through: accepted and rejected ones both occur.
    assert!(rewards.len() >= 2, "{rewards:?}");

    // An adapter comes back: a PEFT adapter (here the run's own, in the format verl's merger
    // writes) checked and placed into a new run directory evaluates as it did in its own run.
    let back = dir.path().join("back");
    let script = repo().join("scripts/verl/adapter_to_run.py");
    let output = Command::new(python())
        .arg(&script)
        .arg("--run")
        .arg(&run_dir)
        .arg("--adapter")
        .arg(run_dir.join("adapter"))
        .arg("--out")
        .arg(&back)
        .output()
        .unwrap();
    assert!(output.status.success(), "{output:?}");
    let eval_rl = |run_dir: &Path| -> Value {
        let stdout = run(arc_rec(&db.url)
            .args(["eval", "--run"])
            .arg(run_dir)
            .args(["--n", "2", "--max-prompts", "2", "--models", "rl"])
            .args(["--device", "cpu", "--json"]));
        let mut report: Value = serde_json::from_str(&stdout).unwrap();
        let model = report["models"][0].as_object_mut().unwrap();
        model.remove("seconds");
        model.remove("path");
        report["models"][0].take()
    };
    assert_eq!(eval_rl(&back), eval_rl(&run_dir));
    // verl's merger without lora_train_meta.json writes lora_alpha 0: refused, naming it.
    let zero = dir.path().join("alpha-zero");
    std::fs::create_dir(&zero).unwrap();
    std::fs::copy(
        run_dir.join("adapter/adapter_model.safetensors"),
        zero.join("adapter_model.safetensors"),
    )
    .unwrap();
    let mut config: Value = serde_json::from_slice(
        &std::fs::read(run_dir.join("adapter/adapter_config.json")).unwrap(),
    )
    .unwrap();
    config["lora_alpha"] = json!(0);
    std::fs::write(zero.join("adapter_config.json"), config.to_string()).unwrap();
    let output = Command::new(python())
        .arg(&script)
        .arg("--run")
        .arg(&run_dir)
        .arg("--adapter")
        .arg(&zero)
        .arg("--out")
        .arg(dir.path().join("never"))
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(1), "{output:?}");
    assert!(String::from_utf8_lossy(&output.stderr).contains("lora_alpha is 0"));
    assert!(!dir.path().join("never").exists());

    // The protocol: errors are answers naming the field, and the process goes on.
    let prompt = &rows[0]["extra_info"];
    let completion = samples[0]["completion"].as_str().unwrap();
    let answers = grade(
        &db.url,
        &run_dir,
        &[
            "not json".to_owned(),
            json!({"id": 1, "prompt_id": "acme/none/1", "completion": completion}).to_string(),
            json!({"id": 2, "prompt_id": prompt["prompt_id"], "completion": completion,
                   "configuration_id": "another"})
            .to_string(),
            json!({"id": 3, "prompt_id": prompt["prompt_id"], "completion": completion,
                   "data_source": "gsm8k"})
            .to_string(),
            json!({"id": 4, "prompt_id": prompt["prompt_id"], "completion": "{not a diff",
                   "organization": prompt["organization"],
                   "current_configuration": prompt["current_configuration"]})
            .to_string(),
            json!({"id": 5, "prompt_id": prompt["prompt_id"], "completion": completion,
                   "colour": "red"})
            .to_string(),
        ],
    );
    assert_eq!(answers.len(), 6);
    let error = |i: usize| answers[i]["error"].as_str().unwrap_or_default().to_owned();
    assert!(error(0).contains("bad request"), "{}", answers[0]);
    assert!(error(1).contains("prompt_id") && error(1).contains("acme/none/1"));
    assert!(error(2).contains("configuration_id") && error(2).contains("another"));
    assert!(error(3).contains("data_source"));
    assert_eq!(answers[4]["id"], 4);
    assert_eq!(answers[4]["format_valid"], false);
    assert_eq!(answers[4]["reward"], -1.0);
    assert!(error(5).contains("colour"), "{}", answers[5]);
}
