//! `arc-rec model init` through the binary: files, determinism, no database, overwrite guard.

use std::path::Path;

use crate::helpers::arc_rec;

/// Nothing listens here: a command that tried to open the database would fail.
const NO_DATABASE: &str = "postgres://nobody@127.0.0.1:1/none";

const FILES: [&str; 5] = [
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
];

fn init(out: &Path, extra: &[&str]) -> std::process::Output {
    arc_rec(NO_DATABASE)
        .args(["model", "init", "--preset", "tiny", "--seed", "4"])
        .args(["--corpus-outcomes", "300", "--out"])
        .arg(out)
        .args(extra)
        .output()
        .unwrap()
}

#[test]
fn model_init_writes_a_loadable_deterministic_checkpoint_without_a_database() {
    let root = tempfile::tempdir().unwrap();
    let first = root.path().join("first");
    let output = init(&first, &[]);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(stdout.contains("parameters: "), "{stdout}");
    for file in FILES {
        assert!(stdout.contains(file), "{file} not reported: {stdout}");
    }

    let config: serde_json::Value =
        serde_json::from_slice(&std::fs::read(first.join("config.json")).unwrap()).unwrap();
    assert_eq!(config["model_type"], "qwen2");
    let tokenizer = trainer::tokenizer::Tokenizer::from_dir(&first).unwrap();
    assert_eq!(config["vocab_size"], tokenizer.vocab_size());
    let template = trainer::chat_template::ChatTemplate::from_dir(&first)
        .unwrap()
        .unwrap();
    let prompt = template
        .render(
            &[trainer::chat_template::ChatMessage::new(
                "user",
                "Switch to claude-3-haiku?",
            )],
            true,
        )
        .unwrap();
    let ids = tokenizer.encode(&prompt, false).unwrap();
    assert_eq!(tokenizer.decode(&ids, false).unwrap(), prompt);
    // Trained on recommendation text: its frequent words are single tokens.
    for word in [" retry", "/claude", "max"] {
        let ids = tokenizer.encode(word, false).unwrap();
        assert_eq!(ids.len(), 1, "{word:?}: {ids:?}");
    }

    // Same seed, byte-identical files.
    let second = root.path().join("second");
    assert!(init(&second, &[]).status.success());
    for file in FILES {
        assert_eq!(
            std::fs::read(first.join(file)).unwrap(),
            std::fs::read(second.join(file)).unwrap(),
            "{file}"
        );
    }

    // A non-empty directory is refused unless --force.
    let refused = init(&first, &[]);
    assert!(!refused.status.success());
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(stderr.contains("--force"), "{stderr}");
    assert!(init(&first, &["--force"]).status.success());
}
