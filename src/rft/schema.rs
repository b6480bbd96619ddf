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
//!   seconds in whole milliseconds from 1 ms, `retry` not empty) keep every sample finite and
//!   meaningful; they are far above what the world and the platform write (checked against a
//!   simulated world in the tests).
//! - Per prompt ([`recommendation_schema_changing`]), model and tool names come from the
//!   organization's [`Catalogue`] and a tool list is no longer than the catalogue: with the
//!   bounded numbers and rationale, no sample can run on in an invented name or an unbounded list.

use serde_json::{Value, json};

use crate::domain::RecommendationType;
use crate::domain::agent_config::MAX_SECONDS;

/// Longest rationale, in characters: one sentence (the world's are at most 72). 300 let rambling
/// samples run past the token limit (not_json, 12 of 1,280 in an eval at 96 tokens).
pub const MAX_RATIONALE_CHARS: usize = 120;
/// Longest model or tool name, in characters (the world's are at most 27).
pub const MAX_NAME_CHARS: usize = 64;
/// Longest system prompt a diff may set, in characters.
pub const MAX_SYSTEM_PROMPT_CHARS: usize = 2000;
/// Most tools a diff's tool list may hold.
pub const MAX_TOOLS: usize = 32;
/// Largest `max_tokens` a diff may set.
pub const MAX_MAX_TOKENS: u64 = 1_000_000;
/// Smallest timeout or backoff a diff may set, and the step of every one: a millisecond.
const MIN_SECONDS: f64 = 0.001;

/// The model and tool names an organization's diffs may name: those its data shows it running
/// or being proposed (current configurations and logged diffs). Under a catalogue the grammar
/// writes names from it only, and a tool list is no longer than the longest the organization
/// has had, so RL spends no sample on an invented name (which `candidates` and the learned
/// grader would refuse anyway) and no list grows without end. What bounds a sample's tokens is
/// the sampler: near `--max-new-tokens` it closes the JSON by the grammar's shortest way
/// (`trainer::generate`), since a list of the catalogue's length with a timeout on each tool can
/// be longer than the limit.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Catalogue {
    pub models: std::collections::BTreeSet<String>,
    pub tools: std::collections::BTreeSet<String>,
    /// The longest tool list among what was added: a sampled list is no longer.
    pub longest_tool_list: usize,
}

impl Catalogue {
    /// Adds the names a configuration or a diff (merge patch) carries.
    pub fn add(&mut self, config: &Value) {
        if let Some(model) = config.get("model").and_then(Value::as_str)
            && !model.trim().is_empty()
            && model.chars().count() <= MAX_NAME_CHARS
        {
            self.models.insert(model.to_owned());
        }
        let tools = config.get("tools").and_then(Value::as_array);
        self.longest_tool_list = self
            .longest_tool_list
            .max(tools.map_or(0, Vec::len).min(MAX_TOOLS));
        for tool in tools.into_iter().flatten() {
            if let Some(name) = tool.get("name").and_then(Value::as_str)
                && !name.trim().is_empty()
                && name.chars().count() <= MAX_NAME_CHARS
            {
                self.tools.insert(name.to_owned());
            }
        }
    }

    /// A tool list's longest length under the catalogue: no longer than the longest the
    /// organization has had (a longer one is outside everything its data says; a barely trained
    /// model writing a list of every tool, some twice, ran past the token limit), nor than the
    /// tools it knows (each at most once).
    fn max_tools(&self) -> usize {
        self.longest_tool_list
            .max(1)
            .min(self.tools.len())
            .min(MAX_TOOLS)
    }
}

/// A string with at least one non-whitespace character (`validate_*`'s `trim().is_empty()`),
/// at most `max` characters.
fn non_blank(max: usize) -> Value {
    json!({"type": "string", "minLength": 1, "maxLength": max, "pattern": "\\S"})
}

/// Seconds as `check_positive` accepts them (a number in (0, 86400]), in whole milliseconds
/// from 1 ms. The inclusive minimum rather than `exclusiveMinimum: 0`: llguidance compiled
/// `{"exclusiveMinimum": 0, "exclusiveMaximum": 1}` (a changed backoff below a current one) into
/// a language with "0" in it, which `validate_diff` refuses (10 of 1,280 samples in an eval).
/// The milliseconds bound the digits: unbounded, a sample spent its last 90 tokens on one
/// timeout's decimals and was cut at the token limit.
fn seconds() -> Value {
    json!({"type": "number", "minimum": MIN_SECONDS, "maximum": MAX_SECONDS, "multipleOf": MIN_SECONDS})
}

/// A retry's attempt count.
fn attempts() -> Value {
    json!({"type": "integer", "minimum": 1, "maximum": 100})
}

/// A `max_tokens` value.
fn max_tokens() -> Value {
    json!({"type": "integer", "minimum": 1, "maximum": MAX_MAX_TOKENS})
}

/// A `temperature` value, in hundredths (so its digits end; see [`seconds`]).
fn temperature() -> Value {
    json!({"type": "number", "minimum": 0, "maximum": 2, "multipleOf": 0.01})
}

/// A `system_prompt` value.
fn system_prompt() -> Value {
    json!({"type": "string", "maxLength": MAX_SYSTEM_PROMPT_CHARS})
}

/// A tool list (it replaces the configuration's whole).
fn tools() -> Value {
    json!({"type": "array", "items": tool(), "maxItems": MAX_TOOLS})
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
            "max_attempts": or_null(attempts())
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
            "max_tokens": or_null(max_tokens()),
            "model": non_blank(MAX_NAME_CHARS),
            "retry": or_null(retry_object()),
            "system_prompt": or_null(system_prompt()),
            "temperature": temperature(),
            "timeout_s": or_null(seconds()),
            "tools": or_null(tools())
        },
        "additionalProperties": false,
        "minProperties": 1
    })
}

/// Longest current string a diff is kept from repeating (the per-character alternation of
/// [`not_equal_pattern`] grows with its square); longer system prompts are not excluded.
const MAX_EXCLUDED_STRING_CHARS: usize = 200;

/// A regular expression for the strings that are not `current`, start with a non-whitespace
/// character (a model or tool name), and whatever `maxLength` bounds them: shorter ones, ones that
/// differ at some character, and longer ones. llguidance's regexes have no look-ahead or
/// complement, so the difference is spelled out.
fn not_equal_pattern(current: &str) -> String {
    let chars: Vec<char> = current.chars().collect();
    let mut branches = Vec::new();
    if chars.len() > 1 {
        branches.push(format!("\\S[\\s\\S]{{0,{}}}", chars.len() - 2));
    }
    for (i, c) in chars.iter().enumerate() {
        let prefix: String = chars[..i].iter().collect();
        let other = if i == 0 {
            format!("[^\\s{}]", class_escape(*c))
        } else {
            format!("[^{}]", class_escape(*c))
        };
        branches.push(format!("{}{other}[\\s\\S]*", regex_escape(&prefix)));
    }
    branches.push(format!("{}[\\s\\S]+", regex_escape(current)));
    format!("^(?:{})$", branches.join("|"))
}

/// `text` as a literal in a regular expression: the meta characters escaped (the set Rust's
/// `regex-syntax`, which llguidance parses with, treats as meta), everything else as it is.
fn regex_escape(text: &str) -> String {
    let mut escaped = String::with_capacity(text.len());
    for c in text.chars() {
        if "\\.+*?()|[]{}^$#&-~".contains(c) {
            escaped.push('\\');
        }
        escaped.push(c);
    }
    escaped
}

/// `c` inside a character class.
fn class_escape(c: char) -> String {
    regex_escape(&c.to_string())
}

/// Numbers of `base`'s range except `current` (`base` has `minimum` and `maximum`).
fn number_except(base: &Value, current: f64) -> Value {
    let mut below = base.clone();
    let mut above = base.clone();
    below["exclusiveMaximum"] = json!(current);
    if let Some(map) = below.as_object_mut() {
        map.remove("maximum");
    }
    above["exclusiveMinimum"] = json!(current);
    if let Some(map) = above.as_object_mut() {
        map.remove("minimum");
    }
    // An empty side (current at a bound) is left out: llguidance refuses an empty range.
    let minimum = base["minimum"].as_f64().unwrap_or(f64::NEG_INFINITY);
    let maximum = base["maximum"].as_f64().unwrap_or(f64::INFINITY);
    let sides: Vec<Value> = [(current > minimum, below), (current < maximum, above)]
        .into_iter()
        .filter_map(|(nonempty, side)| nonempty.then_some(side))
        .collect();
    json!({"anyOf": sides})
}

/// Integers in `[1, max]` except `current`.
fn integer_except(max: u64, current: u64) -> Value {
    let mut ranges = Vec::new();
    if current > 1 {
        ranges.push(json!({"type": "integer", "minimum": 1, "maximum": current - 1}));
    }
    if current < max {
        ranges.push(json!({"type": "integer", "minimum": current + 1, "maximum": max}));
    }
    json!({"anyOf": ranges})
}

/// Values of a key that change it from `current` (`None`: the key is absent): its schema
/// narrowed to the other values, plus null (removal) only when the key is there to remove.
/// `None` as the result: every value this schema can write changes nothing or the key cannot be
/// narrowed (tools, long system prompts), so the key is left as [`diff_schema`] has it.
fn changing_value(
    key: &str,
    current: Option<&Value>,
    catalogue: Option<&Catalogue>,
) -> Option<Value> {
    let present = current.is_some_and(|v| !v.is_null());
    let removable = |schema: Value| if present { or_null(schema) } else { schema };
    if let Some(catalogue) = catalogue {
        match key {
            "model" => {
                let current = current.and_then(Value::as_str);
                let others: Vec<&String> = catalogue
                    .models
                    .iter()
                    .filter(|m| Some(m.as_str()) != current)
                    .collect();
                // [`diff_schema_changing`] leaves the key out when no other model is known.
                return Some(json!({"enum": others}));
            }
            "tools" => return Some(removable(catalogue_tools(catalogue))),
            _ => {}
        }
    }
    match (key, current.filter(|v| !v.is_null())) {
        ("model", Some(Value::String(model)))
            if model.chars().count() <= MAX_EXCLUDED_STRING_CHARS =>
        {
            let mut schema = non_blank(MAX_NAME_CHARS);
            schema["pattern"] = json!(not_equal_pattern(model));
            Some(schema)
        }
        ("temperature", Some(t)) => t
            .as_f64()
            .filter(|t| (0.0..=2.0).contains(t))
            .map(|t| number_except(&temperature(), t)),
        ("max_tokens", Some(m)) => m
            .as_u64()
            .filter(|m| (1..=MAX_MAX_TOKENS).contains(m))
            .map(|m| removable(integer_except(MAX_MAX_TOKENS, m))),
        ("max_tokens", None) => Some(max_tokens()),
        ("timeout_s", Some(t)) => t
            .as_f64()
            .filter(|t| *t > 0.0 && *t <= MAX_SECONDS)
            .map(|t| removable(number_except(&seconds(), t))),
        ("timeout_s", None) => Some(seconds()),
        ("system_prompt", Some(Value::String(prompt)))
            if prompt.chars().count() <= MAX_EXCLUDED_STRING_CHARS =>
        {
            let mut schema = system_prompt();
            // The empty string differs too; the pattern covers the non-empty others.
            schema["anyOf"] = json!([
                {"maxLength": 0},
                {"pattern": not_equal_pattern(prompt)}
            ]);
            Some(removable(schema))
        }
        ("system_prompt", None) => Some(system_prompt()),
        ("retry", Some(Value::Object(retry))) => Some(removable(retry_changing(Some(retry)))),
        ("retry", None) => Some(retry_changing(None)),
        ("tools", None) => Some(tools()),
        _ => None,
    }
}

/// `retry` objects that change the current retry policy (`None`: there is none): at least one
/// key whose value differs, the others as [`retry_object`] has them.
fn retry_changing(current: Option<&serde_json::Map<String, Value>>) -> Value {
    let keys = ["backoff_s", "max_attempts"];
    let base = retry_object();
    let alternatives: Vec<Value> = keys
        .iter()
        .map(|key| {
            let existing = current
                .and_then(|retry| retry.get(*key))
                .filter(|v| !v.is_null());
            let changed = match (*key, existing) {
                ("backoff_s", Some(b)) => b.as_f64().map_or_else(
                    || or_null(seconds()),
                    |b| or_null(number_except(&seconds(), b)),
                ),
                ("backoff_s", None) => seconds(),
                (_, Some(m)) => m
                    .as_u64()
                    .map_or_else(|| or_null(attempts()), |m| or_null(integer_except(100, m))),
                (_, None) => attempts(),
            };
            let mut alternative = base.clone();
            alternative["properties"][*key] = changed;
            alternative["required"] = json!([key]);
            alternative
        })
        .collect();
    json!({"anyOf": alternatives})
}

/// A tool list of `catalogue`'s tools, at most as many items as its longest list and as it knows
/// tools (llguidance has no `uniqueItems`); an empty list when it knows none.
fn catalogue_tools(catalogue: &Catalogue) -> Value {
    if catalogue.tools.is_empty() {
        return json!({"type": "array", "maxItems": 0});
    }
    let mut tool = tool();
    let names: Vec<&String> = catalogue.tools.iter().collect();
    tool["properties"]["name"] = json!({"enum": names});
    json!({"type": "array", "items": tool, "maxItems": catalogue.max_tools()})
}

/// The diff of [`diff_schema`] narrowed to the diffs that change `current` (a configuration
/// object): one alternative per key, that key required with a value other than its current one,
/// the rest as before. A completion under it cannot be [`super::FormatError::NoChange`], except
/// through the keys that are not narrowed (a tool list equal to the current one, or a system
/// prompt over 200 characters repeated); a redundant unchanged key beside a changed one is still
/// allowed, as the world and the warm-up targets write some.
pub fn diff_schema_changing(current: &Value, catalogue: Option<&Catalogue>) -> Value {
    let mut base = diff_schema();
    let switchable = catalogue.is_none_or(|catalogue| {
        let current = current.get("model").and_then(Value::as_str);
        catalogue.models.iter().any(|m| Some(m.as_str()) != current)
    });
    if let Some(catalogue) = catalogue {
        // Names outside the catalogue are out even where the key is not the one changed.
        if let Some(properties) = base["properties"].as_object_mut() {
            let models: Vec<&String> = catalogue.models.iter().collect();
            properties.insert("model".into(), json!({"enum": models}));
            properties.insert("tools".into(), or_null(catalogue_tools(catalogue)));
            if catalogue.models.is_empty() {
                // Rebuilt rather than removed from: a removal may reorder the keys (see the
                // module docs on key order).
                *properties = properties
                    .iter()
                    .filter(|(key, _)| key.as_str() != "model")
                    .map(|(key, value)| (key.clone(), value.clone()))
                    .collect();
            }
        }
    }
    // The keys in the schema's own order (see the module docs).
    let keys: Vec<String> = base["properties"]
        .as_object()
        .map(|properties| properties.keys().cloned().collect())
        .unwrap_or_default();
    let alternatives: Vec<Value> = keys
        .iter()
        .filter(|key| *key != "model" || switchable)
        .map(|key| {
            let mut alternative = base.clone();
            if let Some(map) = alternative.as_object_mut() {
                map.remove("minProperties");
            }
            if let Some(changed) = changing_value(key, current.get(key), catalogue) {
                alternative["properties"][key] = changed;
            }
            alternative["required"] = json!([key]);
            alternative
        })
        .collect();
    json!({"anyOf": alternatives})
}

/// [`recommendation_schema`] for one prompt: its diff must change `current` (see
/// [`diff_schema_changing`]). Constrained sampling compiles it per prompt
/// (`Grammar::recompile` of the shared grammar).
pub fn recommendation_schema_changing(current: &Value, catalogue: Option<&Catalogue>) -> Value {
    let mut schema = recommendation_schema();
    schema["properties"]["diff"] = diff_schema_changing(current, catalogue);
    schema
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
        let corpus = crate::export::tokenizer_corpus::tokenizer_corpus(3, 400).unwrap();
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
                rationale.chars().count() <= MAX_RATIONALE_CHARS * 2 / 3,
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
        // The shared grammar cannot see the configuration: about one walk in ten changes
        // nothing (11 of 100 here); a prompt's own grammar rules those out too
        // (`random_walks_over_a_prompts_grammar_change_its_configuration`).
        assert!(
            parsed * 100 >= finished * 80,
            "{parsed} of {finished} parse; failures: {failures:#?}"
        );
        // The grammar rules out everything but a configuration that changes nothing.
        for kind in failures.keys() {
            assert_eq!(*kind, "no_change", "{failures:#?}");
        }
    }

    /// Every number a grammar takes, in any numeric field, is in range once parsed, and no
    /// number runs on: the shared grammar and prompts' grammars over configurations whose
    /// current backoff sits at several places in the range (a changed backoff below a current
    /// one once let "0" through, `validate_diff`'s error), with exponents that would underflow or
    /// overflow and runs of decimals (a sample once spent 90 tokens on one timeout's digits).
    #[test]
    fn numbers_the_grammars_take_are_in_range_and_short() {
        let dir = tempfile::tempdir().unwrap();
        let tokenizer = tiny_tokenizer(dir.path());
        let shared = compile(&tokenizer);
        let config = json!({
            "model": "m", "temperature": 0.5, "timeout_s": 30,
            "retry": {"max_attempts": 3, "backoff_s": 2.5},
            "tools": [{"name": "t", "timeout_s": 5}]
        });
        let mut grammars = vec![shared.clone()];
        for backoff in [json!(2.5), json!(1), json!(0.5), json!(0.001), json!(null)] {
            let mut config = config.clone();
            config["retry"]["backoff_s"] = backoff;
            let schema = recommendation_schema_changing(&config, None);
            grammars.push(shared.recompile(&schema).unwrap());
        }
        let in_range = ["1", "2.5", "0.5", "0.01", "1.5", "86400", "0.125"];
        let refused = [
            "0",
            "0.0",
            "0.000",
            "00",
            "-0",
            "-1",
            "000.5",
            "0.0001",
            "86400.001",
            "100000000",
            "1e-999",
            "1E-400",
            "1e400",
            "2e0",
            "8.64e4",
            "0.569055558050853055053050055757080508055065555575555577703057565305",
        ];
        let fields: [fn(&str) -> String; 5] = [
            |n| format!("{{\"retry\":{{\"backoff_s\":{n}}}}}"),
            |n| format!("{{\"retry\":{{\"backoff_s\":{n},\"max_attempts\":33}}}}"),
            |n| format!("{{\"timeout_s\":{n}}}"),
            |n| format!("{{\"temperature\":{n}}}"),
            |n| format!("{{\"tools\":[{{\"name\":\"t\",\"timeout_s\":{n}}}]}}"),
        ];
        let mut taken = 0;
        for grammar in &grammars {
            for field in fields {
                for number in in_range.iter().chain(&refused) {
                    let text = format!(
                        "{{\"type\":\"balanced\",\"diff\":{},\"rationale\":\"Because.\"}}",
                        field(number)
                    );
                    if !accepts(grammar, &tokenizer, &text) {
                        continue;
                    }
                    taken += 1;
                    match parse_recommendation(&text, &config) {
                        Ok(_) | Err(crate::rft::FormatError::NoChange) => {}
                        Err(e) => panic!("a grammar takes {text}, which is malformed: {e}"),
                    }
                    // Temperatures stop at 2, with 0 allowed; seconds start at 1 ms.
                    let temperature_zero =
                        field("") == "{\"temperature\":}" && number.parse::<f64>() == Ok(0.0);
                    assert!(
                        !refused.contains(number) || temperature_zero,
                        "a grammar takes {text}"
                    );
                }
            }
        }
        // Each grammar takes the in-range numbers of every field but the ones it narrowed away
        // (a current value, a temperature above 2).
        assert!(
            taken >= grammars.len() * (fields.len() * in_range.len() - 8),
            "{taken} taken"
        );
    }

    /// Whether `grammar` accepts `text` whole, ending at a stop token.
    fn accepts(grammar: &Grammar, tokenizer: &Tokenizer, text: &str) -> bool {
        let mut matcher = grammar.matcher().unwrap();
        if refusal(&mut matcher, tokenizer, text).is_some() {
            return false;
        }
        let stop = i64::from(grammar.stop_ids()[0]);
        matcher.allowed().unwrap().contains(stop)
    }

    fn completion(diff: &Value) -> String {
        format!(
            "{{\"type\":\"balanced\",\"diff\":{},\"rationale\":\"Because it failed.\"}}",
            serde_json::to_string(diff).unwrap()
        )
    }

    /// A prompt's grammar takes every accepted completion of its configuration and refuses the
    /// diffs that leave that configuration as it is, key by key, while a changed value of the
    /// same key passes.
    #[test]
    fn a_prompts_grammar_refuses_the_diffs_that_change_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let tokenizer = tiny_tokenizer(dir.path());
        let shared = compile(&tokenizer);
        let accepted = accepted_completions();
        let (mut checked, mut unchanged) = (0, 0);
        let mut configs_seen = std::collections::HashSet::new();
        for example in &accepted {
            if parse_recommendation(&example.completion, &example.config).is_err() {
                continue;
            }
            let grammar = shared
                .recompile(&recommendation_schema_changing(&example.config, None))
                .unwrap();
            assert!(
                accepts(&grammar, &tokenizer, &example.completion),
                "refused an accepted completion {} of {}",
                example.completion,
                example.config
            );
            checked += 1;
            if !configs_seen.insert(example.config.to_string()) || configs_seen.len() > 12 {
                continue;
            }
            let config = &example.config;
            let mut same = vec![
                json!({"model": config["model"]}),
                json!({"temperature": config["temperature"]}),
            ];
            let mut changed = vec![
                json!({"model": format!("{}-mini", config["model"].as_str().unwrap())}),
                json!({"temperature": if config["temperature"].as_f64() == Some(0.5) { 0.7 } else { 0.5 }}),
            ];
            for key in ["timeout_s", "max_tokens"] {
                match config.get(key).filter(|v| !v.is_null()) {
                    Some(value) => {
                        same.push(json!({key: value}));
                        changed.push(json!({key: null}));
                    }
                    None => {
                        same.push(json!({key: null}));
                        changed.push(json!({key: 30}));
                    }
                }
            }
            if let Some(retry) = config.get("retry").filter(|v| v.is_object()) {
                same.push(json!({"retry": retry}));
                if let Some(attempts) = retry.get("max_attempts").and_then(Value::as_u64) {
                    same.push(json!({"retry": {"max_attempts": attempts}}));
                    changed.push(json!({"retry": {"max_attempts": attempts % 100 + 1}}));
                }
            } else {
                same.push(json!({"retry": null}));
                changed.push(json!({"retry": {"max_attempts": 2}}));
            }
            for diff in &same {
                let text = completion(diff);
                assert!(
                    matches!(
                        parse_recommendation(&text, config),
                        Err(crate::rft::FormatError::NoChange)
                    ),
                    "{text} should change nothing in {config}"
                );
                assert!(
                    !accepts(&grammar, &tokenizer, &text),
                    "{text} over {config}"
                );
                unchanged += 1;
            }
            for diff in &changed {
                let text = completion(diff);
                assert!(
                    parse_recommendation(&text, config).is_ok(),
                    "{text} over {config}"
                );
                assert!(accepts(&grammar, &tokenizer, &text), "{text} over {config}");
            }
        }
        eprintln!(
            "{checked} accepted completions pass their prompt's grammar; {unchanged} no-change diffs refused"
        );
        assert!(checked >= 50 && unchanged >= 30, "{checked}, {unchanged}");
    }

    /// Random walks over a prompt's grammar parse as recommendations that change its
    /// configuration, on several configurations.
    #[test]
    fn random_walks_over_a_prompts_grammar_change_its_configuration() {
        let dir = tempfile::tempdir().unwrap();
        let tokenizer = tiny_tokenizer(dir.path());
        let shared = compile(&tokenizer);
        let mut configs: Vec<Value> = accepted_completions()
            .into_iter()
            .map(|e| e.config)
            .collect();
        configs.dedup();
        let mut rng = ChaCha8Rng::seed_from_u64(11);
        let mut masks = (0u32, std::time::Duration::ZERO);
        let (mut finished, mut parsed) = (0, 0);
        let mut failures = Vec::new();
        let mut compile_time = std::time::Duration::ZERO;
        for config in configs.iter().take(5) {
            let started = std::time::Instant::now();
            let grammar = shared
                .recompile(&recommendation_schema_changing(config, None))
                .unwrap();
            let mut matcher = grammar.matcher().unwrap();
            matcher.allowed().unwrap();
            compile_time += started.elapsed();
            for _ in 0..30 {
                let Some(text) = random_walk(&grammar, &tokenizer, &mut rng, 2000, &mut masks)
                else {
                    continue;
                };
                finished += 1;
                match parse_recommendation(&text, config) {
                    Ok(_) => parsed += 1,
                    Err(e) => failures.push(format!("{}: {text} over {config}", e.kind())),
                }
            }
        }
        eprintln!(
            "random walks over prompts' grammars: {finished} of 150 finished, {parsed} parse; \
             allowed() mean {:.1} µs over {} tokens; a prompt's grammar compiled and its first \
             mask in {:.1} ms",
            masks.1.as_secs_f64() * 1e6 / f64::from(masks.0.max(1)),
            masks.0,
            compile_time.as_secs_f64() * 1e3 / 5.0
        );
        assert!(finished >= 135, "only {finished} of 150 walks finished");
        assert_eq!(parsed, finished, "{failures:#?}");
    }

    /// Under an organization's catalogue a prompt's grammar names only the catalogue's models and
    /// tools, a tool list holds at most as many tools as it knows, and the world's accepted
    /// completions still pass (their names come from the same data).
    #[test]
    fn under_a_catalogue_samples_name_only_known_models_and_tools() {
        let dir = tempfile::tempdir().unwrap();
        let tokenizer = tiny_tokenizer(dir.path());
        let shared = compile(&tokenizer);
        let accepted = accepted_completions();
        let mut catalogue = Catalogue::default();
        for example in &accepted {
            catalogue.add(&example.config);
            let value: Value = serde_json::from_str(&example.completion).unwrap();
            catalogue.add(&value["diff"]);
        }
        assert!(catalogue.models.len() >= 2 && !catalogue.tools.is_empty());
        let mut rng = ChaCha8Rng::seed_from_u64(5);
        let mut masks = (0u32, std::time::Duration::ZERO);
        let (mut walks, mut finished, mut passed) = (0, 0, 0);
        let mut configs_seen = std::collections::HashSet::new();
        for example in &accepted {
            if parse_recommendation(&example.completion, &example.config).is_err() {
                continue;
            }
            let grammar = shared
                .recompile(&recommendation_schema_changing(
                    &example.config,
                    Some(&catalogue),
                ))
                .unwrap();
            assert!(
                accepts(&grammar, &tokenizer, &example.completion),
                "refused {} of {}",
                example.completion,
                example.config
            );
            passed += 1;
            // An invented model name and an invented tool are refused.
            let invented = [
                json!({"model": "deepseek/deepseek-v32"}),
                json!({"tools": [{"name": "5-sonnet_l anthropic fintech"}]}),
            ];
            for diff in &invented {
                assert!(!accepts(&grammar, &tokenizer, &completion(diff)), "{diff}");
            }
            if !configs_seen.insert(example.config.to_string()) || configs_seen.len() > 4 {
                continue;
            }
            for _ in 0..20 {
                walks += 1;
                let Some(text) = random_walk(&grammar, &tokenizer, &mut rng, 2000, &mut masks)
                else {
                    continue;
                };
                finished += 1;
                let value: Value = serde_json::from_str(&text).unwrap();
                let diff = &value["diff"];
                if let Some(model) = diff["model"].as_str() {
                    assert!(catalogue.models.contains(model), "{text}");
                }
                if let Some(tools) = diff["tools"].as_array() {
                    assert!(tools.len() <= catalogue.longest_tool_list, "{text}");
                    for tool in tools {
                        assert!(
                            catalogue.tools.contains(tool["name"].as_str().unwrap()),
                            "{text}"
                        );
                    }
                }
                assert!(
                    parse_recommendation(&text, &example.config).is_ok(),
                    "{text}"
                );
            }
        }
        eprintln!(
            "{passed} accepted completions pass; {finished} of {walks} random walks finished"
        );
        assert!(passed >= 50 && walks >= 60);
        assert!(finished * 10 >= walks * 9, "{finished} of {walks}");
    }
}
