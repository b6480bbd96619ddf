//! `trainer::generate` on the tiny transformers fixtures: greedy equals transformers' continuations
//! (alone and left-padded), seeded draws are reproducible and independent of batch composition,
//! returned log-probs equal a teacher-forced forward, one prefill serves k samples, eos and stop
//! strings cut samples, and bad requests are named errors.

use std::collections::BTreeSet;

use crate::common::{FIXTURES, load_model, read_reference};
use serde::Deserialize;
use tch::{Kind, Tensor};
use trainer::generate::{
    FinishReason, FinishedRows, GenerateError, Generation, GenerationRequest, Sample, StopStrings,
    generate,
};
use trainer::model::{CausalLm, Logits};

#[derive(Debug, Deserialize)]
struct Reference {
    prompts: Vec<Vec<i64>>,
    greedy: Vec<Vec<i64>>,
    new_tokens: usize,
}

fn load(name: &str) -> (CausalLm, Reference) {
    (load_model(name), read_reference(name))
}

fn greedy_request(prompts: Vec<Vec<i64>>, new_tokens: usize) -> GenerationRequest<'static> {
    let mut request = GenerationRequest::new(prompts);
    request.temperature = 0.0;
    request.max_new_tokens = new_tokens;
    request
}

/// Temperature 1 with both filters on, so every sampling path runs.
fn sampling_request(prompts: Vec<Vec<i64>>, samples: usize) -> GenerationRequest<'static> {
    let mut request = GenerationRequest::new(prompts);
    request.num_samples = samples;
    request.max_new_tokens = 12;
    request.temperature = 1.0;
    request.top_k = 64;
    request.top_p = 0.95;
    request.seed = 7;
    request
}

fn tokens_of(generation: &Generation) -> Vec<Vec<i64>> {
    generation
        .samples
        .iter()
        .map(|sample| sample.tokens.clone())
        .collect()
}

#[test]
fn greedy_equals_transformers_alone_and_left_padded() {
    for name in FIXTURES {
        let (model, reference) = load(name);
        for (index, prompt) in reference.prompts.iter().enumerate() {
            let request = greedy_request(vec![prompt.clone()], reference.new_tokens);
            let generation = generate(&model, &request).unwrap();
            let sample = &generation.samples[0];
            assert_eq!(
                sample.tokens, reference.greedy[index],
                "{name} prompt {index}"
            );
            assert_eq!(sample.finish_reason, FinishReason::Length);
            assert!(sample.sampling_logprobs.iter().all(|&lp| lp == 0.0));
        }
        // The prompts have different lengths, so the shorter one is left-padded.
        let request = greedy_request(reference.prompts.clone(), reference.new_tokens);
        let generation = generate(&model, &request).unwrap();
        assert_eq!(tokens_of(&generation), reference.greedy, "{name} batch");
        let counters = generation.counters;
        assert_eq!(counters.decode_steps, reference.new_tokens as u64 - 1);
        assert_eq!(counters.new_tokens, 2 * reference.new_tokens as u64);
    }
}

#[test]
fn top_k_one_at_temperature_one_is_greedy() {
    let (model, reference) = load("tiny-llama");
    let mut request = GenerationRequest::new(reference.prompts.clone());
    request.num_samples = 3;
    request.max_new_tokens = reference.new_tokens;
    request.top_k = 1;
    request.seed = 12345;
    let generation = generate(&model, &request).unwrap();
    for sample in &generation.samples {
        assert_eq!(sample.tokens, reference.greedy[sample.prompt_index]);
        // One token survives the filter, so the distribution drawn from is a point mass.
        assert!(sample.sampling_logprobs.iter().all(|&lp| lp.abs() < 1e-6));
        assert!(sample.logprobs.iter().all(|&lp| lp < 0.0));
    }
}

#[test]
fn same_seed_repeats_and_another_seed_differs() {
    let (model, reference) = load("tiny-qwen2");
    let mut request = GenerationRequest::new(vec![reference.prompts[0].clone()]);
    request.num_samples = 8;
    request.max_new_tokens = 16;
    request.temperature = 1.5;
    request.seed = 1;
    let first = generate(&model, &request).unwrap();
    let again = generate(&model, &request).unwrap();
    assert_eq!(first.samples, again.samples);
    request.seed = 2;
    let other = generate(&model, &request).unwrap();
    // 128 draws at temperature 1.5 over 256 tokens: agreeing everywhere is practically impossible.
    let same = tokens_of(&first)
        .iter()
        .flatten()
        .zip(tokens_of(&other).iter().flatten())
        .filter(|(a, b)| a == b)
        .count();
    assert!(same < 64, "seeds 1 and 2 agree on {same} of 128 tokens");
}

#[test]
fn a_sample_does_not_depend_on_its_batch() {
    let (model, reference) = load("tiny-qwen2");
    let batch = generate(&model, &sampling_request(reference.prompts.clone(), 4)).unwrap();
    assert_eq!(batch.samples.len(), 8);

    // Prompt 0 alone keeps its key (its index); prompt 1 alone is told its key is 1.
    let alone_first = generate(
        &model,
        &sampling_request(vec![reference.prompts[0].clone()], 4),
    );
    let mut second = sampling_request(vec![reference.prompts[1].clone()], 4);
    second.prompt_keys = Some(vec![1]);
    let alone_second = generate(&model, &second).unwrap();
    let alone: Vec<_> = alone_first
        .unwrap()
        .samples
        .into_iter()
        .chain(alone_second.samples)
        .collect();
    for (in_batch, by_itself) in batch.samples.iter().zip(&alone) {
        assert_eq!(
            in_batch.tokens, by_itself.tokens,
            "prompt {} sample {}",
            in_batch.prompt_index, in_batch.sample_index
        );
        assert_eq!(in_batch.finish_reason, by_itself.finish_reason);
        for (a, b) in in_batch.logprobs.iter().zip(&by_itself.logprobs) {
            assert!((a - b).abs() < 1e-4);
        }
    }
    // Fewer samples per prompt: the first two are the same two.
    let two = generate(&model, &sampling_request(reference.prompts.clone(), 2)).unwrap();
    for sample in &two.samples {
        let index = sample.prompt_index * 4 + sample.sample_index;
        assert_eq!(sample.tokens, batch.samples[index].tokens);
    }
    // Without the key, prompt 1 alone would be prompt 0's streams: different samples.
    let mut unkeyed = second;
    unkeyed.prompt_keys = None;
    let unkeyed = generate(&model, &unkeyed).unwrap();
    assert_ne!(tokens_of(&unkeyed), tokens_of(&batch)[4..].to_vec());
}

#[test]
fn logprobs_equal_a_teacher_forced_forward() {
    for name in FIXTURES {
        let (model, reference) = load(name);
        let generation = generate(&model, &sampling_request(reference.prompts.clone(), 3)).unwrap();
        for sample in &generation.samples {
            let prompt = &reference.prompts[sample.prompt_index];
            let full: Vec<i64> = prompt.iter().chain(&sample.tokens).copied().collect();
            let ids = Tensor::from_slice(&full).unsqueeze(0);
            let logits = tch::no_grad(|| model.forward(&ids, None, None, Logits::All)).unwrap();
            let start = prompt.len() as i64 - 1;
            let count = sample.tokens.len() as i64;
            let targets = Tensor::from_slice(&sample.tokens).reshape([1, count, 1]);
            let expected = logits
                .log_softmax(-1, Kind::Float)
                .narrow(1, start, count)
                .gather(2, &targets, false)
                .reshape([count]);
            let returned = Tensor::from_slice(&sample.logprobs);
            let diff = (&returned - &expected).abs().max().double_value(&[]);
            assert!(
                diff < 1e-4,
                "{name} prompt {} sample {}: {diff}",
                sample.prompt_index,
                sample.sample_index
            );
            // The filtered distribution is renormalised over fewer tokens: never less likely.
            for (policy, sampled) in sample.logprobs.iter().zip(&sample.sampling_logprobs) {
                assert!(sampled >= &(policy - 1e-5) && *sampled <= 1e-6);
            }
        }
    }
}

#[test]
fn one_prefill_serves_k_distinct_samples() {
    let (model, reference) = load("tiny-llama");
    let generation = generate(&model, &sampling_request(reference.prompts.clone(), 8)).unwrap();
    let counters = generation.counters;
    assert_eq!(counters.prefill_forwards, 1);
    let lengths: u64 = reference.prompts.iter().map(|p| p.len() as u64).sum();
    assert_eq!(counters.prefill_tokens, lengths);
    assert_eq!(counters.prefill_padded_tokens, 2 * 12);
    // No eos: every sample runs 12 tokens, the first from the prefill, then 11 single-token steps.
    assert_eq!(counters.decode_steps, 11);
    assert_eq!(counters.decode_rows, 11 * 16);
    assert_eq!(counters.new_tokens, 16 * 12);
    for prompt in 0..2 {
        let samples: BTreeSet<Vec<i64>> = generation.samples[prompt * 8..(prompt + 1) * 8]
            .iter()
            .map(|sample| sample.tokens.clone())
            .collect();
        assert_eq!(samples.len(), 8, "prompt {prompt}: samples repeat");
    }
}

#[test]
fn eos_cuts_a_row_and_dropping_finished_rows_changes_nothing() {
    let (model, reference) = load("tiny-qwen2");
    // 114 is the 4th greedy token of prompt 0 and the 18th of prompt 1.
    let eos = 114;
    let cut_at = |greedy: &[i64]| greedy.iter().position(|&t| t == eos).unwrap() + 1;
    assert_eq!(cut_at(&reference.greedy[0]), 4);
    assert_eq!(cut_at(&reference.greedy[1]), 18);
    let mut outputs = Vec::new();
    for policy in [
        FinishedRows::KeepStepping,
        FinishedRows::DropWhenHalfFinished,
    ] {
        let mut request = greedy_request(reference.prompts.clone(), reference.new_tokens);
        request.num_samples = 2;
        request.eos_token_ids = BTreeSet::from([eos, 255]);
        request.finished_rows = policy;
        let generation = generate(&model, &request).unwrap();
        for sample in &generation.samples {
            let greedy = &reference.greedy[sample.prompt_index];
            let cut = cut_at(greedy);
            assert_eq!(sample.tokens, greedy[..cut], "{policy:?}");
            assert_eq!(sample.logprobs.len(), cut);
            assert_eq!(sample.finish_reason, FinishReason::Eos);
        }
        let counters = generation.counters;
        // Stops once the last row has its eos: 17 steps after the prefill, not 31.
        assert_eq!(counters.decode_steps, 17);
        match policy {
            FinishedRows::KeepStepping => {
                assert_eq!(counters.compactions, 0);
                assert_eq!(counters.decode_rows, 17 * 4);
            }
            FinishedRows::DropWhenHalfFinished => {
                // Prompt 0's two rows finish after step 0's token 4: the batch halves once.
                assert_eq!(counters.compactions, 1);
                assert_eq!(counters.decode_rows, 3 * 4 + 14 * 2);
            }
        }
        outputs.push(generation.samples);
    }
    assert_same_samples(&outputs[0], &outputs[1]);
}

/// Same tokens and finish reasons; log-probs only up to float rounding, since a smaller batch may
/// take other GEMM blockings.
fn assert_same_samples(a: &[Sample], b: &[Sample]) {
    assert_eq!(a.len(), b.len());
    for (x, y) in a.iter().zip(b) {
        assert_eq!(
            (x.prompt_index, x.sample_index, &x.tokens, x.finish_reason),
            (y.prompt_index, y.sample_index, &y.tokens, y.finish_reason)
        );
        for (p, q) in x.logprobs.iter().zip(&y.logprobs) {
            assert!((p - q).abs() < 1e-5, "{p} vs {q}");
        }
    }
}

#[test]
fn stop_strings_match_across_tokens_through_the_decoder() {
    let (model, reference) = load("tiny-qwen2");
    let decoder = |ids: &[i64]| ids.iter().map(|id| format!("{id} ")).collect::<String>();
    let mut request = greedy_request(reference.prompts.clone(), reference.new_tokens);
    request.stop = Some(StopStrings {
        strings: vec!["999 ".into(), "250 114".into()],
        decoder: &decoder,
    });
    let generation = generate(&model, &request).unwrap();
    // Prompt 0's greedy continuation is 73 155 250 114 …: "250 114" completes on the 4th token.
    let first = &generation.samples[0];
    assert_eq!(first.tokens, reference.greedy[0][..4]);
    assert_eq!(first.finish_reason, FinishReason::StopString(1));
    // Prompt 1's never contains it and runs to the length limit.
    let second = &generation.samples[1];
    assert_eq!(second.tokens, reference.greedy[1]);
    assert_eq!(second.finish_reason, FinishReason::Length);
}

#[test]
fn bad_requests_are_named_errors() {
    let (model, reference) = load("tiny-qwen2");
    let prompt = reference.prompts[0].clone();
    let check = |request: GenerationRequest<'_>, expected: &str| {
        let error = generate(&model, &request).unwrap_err();
        let message = error.to_string();
        assert!(message.contains(expected), "{message:?} lacks {expected:?}");
        error
    };
    check(GenerationRequest::new(vec![]), "no prompts");
    let error = check(
        GenerationRequest::new(vec![prompt.clone(), vec![]]),
        "prompt 1 of the generation request is empty",
    );
    assert!(matches!(error, GenerateError::EmptyPrompt { index: 1 }));
    let mut request = GenerationRequest::new(vec![prompt.clone()]);
    request.num_samples = 0;
    check(request, "num_samples");
    let mut request = GenerationRequest::new(vec![prompt.clone()]);
    request.max_new_tokens = 0;
    check(request, "max_new_tokens");
    let mut request = GenerationRequest::new(vec![prompt.clone()]);
    request.max_new_tokens = 506;
    check(
        request,
        "needs 513 positions but the model's max_position_embeddings is 512",
    );
    for temperature in [-1.0, f64::INFINITY, f64::NAN] {
        let mut request = GenerationRequest::new(vec![prompt.clone()]);
        request.temperature = temperature;
        check(request, "temperature");
    }
    for top_p in [0.0, 1.5, f64::NAN] {
        let mut request = GenerationRequest::new(vec![prompt.clone()]);
        request.top_p = top_p;
        check(request, "top_p");
    }
    check(
        GenerationRequest::new(vec![prompt.clone(), vec![3, 256]]),
        "prompt 1 position 1 is token id 256, outside the model's vocabulary [0, 256)",
    );
    check(GenerationRequest::new(vec![vec![-1]]), "token id -1");
    let mut request = GenerationRequest::new(vec![prompt.clone()]);
    request.eos_token_ids = BTreeSet::from([1000]);
    check(request, "eos_token_ids is token id 1000");
    let mut request = GenerationRequest::new(vec![prompt.clone()]);
    request.pad_token_id = 256;
    check(request, "pad_token_id");
    let mut request = GenerationRequest::new(vec![prompt.clone()]);
    request.prompt_keys = Some(vec![1, 2]);
    check(
        request,
        "prompt_keys has 2 entries but the request has 1 prompts",
    );
    let decoder = |_: &[i64]| String::new();
    let mut request = GenerationRequest::new(vec![prompt]);
    request.stop = Some(StopStrings {
        strings: vec!["x".into(), String::new()],
        decoder: &decoder,
    });
    check(request, "stop string 1 is empty");
}
