//! Chat templates: the Jinja program in a checkpoint's `tokenizer_config.json` (or
//! `chat_template.jinja`, as transformers 5 saves it) that turns messages into the prompt text the
//! model was trained on, rendered with minijinja the way transformers' `apply_chat_template` does.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use minijinja::value::{Kwargs, Serde, Value, ValueKind};
use minijinja::{Environment, Error as JinjaError, ErrorKind};
use serde::{Deserialize, Serialize};

use crate::tokenizer::{
    TOKENIZER_CONFIG_FILE, TokenizerError, read_optional_json, special_token_text,
};

/// The separate template file transformers 5 writes; it wins over `tokenizer_config.json`'s.
pub const CHAT_TEMPLATE_FILE: &str = "chat_template.jinja";

/// Name under which the template is compiled (it shows in error messages).
const TEMPLATE_NAME: &str = "chat_template";

/// Why a chat template could not be loaded or rendered.
#[derive(Debug, thiserror::Error)]
pub enum ChatTemplateError {
    /// Reading `tokenizer_config.json` or `chat_template.jinja` failed.
    #[error(transparent)]
    Config(#[from] TokenizerError),
    /// `chat_template.jinja` exists but could not be read.
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// `chat_template` is neither a string nor a list of `{name, template}` with a `default`.
    #[error(
        "{path}: field chat_template must be a string or a list of {{name, template}} objects with one named \"default\""
    )]
    Shape { path: PathBuf },
    /// The template is not valid Jinja (or uses something minijinja lacks).
    #[error("{origin}: the chat template does not compile: {message}")]
    Compile { origin: String, message: String },
    /// Rendering failed, e.g. the template called `raise_exception` (its message is included).
    #[error("{origin}: rendering the chat template failed: {message}")]
    Render { origin: String, message: String },
}

/// One chat message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatMessage {
    /// `system`, `user` or `assistant` (templates decide what else they accept).
    pub role: String,
    pub content: String,
}

impl ChatMessage {
    /// A message with the given role.
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        Self {
            role: role.into(),
            content: content.into(),
        }
    }
}

/// The special-token strings a template may refer to (`{{ bos_token }}`); absent ones are
/// undefined in the template, as in transformers.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TemplateTokens {
    pub bos_token: Option<String>,
    pub eos_token: Option<String>,
    pub pad_token: Option<String>,
    pub unk_token: Option<String>,
}

/// A compiled chat template.
#[derive(Debug)]
pub struct ChatTemplate {
    env: Environment<'static>,
    /// The file the template came from, for errors.
    origin: String,
    source: String,
}

impl ChatTemplate {
    /// Compiles a template. `origin` names where it came from in errors.
    pub fn new(
        source: &str,
        tokens: &TemplateTokens,
        origin: &str,
    ) -> Result<Self, ChatTemplateError> {
        let compile_err = |e: JinjaError| ChatTemplateError::Compile {
            origin: origin.to_owned(),
            message: describe(&e),
        };
        let mut env = Environment::new();
        // transformers compiles with trim_blocks and lstrip_blocks (and drops one trailing
        // newline, minijinja's default too); without them every template renders extra blank lines.
        let syntax = env
            .syntax()
            .to_builder()
            .trim_blocks(true)
            .lstrip_blocks(true)
            .keep_trailing_newline(false)
            .build()
            .map_err(compile_err)?;
        env.set_syntax(syntax);
        // Templates call Python str methods: message.content.strip(), .startswith(), .split().
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", raise_exception);
        env.add_filter("tojson", python_tojson);
        for (name, token) in [
            ("bos_token", &tokens.bos_token),
            ("eos_token", &tokens.eos_token),
            ("pad_token", &tokens.pad_token),
            ("unk_token", &tokens.unk_token),
        ] {
            if let Some(token) = token {
                env.add_global(name, token.clone());
            }
        }
        env.add_template_owned(TEMPLATE_NAME, source.to_owned())
            .map_err(compile_err)?;
        Ok(Self {
            env,
            origin: origin.to_owned(),
            source: source.to_owned(),
        })
    }

    /// Loads a checkpoint directory's template: `chat_template.jinja` if present, else
    /// `tokenizer_config.json`'s `chat_template` (a string, or the `default` entry of a list).
    /// Special-token variables come from `tokenizer_config.json`. `None`: the checkpoint has none.
    pub fn from_dir(dir: &Path) -> Result<Option<Self>, ChatTemplateError> {
        let config_path = dir.join(TOKENIZER_CONFIG_FILE);
        let config = read_optional_json(&config_path)?;
        let tokens = match &config {
            Some((path, value)) => TemplateTokens {
                bos_token: special_token_text(path, value, "bos_token")?,
                eos_token: special_token_text(path, value, "eos_token")?,
                pad_token: special_token_text(path, value, "pad_token")?,
                unk_token: special_token_text(path, value, "unk_token")?,
            },
            None => TemplateTokens::default(),
        };
        let jinja_path = dir.join(CHAT_TEMPLATE_FILE);
        match std::fs::read_to_string(&jinja_path) {
            Ok(source) => {
                return Self::new(&source, &tokens, &jinja_path.display().to_string()).map(Some);
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(source) => {
                return Err(ChatTemplateError::Read {
                    path: jinja_path,
                    source,
                });
            }
        }
        let Some((path, config)) = config else {
            return Ok(None);
        };
        let source = match config.get("chat_template") {
            None | Some(serde_json::Value::Null) => return Ok(None),
            Some(serde_json::Value::String(source)) => source.clone(),
            Some(serde_json::Value::Array(named)) => named
                .iter()
                .find(|entry| entry.get("name").and_then(|n| n.as_str()) == Some("default"))
                .and_then(|entry| entry.get("template"))
                .and_then(|t| t.as_str())
                .ok_or_else(|| ChatTemplateError::Shape { path: path.clone() })?
                .to_owned(),
            Some(_) => return Err(ChatTemplateError::Shape { path }),
        };
        Self::new(
            &source,
            &tokens,
            &format!("{} (chat_template)", path.display()),
        )
        .map(Some)
    }

    /// The template's Jinja source.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Renders the conversation; `add_generation_prompt` appends the assistant turn's opening
    /// (what the model continues from).
    pub fn render(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<String, ChatTemplateError> {
        let render_err = |e: JinjaError| ChatTemplateError::Render {
            origin: self.origin.clone(),
            message: describe(&e),
        };
        let template = self.env.get_template(TEMPLATE_NAME).map_err(render_err)?;
        template
            .render(minijinja::context! {
                messages => Value::from(Serde(messages)),
                add_generation_prompt => add_generation_prompt,
            })
            .map_err(render_err)
    }
}

/// An error's message with its template line, when minijinja knows it.
fn describe(error: &JinjaError) -> String {
    let mut message = error
        .detail()
        .map_or_else(|| error.to_string(), str::to_owned);
    if let Some(line) = error.line() {
        let _ = write!(message, " (line {line})");
    }
    message
}

/// transformers' `raise_exception(message)`: templates call it to reject a conversation.
fn raise_exception(message: String) -> Result<Value, JinjaError> {
    Err(JinjaError::new(ErrorKind::InvalidOperation, message))
}

/// transformers' `tojson`: Python's `json.dumps(value, ensure_ascii=False, indent=indent)`,
/// which differs from minijinja's built-in (that one escapes `<`, `>`, `&` and `'` for HTML, and
/// formats floats its own way); tool-calling templates put its output in the prompt verbatim.
fn python_tojson(
    value: &Value,
    indent: Option<usize>,
    kwargs: Kwargs,
) -> Result<Value, JinjaError> {
    let indent = match indent {
        Some(indent) => Some(indent),
        None => kwargs.get::<Option<usize>>("indent")?,
    };
    // Any other keyword (separators, sort_keys) is an error rather than silently ignored.
    kwargs.assert_all_used()?;
    let mut out = String::new();
    write_python_json(&mut out, value, indent, 0)?;
    // Safe string: autoescaping must not touch JSON the template emits.
    Ok(Value::from_safe_string(out))
}

fn write_python_json(
    out: &mut String,
    value: &Value,
    indent: Option<usize>,
    depth: usize,
) -> Result<(), JinjaError> {
    let newline = |out: &mut String, depth: usize| {
        if let Some(width) = indent {
            out.push('\n');
            out.push_str(&" ".repeat(width * depth));
        }
    };
    // Python's separators: ", " and ": " without indent, "," and ": " with one.
    let item_separator = if indent.is_some() { "," } else { ", " };
    match value.kind() {
        ValueKind::Undefined | ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if value.is_true() { "true" } else { "false" }),
        ValueKind::Number => {
            // is_integer tells 1 from 1.0 (as_i64 would accept both).
            if value.is_integer() {
                let _ = write!(out, "{value}");
            } else {
                let float = f64::try_from(value.clone())?;
                out.push_str(&python_float_repr(float));
            }
        }
        ValueKind::String => write_python_string(out, value.as_str().unwrap_or_default()),
        ValueKind::Map => {
            let keys: Vec<Value> = value.try_iter()?.collect();
            if keys.is_empty() {
                out.push_str("{}");
                return Ok(());
            }
            out.push('{');
            for (i, key) in keys.iter().enumerate() {
                if i > 0 {
                    out.push_str(item_separator);
                }
                newline(out, depth + 1);
                match key.as_str() {
                    Some(text) => write_python_string(out, text),
                    None => write_python_string(out, &key.to_string()),
                }
                out.push_str(": ");
                write_python_json(out, &value.get_item(key)?, indent, depth + 1)?;
            }
            newline(out, depth);
            out.push('}');
        }
        ValueKind::Seq | ValueKind::Iterable => {
            let items: Vec<Value> = value.try_iter()?.collect();
            if items.is_empty() {
                out.push_str("[]");
                return Ok(());
            }
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(item_separator);
                }
                newline(out, depth + 1);
                write_python_json(out, item, indent, depth + 1)?;
            }
            newline(out, depth);
            out.push(']');
        }
        _ => {
            return Err(JinjaError::new(
                ErrorKind::InvalidOperation,
                format!("tojson: cannot serialize a {} value", value.kind()),
            ));
        }
    }
    Ok(())
}

/// A string as Python's json module writes it with `ensure_ascii=False`.
fn write_python_string(out: &mut String, text: &str) {
    out.push('"');
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{08}' => out.push_str("\\b"),
            '\u{0c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// Python's `repr(float)`: shortest round-trip digits (as Rust's), but `1.0` keeps its `.0`,
/// and magnitudes below 1e-4 or from 1e16 up use an exponent with a sign and two digits.
fn python_float_repr(value: f64) -> String {
    if value.is_nan() {
        return "NaN".to_owned();
    }
    if value.is_infinite() {
        return if value > 0.0 { "Infinity" } else { "-Infinity" }.to_owned();
    }
    let magnitude = value.abs();
    if magnitude != 0.0 && !(1e-4..1e16).contains(&magnitude) {
        let formatted = format!("{value:e}");
        let (mantissa, exponent) = formatted.split_once('e').unwrap_or((&formatted, "0"));
        let (sign, digits) = match exponent.strip_prefix('-') {
            Some(digits) => ('-', digits),
            None => ('+', exponent),
        };
        return format!("{mantissa}e{sign}{digits:0>2}");
    }
    let formatted = format!("{value}");
    if formatted.contains('.') {
        formatted
    } else {
        format!("{formatted}.0")
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    #[derive(Debug, Deserialize)]
    struct ExpectedRendering {
        messages: Vec<ChatMessage>,
        with_generation_prompt: String,
        without_generation_prompt: String,
    }

    fn fixture_dir() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/qwen2_5_chat")
    }

    /// The expected strings were rendered by transformers' `apply_chat_template` from the same
    /// tokenizer_config.json (scripts/reference/make_text_fixtures.py).
    #[test]
    fn qwen25_template_renders_exactly_what_transformers_renders() {
        let template = ChatTemplate::from_dir(&fixture_dir()).unwrap().unwrap();
        let expected: BTreeMap<String, ExpectedRendering> =
            serde_json::from_slice(&std::fs::read(fixture_dir().join("expected.json")).unwrap())
                .unwrap();
        assert_eq!(expected.len(), 3);
        for (name, case) in expected {
            assert_eq!(
                template.render(&case.messages, true).unwrap(),
                case.with_generation_prompt,
                "{name} with generation prompt"
            );
            assert_eq!(
                template.render(&case.messages, false).unwrap(),
                case.without_generation_prompt,
                "{name} without generation prompt"
            );
        }
    }

    #[test]
    fn jinja_file_wins_and_special_tokens_and_pycompat_work() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join(TOKENIZER_CONFIG_FILE),
            r#"{"bos_token": {"content": "<s>"}, "eos_token": "</s>", "chat_template": "ignored"}"#,
        )
        .unwrap();
        std::fs::write(
            dir.path().join(CHAT_TEMPLATE_FILE),
            "{{ bos_token }}{% for m in messages %}[{{ m.role }}] {{ m.content.strip() }}{{ eos_token }}\n{% endfor %}{{ pad_token }}\n",
        )
        .unwrap();
        let template = ChatTemplate::from_dir(dir.path()).unwrap().unwrap();
        let rendered = template
            .render(&[ChatMessage::new("user", "  hi  ")], false)
            .unwrap();
        // pad_token is undefined (renders empty); the template's trailing newline is dropped.
        assert_eq!(rendered, "<s>[user] hi</s>\n");
    }

    #[test]
    fn list_form_uses_the_default_entry_and_absent_template_is_none() {
        let dir = tempfile::tempdir().unwrap();
        assert!(ChatTemplate::from_dir(dir.path()).unwrap().is_none());
        std::fs::write(
            dir.path().join(TOKENIZER_CONFIG_FILE),
            r#"{"chat_template": [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "D{{ messages|length }}"}]}"#,
        )
        .unwrap();
        let template = ChatTemplate::from_dir(dir.path()).unwrap().unwrap();
        assert_eq!(template.render(&[], false).unwrap(), "D0");
        std::fs::write(
            dir.path().join(TOKENIZER_CONFIG_FILE),
            r#"{"chat_template": 3}"#,
        )
        .unwrap();
        let message = ChatTemplate::from_dir(dir.path()).unwrap_err().to_string();
        assert!(
            message.contains("tokenizer_config.json") && message.contains("chat_template"),
            "{message}"
        );
    }

    #[test]
    fn raise_exception_and_syntax_errors_are_reported_with_their_origin() {
        let template = ChatTemplate::new(
            "{% if messages[0].role != 'user' %}{{ raise_exception('Conversations must start with a user turn') }}{% endif %}ok",
            &TemplateTokens::default(),
            "ckpt/tokenizer_config.json",
        )
        .unwrap();
        assert_eq!(
            template
                .render(&[ChatMessage::new("user", "x")], false)
                .unwrap(),
            "ok"
        );
        let message = template
            .render(&[ChatMessage::new("assistant", "x")], false)
            .unwrap_err()
            .to_string();
        assert!(
            message.contains("ckpt/tokenizer_config.json")
                && message.contains("Conversations must start with a user turn"),
            "{message}"
        );
        let broken = ChatTemplate::new("{% for %}", &TemplateTokens::default(), "broken.jinja")
            .unwrap_err()
            .to_string();
        assert!(
            broken.contains("broken.jinja") && broken.contains("does not compile"),
            "{broken}"
        );
    }

    #[test]
    fn tojson_matches_python_json_dumps() {
        let template = ChatTemplate::new(
            "{{ value|tojson }}|{{ value|tojson(indent=2) }}",
            &TemplateTokens::default(),
            "test",
        )
        .unwrap();
        let env_value = serde_json::json!({"name": "web_search", "args": {"q": "<a&b>'\n", "t": 1.0, "e": 1e-5, "n": [1, 2.5, null, true]}, "ü": "推荐"});
        let rendered = template
            .env
            .get_template(TEMPLATE_NAME)
            .unwrap()
            .render(minijinja::context! { value => Value::from(Serde(&env_value)) })
            .unwrap();
        // What Python's json.dumps(value, ensure_ascii=False) and indent=2 write (keys in
        // serde_json's sorted order here, since the test value went through a serde_json Map).
        let compact = r#"{"args": {"e": 1e-05, "n": [1, 2.5, null, true], "q": "<a&b>'\n", "t": 1.0}, "name": "web_search", "ü": "推荐"}"#;
        let pretty = "{\n  \"args\": {\n    \"e\": 1e-05,\n    \"n\": [\n      1,\n      2.5,\n      null,\n      true\n    ],\n    \"q\": \"<a&b>'\\n\",\n    \"t\": 1.0\n  },\n  \"name\": \"web_search\",\n  \"ü\": \"推荐\"\n}";
        assert_eq!(rendered, format!("{compact}|{pretty}"));
    }

    #[test]
    fn python_float_repr_matches_python() {
        for (value, python) in [
            (1.0, "1.0"),
            (0.1, "0.1"),
            (-2.5, "-2.5"),
            (0.0001, "0.0001"),
            (0.00001, "1e-05"),
            (1e16, "1e+16"),
            (123456789.0, "123456789.0"),
            (1.5e-7, "1.5e-07"),
            (0.0, "0.0"),
        ] {
            assert_eq!(python_float_repr(value), python, "{value}");
        }
    }
}
