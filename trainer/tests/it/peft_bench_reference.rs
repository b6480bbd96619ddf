//! Keeps bench/model_reference.py (the transformers + peft reference `arc-rec bench model` compares
//! against) working: a tiny random Qwen2 on the CPU must yield one JSON object whose token counts
//! follow the settings.

use std::path::Path;
use std::process::Command;

use serde_json::Value;

#[test]
fn reference_benchmark_reports_every_phase_as_json() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let python = root.join(".venv/bin/python");
    assert!(
        python.exists(),
        "{} is missing: run scripts/setup.sh to create .venv with torch, transformers and peft",
        python.display()
    );
    let output = Command::new(&python)
        .arg(root.join("bench/model_reference.py"))
        .args(["--tiny", "--device", "cpu", "--new-tokens", "3", "--k", "2"])
        .args(["--train-len", "8", "--warmup", "0", "--repeats", "1"])
        .env("HF_HUB_OFFLINE", "1")
        .output()
        .unwrap_or_else(|error| panic!("cannot run {}: {error}", python.display()));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "model_reference.py failed ({}); if transformers or peft is missing, run scripts/setup.sh\n{stderr}",
        output.status
    );
    let report: Value = serde_json::from_slice(&output.stdout).unwrap_or_else(|error| {
        panic!(
            "stdout is not one JSON object ({error}):\n{}",
            String::from_utf8_lossy(&output.stdout)
        )
    });
    assert_eq!(report["settings"]["dtype"], "float32");
    assert_eq!(report["settings"]["device"], "cpu");
    let expected_tokens = [
        ("generate_batch1", "tokens_per_run", 3),
        ("generate_k", "tokens_per_run", 2 * 3),
        ("lora_train_step", "tokens_per_step", 2 * 8),
    ];
    for (phase, field, tokens) in expected_tokens {
        assert_eq!(report[phase][field], tokens, "{phase}: {}", report[phase]);
        let seconds = report[phase]["seconds_median"].as_f64().unwrap();
        let rate = report[phase]["tokens_per_s"].as_f64().unwrap();
        assert!(seconds > 0.0, "{phase}: {seconds}");
        assert!(
            (rate * seconds - tokens as f64).abs() < 1e-6 * tokens as f64,
            "{phase}: {rate} tokens/s over {seconds} s is not {tokens} tokens"
        );
    }
    assert_eq!(
        report["lora_train_step"]["trainable_parameters"],
        lora_parameter_count()
    );
}

/// LoRA parameters of the tiny model: r · (in + out) for each of the seven projections in both
/// layers (hidden 64, 4 heads of 16 with 2 KV heads so k/v project to 32, intermediate 128).
fn lora_parameter_count() -> i64 {
    let r = 16;
    let per_layer = [
        (64, 64),
        (64, 32),
        (64, 32),
        (64, 64),
        (64, 128),
        (64, 128),
        (128, 64),
    ]
    .iter()
    .map(|(input, output)| r * (input + output))
    .sum::<i64>();
    2 * per_layer
}
