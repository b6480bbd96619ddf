//! The JSON Schema of one recommendation completion, for grammar-constrained sampling: the
//! `{"type", "diff", "rationale"}` object [`super::parse_recommendation`] reads, written as the
//! warm-up targets (`Recommendation::completion_text`) write it.
//!
//! The grammar is compiled from this schema by `trainer::grammar::Grammar` (llguidance), which
//! makes JSON syntax, the known types, the diff's fields, types and ranges, and the single-line
//! rationale hold by construction; what it cannot see is the configuration a diff applies to, so
//! a completion can still change nothing ([`super::FormatError::NoChange`]).
//!
//! How the text is pinned down, and why:
//! - Compact JSON (`"x-guidance"`: no whitespace, `,` and `:` as separators): `completion_text`
//!   writes compact JSON. Without it llguidance allows any JSON whitespace between tokens, and
//!   the model could spend samples on layout.
//! - Keys in one order: llguidance writes an object's properties in the schema's order, so the
//!   top level is `type`, `diff`, `rationale` and every object of the diff has its keys sorted,
//!   exactly as `completion_text` writes them (the diff through `canonical_json`), whatever order
//!   the diff's keys came in.
//! - The property order lives in the returned `Value`'s maps, so it survives only where serde_json
//!   keeps insertion order (always true where the grammar is compiled: see above). Without the
//!   `rft` feature the same schema validates the same documents; only its key order is sorted.
//! - Nulls only where `validate_diff` lets a key be removed (`model` and `temperature` never).
//! - Only the keys arc-rec understands (`KNOWN_CONFIG_KEYS`): `validate_diff` would let unknown
//!   keys through, but a recommendation about a key nothing reads is not one.
//! - Bounds `validate_*` does not have (string lengths, 32 tools, `max_tokens` up to a million,
//!   `retry` not empty) keep every sample finite and meaningful; they are far above what the
//!   world and the platform write (checked against a simulated world in the tests).

use serde_json::{Value, json};

use crate::domain::RecommendationType;

/// Longest rationale, in characters (one sentence; the world's are under 100).
pub const MAX_RATIONALE_CHARS: usize = 300;
/// Longest model or tool name, in characters.
pub const MAX_NAME_CHARS: usize = 100;
/// Longest system prompt a diff may set, in characters.
pub const MAX_SYSTEM_PROMPT_CHARS: usize = 2000;
/// Most tools a diff's tool list may hold.
pub const MAX_TOOLS: usize = 32;
/// Largest `max_tokens` a diff may set.
pub const MAX_MAX_TOKENS: u64 = 1_000_000;
/// Largest number of seconds `validate_diff` accepts for a timeout or a backoff.
const MAX_SECONDS: f64 = 86_400.0;

/// A string with at least one non-whitespace character (`validate_*`'s `trim().is_empty()`),
/// at most `max` characters.
fn non_blank(max: usize) -> Value {
    json!({"type": "string", "minLength": 1, "maxLength": max, "pattern": "\\S"})
}

/// Seconds as `check_positive` accepts them: a number in (0, 86400].
fn seconds() -> Value {
    json!({"type": "number", "exclusiveMinimum": 0, "maximum": MAX_SECONDS})
}

/// `schema`, or null to remove the key (merge patch).
fn or_null(schema: Value) -> Value {
    json!({"anyOf": [schema, {"type": "null"}]})
}

/// The `retry` object of a diff, keys sorted: each removable, at least one present.
fn retry_object() -> Value {
    json!({
        "type": "object",
        "properties": {
            "backoff_s": or_null(seconds()),
            "max_attempts": or_null(json!({"type": "integer", "minimum": 1, "maximum": 100}))
        },
        "additionalProperties": false,
        "minProperties": 1
    })
}

/// One tool of a diff's tool list (the list replaces the configuration's whole).
fn tool() -> Value {
    json!({
        "type": "object",
        "properties": {
            "name": non_blank(MAX_NAME_CHARS),
            "timeout_s": seconds()
        },
        "required": ["name"],
        "additionalProperties": false
    })
}

/// The diff: a merge patch over the agent configuration with `validate_diff`'s fields, types and
/// ranges, keys sorted, at least one.
pub fn diff_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "max_tokens": or_null(json!({"type": "integer", "minimum": 1, "maximum": MAX_MAX_TOKENS})),
            "model": non_blank(MAX_NAME_CHARS),
            "retry": or_null(retry_object()),
            "system_prompt": or_null(json!({"type": "string", "maxLength": MAX_SYSTEM_PROMPT_CHARS})),
            "temperature": {"type": "number", "minimum": 0, "maximum": 2},
            "timeout_s": or_null(seconds()),
            "tools": or_null(json!({"type": "array", "items": tool(), "maxItems": MAX_TOOLS}))
        },
        "additionalProperties": false,
        "minProperties": 1
    })
}

/// The JSON Schema of one recommendation completion, with llguidance's compact-JSON options
/// (`"x-guidance"`); see the module documentation for the choices.
pub fn recommendation_schema() -> Value {
    let types: Vec<&str> = RecommendationType::ALL
        .into_iter()
        .map(RecommendationType::as_str)
        .collect();
    json!({
        "type": "object",
        "properties": {
            "type": {"enum": types},
            "diff": diff_schema(),
            // One line (no CR or LF) with a non-whitespace character, as parse_recommendation
            // wants it.
            "rationale": {
                "type": "string",
                "minLength": 1,
                "maxLength": MAX_RATIONALE_CHARS,
                "pattern": "^[^\\n\\r]*\\S[^\\n\\r]*$"
            }
        },
        "required": ["type", "diff", "rationale"],
        "additionalProperties": false,
        "x-guidance": {
            "whitespace_flexible": false,
            "item_separator": ",",
            "key_separator": ":"
        }
    })
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;
    use crate::domain::agent_config::KNOWN_CONFIG_KEYS;

    #[test]
    fn the_schema_names_every_type_and_every_known_key() {
        let schema = recommendation_schema();
        let types: Vec<&str> = schema["properties"]["type"]["enum"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap())
            .collect();
        assert_eq!(types.len(), RecommendationType::ALL.len());
        for name in types {
            assert!(RecommendationType::parse(name).is_some(), "{name}");
        }
        let keys: BTreeSet<&str> = schema["properties"]["diff"]["properties"]
            .as_object()
            .unwrap()
            .keys()
            .map(String::as_str)
            .collect();
        assert_eq!(keys, KNOWN_CONFIG_KEYS.iter().copied().collect());
        assert_eq!(
            schema["required"],
            json!(["type", "diff", "rationale"]),
            "every field is required"
        );
    }
}

/// The schema compiled over the tiny preset's tokenizer (trained on a simulated world's text, as
/// `arc-rec model init --preset tiny` trains it) and checked against that world's completions
/// and `parse_recommendation`.
#[cfg(all(test, feature = "rft"))]
mod grammar_tests {
    use std::collections::{BTreeMap, HashMap};

    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;
    use serde_json::Value;
    use trainer::grammar::{Grammar, TokenMatcher};
    use trainer::tokenizer::Tokenizer;

    use super::*;
    use crate::domain::records::{ApprovalStatus, RecordData};
    use crate::export::example::{Recommendation, is_well_formed};
    use crate::rft::parse_recommendation;
    use crate::world::{World, WorldParams};

    /// An approved recommendation of the world: the configuration before it and the completion
    /// the export writes for it.
    struct Accepted {
        config: Value,
        completion: String,
    }

    fn world_params() -> WorldParams {
        WorldParams {
            seed: 3,
            outcomes: 2000,
            ..WorldParams::default()
        }
    }

    /// The approved diffs of the world, as `TrainingExample::from_row` turns them into
    /// recommendations (type as recorded, else inferred).
    fn accepted_completions() -> Vec<Accepted> {
        let world = World::new(world_params()).unwrap();
        let mut configs: HashMap<String, Value> = HashMap::new();
        let mut accepted = Vec::new();
        for record in world.history() {
            match record.data {
                RecordData::ConfigVersion(version) => {
                    configs.insert(version.version_id, version.parsed_config);
                }
                RecordData::ConfigDiff(diff)
                    if diff.approval_status == ApprovalStatus::Approved =>
                {
                    let Some(config) = configs.get(&diff.version_before) else {
                        continue;
                    };
                    let kind = diff.recommendation_type.clone().or_else(|| {
                        RecommendationType::infer(&diff.diff).map(|t| t.as_str().to_owned())
                    });
                    let recommendation = Recommendation {
                        kind,
                        diff: diff.diff,
                        rationale: diff.change_summary,
                        llm_generated: diff.llm_generated,
                    };
                    accepted.push(Accepted {
                        config: config.clone(),
                        completion: recommendation.completion_text(),
                    });
                }
                _ => {}
            }
        }
        accepted
    }

    /// The tiny preset's tokenizer, trained on the world's export text as `arc-rec model init`
    /// does.
    fn tiny_tokenizer(dir: &std::path::Path) -> Tokenizer {
        let corpus = crate::commands::model::tokenizer_corpus(3, 400).unwrap();
        trainer::preset::write_tiny_checkpoint(dir, 1, corpus).unwrap();
        Tokenizer::from_dir(dir).unwrap()
    }

    /// The grammar as `ChatPolicy::grammar` compiles it (over the tokenizer's own vocabulary).
    fn compile(tokenizer: &Tokenizer) -> Grammar {
        Grammar::over_tokenizer(tokenizer, &recommendation_schema(), tokenizer.vocab_size())
            .unwrap()
    }

    /// Feeds `text` tokenized by `tokenizer`; the first token the grammar refuses, with the text
    /// before it, if any.
    fn refusal(matcher: &mut TokenMatcher, tokenizer: &Tokenizer, text: &str) -> Option<String> {
        let ids = tokenizer.encode(text, false).unwrap();
        for (i, &id) in ids.iter().enumerate() {
            if let Err(e) = matcher.consume(i64::from(id)) {
                let before = tokenizer.decode(&ids[..i], false).unwrap();
                return Some(format!("{e} after {before:?}"));
            }
        }
        None
    }

    #[test]
    fn the_worlds_accepted_completions_pass_the_grammar_token_by_token() {
        let dir = tempfile::tempdir().unwrap();
        let tokenizer = tiny_tokenizer(dir.path());
        let grammar = compile(&tokenizer);
        let accepted = accepted_completions();
        let mut checked = 0;
        let mut refused = Vec::new();
        for example in &accepted {
            if parse_recommendation(&example.completion, &example.config).is_err() {
                continue;
            }
            checked += 1;
            let mut matcher = grammar.matcher().unwrap();
            if let Some(why) = refusal(&mut matcher, &tokenizer, &example.completion) {
                refused.push(format!("{}: {why}", example.completion));
                continue;
            }
            assert!(matcher.is_finished(), "{}", example.completion);
            let stop = i64::from(grammar.stop_ids()[0]);
            assert!(matcher.allowed().unwrap().contains(stop));
            matcher.consume(stop).unwrap();
        }
        eprintln!(
            "{} approved completions, {checked} parse, {} refused",
            accepted.len(),
            refused.len()
        );
        assert!(checked >= 50, "only {checked} accepted completions parse");
        // Retry policies with both keys are among them, written with sorted keys whatever
        // order the world built them in.
        assert!(
            accepted
                .iter()
                .any(|e| e.completion.contains("{\"backoff_s\":")
                    && e.completion.contains("\"max_attempts\""))
        );
        assert!(
            refused.is_empty(),
            "{} of {checked} refused:\n{}",
            refused.len(),
            refused.join("\n")
        );
    }

    /// The world's values stay far inside the schema's extra bounds.
    #[test]
    fn the_worlds_completions_are_within_the_schemas_bounds() {
        let accepted = accepted_completions();
        assert!(!accepted.is_empty());
        for example in &accepted {
            let value: Value = serde_json::from_str(&example.completion).unwrap();
            let rationale = value["rationale"].as_str().unwrap();
            assert!(
                rationale.chars().count() <= MAX_RATIONALE_CHARS / 2,
                "{rationale}"
            );
            let diff = &value["diff"];
            if let Some(model) = diff["model"].as_str() {
                assert!(model.chars().count() <= MAX_NAME_CHARS / 2, "{model}");
            }
            if let Some(tools) = diff["tools"].as_array() {
                assert!(tools.len() <= MAX_TOOLS / 2);
            }
        }
    }

    /// Uniformly random allowed tokens until a stop token (or `cap` tokens): the text, if a stop
    /// token ended it.
    fn random_walk(
        grammar: &Grammar,
        tokenizer: &Tokenizer,
        rng: &mut ChaCha8Rng,
        cap: usize,
        masks: &mut (u32, std::time::Duration),
    ) -> Option<String> {
        let mut matcher = grammar.matcher().unwrap();
        let mut ids = Vec::new();
        for _ in 0..cap {
            let started = std::time::Instant::now();
            let allowed = matcher.allowed().unwrap();
            masks.0 += 1;
            masks.1 += started.elapsed();
            let allowed: Vec<i64> = allowed.iter().collect();
            let t = allowed[rng.random_range(0..allowed.len())];
            matcher.consume(t).unwrap();
            if grammar.stop_ids().contains(&(t as u32)) {
                return Some(tokenizer.decode(&ids, false).unwrap());
            }
            ids.push(t as u32);
        }
        None
    }

    #[test]
    fn random_walks_over_the_grammar_are_recommendations() {
        let dir = tempfile::tempdir().unwrap();
        let tokenizer = tiny_tokenizer(dir.path());
        let grammar = compile(&tokenizer);
        let accepted = accepted_completions();
        let config = &accepted.first().expect("the world approves diffs").config;
        assert!(is_well_formed(
            Some("temperature"),
            config,
            &json!({"temperature": 0.25})
        ));
        let mut rng = ChaCha8Rng::seed_from_u64(5);
        let walks = 100;
        let (mut finished, mut parsed) = (0, 0);
        let mut failures: BTreeMap<&'static str, Vec<String>> = BTreeMap::new();
        let mut masks = (0u32, std::time::Duration::ZERO);
        for _ in 0..walks {
            let Some(text) = random_walk(&grammar, &tokenizer, &mut rng, 2000, &mut masks) else {
                continue;
            };
            finished += 1;
            match parse_recommendation(&text, config) {
                Ok(_) => parsed += 1,
                Err(e) => failures.entry(e.kind()).or_default().push(text),
            }
        }
        eprintln!(
            "random walks: {finished} of {walks} finished, {parsed} parse; failures: {:?}; \
             vocab {}, allowed() mean {:.1} µs over {} tokens",
            failures
                .iter()
                .map(|(kind, texts)| (kind, texts.len()))
                .collect::<Vec<_>>(),
            grammar.vocab_size(),
            masks.1.as_secs_f64() * 1e6 / f64::from(masks.0.max(1)),
            masks.0
        );
        assert!(
            finished * 10 >= walks * 9,
            "only {finished} of {walks} walks finished"
        );
        assert!(
            parsed * 100 >= finished * 95,
            "{parsed} of {finished} parse; failures: {failures:#?}"
        );
        // The grammar rules out everything but a configuration that changes nothing.
        for kind in failures.keys() {
            assert_eq!(*kind, "no_change", "{failures:#?}");
        }
    }
}
