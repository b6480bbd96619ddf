//! Grammar-constrained generation (`trainer::grammar`) over the project's own tiny byte-level BPE
//! tokenizer and the reference fixtures' tokenizers: valid text passes token by token, invalid
//! continuations are refused, random walks under the masks end in JSON of the schema's shape,
//! bad schemas and unusable tokenizers give errors that say what is wrong.

use std::path::Path;
use std::time::Instant;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::{Value, json};
use trainer::generate::GrammarSchedule;
use trainer::grammar::{Grammar, GrammarError, TokenMatcher, TokenSet, stack_token_sets};
use trainer::preset::write_tiny_checkpoint;
use trainer::tokenizer::{TOKENIZER_FILE, Tokenizer};

/// Recommendation-like compact JSON and prose, as the export writes them.
fn corpus() -> Vec<String> {
    let models = ["gpt-4o-mini", "gpt-4o", "claude-3-haiku", "llama-3-70b"];
    let tools = ["web_search", "code_exec", "sql_query"];
    let mut lines = Vec::new();
    for (i, model) in models.iter().enumerate() {
        for (j, tool) in tools.iter().enumerate() {
            lines.push(format!(
                "{{\"type\":\"retry_policy\",\"diff\":{{\"model\":\"{model}\",\"retry\":{{\"max_attempts\":{}}}}},\"rationale\":\"Retry {tool} calls that time out.\"}}",
                i + j + 2
            ));
            lines.push(format!(
                "{{\"type\":\"temperature\",\"diff\":{{\"temperature\":0.{}}},\"rationale\":\"Lower the temperature for {tool}.\"}}",
                i + 2 * j
            ));
            lines.push(format!(
                "{} of 40 runs failed; {tool} timed out after {}s with {model}.",
                i + j,
                10 * (j + 1)
            ));
        }
    }
    lines
}

/// The tiny preset's tokenizer, written into `dir`: its `tokenizer.json` bytes and the loaded
/// tokenizer (stop ids resolved from the checkpoint's files).
fn tiny_tokenizer(dir: &Path) -> (Vec<u8>, Tokenizer) {
    write_tiny_checkpoint(dir, 7, corpus()).expect("tiny preset");
    let bytes = std::fs::read(dir.join(TOKENIZER_FILE)).expect("tokenizer.json");
    let tokenizer = Tokenizer::from_dir(dir).expect("tokenizer loads");
    (bytes, tokenizer)
}

/// `samples` completions of `prompt` by `policy` under `grammar`, at most `max_new_tokens` each,
/// ending at the policy's stop ids (temperature 1, seed 0 unless changed).
fn constrained_request<'g>(
    policy: &trainer::chat_policy::ChatPolicy,
    grammar: &'g Grammar,
    prompt: &[i64],
    samples: usize,
    max_new_tokens: usize,
) -> trainer::generate::GenerationRequest<'g> {
    let mut request = trainer::generate::GenerationRequest::new(vec![prompt.to_vec()]);
    request.num_samples = samples;
    request.max_new_tokens = max_new_tokens;
    request.eos_token_ids = policy.stop_ids.iter().copied().collect();
    request.grammars = std::slice::from_ref(grammar);
    request
}

fn stop_ids(tokenizer: &Tokenizer) -> Vec<i64> {
    let ids: Vec<i64> = tokenizer
        .special_tokens()
        .stop_ids
        .iter()
        .map(|&id| i64::from(id))
        .collect();
    assert!(!ids.is_empty(), "the tiny preset names its stop ids");
    ids
}

const TYPES: [&str; 3] = ["retry_policy", "model_switch", "temperature"];

/// A small recommendation-shaped schema in compact JSON: keys in the schema's order.
fn schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "type": {"enum": TYPES},
            "diff": {
                "type": "object",
                "properties": {
                    "model": {"type": "string", "minLength": 1, "maxLength": 24},
                    "temperature": {"type": "number", "minimum": 0, "maximum": 2},
                    "retry": {
                        "type": "object",
                        "properties": {
                            "max_attempts": {"type": "integer", "minimum": 1, "maximum": 100}
                        },
                        "required": ["max_attempts"],
                        "additionalProperties": false
                    }
                },
                "additionalProperties": false,
                "minProperties": 1
            },
            "rationale": {"type": "string", "minLength": 1, "maxLength": 60}
        },
        "required": ["type", "diff", "rationale"],
        "additionalProperties": false,
        "x-guidance": {"whitespace_flexible": false, "item_separator": ",", "key_separator": ":"}
    })
}

const VALID: &str = "{\"type\":\"retry_policy\",\"diff\":{\"model\":\"gpt-4o\",\"retry\":{\"max_attempts\":3}},\"rationale\":\"Retry web_search calls that time out.\"}";

fn encode(tokenizer: &Tokenizer, text: &str) -> Vec<i64> {
    tokenizer
        .encode(text, false)
        .expect("encodes")
        .into_iter()
        .map(i64::from)
        .collect()
}

/// Feeds `tokens`, checking each is in the allowed set before it is consumed.
fn feed(matcher: &mut TokenMatcher, tokens: &[i64], tokenizer: &Tokenizer) {
    for (i, &t) in tokens.iter().enumerate() {
        let allowed = matcher.allowed().expect("a mask at every position");
        assert!(
            allowed.contains(t),
            "token {i} ({t}, {:?}) not allowed after {:?}",
            tokenizer.id_to_token(t as u32),
            tokenizer.decode(
                &tokens[..i].iter().map(|&t| t as u32).collect::<Vec<_>>(),
                false
            )
        );
        matcher.consume(t).expect("allowed token is consumed");
    }
}

/// Feeds `text` choosing, at each step, the longest allowed token that continues it: a prefix
/// that ends inside bytes the grammar forces may tokenize otherwise on its own (`":{` is `":`,
/// `{` while the grammar forces the token `":{"`), so prefixes go through the masks instead.
fn feed_text(matcher: &mut TokenMatcher, tokenizer: &Tokenizer, text: &str) {
    let mut rest = text;
    while !rest.is_empty() {
        let allowed = matcher.allowed().expect("a mask at every position");
        let best = allowed
            .iter()
            .filter_map(|id| {
                let piece = tokenizer.decode(&[id as u32], false).ok()?;
                (!piece.is_empty() && rest.starts_with(&piece)).then_some((piece.len(), id))
            })
            .max();
        let (len, id) = best.unwrap_or_else(|| panic!("no allowed token continues {rest:?}"));
        matcher.consume(id).expect("allowed token is consumed");
        rest = &rest[len..];
    }
}

#[test]
fn valid_text_is_accepted_token_by_token_then_a_stop_id_ends_it() {
    let dir = tempfile::tempdir().unwrap();
    let (json_bytes, tokenizer) = tiny_tokenizer(dir.path());
    let stops = stop_ids(&tokenizer);
    let grammar =
        Grammar::from_json_schema(&json_bytes, &schema(), &stops, tokenizer.vocab_size()).unwrap();
    let mut matcher = grammar.matcher().unwrap();
    let first = matcher.allowed().unwrap();
    for &s in &stops {
        assert!(!first.contains(s), "no stop before the object");
    }
    let tokens = encode(&tokenizer, VALID);
    feed(&mut matcher, &tokens, &tokenizer);
    assert!(matcher.is_finished(), "the closing brace completes it");
    let last = matcher.allowed().unwrap();
    assert_eq!(
        last.iter().collect::<Vec<_>>(),
        {
            let mut s = stops.clone();
            s.sort_unstable();
            s
        },
        "only the stop ids may follow a complete object"
    );
    matcher.consume(stops[0]).unwrap();
    assert!(matcher.is_finished());
    assert!(matches!(matcher.allowed(), Err(GrammarError::Finished)));
    assert!(matches!(
        matcher.consume(stops[0]),
        Err(GrammarError::Finished)
    ));

    // Every stop id is allowed where the text may end, and none before.
    let mut partial = grammar.matcher().unwrap();
    feed(&mut partial, &tokens[..tokens.len() - 1], &tokenizer);
    let before_end = partial.allowed().unwrap();
    for &s in &stops {
        assert!(!before_end.contains(s));
    }
    assert!(!partial.is_finished());
}

#[test]
fn an_invalid_continuation_is_refused_and_the_matcher_can_go_on() {
    let dir = tempfile::tempdir().unwrap();
    let (json_bytes, tokenizer) = tiny_tokenizer(dir.path());
    let stops = stop_ids(&tokenizer);
    let grammar =
        Grammar::from_json_schema(&json_bytes, &schema(), &stops, tokenizer.vocab_size()).unwrap();
    let prefix = "{\"type\":\"temperature\",\"diff\":{\"temperature\":";
    let mut matcher = grammar.matcher().unwrap();
    feed_text(&mut matcher, &tokenizer, prefix);
    // 3 is out of [0, 2]; 1 is in range.
    let three = encode(&tokenizer, "3");
    let one = encode(&tokenizer, "1");
    assert_eq!((three.len(), one.len()), (1, 1), "digits are single tokens");
    let allowed = matcher.allowed().unwrap();
    assert!(!allowed.contains(three[0]));
    assert!(allowed.contains(one[0]));
    match matcher.consume(three[0]) {
        Err(GrammarError::Refused { token, text }) => {
            assert_eq!(token, three[0]);
            assert!(text.contains('3'), "{text}");
            let message = GrammarError::Refused { token, text }.to_string();
            assert!(message.contains(&three[0].to_string()), "{message}");
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
    // Only the schema's keys may open the diff; a stop id mid-object and ids outside the
    // vocabulary are refused too.
    let mut keys = grammar.matcher().unwrap();
    feed_text(
        &mut keys,
        &tokenizer,
        "{\"type\":\"temperature\",\"diff\":{\"",
    );
    let names = ["model\"", "temperature\"", "retry\""];
    for id in keys.allowed().unwrap().iter() {
        let piece = tokenizer.decode(&[id as u32], false).unwrap();
        assert!(
            names
                .iter()
                .any(|name| name.starts_with(&piece) || piece.starts_with(name)),
            "{piece:?} starts no key of the schema"
        );
    }
    assert!(matches!(
        keys.consume(stops[0]),
        Err(GrammarError::Refused { .. })
    ));
    assert!(matches!(
        keys.consume(-1),
        Err(GrammarError::Refused { token: -1, .. })
    ));
    // Refusals leave the matcher where it was: the valid continuation still goes through.
    matcher.consume(one[0]).unwrap();
    feed_text(&mut matcher, &tokenizer, "},\"rationale\":\"Lower it.\"}");
    assert!(matcher.is_finished());
}

/// Draws a uniformly random allowed token until a stop token or `cap` tokens. Returns the
/// tokens (stop excluded) and whether a stop token ended the walk; checks every mask on the way.
fn random_walk(
    grammar: &Grammar,
    rng: &mut ChaCha8Rng,
    cap: usize,
    tokenizer_vocab: usize,
) -> (Vec<i64>, bool) {
    let mut matcher = grammar.matcher().unwrap();
    let mut tokens = Vec::new();
    for _ in 0..cap {
        let allowed = matcher.allowed().expect("never a dead end");
        assert_eq!(allowed.vocab_size(), grammar.vocab_size());
        assert!(!allowed.is_empty());
        let ids: Vec<i64> = allowed.iter().collect();
        assert_eq!(ids.len(), allowed.len());
        assert!(
            ids.iter().all(|&id| (id as usize) < tokenizer_vocab),
            "an id past the tokenizer's vocabulary was allowed"
        );
        for beyond in tokenizer_vocab..grammar.vocab_size() {
            assert!(!allowed.contains(beyond as i64));
        }
        let t = ids[rng.random_range(0..ids.len())];
        let was_complete = matcher.is_finished();
        matcher.consume(t).unwrap();
        if grammar.stop_ids().contains(&(t as u32)) {
            assert!(matcher.is_finished());
            return (tokens, true);
        }
        assert!(!was_complete, "only stop ids follow a complete text");
        tokens.push(t);
    }
    (tokens, false)
}

#[test]
fn random_walks_under_the_masks_end_in_json_of_the_schema() {
    let dir = tempfile::tempdir().unwrap();
    let (json_bytes, tokenizer) = tiny_tokenizer(dir.path());
    let stops = stop_ids(&tokenizer);
    let tokenizer_vocab = tokenizer.vocab_size();
    // Embedding rows past the tokenizer (not a multiple of 32: the bitset's tail is exercised).
    let vocab_size = tokenizer_vocab + 37;
    let grammar = Grammar::from_json_schema(&json_bytes, &schema(), &stops, vocab_size).unwrap();
    assert_eq!(grammar.vocab_size(), vocab_size);
    assert_eq!(grammar.tokenizer_vocab_size(), tokenizer_vocab);
    let mut rng = ChaCha8Rng::seed_from_u64(11);
    let mut finished = 0;
    let mut seen_types = std::collections::BTreeSet::new();
    for walk in 0..50 {
        let (tokens, stopped) = random_walk(&grammar, &mut rng, 300, tokenizer_vocab);
        if !stopped {
            continue;
        }
        finished += 1;
        let ids: Vec<u32> = tokens.iter().map(|&t| t as u32).collect();
        let text = tokenizer.decode(&ids, false).unwrap();
        let value: Value = serde_json::from_str(&text)
            .unwrap_or_else(|e| panic!("walk {walk}: {text:?} is not JSON: {e}"));
        let object = value.as_object().expect("an object");
        assert_eq!(
            object.keys().map(String::as_str).collect::<Vec<_>>(),
            ["type", "diff", "rationale"],
            "walk {walk}: {text}"
        );
        let kind = object["type"].as_str().expect("type is a string");
        assert!(TYPES.contains(&kind), "walk {walk}: {kind}");
        seen_types.insert(kind.to_owned());
        let diff = object["diff"].as_object().expect("diff is an object");
        assert!(!diff.is_empty(), "walk {walk}: empty diff");
        for (key, value) in diff {
            match key.as_str() {
                "model" => {
                    let n = value.as_str().expect("model is a string").chars().count();
                    assert!((1..=24).contains(&n), "walk {walk}: {text}");
                }
                "temperature" => {
                    let t = value.as_f64().expect("temperature is a number");
                    assert!((0.0..=2.0).contains(&t), "walk {walk}: {text}");
                }
                "retry" => {
                    let retry = value.as_object().expect("retry is an object");
                    assert_eq!(retry.len(), 1, "walk {walk}: {text}");
                    let n = retry["max_attempts"].as_u64().expect("an integer");
                    assert!((1..=100).contains(&n), "walk {walk}: {text}");
                }
                other => panic!("walk {walk}: unexpected key {other} in {text}"),
            }
        }
        let rationale = object["rationale"].as_str().expect("rationale is a string");
        assert!((1..=60).contains(&rationale.chars().count()), "walk {walk}");
    }
    assert!(finished >= 40, "only {finished} of 50 walks finished");
    assert!(seen_types.len() >= 2, "walks explore: {seen_types:?}");
}

#[test]
fn masks_become_bool_tensors() {
    let dir = tempfile::tempdir().unwrap();
    let (json_bytes, tokenizer) = tiny_tokenizer(dir.path());
    let stops = stop_ids(&tokenizer);
    let vocab_size = tokenizer.vocab_size() + 5;
    let grammar = Grammar::from_json_schema(&json_bytes, &schema(), &stops, vocab_size).unwrap();
    let mut matcher = grammar.matcher().unwrap();
    let first = matcher.allowed().unwrap();
    matcher.consume(first.iter().next().unwrap()).unwrap();
    let second = matcher.allowed().unwrap();
    assert_ne!(first, second);
    let tensor = first.to_tensor(tch::Device::Cpu).unwrap();
    assert_eq!(tensor.size(), [vocab_size as i64]);
    assert_eq!(tensor.kind(), tch::Kind::Bool);
    let as_ids: Vec<i64> = Vec::<i64>::try_from(&tensor.nonzero().flatten(0, -1)).unwrap();
    assert_eq!(as_ids, first.iter().collect::<Vec<_>>());
    let stacked = stack_token_sets(&[&first, &second, &first], tch::Device::Cpu).unwrap();
    assert_eq!(stacked.size(), [3, vocab_size as i64]);
    assert!(stacked.get(0).equal(&tensor));
    assert!(
        stacked
            .get(1)
            .equal(&second.to_tensor(tch::Device::Cpu).unwrap())
    );
    assert_eq!(
        i64::try_from(stacked.sum(tch::Kind::Int64)).unwrap(),
        (2 * first.len() + second.len()) as i64
    );
    let empty = stack_token_sets(&[], tch::Device::Cpu).unwrap();
    assert_eq!(empty.size(), [0, 0]);
}

#[test]
fn bad_schemas_and_bad_arguments_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let (json_bytes, tokenizer) = tiny_tokenizer(dir.path());
    let stops = stop_ids(&tokenizer);
    let vocab = tokenizer.vocab_size();
    let compile = |schema: Value| Grammar::from_json_schema(&json_bytes, &schema, &stops, vocab);
    let unknown_type = json!({"type": "object", "properties": {"a": {"type": "strin"}}});
    match compile(unknown_type) {
        Err(e @ GrammarError::Schema(_)) => assert!(e.to_string().contains("strin"), "{e}"),
        other => panic!("expected a schema error, got {other:?}"),
    }
    let bad_pattern = json!({"type": "string", "pattern": "(unclosed"});
    match compile(bad_pattern) {
        Err(e @ GrammarError::Schema(_)) => assert!(e.to_string().contains("invalid JSON schema")),
        other => panic!("expected a schema error, got {other:?}"),
    }
    let unsatisfiable = json!({"type": "integer", "minimum": 5, "maximum": 1});
    assert!(matches!(
        compile(unsatisfiable),
        Err(GrammarError::Schema(_))
    ));

    assert!(matches!(
        Grammar::from_json_schema(&json_bytes, &schema(), &stops, vocab - 1),
        Err(GrammarError::VocabSize { .. })
    ));
    assert!(matches!(
        Grammar::from_json_schema(&json_bytes, &schema(), &[], vocab),
        Err(GrammarError::NoStopIds)
    ));
    let past = vocab as i64 + 3;
    match Grammar::from_json_schema(&json_bytes, &schema(), &[past], vocab + 10) {
        Err(e @ GrammarError::StopId { .. }) => assert!(e.to_string().contains(&past.to_string())),
        other => panic!("expected a stop id error, got {other:?}"),
    }
    assert!(matches!(
        Grammar::from_json_schema(&json_bytes, &schema(), &[-1], vocab),
        Err(GrammarError::StopId { id: -1, .. })
    ));
}

#[test]
fn tokenizers_that_cannot_express_a_grammar_say_so() {
    let schema = schema();
    match Grammar::from_json_schema(b"not json", &schema, &[0], 10) {
        Err(e @ GrammarError::Tokenizer(_)) => {
            assert!(e.to_string().contains("cannot be read"), "{e}");
        }
        other => panic!("expected a tokenizer error, got {other:?}"),
    }
    let not_a_tokenizer = br#"{"model": {"type": "Nope"}}"#;
    assert!(matches!(
        Grammar::from_json_schema(not_a_tokenizer, &schema, &[0], 10),
        Err(GrammarError::Tokenizer(_))
    ));
    // A word-level tokenizer has no byte strings for its tokens.
    let word_level = json!({
        "version": "1.0", "truncation": null, "padding": null,
        "added_tokens": [{"id": 2, "content": "</s>", "single_word": false, "lstrip": false,
                          "rstrip": false, "normalized": false, "special": true}],
        "normalizer": null, "pre_tokenizer": {"type": "Whitespace"}, "post_processor": null,
        "decoder": null,
        "model": {"type": "WordLevel", "vocab": {"a": 0, "b": 1, "</s>": 2}, "unk_token": "a"}
    });
    match Grammar::from_json_schema(&serde_json::to_vec(&word_level).unwrap(), &schema, &[2], 3) {
        Err(e @ GrammarError::UnsupportedTokenizer(_)) => {
            assert!(e.to_string().contains("byte-level or byte-fallback"), "{e}");
        }
        other => panic!("expected an unsupported-tokenizer error, got {other:?}"),
    }
}

/// The reference fixtures' Qwen2 and Llama 3 tokenizers (byte-level BPE, 400 merges) express the
/// grammar too.
#[test]
fn fixture_tokenizers_express_the_grammar() {
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    for (name, stop) in [("qwen2_bpe", "<|im_end|>"), ("llama3_bpe", "<|eot_id|>")] {
        let path = fixtures.join(name).join(TOKENIZER_FILE);
        let bytes = std::fs::read(&path).unwrap();
        let tokenizer = Tokenizer::from_file(&path).unwrap();
        let stop = i64::from(tokenizer.token_to_id(stop).unwrap());
        let grammar =
            Grammar::from_json_schema(&bytes, &schema(), &[stop], tokenizer.vocab_size()).unwrap();
        let mut matcher = grammar.matcher().unwrap();
        feed(&mut matcher, &encode(&tokenizer, VALID), &tokenizer);
        assert!(matcher.allowed().unwrap().contains(stop), "{name}");
        matcher.consume(stop).unwrap();
        assert!(matcher.is_finished(), "{name}");
    }
}

#[test]
fn grammars_and_sets_cross_threads() {
    fn send_sync<T: Send + Sync>() {}
    fn send<T: Send>() {}
    send_sync::<Grammar>();
    send_sync::<TokenSet>();
    send::<TokenMatcher>();
}

/// Mean wall time of one `allowed()` (a fresh mask) over 100 tokens of random walks with the tiny
/// tokenizer: `cargo test --release -p trainer --test it -- grammar:: --ignored --nocapture`.
#[test]
#[ignore = "a measurement, not a check"]
fn mask_cost() {
    let dir = tempfile::tempdir().unwrap();
    let (json_bytes, tokenizer) = tiny_tokenizer(dir.path());
    let stops = stop_ids(&tokenizer);
    let started = Instant::now();
    let grammar =
        Grammar::from_json_schema(&json_bytes, &schema(), &stops, tokenizer.vocab_size()).unwrap();
    let compile = started.elapsed();
    let mut rng = ChaCha8Rng::seed_from_u64(1);
    let (mut calls, mut spent) = (0u32, std::time::Duration::ZERO);
    while calls < 100 {
        let mut matcher = grammar.matcher().unwrap();
        while calls < 100 && !matcher.is_finished() {
            let t0 = Instant::now();
            let allowed = matcher.allowed().unwrap();
            spent += t0.elapsed();
            calls += 1;
            let ids: Vec<i64> = allowed.iter().collect();
            matcher
                .consume(ids[rng.random_range(0..ids.len())])
                .unwrap();
        }
    }
    println!(
        "vocab {}: compile {:.1} ms, allowed() mean {:.1} µs over {calls} tokens",
        tokenizer.vocab_size(),
        compile.as_secs_f64() * 1e3,
        spent.as_secs_f64() * 1e6 / f64::from(calls)
    );
}

/// Generation under a grammar stays in its language, and the trainer, given the sets each token
/// was drawn from, scores the masked distribution the sampler drew from: its log-probs equal the
/// sampler's (the PPO ratio starts at 1), while the unmasked log-probs do not.
#[test]
fn constrained_samples_score_in_the_trainer_as_the_sampler_drew_them() {
    use trainer::chat_policy::{ChatPolicy, Sequence, pack};
    use trainer::device::{DeviceRequest, Runtime};
    use trainer::generate::generate;
    use trainer::train_step::{Measure, TrainerConfig, accumulate_gradients, masked_mean_nll};

    let dir = tempfile::tempdir().unwrap();
    write_tiny_checkpoint(dir.path(), 7, corpus()).unwrap();
    let runtime = Runtime::select(DeviceRequest::Cpu).unwrap();
    let (mut policy, _) = ChatPolicy::load(dir.path(), runtime).unwrap();
    policy
        .model
        .attach_lora(&trainer::model::LoraConfig::default())
        .unwrap();
    let grammar = policy.grammar(&schema()).unwrap();
    let prompt = policy
        .prompt_ids("Recommend a change.", "web_search timed out.")
        .unwrap();
    let mut request = constrained_request(&policy, &grammar, &prompt, 4, 120);
    request.temperature = 0.8;
    request.seed = 11;
    let generation = generate(&policy.model, &request).unwrap();
    let mut finished = 0;
    for sample in &generation.samples {
        assert_eq!(sample.allowed.len(), sample.tokens.len());
        for (token, set) in sample.tokens.iter().zip(&sample.allowed) {
            assert!(set.contains(*token), "token {token} outside its set");
        }
        if sample.finish_reason == trainer::generate::FinishReason::Eos {
            finished += 1;
            let text = policy.decode(&sample.tokens);
            let value: Value =
                serde_json::from_str(&text).unwrap_or_else(|e| panic!("{text}: {e}"));
            assert!(TYPES.contains(&value["type"].as_str().unwrap()), "{text}");
        }
    }
    assert!(finished > 0, "no sample finished within 120 tokens");

    let sequences: Vec<Sequence<'_>> = generation
        .samples
        .iter()
        .map(|sample| Sequence {
            prompt: &prompt,
            completion: &sample.tokens,
            sampling_logprobs: Some(&sample.sampling_logprobs),
            allowed: Some(&sample.allowed),
        })
        .collect();
    let packed = pack(&sequences, policy.pad_id, tch::Device::Cpu).unwrap();
    let config = TrainerConfig {
        temperature: 0.8,
        adapter_dropout: false,
        ..TrainerConfig::default()
    };
    let gap_to_sampler = |batch: &trainer::logprobs::TrainBatch| {
        let mut captured = None;
        accumulate_gradients(
            &policy.model,
            batch,
            &config,
            Measure::LossOnly,
            |logprobs, mask| {
                captured = Some(logprobs.detach().copy());
                masked_mean_nll(logprobs, mask)
            },
        )
        .unwrap();
        let scored = packed
            .batch
            .completion_mask
            .narrow(1, 1, packed.sampling_logprobs.size()[1]);
        (captured.unwrap() - &packed.sampling_logprobs)
            .abs()
            .multiply(&scored.to_kind(tch::Kind::Float))
            .max()
            .double_value(&[])
    };
    let masked = gap_to_sampler(&packed.batch);
    assert!(
        masked < 1e-4,
        "masked log-probs differ from the sampler's by {masked}"
    );
    let unmasked = gap_to_sampler(&without_allowed_sets(&packed.batch));
    assert!(
        unmasked > 1e-3,
        "the mask should change the log-probs ({unmasked})"
    );
}

/// The forbidden mass: measured on constrained batches only, the penalty adds `coef × mean
/// −log P(allowed)` to the loss (linear in the coefficient), and training with it moves the
/// unmasked distribution's mass onto the grammar's tokens, which the masked loss alone does not.
#[test]
fn the_forbidden_mass_penalty_keeps_the_model_on_the_grammars_tokens() {
    use trainer::chat_policy::{Sequence, pack};
    use trainer::generate::generate;
    use trainer::train_step::{
        Measure, Trainer, TrainerConfig, accumulate_gradients, masked_mean_nll,
    };

    let dir = tempfile::tempdir().unwrap();
    let (mut policy, grammar, prompt) = tiny_policy_with_grammar(dir.path());
    let mut request = constrained_request(&policy, &grammar, &prompt, 4, 40);
    request.seed = 5;
    let generation = generate(&policy.model, &request).unwrap();
    let sequences: Vec<Sequence<'_>> = generation
        .samples
        .iter()
        .map(|sample| Sequence::sampled(&prompt, &sample.tokens, &sample.logprobs, &sample.allowed))
        .collect();
    let packed = pack(&sequences, policy.pad_id, tch::Device::Cpu).unwrap();
    let free_batch = without_allowed_sets(&packed.batch);
    policy
        .model
        .attach_lora(&trainer::model::LoraConfig::default())
        .unwrap();
    let config = |forbidden_mass_coef| TrainerConfig {
        adapter_dropout: false,
        forbidden_mass_coef,
        learning_rate: 3e-3,
        ..TrainerConfig::default()
    };
    let measure_with = |batch, coef, what| {
        let measured =
            accumulate_gradients(&policy.model, batch, &config(coef), what, masked_mean_nll)
                .unwrap();
        policy.model.var_store().variables().values().for_each(|v| {
            let mut grad = v.grad();
            if grad.defined() {
                let _ = grad.zero_();
            }
        });
        measured
    };
    let measure = |batch, coef| measure_with(batch, coef, Measure::ForbiddenMass);
    let plain = measure(&packed.batch, 0.0);
    let mass = plain
        .forbidden_mass
        .expect("a constrained batch measures it");
    assert!(
        mass > 0.1 && mass < 1.0,
        "a random model spreads its mass: {mass}"
    );
    assert_eq!(measure(&free_batch, 1.0).forbidden_mass, None);
    // Not asked for and not penalized, it is not computed; a penalized step computes it anyway.
    let unmeasured = measure_with(&packed.batch, 0.0, Measure::LossOnly);
    assert_eq!(unmeasured.forbidden_mass, None);
    assert_eq!(unmeasured.loss, plain.loss);
    assert_eq!(
        measure_with(&packed.batch, 1.0, Measure::LossOnly).forbidden_mass,
        measure(&packed.batch, 1.0).forbidden_mass
    );
    let (once, twice) = (measure(&packed.batch, 1.0), measure(&packed.batch, 2.0));
    let penalty = once.loss - plain.loss;
    assert!(penalty > 0.0, "{penalty}");
    assert!((twice.loss - plain.loss - 2.0 * penalty).abs() < 1e-4 * penalty.max(1.0));

    // Thirty steps of the masked loss from the same adapters, without and with the penalty.
    let initial: Vec<(String, tch::Tensor)> = policy
        .model
        .var_store()
        .variables()
        .into_iter()
        .filter(|(_, v)| v.requires_grad())
        .map(|(name, v)| (name, v.detach().copy()))
        .collect();
    let mut after = Vec::new();
    for coef in [0.0, 1.0] {
        tch::no_grad(|| {
            let variables = policy.model.var_store().variables();
            for (name, value) in &initial {
                variables[name].shallow_clone().copy_(value);
            }
        });
        let mut trainer = Trainer::new(&policy.model, config(coef)).unwrap();
        for _ in 0..30 {
            trainer
                .step(
                    &policy.model,
                    &packed.batch,
                    Measure::LossOnly,
                    masked_mean_nll,
                )
                .unwrap();
        }
        let without = measure(&packed.batch, 0.0);
        let penalty = measure(&packed.batch, 1.0).loss - without.loss;
        after.push((penalty, without.forbidden_mass.unwrap()));
    }
    let ((plain_penalty, plain_mass), (penalized, penalized_mass)) = (after[0], after[1]);
    // What the penalty optimizes, the mean −log P(allowed), falls by a fifth or more with it
    // and less without; the mean forbidden probability follows.
    assert!(
        penalized < 0.8 * penalty && penalized < 0.8 * plain_penalty,
        "−log P(allowed) from {penalty}: {plain_penalty} without the penalty, {penalized} with it"
    );
    assert!(
        penalized_mass < plain_mass && penalized_mass < mass,
        "forbidden mass from {mass}: {plain_mass} without the penalty, {penalized_mass} with it"
    );
}

/// `batch` scored without its allowed sets (the unmasked distribution).
fn without_allowed_sets(batch: &trainer::logprobs::TrainBatch) -> trainer::logprobs::TrainBatch {
    trainer::logprobs::TrainBatch {
        input_ids: batch.input_ids.shallow_clone(),
        attention_mask: batch.attention_mask.as_ref().map(|t| t.shallow_clone()),
        completion_mask: batch.completion_mask.shallow_clone(),
        allowed: None,
    }
}

/// The tiny preset's policy on the CPU, written to `dir`, the test schema's grammar over its
/// tokenizer and a prompt.
fn tiny_policy_with_grammar(dir: &Path) -> (trainer::chat_policy::ChatPolicy, Grammar, Vec<i64>) {
    use trainer::device::{DeviceRequest, Runtime};

    let (_, tokenizer) = tiny_tokenizer(dir);
    let runtime = Runtime::select(DeviceRequest::Cpu).unwrap();
    let (policy, _) = trainer::chat_policy::ChatPolicy::load(dir, runtime).unwrap();
    let vocab_size = usize::try_from(policy.model.config().vocab_size).unwrap();
    let grammar = Grammar::over_tokenizer(&tokenizer, &schema(), vocab_size).unwrap();
    let prompt = policy
        .prompt_ids("Recommend a change.", "timeouts")
        .unwrap();
    (policy, grammar, prompt)
}

/// `bench model`'s constrained phase: every timed run draws its own samples and is counted, and
/// the grammar's host time is counted inside each run's wall time (and is zero without a
/// grammar).
#[test]
fn the_bench_times_the_grammar_inside_constrained_generation() {
    use trainer::bench_model::constrained_generation_throughput;
    use trainer::generate::{GenerationRequest, generate};

    let dir = tempfile::tempdir().unwrap();
    let (policy, grammar, prompt) = tiny_policy_with_grammar(dir.path());
    let stops: Vec<i64> = grammar.stop_ids().iter().map(|&id| i64::from(id)).collect();
    assert_eq!(
        stops, policy.stop_ids,
        "the tokenizer's stop ids end the grammar"
    );

    let measure = |schedule| {
        constrained_generation_throughput(
            &policy.model,
            &prompt,
            3,
            60,
            &grammar,
            1,
            2,
            5,
            schedule,
        )
        .unwrap()
    };
    let run = measure(GrammarSchedule::AfterForward);
    assert_eq!(run.tokens.len(), 2, "one count per timed run");
    for &tokens in &run.tokens {
        assert!((3..=3 * 60).contains(&tokens), "{tokens} tokens");
    }
    assert_eq!(
        run.throughput.tokens_per_repeat,
        run.tokens.iter().sum::<i64>() / 2
    );
    let total_seconds: f64 = run.throughput.seconds.iter().sum();
    let expected = run.tokens.iter().sum::<i64>() as f64 / total_seconds;
    assert!((run.throughput.tokens_per_s - expected).abs() <= 1e-9 * expected);
    assert!(run.completed <= 2 * 3);
    assert_eq!(run.mask_seconds.len(), 2, "one per timed run");
    for (mask, total) in run.mask_seconds.iter().zip(&run.throughput.seconds) {
        assert!(*mask > 0.0 && mask < total, "mask {mask} s of {total} s");
    }
    assert!(run.mask_share() > 0.0 && run.mask_share() < 1.0);
    assert!(run.mask_ms_per_token() > 0.0);
    assert!(run.beside_forward_seconds.iter().all(|&s| s == 0.0));

    // Beside the forward: the same seeds draw the same samples; the sets' work is counted on
    // the second thread, and the decode loop still spends some time on the grammar (the first
    // step's sets, the mask, advancing the matchers).
    let beside = measure(GrammarSchedule::BesideForward);
    assert_eq!(
        beside.tokens, run.tokens,
        "the schedule must not change the samples"
    );
    assert!(beside.beside_forward_seconds.iter().all(|&s| s > 0.0));
    for (mask, total) in beside.mask_seconds.iter().zip(&beside.throughput.seconds) {
        assert!(*mask > 0.0 && mask < total, "mask {mask} s of {total} s");
    }

    let mut free = GenerationRequest::new(vec![prompt]);
    free.num_samples = 2;
    free.max_new_tokens = 5;
    let generation = generate(&policy.model, &free).unwrap();
    assert_eq!(generation.counters.mask_time, std::time::Duration::ZERO);
}

/// Computing the allowed sets beside the forward or after it (or as `Auto` picks) is a speed
/// choice only: the same tokens, log-probs and allowed sets come out.
#[test]
fn the_grammar_schedule_does_not_change_the_samples() {
    use trainer::generate::generate;

    let dir = tempfile::tempdir().unwrap();
    let (policy, grammar, prompt) = tiny_policy_with_grammar(dir.path());
    let mut request = constrained_request(&policy, &grammar, &prompt, 4, 60);
    request.seed = 11;
    let mut samples = Vec::new();
    for schedule in [
        GrammarSchedule::BesideForward,
        GrammarSchedule::AfterForward,
        GrammarSchedule::Auto,
    ] {
        request.grammar_schedule = schedule;
        let generation = generate(&policy.model, &request).unwrap();
        assert!(generation.samples.iter().any(|s| s.tokens.len() > 1));
        let beside = generation.counters.mask_beside_forward > std::time::Duration::ZERO;
        assert_eq!(
            beside,
            schedule.resolve(tch::Device::Cpu) == GrammarSchedule::BesideForward,
            "{schedule:?}"
        );
        samples.push(generation.samples);
    }
    assert_eq!(samples[0], samples[1]);
    assert_eq!(samples[0], samples[2]);
}

/// Below f32 the update's behaviour log-probs are the trainer's own forward of the sampled tokens
/// (the sampler's incremental decode rounds differently); in f32 the sampler's stay.
#[test]
fn reduced_precision_batches_are_rescored_by_the_trainer_forward() {
    use trainer::chat_policy::{ChatPolicy, Sequence, pack};
    use trainer::device::Runtime;
    use trainer::generate::generate;
    use trainer::logprobs::score_logprobs;

    let dir = tempfile::tempdir().unwrap();
    let (_, tokenizer) = tiny_tokenizer(dir.path());
    for kind in [tch::Kind::Float, tch::Kind::BFloat16] {
        let runtime = Runtime {
            device: tch::Device::Cpu,
            kind,
        };
        let (policy, _) = ChatPolicy::load(dir.path(), runtime).unwrap();
        let vocab_size = usize::try_from(policy.model.config().vocab_size).unwrap();
        let grammar = Grammar::over_tokenizer(&tokenizer, &schema(), vocab_size).unwrap();
        let prompt = policy
            .prompt_ids("Recommend a change.", "timeouts")
            .unwrap();
        let mut request = constrained_request(&policy, &grammar, &prompt, 3, 24);
        request.seed = 3;
        let generation = generate(&policy.model, &request).unwrap();
        let sequences: Vec<Sequence<'_>> = generation
            .samples
            .iter()
            .map(|sample| {
                Sequence::sampled(&prompt, &sample.tokens, &sample.logprobs, &sample.allowed)
            })
            .collect();
        let mut packed = pack(&sequences, 0, tch::Device::Cpu).unwrap();
        let sampler = packed.sampling_logprobs.copy();
        let gap = packed
            .rescore_in_reduced_precision(&policy.model, 1.0, 2)
            .unwrap();
        let moved = (&packed.sampling_logprobs - &sampler)
            .abs()
            .max()
            .double_value(&[]);
        if kind == tch::Kind::Float {
            assert_eq!(gap, None);
            assert_eq!(moved, 0.0, "f32 keeps the sampler's log-probs");
            continue;
        }
        let gap = gap.expect("bf16 is rescored");
        assert!(
            gap.is_finite() && (gap - moved).abs() < 1e-9,
            "{gap} vs {moved}"
        );
        let width = packed.batch.completion_mask.size()[1];
        let scored = packed
            .batch
            .completion_mask
            .narrow(1, 1, width - 1)
            .to_kind(tch::Kind::Float);
        // Scored two rows at a time (the update's minibatch), as the update will score them.
        let pairs: Vec<tch::Tensor> = [vec![0, 1], vec![2]]
            .iter()
            .map(|rows| {
                let part = packed.select_rows(rows).unwrap();
                score_logprobs(&policy.model, &part.batch, 1.0)
                    .unwrap()
                    .to_kind(tch::Kind::Float)
            })
            .collect();
        let trainer = tch::Tensor::cat(&pairs, 0) * &scored;
        assert_eq!(
            (&packed.sampling_logprobs - trainer)
                .abs()
                .max()
                .double_value(&[]),
            0.0,
            "the trainer's forward, masked to the completion tokens"
        );
        assert_eq!(
            (&packed.sampling_logprobs * scored.ones_like().g_sub(&scored))
                .abs()
                .max()
                .double_value(&[]),
            0.0,
            "zero off the completions, as pack leaves them"
        );
    }
}

/// From anywhere a random walk reaches, the matcher's closing path ends the text: every token of
/// it is allowed in turn, the last is a stop id, the text is JSON of the schema, and the path
/// is no longer than asked for; the matcher it came from does not move.
#[test]
fn a_closing_path_ends_the_text_from_wherever_a_walk_stopped() {
    let dir = tempfile::tempdir().unwrap();
    let (json_bytes, tokenizer) = tiny_tokenizer(dir.path());
    let stops = stop_ids(&tokenizer);
    let grammar =
        Grammar::from_json_schema(&json_bytes, &schema(), &stops, tokenizer.vocab_size()).unwrap();
    let mut rng = ChaCha8Rng::seed_from_u64(3);
    let mut longest = 0;
    for walk in 0..40 {
        // Stop the walk anywhere in its first 60 tokens.
        let steps = rng.random_range(0..60);
        let mut matcher = grammar.matcher().unwrap();
        let mut tokens = Vec::new();
        for _ in 0..steps {
            let ids: Vec<i64> = matcher
                .allowed()
                .unwrap()
                .iter()
                .filter(|id| !stops.contains(id))
                .collect();
            if ids.is_empty() {
                break;
            }
            let t = ids[rng.random_range(0..ids.len())];
            matcher.consume(t).unwrap();
            tokens.push(t);
        }
        let before = matcher.allowed().unwrap();
        let path = matcher
            .closing_path(40)
            .unwrap()
            .unwrap_or_else(|| panic!("walk {walk}: no way to end {tokens:?}"));
        assert!(path.len() <= 40);
        assert_eq!(matcher.allowed().unwrap(), before, "the matcher moved");
        let (&stop, body) = path.split_last().unwrap();
        assert!(stops.contains(&stop));
        feed(&mut matcher, &path, &tokenizer);
        assert!(matcher.is_finished());
        tokens.extend_from_slice(body);
        let text = tokenizer
            .decode(&tokens.iter().map(|&t| t as u32).collect::<Vec<_>>(), false)
            .unwrap();
        let value: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{text}: {e}"));
        assert!(TYPES.contains(&value["type"].as_str().unwrap()), "{text}");
        longest = longest.max(path.len());
    }
    eprintln!("longest closing path: {longest} tokens");
    // Too few tokens to end: none is made up.
    let start = grammar.matcher().unwrap();
    assert_eq!(start.closing_path(2).unwrap(), None);
}

/// A random-initialised model under the grammar writes strings until it is stopped; with the
/// token limit below its natural length every sample still ends with a stop id inside the
/// limit, as JSON of the schema, and the forced steps' recorded sets hold only their token.
#[test]
fn constrained_samples_of_a_random_model_close_within_their_token_limit() {
    use trainer::generate::{FinishReason, generate};

    let dir = tempfile::tempdir().unwrap();
    let (policy, grammar, prompt) = tiny_policy_with_grammar(dir.path());
    for (limit, seed) in [(40, 1), (64, 2)] {
        let mut request = constrained_request(&policy, &grammar, &prompt, 12, limit);
        request.seed = seed;
        let generation = generate(&policy.model, &request).unwrap();
        for sample in &generation.samples {
            let text = policy.decode(&sample.tokens);
            assert_eq!(sample.finish_reason, FinishReason::Eos, "{limit}: {text}");
            assert!(sample.tokens.len() <= limit);
            let value: Value =
                serde_json::from_str(&text).unwrap_or_else(|e| panic!("{limit}: {text}: {e}"));
            assert!(TYPES.contains(&value["type"].as_str().unwrap()), "{text}");
            for (token, set) in sample.tokens.iter().zip(&sample.allowed) {
                assert!(set.contains(*token));
            }
        }
    }
}
