//! The latent failure modes and how each one shows up in the platform's data: its error category,
//! failure type, outcome status and error messages that vary in wording like real logs do.
//!
//! Which configuration properties make each mode likely, and what fixes it, lives in
//! [`super::truth`]; this file only says what a failure looks like.

use rand::Rng;
use serde::{Deserialize, Serialize};

use crate::domain::records::{ErrorCategory, OutcomeStatus};

use super::sampling::{hex_id, int_between, pick, uniform};

/// One failure as a client reports it (`failure_context.failures[]` of the recommendations API).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ObservedFailure {
    /// The error category label (`timeout`, `tool_error`, ...).
    pub failure_category: String,
    /// The error message as logged.
    pub error_message: String,
    /// The tool involved, when there is one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_name: Option<String>,
}

/// A hidden cause of failure. The platform sees only messages, categories and trajectories; the
/// mode itself is ground truth.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum FailureMode {
    /// A tool call exceeded its timeout (short timeouts, slow backends).
    ToolTimeout,
    /// The provider answered 429 (cheap, high-volume endpoints under load).
    RateLimit,
    /// The provider failed (5xx, overloaded, connection reset).
    ProviderError,
    /// The model produced arguments the tool rejects (high temperature, weaker models).
    MalformedToolArgs,
    /// The model called a tool that is not configured (high temperature, weak models, a tool the
    /// task needs but the configuration lacks).
    HallucinatedTool,
    /// The prompt outgrew the model's context window (small-context models, many tool schemas).
    ContextOverflow,
    /// The agent repeated itself until the step budget ran out (temperature near zero).
    Looping,
    /// The final answer failed output validation (weaker models).
    OutputFormat,
    /// The execution sandbox failed; no configuration change fixes it.
    SandboxFailure,
    /// A tool's credentials are broken; no configuration change fixes it (it needs a secret).
    ToolAuth,
}

impl FailureMode {
    /// Every mode, in the order a run meets them (context is built first, the answer checked last).
    pub const ALL: [FailureMode; 10] = [
        FailureMode::ContextOverflow,
        FailureMode::RateLimit,
        FailureMode::ProviderError,
        FailureMode::SandboxFailure,
        FailureMode::ToolAuth,
        FailureMode::HallucinatedTool,
        FailureMode::MalformedToolArgs,
        FailureMode::ToolTimeout,
        FailureMode::Looping,
        FailureMode::OutputFormat,
    ];

    /// Number of modes.
    pub const COUNT: usize = Self::ALL.len();

    /// Position in [`Self::ALL`], for per-mode arrays.
    pub fn index(self) -> usize {
        Self::ALL.iter().position(|m| *m == self).unwrap_or(0)
    }

    /// A stable snake_case label (`tool_timeout`), used in docs, tests and cluster names.
    pub fn label(self) -> &'static str {
        match self {
            FailureMode::ToolTimeout => "tool_timeout",
            FailureMode::RateLimit => "rate_limit",
            FailureMode::ProviderError => "provider_error",
            FailureMode::MalformedToolArgs => "malformed_tool_args",
            FailureMode::HallucinatedTool => "hallucinated_tool",
            FailureMode::ContextOverflow => "context_overflow",
            FailureMode::Looping => "looping",
            FailureMode::OutputFormat => "output_format",
            FailureMode::SandboxFailure => "sandbox_failure",
            FailureMode::ToolAuth => "tool_auth",
        }
    }

    /// `outcomes.error_category` (and `failure_patterns.failure_category`).
    pub fn error_category(self) -> ErrorCategory {
        match self {
            FailureMode::ToolTimeout | FailureMode::Looping => ErrorCategory::Timeout,
            FailureMode::MalformedToolArgs | FailureMode::HallucinatedTool => {
                ErrorCategory::ToolError
            }
            FailureMode::RateLimit | FailureMode::ProviderError | FailureMode::ContextOverflow => {
                ErrorCategory::ModelError
            }
            FailureMode::OutputFormat => ErrorCategory::ValidationError,
            FailureMode::SandboxFailure => ErrorCategory::SandboxError,
            FailureMode::ToolAuth => ErrorCategory::SystemError,
        }
    }

    /// `failure_patterns.failure_type`, in the platform clusterer's vocabulary
    /// (`tool_error`, `execution_error`).
    pub fn failure_type(self) -> &'static str {
        match self {
            FailureMode::ToolTimeout
            | FailureMode::MalformedToolArgs
            | FailureMode::HallucinatedTool
            | FailureMode::ToolAuth => "tool_error",
            _ => "execution_error",
        }
    }

    /// The outcome status a run that dies of this mode gets.
    pub fn outcome_status(self) -> OutcomeStatus {
        match self {
            FailureMode::ToolTimeout | FailureMode::Looping => OutcomeStatus::Timeout,
            _ => OutcomeStatus::Error,
        }
    }

    /// `TrajectoryData.error_events[].error_type`, the exception class a real log would show.
    pub(crate) fn error_type(self) -> &'static str {
        match self {
            FailureMode::ToolTimeout => "ToolTimeout",
            FailureMode::RateLimit => "RateLimitError",
            FailureMode::ProviderError => "APIError",
            FailureMode::MalformedToolArgs => "ToolInputValidationError",
            FailureMode::HallucinatedTool => "ToolNotFoundError",
            FailureMode::ContextOverflow => "ContextLengthExceeded",
            FailureMode::Looping => "MaxIterationsExceeded",
            FailureMode::OutputFormat => "OutputParserException",
            FailureMode::SandboxFailure => "SandboxError",
            FailureMode::ToolAuth => "AuthenticationError",
        }
    }

    /// Whether some configuration change can make this mode rarer.
    pub fn fixable_by_config(self) -> bool {
        !matches!(self, FailureMode::SandboxFailure | FailureMode::ToolAuth)
    }

    /// The tool a failure of this mode is about, when it is about one (observed failures carry it).
    pub(crate) fn concerns_a_tool(self) -> bool {
        matches!(
            self,
            FailureMode::ToolTimeout
                | FailureMode::MalformedToolArgs
                | FailureMode::HallucinatedTool
                | FailureMode::ToolAuth
                | FailureMode::Looping
        )
    }
}

/// The concrete facts a failure message mentions.
#[derive(Debug, Clone)]
pub(crate) struct FailureFacts {
    /// The tool involved (the hallucinated name for hallucinated tools).
    pub tool: String,
    /// A configured tool the hallucinated name resembles, for "did you mean" messages.
    pub nearest_tool: String,
    /// Configured tool names, for "available tools" messages.
    pub available_tools: Vec<String>,
    pub model: String,
    pub provider: String,
    /// The timeout that fired, in seconds.
    pub timeout_s: f64,
    /// Prompt tokens and the context window, for overflows.
    pub tokens: u64,
    pub context_window: u64,
    /// Which attempt failed and how many were allowed.
    pub attempt: u32,
    pub max_attempts: u32,
}

/// One rendered failure: which template produced it (tests count them), the message and an
/// `error_code` as the platform stores it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RenderedFailure {
    pub template: usize,
    pub message: String,
    pub error_code: String,
}

/// Renders an error message for `mode`, picking one of several wordings and filling in the facts.
pub(crate) fn render_message<R: Rng + ?Sized>(
    mode: FailureMode,
    facts: &FailureFacts,
    rng: &mut R,
) -> RenderedFailure {
    let template = int_between(rng, 0, template_count(mode) as u64 - 1) as usize;
    let (message, error_code) = match mode {
        FailureMode::ToolTimeout => (
            tool_timeout(template, facts, rng),
            "TOOL_TIMEOUT".to_owned(),
        ),
        FailureMode::RateLimit => (rate_limit(template, facts, rng), "429".to_owned()),
        FailureMode::ProviderError => provider_error(template, facts, rng),
        FailureMode::MalformedToolArgs => (
            malformed_arguments(template, facts, rng),
            "INVALID_TOOL_ARGUMENTS".to_owned(),
        ),
        FailureMode::HallucinatedTool => (
            hallucinated_tool(template, facts),
            "TOOL_NOT_FOUND".to_owned(),
        ),
        FailureMode::ContextOverflow => (
            context_overflow(template, facts),
            "context_length_exceeded".to_owned(),
        ),
        FailureMode::Looping => (looping(template, facts, rng), "MAX_ITERATIONS".to_owned()),
        FailureMode::OutputFormat => (output_format(template, rng), "OUTPUT_VALIDATION".to_owned()),
        FailureMode::SandboxFailure => (sandbox(template, rng), "SANDBOX_FAILURE".to_owned()),
        FailureMode::ToolAuth => (tool_auth(template, facts, rng), "AUTH_FAILED".to_owned()),
    };
    RenderedFailure {
        template,
        message,
        error_code,
    }
}

fn tool_timeout<R: Rng + ?Sized>(template: usize, f: &FailureFacts, rng: &mut R) -> String {
    let ms = (f.timeout_s * 1000.0).round() as u64;
    let elapsed = ms + int_between(rng, 1, 40);
    let seconds = trim_float(f.timeout_s);
    let tool = &f.tool;
    match template {
        0 => format!("{tool} timed out after {ms} ms"),
        1 => format!("Timeout: tool '{tool}' exceeded {seconds}s deadline"),
        2 => format!(
            "ToolExecutionTimeout: {tool} did not respond within {:.1}s (attempt {}/{})",
            f.timeout_s, f.attempt, f.max_attempts
        ),
        3 => format!(
            "asyncio.TimeoutError while awaiting tool {tool} \
             (limit={seconds}s, elapsed={elapsed}ms)"
        ),
        _ => format!(
            "tool call call_{} ({tool}) cancelled: deadline exceeded after {elapsed} ms",
            hex_id(rng, 8)
        ),
    }
}

fn rate_limit<R: Rng + ?Sized>(template: usize, f: &FailureFacts, rng: &mut R) -> String {
    let retry_after = int_between(rng, 2, 60);
    let limit = [30_000u64, 60_000, 200_000, 400_000][int_between(rng, 0, 3) as usize];
    let (provider, model) = (&f.provider, &f.model);
    match template {
        0 => format!(
            "HTTP 429 Too Many Requests from provider {provider} (retry-after {retry_after}s)"
        ),
        1 => format!(
            "RateLimitError: Rate limit reached for {model} in organization org-{} on tokens \
             per min (TPM): Limit {limit}, Used {}, Requested {}.",
            hex_id(rng, 12),
            limit - int_between(rng, 0, limit / 10),
            int_between(rng, 800, 9000)
        ),
        2 => format!(
            "{provider} API error 429: rate_limit_exceeded, please retry after {} ms",
            retry_after * 1000
        ),
        3 => "Error code: 429 - {'type': 'error', 'error': {'type': 'rate_limit_error', \
              'message': 'Number of request tokens has exceeded your per-minute rate limit'}}"
            .to_owned(),
        _ => format!(
            "ResourceExhausted: 429 Quota exceeded for generate_content_requests_per_minute \
             with base model: {model}"
        ),
    }
}

fn provider_error<R: Rng + ?Sized>(
    template: usize,
    f: &FailureFacts,
    rng: &mut R,
) -> (String, String) {
    let (provider, model) = (&f.provider, &f.model);
    let (text, code) = match template {
        0 => (
            format!(
                "HTTP 503 Service Unavailable from {provider}: the model {model} is currently overloaded"
            ),
            "503",
        ),
        1 => (
            "InternalServerError: Error code: 500 - {'error': {'message': 'The server had an \
             error while processing your request.'}}"
                .to_owned(),
            "500",
        ),
        2 => (
            "Error code: 529 - {'type': 'error', 'error': {'type': 'overloaded_error', \
             'message': 'Overloaded'}}"
                .to_owned(),
            "529",
        ),
        3 => (
            format!(
                "{provider} returned 502 Bad Gateway (request id req_{})",
                hex_id(rng, 16)
            ),
            "502",
        ),
        _ => (
            format!(
                "APIConnectionError: Connection reset by peer while streaming from {provider} \
                 after {} tokens",
                int_between(rng, 3, 900)
            ),
            "ECONNRESET",
        ),
    };
    (text, code.to_owned())
}

fn malformed_arguments<R: Rng + ?Sized>(template: usize, f: &FailureFacts, rng: &mut R) -> String {
    let field = pick(rng, ARGUMENT_FIELDS).copied().unwrap_or("query");
    let column = int_between(rng, 12, 240);
    let tool = &f.tool;
    match template {
        0 => format!("Invalid arguments for tool '{tool}': expected object, got string"),
        1 => format!(
            "1 validation error for {}Args: {field} field required (type=value_error.missing)",
            camel_case(tool)
        ),
        2 => format!(
            "json.decoder.JSONDecodeError: Expecting ',' delimiter: line 1 column {column} \
             (char {}) in arguments to {tool}",
            column - 1
        ),
        3 => format!("tool {tool} rejected input: '{field}' must be of type integer, got string"),
        _ => format!(
            "Failed to parse function call arguments for {tool}: unexpected end of JSON input"
        ),
    }
}

fn hallucinated_tool(template: usize, f: &FailureFacts) -> String {
    let tool = &f.tool;
    match template {
        0 => format!(
            "Unknown tool '{tool}' requested by model; available tools: {}",
            f.available_tools.join(", ")
        ),
        1 => format!("KeyError: '{tool}' not found in tool registry"),
        2 => format!("Model attempted to call undefined function {tool}()"),
        _ => format!(
            "ToolNotFoundError: no tool named \"{tool}\" (did you mean \"{}\"?)",
            f.nearest_tool
        ),
    }
}

fn context_overflow(template: usize, f: &FailureFacts) -> String {
    let (tokens, window, model) = (f.tokens, f.context_window, &f.model);
    match template {
        0 => format!(
            "This model's maximum context length is {window} tokens. However, your messages \
             resulted in {tokens} tokens. Please reduce the length of the messages."
        ),
        1 => format!(
            "context_length_exceeded: prompt is too long: {tokens} tokens > {window} maximum"
        ),
        2 => format!(
            "InvalidRequestError: input length {tokens} exceeds context window of {model} ({window})"
        ),
        _ => format!(
            "400 Bad Request: The input token count ({tokens}) exceeds the maximum number of \
             tokens allowed ({window})."
        ),
    }
}

fn looping<R: Rng + ?Sized>(template: usize, f: &FailureFacts, rng: &mut R) -> String {
    let steps = [15u64, 20, 25, 30][int_between(rng, 0, 3) as usize];
    let repeats = int_between(rng, 4, 12);
    match template {
        0 => "Agent stopped due to iteration limit or time limit.".to_owned(),
        1 => format!("Max iterations ({steps}) reached without final answer"),
        2 => format!(
            "Loop detected: tool '{}' called {repeats} times with identical arguments",
            f.tool
        ),
        3 => format!(
            "RecursionError: agent exceeded max_steps={steps}; last {repeats} actions were identical"
        ),
        _ => format!(
            "Detected repetitive output: the last {repeats} responses were identical \
             (similarity {:.2})",
            uniform(rng, 0.97, 1.0)
        ),
    }
}

fn output_format<R: Rng + ?Sized>(template: usize, rng: &mut R) -> String {
    let field = pick(rng, ANSWER_FIELDS).copied().unwrap_or("answer");
    match template {
        0 => format!(
            "OutputParserException: Could not parse LLM output: `{}`",
            pick(rng, BAD_OUTPUTS).copied().unwrap_or("Sure!")
        ),
        1 => format!("Final answer failed schema validation: missing required field '{field}'"),
        2 => "ValidationError: response is not valid JSON (Expecting value: line 1 column 1 \
              (char 0))"
            .to_owned(),
        3 => format!(
            "Expected output format json but got free text ({} chars)",
            int_between(rng, 80, 2400)
        ),
        _ => format!(
            "pydantic_core.ValidationError: 1 validation error for FinalAnswer: {field} Input \
             should be a valid number"
        ),
    }
}

fn sandbox<R: Rng + ?Sized>(template: usize, rng: &mut R) -> String {
    let file = pick(rng, SANDBOX_FILES).copied().unwrap_or("input.csv");
    match template {
        0 => format!(
            "Sandbox container sb-{} was OOM-killed (exit code 137)",
            hex_id(rng, 10)
        ),
        1 => format!("PermissionError: [Errno 13] Permission denied: '/mnt/data/{file}'"),
        2 => format!(
            "sandbox startup failed: image pull backoff for arc-sandbox:{}.{}",
            int_between(rng, 1, 4),
            int_between(rng, 0, 20)
        ),
        3 => format!(
            "Modal sandbox terminated unexpectedly: worker wk-{} lost heartbeat",
            hex_id(rng, 8)
        ),
        _ => format!("SandboxError: filesystem is read-only (errno 30) at /workspace/{file}"),
    }
}

fn tool_auth<R: Rng + ?Sized>(template: usize, f: &FailureFacts, rng: &mut R) -> String {
    let tool = &f.tool;
    match template {
        0 => format!(
            "401 Unauthorized: invalid API key for {tool} (key ending ...{})",
            hex_id(rng, 4)
        ),
        1 => format!(
            "{tool} request failed: 403 Forbidden - token expired at 2026-{:02}-{:02}T{:02}:00:00Z",
            int_between(rng, 1, 12),
            int_between(rng, 1, 28),
            int_between(rng, 0, 23)
        ),
        2 => format!(
            "AuthenticationError: credentials for {tool} not found in secret store \
             (secret {}-credentials)",
            tool.replace('_', "-")
        ),
        _ => format!("OAuth refresh failed for {tool}: invalid_grant"),
    }
}

/// How many wordings each mode has.
pub(crate) fn template_count(mode: FailureMode) -> usize {
    match mode {
        FailureMode::HallucinatedTool | FailureMode::ContextOverflow | FailureMode::ToolAuth => 4,
        _ => 5,
    }
}

const ARGUMENT_FIELDS: &[&str] = &[
    "query",
    "customer_id",
    "path",
    "expression",
    "order_id",
    "limit",
];
const ANSWER_FIELDS: &[&str] = &["answer", "confidence", "sources", "amount", "decision"];
const BAD_OUTPUTS: &[&str] = &[
    "Sure! Here is the summary you asked for:",
    "{\"answer\": \"refund approved\", \"confidence\": high",
    "I'm sorry, I cannot complete this request.",
    "```json\n{\"decision\": ",
];
const SANDBOX_FILES: &[&str] = &[
    "input.csv",
    "report.xlsx",
    "export.parquet",
    "out.json",
    "notes.pdf",
];

/// `web_search` -> `WebSearch`.
fn camel_case(name: &str) -> String {
    name.split('_')
        .map(|part| {
            let mut chars = part.chars();
            match chars.next() {
                Some(first) => first.to_ascii_uppercase().to_string() + chars.as_str(),
                None => String::new(),
            }
        })
        .collect()
}

/// `5.0` -> `5`, `2.5` -> `2.5`.
fn trim_float(value: f64) -> String {
    if (value - value.round()).abs() < 1e-9 {
        format!("{}", value.round() as i64)
    } else {
        format!("{value}")
    }
}
