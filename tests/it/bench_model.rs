//! `arc-rec bench model` through the binary on the tiny preset: both sides report every phase (the
//! RL step included) for the same token counts, `--phases` narrows the run, and a missing reference
//! is explained (and fatal only with --reference).

use serde_json::Value;

use crate::helpers::arc_rec;

/// Nothing listens here: a command that tried to open the database would fail.
const NO_DATABASE: &str = "postgres://nobody@127.0.0.1:1/none";

const PHASES: [&str; 4] = [
    "generate_batch1",
    "generate_k",
    "lora_train_step",
    "rl_step",
];

/// The smallest sizes that still exercise every phase: seconds on two cores.
const TINY_SIZES: [&str; 14] = [
    "--prompt-tokens",
    "16",
    "--new-tokens",
    "8",
    "--samples",
    "4",
    "--train-seq",
    "32",
    "--repeats",
    "2",
    "--warmup",
    "1",
    "--threads",
    "1",
];

fn bench_model(extra: &[&str]) -> std::process::Output {
    arc_rec(NO_DATABASE)
        .args(["bench", "model", "--device", "cpu", "--json"])
        .args(TINY_SIZES)
        .args(extra)
        .output()
        .unwrap()
}

fn report(output: &std::process::Output) -> Value {
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).unwrap()
}

#[test]
fn bench_model_compares_every_phase_with_the_pytorch_reference_on_the_same_work() {
    let report = report(&bench_model(&["--reference"]));
    let reference = &report["reference"];
    assert_eq!(report["reference_error"], Value::Null);
    // The same threads, model and sizes on both sides.
    assert_eq!(report["settings"]["torch_threads"], 1);
    assert_eq!(reference["settings"]["cpu_threads"], 1);
    assert_eq!(
        report["settings"]["parameters"],
        reference["settings"]["parameters"]
    );
    // The RL step counts 4 × 8 generated and 4 × (16 + 8) trained tokens.
    let expected_tokens = [
        ("generate_batch1", 8),
        ("generate_k", 32),
        ("lora_train_step", 128),
        ("rl_step", 32 + 96),
    ];
    for (phase, tokens) in expected_tokens {
        let ours = &report["arc_rec"][phase];
        assert_eq!(ours["tokens_per_run"], tokens, "{phase}");
        assert_eq!(ours["seconds"].as_array().map(Vec::len), Some(2), "{phase}");
        assert!(ours["tokens_per_s"].as_f64().unwrap() > 0.0, "{phase}");
        let theirs = &reference[phase];
        let count = if matches!(phase, "lora_train_step" | "rl_step") {
            &theirs["tokens_per_step"]
        } else {
            &theirs["tokens_per_run"]
        };
        assert_eq!(*count, tokens, "{phase}");
        assert!(theirs["tokens_per_s"].as_f64().unwrap() > 0.0, "{phase}");
    }
    let comparison = report["comparison"].as_array().unwrap();
    assert_eq!(comparison.len(), PHASES.len());
    for (row, phase) in comparison.iter().zip(PHASES) {
        assert_eq!(row["phase"], phase);
        let ratio = row["ratio"].as_f64().unwrap();
        let expected = report["arc_rec"][phase]["tokens_per_s"].as_f64().unwrap()
            / reference[phase]["tokens_per_s"].as_f64().unwrap();
        assert!((ratio - expected).abs() <= 1e-9 * expected, "{phase}");
        assert_eq!(row["meets_goal"], ratio >= 1.0, "{phase}");
    }
    // Batch 1 is greedy and the k samples are drawn, as transformers' generate calls are.
    assert_eq!(reference["generate_batch1"]["do_sample"], false);
    assert_eq!(reference["generate_k"]["do_sample"], true);
    assert_eq!(reference["rl_step"]["do_sample"], true);
    // The RL step on both sides: the same split of the tokens, both parts timed, and gradient
    // checkpointing off on both (auto: the model is under 1B parameters).
    let ours = &report["arc_rec"]["rl_step"];
    let theirs = &reference["rl_step"];
    for side in [ours, theirs] {
        assert_eq!(side["generated_tokens"], 32);
        assert_eq!(side["trained_tokens"], 96);
        assert_eq!(side["gradient_checkpointing"], false);
        for part in ["generate_seconds_median", "train_seconds_median"] {
            assert!(side[part].as_f64().unwrap() > 0.0, "{part}");
        }
        assert_eq!(side["losses"].as_array().map(Vec::len), Some(3));
    }
    assert_eq!(report["settings"]["gradient_checkpointing"], false);
    // The constrained phase is ours alone: measured, never sent to the reference.
    let constrained = &report["arc_rec"]["generate_k_constrained"];
    let tokens = constrained["tokens_per_run"].as_i64().unwrap();
    assert!((1..=32).contains(&tokens), "{tokens}: at most 4 × 8");
    let share = constrained["mask_share"].as_f64().unwrap();
    assert!(share > 0.0 && share < 1.0, "{share}");
    assert_eq!(reference.get("generate_k_constrained"), None);
    let row = &comparison[3];
    assert!(row["arc_rec_seconds"].as_f64().unwrap() > 0.0);
    assert!(row["reference_seconds"].as_f64().unwrap() > 0.0);
}

#[test]
fn bench_model_phases_runs_only_the_named_phases() {
    let report = report(&bench_model(&["--phases", "rl_step", "--no-reference"]));
    assert_eq!(report["settings"]["phases"], serde_json::json!(["rl_step"]));
    for phase in ["generate_batch1", "generate_k", "lora_train_step"] {
        assert_eq!(report["arc_rec"][phase], Value::Null, "{phase}");
    }
    let rl = &report["arc_rec"]["rl_step"];
    assert_eq!(rl["tokens_per_run"], 128);
    assert!(rl["tokens_per_s"].as_f64().unwrap() > 0.0);
}

#[test]
fn bench_model_without_the_reference_reports_why_and_fails_only_when_it_was_asked_for() {
    let missing = "/nonexistent/python";
    let report = report(&bench_model(&["--python", missing]));
    assert_eq!(report["reference"], Value::Null);
    assert_eq!(report["comparison"], Value::Array(Vec::new()));
    let reason = report["reference_error"].as_str().unwrap();
    assert!(reason.contains(missing), "{reason}");
    for phase in PHASES {
        assert!(report["arc_rec"][phase]["tokens_per_s"].as_f64().unwrap() > 0.0);
    }

    let output = bench_model(&["--python", missing, "--reference"]);
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("--reference was asked for") && stderr.contains(missing),
        "{stderr}"
    );
}

#[test]
fn bench_model_measures_the_grammar_alone_and_names_a_bad_tokenizer() {
    let report = report(&bench_model(&[
        "--phases",
        "generate_k_constrained,rl_step_constrained",
    ]));
    let reason = report["reference_error"].as_str().unwrap();
    assert!(reason.contains("PyTorch counterpart"), "{reason}");
    let constrained = &report["arc_rec"]["generate_k_constrained"];
    assert_eq!(
        constrained["mask_seconds"].as_array().map(Vec::len),
        Some(2)
    );
    assert!(constrained["mask_ms_per_token"].as_f64().unwrap() > 0.0);
    // The allowed sets beside the forward, against the same seeds with them after it: the same
    // samples, so the same tokens, and no work beside the forward there.
    assert!(constrained["beside_forward_ms_per_token"].as_f64().unwrap() > 0.0);
    let after = &constrained["after_forward"];
    assert_eq!(after["tokens"], constrained["tokens"]);
    assert!(after["mask_ms_per_token"].as_f64().unwrap() > 0.0);
    assert!(after["tokens_per_s"].as_f64().unwrap() > 0.0);
    let default = constrained["default_schedule"].as_str().unwrap();
    assert!(
        ["beside_forward", "after_forward"].contains(&default),
        "{default}"
    );
    let vocab = constrained["tokenizer_vocab"].as_u64().unwrap();
    assert!(
        (256..=1024).contains(&vocab),
        "the tiny preset's byte-level BPE: {vocab}"
    );
    assert_eq!(report["arc_rec"]["generate_k"], Value::Null);

    // The RL step with the training update: 2 passes × 2 minibatches of the 4 samples, each
    // sample at most 8 tokens, the sampler's and the first minibatch's log-probs equal.
    let rl = &report["arc_rec"]["rl_step_constrained"];
    assert_eq!(rl["optimizer_steps"], 4);
    assert_eq!(
        rl["losses"].as_array().map(Vec::len),
        Some(3),
        "warm-up + 2"
    );
    let generated: Vec<i64> = serde_json::from_value(rl["generated_tokens"].clone()).unwrap();
    let trained: Vec<i64> = serde_json::from_value(rl["trained_tokens"].clone()).unwrap();
    assert_eq!(generated.len(), 2, "one per timed step");
    for (generated, trained) in generated.iter().zip(&trained) {
        assert!((4..=32).contains(generated), "{generated}: 4 × 1 to 4 × 8");
        assert_eq!(
            *trained,
            generated + 4 * 16,
            "prompt + completion positions"
        );
    }
    assert_eq!(
        rl["tokens_per_run"].as_i64().unwrap(),
        generated
            .iter()
            .zip(&trained)
            .map(|(g, t)| g + 2 * t)
            .sum::<i64>()
            / 2,
        "generated + two passes of trained tokens, mean of the timed steps"
    );
    for ratio in rl["first_max_abs_log_ratios"].as_array().unwrap() {
        assert!(ratio.as_f64().unwrap() < 1e-4, "{ratio}");
    }
    let parts: f64 = ["generate", "reference", "update"]
        .iter()
        .map(|part| rl[format!("{part}_seconds_median")].as_f64().unwrap())
        .sum();
    assert!(parts > 0.0);
    assert!(rl["mask_share_of_generation"].as_f64().unwrap() > 0.0);

    let output = bench_model(&["--phases", "rl_step_constrained", "--minibatches", "5"]);
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("between 1 and 4 minibatches"), "{stderr}");

    let output = bench_model(&[
        "--phases",
        "generate_k_constrained",
        "--tokenizer",
        "/nonexistent/tokenizer",
    ]);
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("--tokenizer /nonexistent/tokenizer"),
        "{stderr}"
    );
}

#[test]
fn bench_model_refuses_qwen2_5_7b_on_the_cpu() {
    let output = arc_rec(NO_DATABASE)
        .args(["bench", "model", "--shape", "qwen2.5-7b", "--device", "cpu"])
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("refusing qwen2.5-7b on the CPU"),
        "{stderr}"
    );
}
