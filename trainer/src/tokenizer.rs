//! Text ↔ token ids through Hugging Face `tokenizer.json` files, with the special tokens (bos,
//! eos, pad, stop ids) a checkpoint's `tokenizer_config.json`, `generation_config.json` and
//! `config.json` name; and the byte-level BPE trainer the `tiny` preset uses.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use serde_json::Value;
use tokenizers::models::TrainerWrapper;
use tokenizers::models::bpe::{BPE, BpeTrainerBuilder};
use tokenizers::normalizers::unicode::NFC;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::{AddedToken, SplitDelimiterBehavior};

use crate::generation_config::{GenerationConfig, GenerationConfigError};

/// The file holding the tokenizer itself.
pub const TOKENIZER_FILE: &str = "tokenizer.json";
/// transformers' tokenizer settings: special tokens by text, chat template.
pub const TOKENIZER_CONFIG_FILE: &str = "tokenizer_config.json";
/// The model's architecture config; names bos/eos ids as a last resort.
pub const MODEL_CONFIG_FILE: &str = "config.json";

/// Qwen2's pre-tokenizer split pattern, verbatim from its `tokenizer.json`: contractions, words
/// with one leading non-letter, single digits, punctuation runs, newlines, spaces.
pub const QWEN2_SPLIT_PATTERN: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// Why a tokenizer could not be loaded, trained or used.
#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    /// A file could not be read.
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A file could not be written.
    #[error("cannot write {path}: {source}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// `tokenizer.json` is not a tokenizer the `tokenizers` library understands.
    #[error("{path} is not a valid tokenizer: {message}")]
    Parse { path: PathBuf, message: String },
    /// A JSON config file is malformed.
    #[error("{path} is not valid JSON: {source}")]
    Json {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    /// A config names a special token in a form we do not understand.
    #[error(
        "{path}: field {field} must be a token string or an object with \"content\", got {value}"
    )]
    SpecialTokenShape {
        path: PathBuf,
        field: String,
        value: String,
    },
    /// A config names a special token (or id) the vocabulary does not have.
    #[error("{path}: field {field} names {token}, which is not in the tokenizer's vocabulary")]
    UnknownSpecialToken {
        path: PathBuf,
        field: String,
        token: String,
    },
    /// `generation_config.json` could not be read.
    #[error(transparent)]
    GenerationConfig(#[from] GenerationConfigError),
    /// Encoding failed (e.g. the pre-tokenizer regex could not run).
    #[error("cannot encode text: {0}")]
    Encode(String),
    /// Decoding failed (e.g. an id outside the vocabulary).
    #[error("cannot decode ids: {0}")]
    Decode(String),
    /// Training failed.
    #[error("cannot train the tokenizer: {0}")]
    Train(String),
}

/// A special token: its text and its id in the vocabulary.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpecialToken {
    pub text: String,
    pub id: u32,
}

/// The special tokens generation and batching need.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SpecialTokens {
    /// Beginning of sequence; Qwen2 has none (its configs say null).
    pub bos: Option<SpecialToken>,
    /// The end-of-turn token the chat template writes after an assistant message.
    pub eos: Option<SpecialToken>,
    /// Padding; batches are padded with it (masked out of attention and loss).
    pub pad: Option<SpecialToken>,
    /// Every id that ends generation: eos plus `generation_config.json`'s `eos_token_id` list
    /// (Qwen2.5 stops on both `<|im_end|>` and `<|endoftext|>`). Sorted, no duplicates.
    pub stop_ids: Vec<u32>,
}

/// A loaded tokenizer with its special tokens resolved.
#[derive(Debug, Clone)]
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    special: SpecialTokens,
}

impl Tokenizer {
    /// Loads `tokenizer.json` alone; special tokens stay unresolved (see [`Self::from_dir`]).
    pub fn from_file(path: &Path) -> Result<Self, TokenizerError> {
        let bytes = std::fs::read(path).map_err(|source| TokenizerError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        let inner =
            tokenizers::Tokenizer::from_bytes(&bytes).map_err(|e| TokenizerError::Parse {
                path: path.to_path_buf(),
                message: e.to_string(),
            })?;
        Ok(Self::from_parts(inner, SpecialTokens::default()))
    }

    /// Loads a checkpoint directory's tokenizer: `tokenizer.json` (required), then resolves bos,
    /// eos and pad from `tokenizer_config.json` (by text), falling back to the ids in
    /// `generation_config.json` and then `config.json`; any of these files may be absent.
    pub fn from_dir(dir: &Path) -> Result<Self, TokenizerError> {
        let mut tokenizer = Self::from_file(&dir.join(TOKENIZER_FILE))?;
        let tokenizer_config = read_optional_json(&dir.join(TOKENIZER_CONFIG_FILE))?;
        let generation = GenerationConfig::from_dir(dir)?;
        let model_config = read_optional_json(&dir.join(MODEL_CONFIG_FILE))?;

        let mut special = SpecialTokens::default();
        for (name, slot) in [
            ("bos", &mut special.bos),
            ("eos", &mut special.eos),
            ("pad", &mut special.pad),
        ] {
            *slot = tokenizer.resolve_special(
                name,
                tokenizer_config.as_ref().map(|(p, v)| (p.as_path(), v)),
                generation.as_ref(),
                &dir.join(crate::generation_config::GENERATION_CONFIG_FILE),
                model_config.as_ref().map(|(p, v)| (p.as_path(), v)),
            )?;
        }
        let mut stop_ids: Vec<u32> = special.eos.iter().map(|t| t.id).collect();
        if let Some(generation) = &generation {
            for &id in &generation.eos_token_id {
                tokenizer.check_id(
                    id,
                    &dir.join(crate::generation_config::GENERATION_CONFIG_FILE),
                    "eos_token_id",
                )?;
                stop_ids.push(id);
            }
        }
        stop_ids.sort_unstable();
        stop_ids.dedup();
        special.stop_ids = stop_ids;
        tokenizer.special = special;
        Ok(tokenizer)
    }

    /// Wraps an in-memory tokenizer (e.g. one just trained).
    pub fn from_parts(inner: tokenizers::Tokenizer, special: SpecialTokens) -> Self {
        Self { inner, special }
    }

    /// The resolved special tokens.
    pub fn special_tokens(&self) -> &SpecialTokens {
        &self.special
    }

    /// The underlying `tokenizers` tokenizer, for anything this wrapper does not expose.
    pub fn inner(&self) -> &tokenizers::Tokenizer {
        &self.inner
    }

    /// Number of ids, added (special) tokens included: the embedding needs at least this many rows.
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    /// The id of a token string (special tokens included).
    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    /// The token string of an id.
    pub fn id_to_token(&self, id: u32) -> Option<String> {
        self.inner.id_to_token(id)
    }

    /// Encodes text. Special-token strings in the text (`<|im_start|>`) become their single ids,
    /// as in transformers; `add_special_tokens` runs the post-processor (Llama 3 prepends bos).
    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>, TokenizerError> {
        self.inner
            .encode(text, add_special_tokens)
            .map(|encoding| encoding.get_ids().to_vec())
            .map_err(|e| TokenizerError::Encode(e.to_string()))
    }

    /// Decodes ids to text; `skip_special_tokens` drops added special tokens such as `<|im_end|>`.
    pub fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> Result<String, TokenizerError> {
        let size = self.vocab_size();
        if let Some(&bad) = ids.iter().find(|&&id| id as usize >= size) {
            return Err(TokenizerError::Decode(format!(
                "id {bad} is outside the vocabulary of {size} tokens"
            )));
        }
        self.inner
            .decode(ids, skip_special_tokens)
            .map_err(|e| TokenizerError::Decode(e.to_string()))
    }

    /// Writes `tokenizer.json` (pretty-printed, as transformers saves it).
    pub fn save(&self, path: &Path) -> Result<(), TokenizerError> {
        let text = self
            .inner
            .to_string(true)
            .map_err(|e| TokenizerError::Parse {
                path: path.to_path_buf(),
                message: e.to_string(),
            })?;
        std::fs::write(path, text).map_err(|source| TokenizerError::Write {
            path: path.to_path_buf(),
            source,
        })
    }

    fn check_id(&self, id: u32, path: &Path, field: &str) -> Result<(), TokenizerError> {
        if self.inner.id_to_token(id).is_none() {
            return Err(TokenizerError::UnknownSpecialToken {
                path: path.to_path_buf(),
                field: field.to_owned(),
                token: format!("id {id}"),
            });
        }
        Ok(())
    }

    /// One special token, from the first file that names it: tokenizer_config.json's
    /// `<name>_token` text, else generation_config.json's `<name>_token_id` (first of a list),
    /// else config.json's `<name>_token_id`. An explicit null in tokenizer_config.json means
    /// "none", as transformers reads it: Qwen2.5 says `bos_token: null` and has no bos, although
    /// its generation_config.json names a `bos_token_id`.
    fn resolve_special(
        &self,
        name: &str,
        tokenizer_config: Option<(&Path, &Value)>,
        generation: Option<&GenerationConfig>,
        generation_path: &Path,
        model_config: Option<(&Path, &Value)>,
    ) -> Result<Option<SpecialToken>, TokenizerError> {
        let text_field = format!("{name}_token");
        if let Some((path, config)) = tokenizer_config
            && config.get(&text_field).is_some()
        {
            let Some(text) = special_token_text(path, config, &text_field)? else {
                return Ok(None);
            };
            let id = self.inner.token_to_id(&text).ok_or_else(|| {
                TokenizerError::UnknownSpecialToken {
                    path: path.to_path_buf(),
                    field: text_field.clone(),
                    token: text.clone(),
                }
            })?;
            return Ok(Some(SpecialToken { text, id }));
        }
        let id_field = format!("{name}_token_id");
        let from_generation = generation.and_then(|g| match name {
            "bos" => g.bos_token_id,
            "eos" => g.eos_token_id.first().copied(),
            _ => g.pad_token_id,
        });
        if let Some(id) = from_generation {
            return self
                .special_from_id(id, generation_path, &id_field)
                .map(Some);
        }
        if let Some((path, config)) = model_config {
            let id = match config.get(&id_field) {
                Some(Value::Number(n)) => n.as_u64(),
                Some(Value::Array(ids)) => ids.first().and_then(Value::as_u64),
                _ => None,
            };
            if let Some(id) = id {
                let id = u32::try_from(id).map_err(|_| TokenizerError::UnknownSpecialToken {
                    path: path.to_path_buf(),
                    field: id_field.clone(),
                    token: format!("id {id}"),
                })?;
                return self.special_from_id(id, path, &id_field).map(Some);
            }
        }
        Ok(None)
    }

    fn special_from_id(
        &self,
        id: u32,
        path: &Path,
        field: &str,
    ) -> Result<SpecialToken, TokenizerError> {
        let text =
            self.inner
                .id_to_token(id)
                .ok_or_else(|| TokenizerError::UnknownSpecialToken {
                    path: path.to_path_buf(),
                    field: field.to_owned(),
                    token: format!("id {id}"),
                })?;
        Ok(SpecialToken { text, id })
    }
}

/// Reads a JSON file that may be absent.
pub(crate) fn read_optional_json(path: &Path) -> Result<Option<(PathBuf, Value)>, TokenizerError> {
    let bytes = match std::fs::read(path) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => {
            return Err(TokenizerError::Read {
                path: path.to_path_buf(),
                source,
            });
        }
    };
    let value = serde_json::from_slice(&bytes).map_err(|source| TokenizerError::Json {
        path: path.to_path_buf(),
        source,
    })?;
    Ok(Some((path.to_path_buf(), value)))
}

/// A special token's text in tokenizer_config.json: a string, or transformers' serialized
/// `AddedToken` object `{"content": "<|im_end|>", ...}`; null or absent gives `None`.
pub(crate) fn special_token_text(
    path: &Path,
    config: &Value,
    field: &str,
) -> Result<Option<String>, TokenizerError> {
    match config.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(text)) => Ok(Some(text.clone())),
        Some(Value::Object(object)) => match object.get("content") {
            Some(Value::String(text)) => Ok(Some(text.clone())),
            _ => Err(TokenizerError::SpecialTokenShape {
                path: path.to_path_buf(),
                field: field.to_owned(),
                value: Value::Object(object.clone()).to_string(),
            }),
        },
        Some(other) => Err(TokenizerError::SpecialTokenShape {
            path: path.to_path_buf(),
            field: field.to_owned(),
            value: other.to_string(),
        }),
    }
}

/// Trains a byte-level BPE with Qwen2's pipeline (NFC, Qwen2's split regex, byte-level
/// pre-tokenizer and decoder) on `corpus`. Special tokens get the first ids, in the order given;
/// then the 256 byte symbols; then merges until `vocab_size` (or until no pair occurs twice).
/// Deterministic: the same corpus gives the same tokenizer, whatever the thread count.
pub fn train_byte_level_bpe<I, S>(
    corpus: I,
    vocab_size: usize,
    special_tokens: &[&str],
) -> Result<tokenizers::Tokenizer, TokenizerError>
where
    I: Iterator<Item = S> + Send,
    S: AsRef<str> + Send,
{
    let train_err = |e: tokenizers::Error| TokenizerError::Train(e.to_string());
    let mut tokenizer = tokenizers::Tokenizer::new(BPE::default());
    let split = Split::new(
        SplitPattern::Regex(QWEN2_SPLIT_PATTERN.to_owned()),
        SplitDelimiterBehavior::Isolated,
        false,
    )
    .map_err(train_err)?;
    // use_regex false: the Split above already did GPT-2-style splitting; ByteLevel only maps
    // bytes to its printable alphabet, exactly as Qwen2's tokenizer.json configures it.
    let byte_level = ByteLevel::new(false, false, false);
    tokenizer
        .with_normalizer(Some(NFC))
        .with_pre_tokenizer(Some(Sequence::new(vec![split.into(), byte_level.into()])))
        .with_post_processor(Some(byte_level))
        .with_decoder(Some(byte_level));
    let alphabet: HashSet<char> = ByteLevel::alphabet().into_iter().collect();
    let mut trainer: TrainerWrapper = BpeTrainerBuilder::new()
        .vocab_size(vocab_size)
        .min_frequency(2)
        .show_progress(false)
        .special_tokens(
            special_tokens
                .iter()
                .map(|t| AddedToken::from(*t, true))
                .collect(),
        )
        .initial_alphabet(alphabet)
        .build()
        .into();
    tokenizer.train(&mut trainer, corpus).map_err(train_err)?;
    Ok(tokenizer)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One case of a fixture made by `scripts/reference/make_text_fixtures.py` with the Python
    /// `tokenizers` library.
    #[derive(Debug, serde::Deserialize)]
    struct ExpectedEncoding {
        text: String,
        ids_with_special_tokens: Vec<u32>,
        ids: Vec<u32>,
        decoded_skipping_special_tokens: String,
        decoded: String,
    }

    fn fixture_dir(name: &str) -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures")
            .join(name)
    }

    fn assert_matches_python(name: &str) {
        let dir = fixture_dir(name);
        let tokenizer = Tokenizer::from_file(&dir.join(TOKENIZER_FILE)).unwrap();
        let cases: Vec<ExpectedEncoding> =
            serde_json::from_slice(&std::fs::read(dir.join("expected.json")).unwrap()).unwrap();
        assert!(cases.len() >= 5);
        for case in cases {
            assert_eq!(
                tokenizer.encode(&case.text, true).unwrap(),
                case.ids_with_special_tokens,
                "{name}: {:?} with special tokens",
                case.text
            );
            assert_eq!(
                tokenizer.encode(&case.text, false).unwrap(),
                case.ids,
                "{name}: {:?}",
                case.text
            );
            assert_eq!(
                tokenizer
                    .decode(&case.ids_with_special_tokens, true)
                    .unwrap(),
                case.decoded_skipping_special_tokens,
                "{name}: decode {:?}",
                case.text
            );
            assert_eq!(
                tokenizer
                    .decode(&case.ids_with_special_tokens, false)
                    .unwrap(),
                case.decoded,
                "{name}: decode {:?} keeping special tokens",
                case.text
            );
        }
    }

    #[test]
    fn qwen2_layout_encodes_and_decodes_like_python_tokenizers() {
        assert_matches_python("qwen2_bpe");
    }

    #[test]
    fn llama3_layout_encodes_and_decodes_like_python_tokenizers() {
        assert_matches_python("llama3_bpe");
    }

    #[test]
    fn special_tokens_come_from_tokenizer_config_then_generation_config() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::copy(
            fixture_dir("qwen2_bpe").join(TOKENIZER_FILE),
            dir.path().join(TOKENIZER_FILE),
        )
        .unwrap();
        std::fs::write(
            dir.path().join(TOKENIZER_CONFIG_FILE),
            r#"{"eos_token": "<|im_end|>", "unk_token": null,
                "pad_token": {"content": "<|endoftext|>", "special": true}}"#,
        )
        .unwrap();
        // generation_config lists a second stop id; config.json names a bos id that
        // tokenizer_config.json does not mention.
        std::fs::write(
            dir.path().join("generation_config.json"),
            r#"{"eos_token_id": [2, 0]}"#,
        )
        .unwrap();
        std::fs::write(dir.path().join(MODEL_CONFIG_FILE), r#"{"bos_token_id": 0}"#).unwrap();
        let tokenizer = Tokenizer::from_dir(dir.path()).unwrap();
        let special = tokenizer.special_tokens();
        assert_eq!(
            special.eos,
            Some(SpecialToken {
                text: "<|im_end|>".into(),
                id: 2
            })
        );
        assert_eq!(special.pad.as_ref().map(|t| t.id), Some(0));
        assert_eq!(
            special.bos.as_ref().map(|t| t.text.as_str()),
            Some("<|endoftext|>")
        );
        assert_eq!(special.stop_ids, vec![0, 2]);

        // An explicit null wins over the ids other files name (Qwen2.5 has no bos).
        std::fs::write(
            dir.path().join(TOKENIZER_CONFIG_FILE),
            r#"{"bos_token": null, "eos_token": "<|im_end|>"}"#,
        )
        .unwrap();
        let tokenizer = Tokenizer::from_dir(dir.path()).unwrap();
        assert_eq!(tokenizer.special_tokens().bos, None);
    }

    #[test]
    fn errors_name_the_file_and_field_at_fault() {
        let dir = tempfile::tempdir().unwrap();
        let missing = Tokenizer::from_dir(dir.path()).unwrap_err().to_string();
        assert!(missing.contains("tokenizer.json"), "{missing}");

        std::fs::write(dir.path().join(TOKENIZER_FILE), "{\"model\": 3}").unwrap();
        let garbage = Tokenizer::from_dir(dir.path()).unwrap_err().to_string();
        assert!(garbage.contains("is not a valid tokenizer"), "{garbage}");

        std::fs::copy(
            fixture_dir("qwen2_bpe").join(TOKENIZER_FILE),
            dir.path().join(TOKENIZER_FILE),
        )
        .unwrap();
        std::fs::write(
            dir.path().join(TOKENIZER_CONFIG_FILE),
            r#"{"eos_token": "<|no_such_token|>"}"#,
        )
        .unwrap();
        let unknown = Tokenizer::from_dir(dir.path()).unwrap_err().to_string();
        assert!(
            unknown.contains("tokenizer_config.json") && unknown.contains("eos_token"),
            "{unknown}"
        );

        std::fs::write(
            dir.path().join(TOKENIZER_CONFIG_FILE),
            r#"{"eos_token": 7}"#,
        )
        .unwrap();
        let shape = Tokenizer::from_dir(dir.path()).unwrap_err().to_string();
        assert!(shape.contains("field eos_token must be"), "{shape}");

        let tokenizer = Tokenizer::from_file(&dir.path().join(TOKENIZER_FILE)).unwrap();
        let out_of_range = tokenizer
            .decode(&[1_000_000], false)
            .unwrap_err()
            .to_string();
        assert!(out_of_range.contains("1000000"), "{out_of_range}");
    }

    #[test]
    fn trained_bpe_is_deterministic_and_round_trips() {
        let corpus = [
            "Switch to claude-3-haiku (98.7% lower cost, 96% reliability)",
            "Raise retry.max_attempts to 3 (timeouts on web_search)",
            "Lower temperature to 0.2 (fewer malformed tool calls)",
        ];
        let train = || {
            train_byte_level_bpe(
                corpus.iter().cycle().take(30),
                400,
                &["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
            )
            .unwrap()
        };
        let first = train();
        assert_eq!(
            first.to_string(false).unwrap(),
            train().to_string(false).unwrap()
        );
        let tokenizer = Tokenizer::from_parts(first, SpecialTokens::default());
        assert_eq!(tokenizer.token_to_id("<|endoftext|>"), Some(0));
        assert_eq!(tokenizer.token_to_id("<|im_end|>"), Some(2));
        // Merges were learned: 24 bytes, 6 pre-tokenizer pieces (Switch| to| claude|-|3|-haiku),
        // each merged into one token.
        let ids = tokenizer.encode("Switch to claude-3-haiku", false).unwrap();
        assert_eq!(ids.len(), 6, "{ids:?}");
        // Byte-level: text the corpus never saw still round-trips.
        let unseen = "<|im_start|>user\nζ∑ 🚀 {\"x\": 1}<|im_end|>";
        let ids = tokenizer.encode(unseen, false).unwrap();
        assert_eq!(ids.first(), Some(&1));
        assert_eq!(tokenizer.decode(&ids, false).unwrap(), unseen);
    }
}
