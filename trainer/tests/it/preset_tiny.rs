//! The `tiny` preset checkpoint: deterministic files in the Hugging Face layout that this crate's
//! own tokenizer, chat-template and generation-config readers load back.

use std::path::Path;

use safetensors::SafeTensors;
use trainer::chat_template::{ChatMessage, ChatTemplate};
use trainer::generation_config::GenerationConfig;
use trainer::preset::{TINY, WEIGHTS_FILE, write_tiny_checkpoint};
use trainer::tokenizer::Tokenizer;

const FILES: [&str; 5] = [
    "config.json",
    "model.safetensors",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
];

/// Recommendation-like text, varied enough for a few hundred merges.
fn corpus() -> Vec<String> {
    let models = [
        "claude-3-haiku",
        "gpt-4o-mini",
        "gpt-4o",
        "claude-3-5-sonnet",
        "llama-3-70b",
    ];
    let tools = ["web_search", "code_exec", "sql_query", "file_read"];
    let mut lines = Vec::new();
    for (i, model) in models.iter().enumerate() {
        for (j, tool) in tools.iter().enumerate() {
            let cost = 90.0 + i as f64 * 1.7 + j as f64 * 0.3;
            lines.push(format!(
                "Switch to {model} ({cost:.1}% lower cost, {}% reliability)",
                80 + i * 3 + j
            ));
            lines.push(format!(
                "{} of 40 runs failed (mean reliability 0.{}, $0.0{}12/run).\nTop failures:\n- tool_error (timeout) x{}: \"{tool} timed out after {}s\"",
                i + j,
                70 + i,
                j,
                i + 2,
                10 * (j + 1)
            ));
            lines.push(format!(
                "{{\"type\": \"retry_policy\", \"diff\": {{\"retry\": {{\"max_attempts\": {}}}, \"model\": \"{model}\"}}, \"rationale\": \"Retry {tool} calls that time out.\"}}",
                j + 2
            ));
        }
    }
    lines
}

fn read(dir: &Path, name: &str) -> Vec<u8> {
    std::fs::read(dir.join(name)).unwrap()
}

#[test]
fn same_seed_gives_byte_identical_files_and_another_seed_other_weights() {
    let first = tempfile::tempdir().unwrap();
    let second = tempfile::tempdir().unwrap();
    let other_seed = tempfile::tempdir().unwrap();
    let written = write_tiny_checkpoint(first.path(), 7, corpus()).unwrap();
    write_tiny_checkpoint(second.path(), 7, corpus()).unwrap();
    write_tiny_checkpoint(other_seed.path(), 8, corpus()).unwrap();

    let names: Vec<&str> = written.files.iter().map(|f| f.name).collect();
    let mut sorted_names = names.clone();
    sorted_names.sort_unstable();
    let mut expected = FILES.to_vec();
    expected.sort_unstable();
    assert_eq!(sorted_names, expected);
    for file in &written.files {
        let bytes = read(first.path(), file.name);
        assert_eq!(bytes.len() as u64, file.bytes, "{}", file.name);
        assert_eq!(
            bytes,
            read(second.path(), file.name),
            "{} differs",
            file.name
        );
        if file.name == WEIGHTS_FILE {
            assert_ne!(bytes, read(other_seed.path(), file.name));
        } else {
            // Only the weights depend on the seed; the tokenizer depends on the corpus alone.
            assert_eq!(bytes, read(other_seed.path(), file.name), "{}", file.name);
        }
    }
}

#[test]
fn weights_have_every_qwen2_tensor_with_its_shape_and_init() {
    let dir = tempfile::tempdir().unwrap();
    let written = write_tiny_checkpoint(dir.path(), 1, corpus()).unwrap();
    let bytes = read(dir.path(), WEIGHTS_FILE);
    let (_, metadata) = SafeTensors::read_metadata(&bytes).unwrap();
    assert_eq!(
        metadata.metadata().as_ref().and_then(|m| m.get("format")),
        Some(&"pt".to_owned())
    );
    let tensors = SafeTensors::deserialize(&bytes).unwrap();
    let expected = TINY.tensor_shapes(written.vocab_size);
    assert_eq!(tensors.len(), expected.len());
    // 1 embedding + 12 per layer + final norm; biases on q/k/v only; tied, so no lm_head.
    assert_eq!(expected.len(), 2 + 12 * TINY.num_hidden_layers);
    assert!(tensors.tensor("lm_head.weight").is_err());
    assert!(
        tensors
            .tensor("model.layers.0.self_attn.o_proj.bias")
            .is_err()
    );
    assert_eq!(
        tensors
            .tensor("model.layers.3.self_attn.k_proj.weight")
            .unwrap()
            .shape(),
        [64, 128]
    );
    let mut parameters = 0;
    for (name, shape) in &expected {
        let view = tensors.tensor(name).unwrap();
        assert_eq!(view.shape(), shape.as_slice(), "{name}");
        assert_eq!(view.dtype(), safetensors::Dtype::F32, "{name}");
        let values: Vec<f32> = view
            .data()
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        parameters += values.len();
        if name.ends_with("norm.weight") {
            assert!(values.iter().all(|&v| v == 1.0), "{name} is not all ones");
        } else {
            let mean = values.iter().sum::<f32>() / values.len() as f32;
            let std = (values.iter().map(|v| (v - mean).powi(2)).sum::<f32>()
                / values.len() as f32)
                .sqrt();
            // Bias vectors have 64–128 entries, so their sample std is looser.
            assert!((0.014..0.026).contains(&std), "{name}: std {std}");
            assert!(mean.abs() < 0.006, "{name}: mean {mean}");
        }
    }
    assert_eq!(parameters, written.parameter_count);
    assert!((800_000..1_200_000).contains(&parameters), "{parameters}");
}

#[test]
fn config_tokenizer_template_and_generation_config_load_back() {
    let dir = tempfile::tempdir().unwrap();
    let written = write_tiny_checkpoint(dir.path(), 3, corpus()).unwrap();

    let config: serde_json::Value =
        serde_json::from_slice(&read(dir.path(), "config.json")).unwrap();
    assert_eq!(config["model_type"], "qwen2");
    assert_eq!(config["architectures"][0], "Qwen2ForCausalLM");
    assert_eq!(config["tie_word_embeddings"], true);
    assert_eq!(config["num_key_value_heads"], 2);
    assert_eq!(config["rope_theta"], 1_000_000.0);
    assert_eq!(config["vocab_size"], written.vocab_size);
    assert_eq!(config["eos_token_id"], 2);

    let tokenizer = Tokenizer::from_dir(dir.path()).unwrap();
    assert_eq!(tokenizer.vocab_size(), written.vocab_size);
    // 3 special tokens + 256 bytes + merges learned from the corpus.
    assert!(written.vocab_size > 259 + 100, "{}", written.vocab_size);
    let special = tokenizer.special_tokens();
    assert_eq!(
        special.eos.as_ref().map(|t| (t.text.as_str(), t.id)),
        Some(("<|im_end|>", 2))
    );
    assert_eq!(special.pad.as_ref().map(|t| t.id), Some(0));
    // tokenizer_config.json says bos_token null, as Qwen2.5's does: no bos is prepended.
    assert_eq!(special.bos, None);
    assert_eq!(special.stop_ids, vec![0, 2]);

    let template = ChatTemplate::from_dir(dir.path()).unwrap().unwrap();
    let messages = [
        ChatMessage::new("system", "You are arc-rec."),
        ChatMessage::new("user", "3 of 40 runs failed."),
    ];
    let prompt = template.render(&messages, true).unwrap();
    assert_eq!(
        prompt,
        "<|im_start|>system\nYou are arc-rec.<|im_end|>\n<|im_start|>user\n3 of 40 runs failed.<|im_end|>\n<|im_start|>assistant\n"
    );
    let ids = tokenizer.encode(&prompt, true).unwrap();
    assert_eq!(ids.first(), Some(&1), "<|im_start|> is one id");
    assert_eq!(ids.iter().filter(|&&id| id == 2).count(), 2);
    assert_eq!(tokenizer.decode(&ids, false).unwrap(), prompt);
    let tool_turn = template
        .render(&[ChatMessage::new("tool", "{}")], false)
        .unwrap_err()
        .to_string();
    assert!(tool_turn.contains("got role tool"), "{tool_turn}");

    let generation = GenerationConfig::from_dir(dir.path()).unwrap().unwrap();
    assert_eq!(generation.eos_token_id, vec![2, 0]);
    assert!(generation.do_sample);
    assert_eq!(generation.max_new_tokens, Some(256));
}

#[test]
fn empty_corpus_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let message = write_tiny_checkpoint(dir.path(), 1, Vec::<String>::new())
        .unwrap_err()
        .to_string();
    assert!(message.contains("corpus is empty"), "{message}");
}
