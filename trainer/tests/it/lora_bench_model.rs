//! The model benchmark's measurement code on a tiny random model: the training-step figures are
//! consistent, random initialisation follows transformers' scheme, parameter counts are right for
//! Qwen2.5-7B, and the PyTorch reference's JSON (or failure) comes back to the caller.

use crate::common::{repo_root, venv_python};
use std::path::Path;

use tch::Kind;
use trainer::bench_model::{
    BenchError, generation_throughput, parameter_count, qwen2_5_7b_config, random_model,
    random_prompt, run_reference_bench, train_step_throughput,
};
use trainer::device::{DeviceRequest, Runtime};
use trainer::model::{Config, LoraConfig};

fn tiny_config() -> Config {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tiny-qwen2/config.json");
    Config::from_file(&path).unwrap()
}

#[test]
fn parameter_count_matches_qwen2_5_7b_and_a_built_model() {
    assert_eq!(parameter_count(&qwen2_5_7b_config()), 7_615_616_512);
    for tied in [true, false] {
        let config = Config {
            tie_word_embeddings: tied,
            ..tiny_config()
        };
        let runtime = Runtime::select(DeviceRequest::Cpu).unwrap();
        let expected = parameter_count(&config);
        let model = random_model(config, runtime, 0.02, None).unwrap();
        let built: usize = model
            .var_store()
            .variables()
            .values()
            .map(|tensor| tensor.numel())
            .sum();
        assert_eq!(built as i64, expected, "tied {tied}");
    }
}

#[test]
fn random_model_initialises_like_transformers() {
    let runtime = Runtime::select(DeviceRequest::Cpu).unwrap();
    tch::manual_seed(0);
    let model = random_model(tiny_config(), runtime, 0.02, Some(&LoraConfig::default())).unwrap();
    for (name, tensor) in model.var_store().variables() {
        let (mean, std) = (
            tensor.mean(Kind::Float).double_value(&[]),
            tensor.std(true).double_value(&[]),
        );
        if name.ends_with("norm.weight") {
            assert_eq!((mean, std), (1.0, 0.0), "{name}");
        } else if name.ends_with(".bias") || name.ends_with(".lora_B.weight") {
            assert_eq!(tensor.abs().max().double_value(&[]), 0.0, "{name}");
        } else if name.ends_with(".lora_A.weight") {
            // PEFT's kaiming-uniform, untouched by the base initialisation.
            assert!(std > 0.03, "{name}: std {std}");
        } else {
            assert!(
                mean.abs() < 0.005 && (std - 0.02).abs() < 0.004,
                "{name}: {mean} {std}"
            );
        }
    }
}

#[test]
fn random_prompts_are_fixed_by_the_seed_and_avoid_the_pad_id() {
    let prompt = random_prompt(5, 200, 3).unwrap();
    assert_eq!(prompt, random_prompt(5, 200, 3).unwrap());
    assert_ne!(prompt, random_prompt(5, 200, 4).unwrap());
    assert!(prompt.iter().all(|id| (1..5).contains(id)), "{prompt:?}");
    assert!((1..5).all(|id| prompt.contains(&id)), "every id drawn");
    assert!(matches!(
        random_prompt(1, 4, 0),
        Err(BenchError::Settings(_))
    ));
}

#[test]
fn generation_throughput_counts_every_new_token_of_every_sample() {
    let runtime = Runtime::select(DeviceRequest::Cpu).unwrap();
    tch::manual_seed(2);
    let config = tiny_config();
    let prompt = random_prompt(config.vocab_size, 5, 0).unwrap();
    let model = random_model(config, runtime, 0.02, Some(&LoraConfig::default())).unwrap();
    for (sequences, sampled) in [(1, false), (3, true)] {
        let report = generation_throughput(&model, &prompt, sequences, 4, sampled, 1, 2).unwrap();
        let figures = &report.throughput;
        assert_eq!(figures.tokens_per_repeat, sequences as i64 * 4);
        assert_eq!(figures.seconds.len(), 2);
        assert!(figures.tokens_per_s > 0.0 && figures.tokens_per_s.is_finite());
        assert_eq!(
            (report.prompt_tokens, report.new_tokens_per_sequence),
            (5, 4)
        );
        assert_eq!(report.sampled, sampled);
    }
    assert!(matches!(
        generation_throughput(&model, &prompt, 0, 4, true, 0, 1),
        Err(BenchError::Settings(_))
    ));
}

#[test]
fn train_step_throughput_reports_consistent_figures() {
    let runtime = Runtime::select(DeviceRequest::Cpu).unwrap();
    tch::manual_seed(1);
    let model = random_model(tiny_config(), runtime, 0.02, Some(&LoraConfig::default())).unwrap();
    let report = train_step_throughput(&model, 2, 16, 3, 1).unwrap();
    let figures = &report.throughput;
    assert_eq!(figures.tokens_per_repeat, 32);
    assert_eq!(figures.seconds.len(), 3);
    assert_eq!(report.losses.len(), 4, "warm-up step included");
    let mut sorted = figures.seconds.clone();
    sorted.sort_by(f64::total_cmp);
    assert_eq!(figures.median_s, sorted[1]);
    assert!((figures.tokens_per_s - 32.0 / figures.median_s).abs() < 1e-9);
    assert_eq!(figures.peak_memory_bytes, None);
    // r=16 on 7 projections of 2 layers: A is [16, in], B is [out, 16].
    let config = tiny_config();
    let (hidden, inner) = (config.hidden_size, config.intermediate_size);
    let (q, kv) = (
        config.num_attention_heads * config.head_dim,
        config.num_key_value_heads * config.head_dim,
    );
    let per_layer = 16
        * ((hidden + q)
            + 2 * (hidden + kv)
            + (q + hidden)
            + 2 * (hidden + inner)
            + (inner + hidden));
    assert_eq!(
        report.trainable_parameters,
        config.num_hidden_layers * per_layer
    );
    // A random model predicts random tokens at about ln(vocab) nats.
    let uniform = (config.vocab_size as f64).ln();
    assert!(
        report
            .losses
            .iter()
            .all(|loss| (loss - uniform).abs() < 0.5),
        "{:?}",
        report.losses
    );
    assert!(matches!(
        train_step_throughput(&model, 2, 1, 1, 0),
        Err(BenchError::Settings(_))
    ));
}

#[test]
fn reference_bench_json_or_failure_reaches_the_caller() {
    let python = venv_python();
    let script = repo_root().join("bench/model_reference.py");
    let report = run_reference_bench(
        &python,
        &script,
        &[
            "--tiny",
            "--device",
            "cpu",
            "--phases",
            "lora_train_step",
            "--warmup",
            "0",
            "--repeats",
            "1",
            "--k",
            "2",
            "--train-len",
            "8",
        ],
    )
    .unwrap();
    let phase = &report["lora_train_step"];
    assert_eq!(phase["tokens_per_step"], 16);
    assert!(phase["tokens_per_s"].as_f64().unwrap() > 0.0);
    assert_eq!(report["settings"]["lora_r"], 16);

    let missing = repo_root().join("bench/no_such_script.py");
    let error = run_reference_bench(&python, &missing, &[]).unwrap_err();
    assert!(
        matches!(error, BenchError::ReferenceFailed { .. }),
        "{error}"
    );
}
