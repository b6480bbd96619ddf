//! What a failure says about its cause: the platform's six error categories are too coarse to
//! pick a fix (`model_error` is a 429, a 5xx or a context overflow; `timeout` a slow tool or a
//! loop), so error codes and messages are read for the usual wording of each cause.

use serde::{Deserialize, Serialize};

/// A failure's likely cause, as far as its category, code and message tell.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FailureSignal {
    /// A tool call exceeded its deadline.
    ToolTimeout,
    /// HTTP 429 / quota.
    RateLimit,
    /// 5xx, overloads, dropped connections: transient provider faults.
    ProviderError,
    /// The model produced tool arguments the tool rejects.
    MalformedArgs,
    /// The model called a tool that is not configured.
    HallucinatedTool,
    /// The prompt outgrew the model's context window.
    ContextOverflow,
    /// The agent repeated itself until a step or time budget ran out.
    Looping,
    /// The final answer failed output validation.
    OutputFormat,
    /// The execution sandbox failed (not the configuration's doing).
    Sandbox,
    /// Credentials were rejected (needs a secret, not a configuration change).
    Auth,
    /// Nothing recognisable.
    Other,
}

impl FailureSignal {
    /// Every signal, in index order.
    pub const ALL: [FailureSignal; 11] = [
        FailureSignal::ToolTimeout,
        FailureSignal::RateLimit,
        FailureSignal::ProviderError,
        FailureSignal::MalformedArgs,
        FailureSignal::HallucinatedTool,
        FailureSignal::ContextOverflow,
        FailureSignal::Looping,
        FailureSignal::OutputFormat,
        FailureSignal::Sandbox,
        FailureSignal::Auth,
        FailureSignal::Other,
    ];
    /// Number of signals.
    pub const COUNT: usize = Self::ALL.len();

    /// Position in [`Self::ALL`], for per-signal arrays.
    pub fn index(self) -> usize {
        self as usize
    }

    /// snake_case label; also how cluster keys such as `tool_timeout-web_search` start.
    pub fn label(self) -> &'static str {
        match self {
            FailureSignal::ToolTimeout => "tool_timeout",
            FailureSignal::RateLimit => "rate_limit",
            FailureSignal::ProviderError => "provider_error",
            FailureSignal::MalformedArgs => "malformed_tool_args",
            FailureSignal::HallucinatedTool => "hallucinated_tool",
            FailureSignal::ContextOverflow => "context_overflow",
            FailureSignal::Looping => "looping",
            FailureSignal::OutputFormat => "output_format",
            FailureSignal::Sandbox => "sandbox_failure",
            FailureSignal::Auth => "tool_auth",
            FailureSignal::Other => "other",
        }
    }

    /// How people name a few of these failures in one-line descriptions.
    pub fn plural_noun(self) -> &'static str {
        match self {
            FailureSignal::ToolTimeout => "timeouts",
            FailureSignal::RateLimit => "rate limits",
            FailureSignal::ProviderError => "provider errors",
            FailureSignal::MalformedArgs => "malformed tool calls",
            FailureSignal::HallucinatedTool => "unknown-tool calls",
            FailureSignal::ContextOverflow => "context overflows",
            FailureSignal::Looping => "loops",
            FailureSignal::OutputFormat => "format errors",
            FailureSignal::Sandbox => "sandbox failures",
            FailureSignal::Auth => "auth failures",
            FailureSignal::Other => "failures",
        }
    }

    /// Whether a retry of the same request plausibly recovers.
    pub fn transient(self) -> bool {
        matches!(
            self,
            FailureSignal::ToolTimeout | FailureSignal::RateLimit | FailureSignal::ProviderError
        )
    }

    /// Parses a label (cluster keys start with one).
    pub fn from_label(label: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|s| s.label() == label)
    }

    /// Reads a failure's category, code and message. The order of the checks matters: the most
    /// specific wordings first (an auth failure's "401" before a generic status code, a loop's
    /// "time limit" before a timeout).
    pub fn classify(category: Option<&str>, code: Option<&str>, message: Option<&str>) -> Self {
        let mut text =
            String::with_capacity(code.map_or(0, str::len) + message.map_or(0, str::len) + 1);
        if let Some(code) = code {
            text.push_str(code);
            text.push(' ');
        }
        if let Some(message) = message {
            text.push_str(message);
        }
        let text = text.to_ascii_lowercase();
        let has = |needles: &[&str]| needles.iter().any(|n| text.contains(n));
        // Status codes only count as whole words: request ids and hex digests contain "401" too.
        let has_code = |codes: &[&str]| {
            text.split(|c: char| !c.is_ascii_alphanumeric())
                .any(|word| codes.contains(&word))
        };
        if has_code(&["401", "403"])
            || has(&[
                "unauthorized",
                "forbidden",
                "authenticat",
                "credential",
                "invalid_grant",
                "api key",
                "auth_failed",
                "oauth",
                "token expired",
            ])
        {
            return FailureSignal::Auth;
        }
        if has_code(&["429"])
            || has(&[
                "rate limit",
                "rate_limit",
                "ratelimit",
                "too many requests",
                "quota",
                "resourceexhausted",
            ])
        {
            return FailureSignal::RateLimit;
        }
        if has(&[
            "context length",
            "context_length",
            "context window",
            "maximum context",
            "token count",
            "prompt is too long",
            "maximum number of tokens",
        ]) {
            return FailureSignal::ContextOverflow;
        }
        if category == Some("sandbox_error")
            || has(&[
                "sandbox",
                "oom-killed",
                "out of memory",
                "container",
                "read-only",
                "permission denied",
                "image pull",
            ])
        {
            return FailureSignal::Sandbox;
        }
        if has(&[
            "unknown tool",
            "tool registry",
            "undefined function",
            "tool_not_found",
            "toolnotfound",
            "no tool named",
            "not a valid tool",
        ]) {
            return FailureSignal::HallucinatedTool;
        }
        // Before malformed arguments: a loop report says "called 7 times with identical arguments".
        if has(&[
            "iteration",
            "max_steps",
            "max steps",
            "loop",
            "repetitive",
            "recursion",
            "identical",
        ]) {
            return FailureSignal::Looping;
        }
        if has(&[
            "argument",
            "args:",
            "args ",
            "rejected input",
            "invalid input",
            "invalid_tool",
        ]) {
            return FailureSignal::MalformedArgs;
        }
        if has(&["timed out", "timeout", "deadline", "did not respond"]) {
            return FailureSignal::ToolTimeout;
        }
        if has_code(&["500", "502", "503", "504", "529", "econnreset"])
            || has(&[
                "overloaded",
                "unavailable",
                "bad gateway",
                "internal server",
                "internalserver",
                "server had an error",
                "connection reset",
                "apierror",
                "apiconnectionerror",
            ])
        {
            return FailureSignal::ProviderError;
        }
        if has(&["output", "parse", "schema", "not valid json", "validation"]) {
            return FailureSignal::OutputFormat;
        }
        match category {
            Some("timeout") => FailureSignal::ToolTimeout,
            Some("tool_error") => FailureSignal::MalformedArgs,
            Some("model_error") => FailureSignal::ProviderError,
            Some("validation_error") => FailureSignal::OutputFormat,
            Some("system_error") => FailureSignal::Auth,
            _ => FailureSignal::Other,
        }
    }
}

/// The platform's error categories (`outcomes.error_category`), plus a slot for none/unknown.
pub const CATEGORIES: [&str; 6] = [
    "timeout",
    "tool_error",
    "model_error",
    "validation_error",
    "system_error",
    "sandbox_error",
];
/// Slots per-category arrays have: the six categories and "other".
pub const CATEGORY_SLOTS: usize = CATEGORIES.len() + 1;

/// The slot of a category name (unknown and missing ones share the last).
pub fn category_slot(category: Option<&str>) -> usize {
    category
        .and_then(|c| CATEGORIES.iter().position(|k| *k == c))
        .unwrap_or(CATEGORIES.len())
}

/// The category a signal's failures are filed under, for contexts that only name a signal.
pub fn category_of(signal: FailureSignal) -> Option<&'static str> {
    Some(match signal {
        FailureSignal::ToolTimeout | FailureSignal::Looping => "timeout",
        FailureSignal::MalformedArgs | FailureSignal::HallucinatedTool => "tool_error",
        FailureSignal::RateLimit
        | FailureSignal::ProviderError
        | FailureSignal::ContextOverflow => "model_error",
        FailureSignal::OutputFormat => "validation_error",
        FailureSignal::Sandbox => "sandbox_error",
        FailureSignal::Auth => "system_error",
        FailureSignal::Other => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn usual_wordings_are_recognised() {
        let cases = [
            (
                "timeout",
                "web_search timed out after 5000 ms",
                FailureSignal::ToolTimeout,
            ),
            (
                "timeout",
                "Timeout: tool 'sql_query' exceeded 5s deadline",
                FailureSignal::ToolTimeout,
            ),
            (
                "timeout",
                "Agent stopped due to iteration limit or time limit.",
                FailureSignal::Looping,
            ),
            (
                "timeout",
                "Max iterations (20) reached without final answer",
                FailureSignal::Looping,
            ),
            (
                "model_error",
                "HTTP 429 Too Many Requests from provider openai (retry-after 12s)",
                FailureSignal::RateLimit,
            ),
            (
                "model_error",
                "HTTP 503 Service Unavailable from google: the model is currently overloaded",
                FailureSignal::ProviderError,
            ),
            (
                "model_error",
                "APIConnectionError: Connection reset by peer while streaming",
                FailureSignal::ProviderError,
            ),
            (
                "model_error",
                "This model's maximum context length is 8192 tokens. However, your messages resulted in 9411 tokens.",
                FailureSignal::ContextOverflow,
            ),
            (
                "tool_error",
                "Invalid arguments for tool 'crm_lookup': expected object, got string",
                FailureSignal::MalformedArgs,
            ),
            (
                "tool_error",
                "1 validation error for WebSearchArgs: query field required (type=value_error.missing)",
                FailureSignal::MalformedArgs,
            ),
            (
                "tool_error",
                "Unknown tool 'web_browser' requested by model; available tools: calculator",
                FailureSignal::HallucinatedTool,
            ),
            (
                "validation_error",
                "OutputParserException: Could not parse LLM output: `Sure!`",
                FailureSignal::OutputFormat,
            ),
            (
                "validation_error",
                "pydantic_core.ValidationError: 1 validation error for FinalAnswer: amount Input should be a valid number",
                FailureSignal::OutputFormat,
            ),
            (
                "timeout",
                "Loop detected: tool 'sql_query' called 7 times with identical arguments",
                FailureSignal::Looping,
            ),
            (
                "model_error",
                "crm_lookup returned 502 Bad Gateway (request id req_4013a429b0c1d2e3)",
                FailureSignal::ProviderError,
            ),
            (
                "sandbox_error",
                "Sandbox container sb-3f2a91c0de was OOM-killed (exit code 137)",
                FailureSignal::Sandbox,
            ),
            (
                "system_error",
                "401 Unauthorized: invalid API key for crm_lookup (key ending ...3f2a)",
                FailureSignal::Auth,
            ),
        ];
        for (category, message, expected) in cases {
            assert_eq!(
                FailureSignal::classify(Some(category), None, Some(message)),
                expected,
                "{message}"
            );
        }
    }

    #[test]
    fn codes_and_bare_categories_fall_back_sensibly() {
        let classify = |category, code| FailureSignal::classify(category, code, None);
        assert_eq!(
            classify(Some("model_error"), Some("429")),
            FailureSignal::RateLimit
        );
        assert_eq!(
            classify(Some("model_error"), Some("502")),
            FailureSignal::ProviderError
        );
        assert_eq!(
            classify(Some("timeout"), Some("MAX_ITERATIONS")),
            FailureSignal::Looping
        );
        assert_eq!(
            classify(Some("tool_error"), Some("TOOL_NOT_FOUND")),
            FailureSignal::HallucinatedTool
        );
        assert_eq!(
            classify(Some("validation_error"), None),
            FailureSignal::OutputFormat
        );
        assert_eq!(classify(None, None), FailureSignal::Other);
        for signal in FailureSignal::ALL {
            assert_eq!(FailureSignal::from_label(signal.label()), Some(signal));
            assert_eq!(FailureSignal::ALL[signal.index()], signal);
        }
    }
}
