//! `generation_config.json`: a checkpoint's stop ids and sampling defaults, with transformers'
//! defaults for whatever the file leaves out.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Deserializer};

/// The file transformers writes next to a checkpoint.
pub const GENERATION_CONFIG_FILE: &str = "generation_config.json";

/// Why `generation_config.json` could not be used.
#[derive(Debug, thiserror::Error)]
pub enum GenerationConfigError {
    /// The file exists but could not be read.
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// Not JSON, or a field of the wrong type.
    #[error("{path}: field {field}: {source}")]
    Json {
        path: PathBuf,
        /// The JSON path of the field at fault (`.` for the whole document).
        field: String,
        #[source]
        source: serde_json::Error,
    },
    /// A field holds a value generation cannot use.
    #[error("{path}: field {field} {problem}")]
    Invalid {
        path: PathBuf,
        field: &'static str,
        problem: String,
    },
}

/// What `generation_config.json` says; fields it omits take transformers' `GenerationConfig`
/// defaults (greedy, temperature 1, top_p 1, top_k 50, max_length 20). Unknown fields are ignored.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default)]
pub struct GenerationConfig {
    pub bos_token_id: Option<u32>,
    /// Every id that ends generation; the file may give one id or a list.
    #[serde(deserialize_with = "one_or_many_ids")]
    pub eos_token_id: Vec<u32>,
    pub pad_token_id: Option<u32>,
    /// Sample (true) or decode greedily (false).
    pub do_sample: bool,
    pub temperature: f64,
    /// Nucleus mass kept, in (0, 1].
    pub top_p: f64,
    /// Most likely tokens kept; 0 disables the filter.
    pub top_k: u32,
    /// New tokens at most; `None` leaves the limit to `max_length`.
    pub max_new_tokens: Option<usize>,
    /// Prompt plus new tokens at most, used only without `max_new_tokens`.
    pub max_length: usize,
    /// Divides the logits of tokens already present (1 disables it).
    pub repetition_penalty: f64,
}

impl Default for GenerationConfig {
    fn default() -> Self {
        Self {
            bos_token_id: None,
            eos_token_id: Vec::new(),
            pad_token_id: None,
            do_sample: false,
            temperature: 1.0,
            top_p: 1.0,
            top_k: 50,
            max_new_tokens: None,
            max_length: 20,
            repetition_penalty: 1.0,
        }
    }
}

fn one_or_many_ids<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Vec<u32>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum OneOrMany {
        One(u32),
        Many(Vec<u32>),
    }
    Ok(match Option::<OneOrMany>::deserialize(deserializer)? {
        None => Vec::new(),
        Some(OneOrMany::One(id)) => vec![id],
        Some(OneOrMany::Many(ids)) => ids,
    })
}

impl GenerationConfig {
    /// Reads and checks a `generation_config.json` file.
    pub fn from_file(path: &Path) -> Result<Self, GenerationConfigError> {
        let bytes = std::fs::read(path).map_err(|source| GenerationConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Self::from_json(&bytes, path)
    }

    /// Reads `dir/generation_config.json`; `None` when the checkpoint has none.
    pub fn from_dir(dir: &Path) -> Result<Option<Self>, GenerationConfigError> {
        let path = dir.join(GENERATION_CONFIG_FILE);
        if !path.exists() {
            return Ok(None);
        }
        Self::from_file(&path).map(Some)
    }

    /// Parses and checks the file's bytes; `path` is only used in errors.
    pub fn from_json(bytes: &[u8], path: &Path) -> Result<Self, GenerationConfigError> {
        let deserializer = &mut serde_json::Deserializer::from_slice(bytes);
        let config: Self = serde_path_to_error::deserialize(deserializer).map_err(|e| {
            GenerationConfigError::Json {
                path: path.to_path_buf(),
                field: e.path().to_string(),
                source: e.into_inner(),
            }
        })?;
        config.validate(path)?;
        Ok(config)
    }

    fn validate(&self, path: &Path) -> Result<(), GenerationConfigError> {
        let invalid = |field, problem: String| GenerationConfigError::Invalid {
            path: path.to_path_buf(),
            field,
            problem,
        };
        if !(self.temperature.is_finite() && self.temperature >= 0.0) {
            return Err(invalid(
                "temperature",
                format!("must be a finite number >= 0, got {}", self.temperature),
            ));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return Err(invalid(
                "top_p",
                format!("must be in (0, 1], got {}", self.top_p),
            ));
        }
        if !(self.repetition_penalty.is_finite() && self.repetition_penalty > 0.0) {
            return Err(invalid(
                "repetition_penalty",
                format!(
                    "must be a finite number > 0, got {}",
                    self.repetition_penalty
                ),
            ));
        }
        if self.max_new_tokens == Some(0) {
            return Err(invalid("max_new_tokens", "must be at least 1".to_owned()));
        }
        Ok(())
    }

    /// The most new tokens to generate after a prompt of `prompt_len` tokens.
    pub fn new_token_budget(&self, prompt_len: usize) -> usize {
        self.max_new_tokens
            .unwrap_or_else(|| self.max_length.saturating_sub(prompt_len))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(json: &str) -> Result<GenerationConfig, GenerationConfigError> {
        GenerationConfig::from_json(json.as_bytes(), Path::new("ckpt/generation_config.json"))
    }

    #[test]
    fn reads_qwen25_instruct_generation_config() {
        // Qwen2.5-7B-Instruct's file, verbatim.
        let config = parse(
            r#"{"bos_token_id": 151643, "pad_token_id": 151643, "do_sample": true,
                "eos_token_id": [151645, 151643], "repetition_penalty": 1.05,
                "temperature": 0.7, "top_p": 0.8, "top_k": 20, "transformers_version": "4.37.0"}"#,
        )
        .unwrap();
        assert_eq!(config.eos_token_id, vec![151645, 151643]);
        assert_eq!(config.bos_token_id, Some(151643));
        assert_eq!(config.pad_token_id, Some(151643));
        assert!(config.do_sample);
        assert_eq!(
            (config.temperature, config.top_p, config.top_k),
            (0.7, 0.8, 20)
        );
        assert_eq!(config.repetition_penalty, 1.05);
        assert_eq!(config.max_new_tokens, None);
        assert_eq!(config.new_token_budget(5), 15);
    }

    #[test]
    fn single_eos_id_and_transformers_defaults() {
        let config = parse(r#"{"eos_token_id": 2, "max_new_tokens": 64}"#).unwrap();
        assert_eq!(config.eos_token_id, vec![2]);
        assert!(!config.do_sample);
        assert_eq!(
            (config.temperature, config.top_p, config.top_k),
            (1.0, 1.0, 50)
        );
        assert_eq!(config.new_token_budget(1000), 64);
        assert!(
            parse(r#"{"eos_token_id": null}"#)
                .unwrap()
                .eos_token_id
                .is_empty()
        );
    }

    #[test]
    fn bad_values_name_the_file_and_field() {
        for (json, field) in [
            (r#"{"top_p": 0}"#, "top_p"),
            (r#"{"temperature": -1}"#, "temperature"),
            (r#"{"max_new_tokens": 0}"#, "max_new_tokens"),
            (r#"{"repetition_penalty": 0}"#, "repetition_penalty"),
            (r#"{"eos_token_id": "x"}"#, "eos_token_id"),
            (r#"{"top_k": -3}"#, "top_k"),
        ] {
            let message = parse(json).unwrap_err().to_string();
            assert!(
                message.contains("ckpt/generation_config.json") && message.contains(field),
                "{json}: {message}"
            );
        }
    }

    #[test]
    fn missing_file_is_none_but_unreadable_json_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        assert!(GenerationConfig::from_dir(dir.path()).unwrap().is_none());
        std::fs::write(dir.path().join(GENERATION_CONFIG_FILE), "{").unwrap();
        let message = GenerationConfig::from_dir(dir.path())
            .unwrap_err()
            .to_string();
        assert!(message.contains(GENERATION_CONFIG_FILE), "{message}");
    }
}
