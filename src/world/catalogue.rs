//! The world's catalogue: models with prices and latent traits, tools, scenario templates, user
//! roles and domains, and the per-organization users and scenarios drawn from them.
//!
//! Prices are the platform's per-1k-token figures (`MODELS_PRICING` in `arc/cli/commands/run.py`).
//! The latent traits (quality, rate-limit proneness, provider error rate) are ground truth: the
//! platform never sees them, only their consequences in outcomes.

use rand::Rng;

use super::sampling::{chance, int_between, normal, pick, uniform, uuid};

/// One model the platform can run an agent on.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ModelSpec {
    /// `provider/model`, as configurations name it.
    pub name: &'static str,
    /// The provider (rate limits and outages are per provider).
    pub provider: &'static str,
    /// USD per 1k input tokens.
    pub price_in_per_1k: f64,
    /// USD per 1k output tokens.
    pub price_out_per_1k: f64,
    /// Ground truth: capability in [0, 1]; drives format errors, hallucinated tools, malformed
    /// arguments, looping and the score of successful runs.
    pub quality: f64,
    /// Context window in tokens.
    pub context_window: u32,
    /// Ground truth: how easily this model's endpoint answers 429 under load, in [0, 1].
    pub rate_limit_proneness: f64,
    /// Ground truth: probability of a 5xx/overloaded answer per run at nominal load.
    pub provider_error_rate: f64,
    /// Generation speed, for durations in trajectories.
    pub ms_per_output_token: f64,
}

impl ModelSpec {
    /// A single price figure for comparing models: an agent call reads about three input tokens
    /// per output token it writes, so this weighs input three times.
    pub fn blended_price(&self) -> f64 {
        3.0 * self.price_in_per_1k + self.price_out_per_1k
    }
}

/// Every model in the world. At least 9 models from at least 5 providers, as the platform's
/// multi-model tester covers.
pub const MODELS: &[ModelSpec] = &[
    model(
        "openai/gpt-4.1",
        0.002,
        0.008,
        0.90,
        1_047_576,
        0.30,
        0.015,
        12.0,
    ),
    model(
        "openai/gpt-4.1-mini",
        0.0004,
        0.0016,
        0.80,
        1_047_576,
        0.45,
        0.015,
        8.0,
    ),
    model(
        "openai/gpt-4o-mini",
        0.000_15,
        0.0006,
        0.72,
        128_000,
        0.55,
        0.02,
        7.0,
    ),
    model(
        "anthropic/claude-3.5-sonnet",
        0.003,
        0.015,
        0.92,
        200_000,
        0.35,
        0.03,
        14.0,
    ),
    model(
        "anthropic/claude-3-haiku",
        0.000_25,
        0.001_25,
        0.70,
        200_000,
        0.50,
        0.03,
        6.0,
    ),
    model(
        "google/gemini-1.5-pro",
        0.001_25,
        0.005,
        0.87,
        2_097_152,
        0.40,
        0.02,
        13.0,
    ),
    model(
        "google/gemini-1.5-flash",
        0.000_075,
        0.0003,
        0.74,
        1_048_576,
        0.60,
        0.02,
        5.0,
    ),
    model(
        "meta/llama-3.1-70b",
        0.000_88,
        0.000_88,
        0.78,
        128_000,
        0.65,
        0.04,
        11.0,
    ),
    model(
        "meta/llama-3-8b",
        0.000_18,
        0.000_18,
        0.58,
        8_192,
        0.70,
        0.04,
        4.0,
    ),
    model(
        "mistral/mistral-large",
        0.002,
        0.006,
        0.84,
        128_000,
        0.55,
        0.03,
        12.0,
    ),
    model(
        "mistral/mistral-small",
        0.0002,
        0.0006,
        0.66,
        32_000,
        0.60,
        0.03,
        6.0,
    ),
    model(
        "deepseek/deepseek-v3",
        0.000_27,
        0.0011,
        0.85,
        64_000,
        0.85,
        0.06,
        15.0,
    ),
];

#[allow(clippy::too_many_arguments)] // a table row; named fields would triple the table
const fn model(
    name: &'static str,
    price_in_per_1k: f64,
    price_out_per_1k: f64,
    quality: f64,
    context_window: u32,
    rate_limit_proneness: f64,
    provider_error_rate: f64,
    ms_per_output_token: f64,
) -> ModelSpec {
    let provider = provider_of(name);
    ModelSpec {
        name,
        provider,
        price_in_per_1k,
        price_out_per_1k,
        quality,
        context_window,
        rate_limit_proneness,
        provider_error_rate,
        ms_per_output_token,
    }
}

/// The part of `provider/model` before the slash, in a `const fn` (string slicing is not const).
const fn provider_of(name: &'static str) -> &'static str {
    let bytes = name.as_bytes();
    let mut i = 0;
    while i < bytes.len() && bytes[i] != b'/' {
        i += 1;
    }
    match name.split_at_checked(i) {
        Some((provider, _)) => provider,
        None => name,
    }
}

/// The catalogue entry for a model name, if the world knows it.
pub fn model_spec(name: &str) -> Option<&'static ModelSpec> {
    MODELS.iter().find(|m| m.name == name)
}

/// The distinct providers, in catalogue order.
pub fn providers() -> Vec<&'static str> {
    let mut seen: Vec<&'static str> = Vec::new();
    for m in MODELS {
        if !seen.contains(&m.provider) {
            seen.push(m.provider);
        }
    }
    seen
}

/// One tool an agent can be given.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ToolSpec {
    /// The name configurations use (`{"name": "web_search"}`).
    pub name: &'static str,
    /// Ground truth: median latency of one call on a healthy backend, in seconds.
    pub median_latency_s: f64,
    /// Tokens its JSON schema adds to every prompt (why many tools overflow small contexts).
    pub schema_tokens: u32,
    /// What it does, for descriptions.
    pub description: &'static str,
}

/// Every tool in the world.
pub const TOOLS: &[ToolSpec] = &[
    tool("web_search", 2.5, 700, "search the public web"),
    tool("calculator", 0.05, 250, "evaluate arithmetic"),
    tool("sql_query", 1.8, 1100, "run read-only SQL on the warehouse"),
    tool("code_exec", 4.5, 900, "run Python in the sandbox"),
    tool("file_read", 0.4, 400, "read a file from the workspace"),
    tool("email_send", 1.2, 650, "send an email"),
    tool("crm_lookup", 2.2, 850, "look up a customer in the CRM"),
    tool("vector_search", 0.9, 600, "search the knowledge base"),
    tool("http_request", 1.6, 750, "call an HTTP API"),
    tool(
        "pdf_extract",
        3.5,
        550,
        "extract text and tables from a PDF",
    ),
    tool("calendar_lookup", 0.8, 500, "find free calendar slots"),
    tool("ticket_update", 1.0, 600, "update a support ticket"),
];

const fn tool(
    name: &'static str,
    median_latency_s: f64,
    schema_tokens: u32,
    description: &'static str,
) -> ToolSpec {
    ToolSpec {
        name,
        median_latency_s,
        schema_tokens,
        description,
    }
}

/// The catalogue entry for a tool name, if the world knows it.
pub fn tool_spec(name: &str) -> Option<&'static ToolSpec> {
    TOOLS.iter().find(|t| t.name == name)
}

/// Tool names models invent when they hallucinate and no configured tool fits.
pub(crate) const INVENTED_TOOLS: &[&str] = &[
    "web_browser",
    "search_internet",
    "python_repl",
    "database_query",
    "send_slack_message",
    "get_customer_info",
    "read_document",
    "lookup_order",
];

/// User roles on the platform; the acceptance model weighs reliability and cost by role.
pub const ROLES: &[&str] = &crate::domain::segments::ROLES;

/// Business domains of organizations, users and scenarios.
pub const DOMAINS: &[&str] = &crate::domain::segments::DOMAINS;

/// A scenario blueprint; each organization instantiates some of them at some difficulties.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ScenarioTemplate {
    pub name: &'static str,
    pub domain: &'static str,
    pub tools: &'static [&'static str],
    /// Added to the difficulty level's base (some tasks are simply harder).
    pub difficulty_shift: f64,
    pub task: &'static str,
}

const fn scenario(
    name: &'static str,
    domain: &'static str,
    tools: &'static [&'static str],
    difficulty_shift: f64,
    task: &'static str,
) -> ScenarioTemplate {
    ScenarioTemplate {
        name,
        domain,
        tools,
        difficulty_shift,
        task,
    }
}

pub(crate) const SCENARIO_TEMPLATES: &[ScenarioTemplate] = &[
    scenario(
        "refund with missing order id",
        "ecommerce",
        &["crm_lookup", "ticket_update"],
        0.05,
        "A customer asks for a refund but gives no order id; find the order and refund it.",
    ),
    scenario(
        "competitor price research",
        "ecommerce",
        &["web_search", "calculator"],
        0.0,
        "Compare our price for SKU {n} with three competitors and compute the gap.",
    ),
    scenario(
        "order status with carrier delay",
        "ecommerce",
        &["crm_lookup", "http_request", "email_send"],
        0.1,
        "Tell customer {n} where their parcel is and apologise for the delay.",
    ),
    scenario(
        "reconcile monthly ledger",
        "fintech",
        &["sql_query", "calculator"],
        0.1,
        "Reconcile ledger batch {n} against bank statements and report mismatches.",
    ),
    scenario(
        "fraud alert triage",
        "fintech",
        &["sql_query", "crm_lookup"],
        0.15,
        "Triage fraud alert {n}: check recent transactions and the customer's history.",
    ),
    scenario(
        "news-driven portfolio summary",
        "fintech",
        &["web_search", "http_request", "calculator"],
        0.2,
        "Summarise today's news for portfolio {n} and estimate exposure.",
    ),
    scenario(
        "kyc document check",
        "fintech",
        &["pdf_extract", "vector_search"],
        0.1,
        "Check the KYC documents of applicant {n} against policy.",
    ),
    scenario(
        "summarize discharge notes",
        "healthcare",
        &["file_read", "pdf_extract"],
        0.05,
        "Summarise the discharge notes of patient {n} for the GP.",
    ),
    scenario(
        "schedule follow-up appointment",
        "healthcare",
        &["calendar_lookup", "email_send"],
        -0.05,
        "Book a follow-up for patient {n} within two weeks and confirm by email.",
    ),
    scenario(
        "drug interaction lookup",
        "healthcare",
        &["vector_search", "web_search"],
        0.15,
        "List interactions between the {n} medications on this chart.",
    ),
    scenario(
        "onboarding question from knowledge base",
        "saas",
        &["vector_search"],
        -0.1,
        "Answer a new customer's SSO setup question (ticket {n}).",
    ),
    scenario(
        "escalate outage ticket",
        "saas",
        &["ticket_update", "email_send", "http_request"],
        0.05,
        "Escalate outage ticket {n}, check the status page and notify the account owner.",
    ),
    scenario(
        "usage-based invoice dispute",
        "saas",
        &["sql_query", "crm_lookup", "calculator"],
        0.15,
        "Explain invoice {n}'s usage charges to the customer.",
    ),
    scenario(
        "claim eligibility check",
        "insurance",
        &["pdf_extract", "vector_search", "crm_lookup"],
        0.15,
        "Decide whether claim {n} is covered by the policy wording.",
    ),
    scenario(
        "policy renewal quote",
        "insurance",
        &["crm_lookup", "calculator"],
        0.0,
        "Prepare a renewal quote for policy {n}.",
    ),
    scenario(
        "analyze csv and report",
        "analytics",
        &["file_read", "code_exec"],
        0.1,
        "Load export {n}.csv, find the top drivers of churn and summarise.",
    ),
    scenario(
        "debug failing sql report",
        "analytics",
        &["sql_query", "code_exec"],
        0.2,
        "Report {n} returns no rows since Monday; find out why.",
    ),
    scenario(
        "weekly kpi digest",
        "analytics",
        &["sql_query", "calculator", "email_send"],
        0.0,
        "Compute this week's KPIs for team {n} and email the digest.",
    ),
    scenario(
        "market sizing estimate",
        "analytics",
        &["web_search", "code_exec", "calculator"],
        0.25,
        "Estimate the market size for product line {n} with sources.",
    ),
    scenario(
        "contract clause extraction",
        "insurance",
        &["pdf_extract", "file_read"],
        0.05,
        "Extract the termination clauses of contract {n}.",
    ),
];

/// Difficulty levels as the platform labels them, with the numeric difficulty they start from.
const DIFFICULTY_LEVELS: &[(&str, f64)] = &[("easy", 0.2), ("medium", 0.5), ("hard", 0.8)];

/// A platform user: role and domain are visible to arc-rec; `strictness` is ground truth.
#[derive(Debug, Clone, PartialEq)]
pub struct UserProfile {
    /// The user's id (`users.user_id`).
    pub user_id: String,
    /// e.g. `senior_ml_engineer`.
    pub role: String,
    /// e.g. `fintech`.
    pub domain: String,
    /// Ground truth: how much harder this person is to convince than their role suggests
    /// (a logit offset; positive is stricter).
    pub(crate) strictness: f64,
}

impl UserProfile {
    /// A user with no personal bias beyond role and domain (for callers building contexts).
    pub fn new(user_id: &str, role: &str, domain: &str) -> Self {
        Self {
            user_id: user_id.to_owned(),
            role: role.to_owned(),
            domain: domain.to_owned(),
            strictness: 0.0,
        }
    }
}

/// An evaluation scenario of one organization.
#[derive(Debug, Clone, PartialEq)]
pub struct ScenarioSpec {
    /// `scenarios.scenario_id`.
    pub scenario_id: String,
    /// `scenarios.name`.
    pub name: String,
    /// The business domain.
    pub domain: &'static str,
    /// `easy`, `medium` or `hard`.
    pub difficulty_level: &'static str,
    /// Ground truth: numeric difficulty in [0.05, 0.95].
    pub(crate) difficulty: f64,
    /// The tools a good run of this scenario calls.
    pub expected_tools: &'static [&'static str],
    /// The prompt the agent receives.
    pub task_prompt: String,
}

/// One organization: its main domain, users and scenarios.
#[derive(Debug, Clone, PartialEq)]
pub struct OrgProfile {
    /// The organization id (`acme`).
    pub org: String,
    /// The domain most of its users and scenarios belong to.
    pub domain: &'static str,
    /// Its users (at least one).
    pub users: Vec<UserProfile>,
    /// Its scenarios (at least one).
    pub scenarios: Vec<ScenarioSpec>,
}

/// Draws an organization: 6–10 users over all roles, and about 15–30 scenarios (templates at one
/// to three difficulty levels), most in its own domain.
pub(crate) fn draw_org<R: Rng + ?Sized>(
    rng: &mut R,
    org: &str,
    domain: &'static str,
) -> OrgProfile {
    let user_count = int_between(rng, 6, 10) as usize;
    let first_role = int_between(rng, 0, ROLES.len() as u64 - 1) as usize;
    let users = (0..user_count)
        .map(|i| {
            // Roles rotate so every organization has every role; domains mostly follow the org.
            let role = ROLES[(first_role + i) % ROLES.len()];
            let user_domain = if chance(rng, 0.7) {
                domain
            } else {
                pick(rng, DOMAINS).copied().unwrap_or(domain)
            };
            UserProfile {
                user_id: uuid(rng),
                role: role.to_owned(),
                domain: user_domain.to_owned(),
                strictness: normal(rng, 0.0, 0.35),
            }
        })
        .collect();
    let mut scenarios = Vec::new();
    for template in SCENARIO_TEMPLATES {
        // Organizations run most scenarios of their own domain and some of the others.
        let keep = if template.domain == domain {
            0.95
        } else {
            0.55
        };
        if !chance(rng, keep) {
            continue;
        }
        for &(level, base) in DIFFICULTY_LEVELS {
            if !chance(rng, 0.6) {
                continue;
            }
            let difficulty =
                (base + template.difficulty_shift + normal(rng, 0.0, 0.05)).clamp(0.05, 0.95);
            let n = int_between(rng, 100, 9999);
            let name = match level {
                "easy" => template.name.to_owned(),
                "medium" => format!(
                    "{} ({})",
                    template.name,
                    pick(rng, MEDIUM_TWISTS).copied().unwrap_or("variant")
                ),
                _ => format!(
                    "{} ({})",
                    template.name,
                    pick(rng, HARD_TWISTS).copied().unwrap_or("hard")
                ),
            };
            scenarios.push(ScenarioSpec {
                scenario_id: uuid(rng),
                name,
                domain: template.domain,
                difficulty_level: level,
                difficulty,
                expected_tools: template.tools,
                task_prompt: template.task.replace("{n}", &n.to_string()),
            });
        }
    }
    if scenarios.is_empty() {
        // Vanishingly unlikely, but an organization must have something to evaluate.
        let template = &SCENARIO_TEMPLATES[0];
        scenarios.push(ScenarioSpec {
            scenario_id: uuid(rng),
            name: template.name.to_owned(),
            domain: template.domain,
            difficulty_level: "medium",
            difficulty: uniform(rng, 0.4, 0.6),
            expected_tools: template.tools,
            task_prompt: template.task.replace("{n}", "42"),
        });
    }
    OrgProfile {
        org: org.to_owned(),
        domain,
        users,
        scenarios,
    }
}

const MEDIUM_TWISTS: &[&str] = &[
    "ambiguous request",
    "two-step",
    "partial data",
    "follow-up question",
    "non-english customer",
];
const HARD_TWISTS: &[&str] = &[
    "edge case: conflicting records",
    "adversarial user",
    "large attachment",
    "multi-currency",
    "stale cache",
    "long history",
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn catalogue_is_broad_enough() {
        assert!(MODELS.len() >= 9);
        assert!(providers().len() >= 5);
        assert_eq!(
            model_spec("openai/gpt-4.1").map(|m| m.provider),
            Some("openai")
        );
        assert_eq!(
            model_spec("openai/gpt-4.1").map(|m| m.price_in_per_1k),
            Some(0.002)
        );
        for template in SCENARIO_TEMPLATES {
            for t in template.tools {
                assert!(tool_spec(t).is_some(), "{t} is not in TOOLS");
            }
        }
    }
}
