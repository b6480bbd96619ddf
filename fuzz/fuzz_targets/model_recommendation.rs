//! The recommender model's output parser (graders, `arc-rec candidates`): any text, no panic; an
//! accepted recommendation changes something and leaves a valid configuration.
#![no_main]

use arc_rec::domain::agent_config::validate_config;
use arc_rec::domain::{FieldErrors, apply_merge_patch};
use arc_rec::rft::parse_recommendation;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let current = serde_json::json!({
        "model": "openai/gpt-4.1",
        "temperature": 0.7,
        "tools": [{"name": "web_search"}],
        "retry": {"max_attempts": 1},
        "timeout_s": 30
    });
    if let Ok(parsed) = parse_recommendation(text, &current) {
        assert!(parsed.patch.as_object().is_some_and(|p| !p.is_empty()));
        let mut after = current.clone();
        apply_merge_patch(&mut after, &parsed.patch);
        let mut errors = FieldErrors::default();
        validate_config(&after, &mut errors);
        assert!(errors.is_empty(), "{after}: {:?}", errors.into_vec());
    }
});
