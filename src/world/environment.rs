//! The world as an environment for benchmarks: draw a failure context, let a policy pick a
//! diff, answer with the person's decision and the diff's real effect, and know the oracle.
//!
//! A bandit run looks like: `ctx = env.next_context(rng)`, `cands = env.candidate_diffs(&ctx)`,
//! the policy picks `i`, `env.feedback(&ctx, &cands[i].1, rng)` returns accept/reject; the oracle's
//! pick is `env.best_of(&ctx, ..)` (or `first_best` over truths already computed) and its expected
//! acceptance `env.acceptance_probability`.

use rand::Rng;
use serde_json::Value;

use super::agent::{AgentSpec, draw_initial_config};
use super::candidates::candidate_diffs;
use super::catalogue::{OrgProfile, ScenarioSpec, UserProfile};
use super::embedding::ErrorEmbedder;
use super::failure::{FailureMode, ObservedFailure, render_message};
use super::sampling::{chance, int_between, normal, pick, uniform, weighted_index};
use super::trajectory::{RunSetting, failure_facts};
use super::truth::{
    Effect, GroundTruth, HiddenState, Latent, ScenarioProfile, evaluate, mode_odds, sorted_rates,
};
use super::{World, WorldParams};

/// A failure context: what arc-rec is shown, plus the hidden truth used to score its answer.
#[derive(Debug, Clone, PartialEq)]
pub struct Context {
    /// The organization.
    pub org: String,
    /// The person who will accept or reject (role and domain are visible; their personal
    /// strictness is not).
    pub user: UserProfile,
    /// The configuration that failed.
    pub current_config: Value,
    /// Its recent failures (1–4).
    pub failures: Vec<ObservedFailure>,
    /// The failure-cluster embedding (normalized mean of the failures' embeddings), when the
    /// world has an embedding dimension.
    pub embedding: Option<Vec<f32>>,
    /// Ground truth; a policy under evaluation must not look (see [`Context::hidden`]).
    pub(crate) hidden: HiddenState,
}

impl Context {
    /// The ground truth of this context, for reports and graders only: a policy that reads it is
    /// cheating.
    pub fn hidden(&self) -> &HiddenState {
        &self.hidden
    }
}

/// What happened after a diff was shown.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Feedback {
    /// Whether the person accepted it.
    pub accepted: bool,
    /// The reliability change measured by re-running (the true effect plus measurement noise).
    pub reliability_delta: f64,
}

/// Standard deviation of the measured reliability delta around the true one.
const MEASUREMENT_NOISE: f64 = 0.03;
/// Contexts are drawn from configurations that fail at least this often (nobody asks for help
/// with a configuration that works).
const MIN_FAILURE_RATE: f64 = 0.12;

/// Draws contexts and answers for them. Cheap to clone; holds only the catalogue of its world.
#[derive(Debug, Clone, PartialEq)]
pub struct Environment {
    orgs: Vec<OrgProfile>,
    embedder: Option<ErrorEmbedder>,
    truth: GroundTruth,
}

impl Environment {
    /// The environment of `world`: same organizations, users, scenarios and embedding space.
    pub fn new(world: &World) -> Self {
        Self {
            orgs: world.orgs.clone(),
            embedder: world.embedder.clone(),
            truth: GroundTruth,
        }
    }

    /// The environment of the default world with this seed (no embeddings).
    pub fn from_seed(seed: u64) -> Self {
        let params = WorldParams {
            seed,
            outcomes: 0,
            ..WorldParams::default()
        };
        match World::new(params) {
            Ok(world) => Self::new(&world),
            // The default parameters are valid; this arm only keeps the signature infallible.
            Err(_) => Self {
                orgs: Vec::new(),
                embedder: None,
                truth: GroundTruth,
            },
        }
    }

    /// The ground truth this environment scores with.
    pub fn ground_truth(&self) -> GroundTruth {
        self.truth
    }

    /// Draws a failure context: a person, a configuration that fails noticeably, and 1–4 of its
    /// failures as the platform would report them.
    pub fn next_context<R: Rng + ?Sized>(&self, rng: &mut R) -> Context {
        let Some(org) = pick(rng, &self.orgs) else {
            return empty_context();
        };
        let user = pick(rng, &org.users)
            .cloned()
            .unwrap_or_else(|| UserProfile::new("unknown", "ml_engineer", org.domain));
        let size = int_between(rng, 4, 8) as usize;
        let workload: Vec<&ScenarioSpec> = draw_workload(rng, &org.scenarios, &user.domain, size)
            .into_iter()
            .map(|i| &org.scenarios[i])
            .collect();
        let needed = needed_tools(&workload);
        let latent = draw_latent(rng, &needed);
        let profiles: Vec<ScenarioProfile> = workload.iter().map(|s| profile_of(s)).collect();

        let config = draw_failing_config(rng, &latent, &profiles, &needed, &user.domain);

        let mut failures = Vec::new();
        let mut embeddings = Vec::new();
        let mut rates = [0.0; FailureMode::COUNT];
        if let Ok(spec) = AgentSpec::parse(&config) {
            rates = evaluate(&spec, &latent, &profiles).failure_rates;
            let per_scenario: Vec<_> = profiles
                .iter()
                .map(|p| mode_odds(&spec, &latent, p))
                .collect();
            let scenario_weights: Vec<f64> = per_scenario
                .iter()
                .map(|odds| 1.0 - odds.success(spec.max_attempts))
                .collect();
            let count = int_between(rng, 1, 4);
            for _ in 0..count {
                let Some(j) = weighted_index(rng, &scenario_weights) else {
                    break;
                };
                let mode_weights: Vec<f64> = FailureMode::ALL
                    .iter()
                    .map(|m| per_scenario[j].fail(*m, spec.max_attempts))
                    .collect();
                let Some(m) = weighted_index(rng, &mode_weights) else {
                    continue;
                };
                let mode = FailureMode::ALL[m];
                let setting = RunSetting {
                    spec: &spec,
                    latent: &latent,
                    scenario: workload[j],
                    profile: &profiles[j],
                    embedder: self.embedder.as_ref(),
                };
                let facts = failure_facts(rng, &setting, mode, spec.max_attempts);
                let rendered = render_message(mode, &facts, rng);
                let tool = mode.concerns_a_tool().then(|| facts.tool.clone());
                if let Some(embedder) = &self.embedder {
                    embeddings.push(embedder.embed(mode, tool.as_deref(), rng));
                }
                failures.push(ObservedFailure {
                    failure_category: mode.error_category().as_str().to_owned(),
                    error_message: rendered.message,
                    tool_name: tool,
                });
            }
        }
        let embedding = self.embedder.as_ref().and_then(|e| e.mean(&embeddings));
        Context {
            org: org.org.clone(),
            user,
            current_config: config,
            failures,
            embedding,
            hidden: HiddenState {
                latent,
                workload: profiles,
                failure_rates: sorted_rates(&rates),
            },
        }
    }

    /// The true effect of `diff` in this context.
    pub fn effect(&self, ctx: &Context, diff: &Value) -> Effect {
        self.truth.effect(&ctx.hidden, &ctx.current_config, diff)
    }

    /// Probability that the context's user accepts `diff`.
    pub fn acceptance_probability(&self, ctx: &Context, diff: &Value) -> f64 {
        self.truth
            .acceptance_probability(&ctx.user, &ctx.hidden, &ctx.current_config, diff)
    }

    /// Shows `diff` to the user: samples the decision from the acceptance model and measures the
    /// reliability change with noise.
    pub fn feedback<R: Rng + ?Sized>(&self, ctx: &Context, diff: &Value, rng: &mut R) -> Feedback {
        let assessment = self.truth.assess(&ctx.hidden, &ctx.current_config, diff);
        let p = super::truth::acceptance_from(&ctx.user, &assessment);
        Feedback {
            accepted: chance(rng, p),
            reliability_delta: assessment.effect.reliability_delta
                + normal(rng, 0.0, MEASUREMENT_NOISE),
        }
    }

    /// The oracle: the index of the candidate most likely to be accepted (first on ties).
    pub fn best_of(&self, ctx: &Context, candidate_diffs: &[Value]) -> Option<usize> {
        let truths: Vec<f64> = candidate_diffs
            .iter()
            .map(|diff| self.acceptance_probability(ctx, diff))
            .collect();
        first_best(&truths)
    }

    /// Plausible candidates for the context: `(recommendation_type, diff, description)`.
    pub fn candidate_diffs(&self, ctx: &Context) -> Vec<(String, Value, String)> {
        candidate_diffs(&ctx.current_config, &ctx.failures)
            .into_iter()
            .map(|c| {
                (
                    c.recommendation_type.as_str().to_owned(),
                    c.diff,
                    c.description,
                )
            })
            .collect()
    }
}

/// A context for an environment with no organizations (cannot happen with a valid world).
fn empty_context() -> Context {
    Context {
        org: String::new(),
        user: UserProfile::new("unknown", "ml_engineer", "saas"),
        current_config: serde_json::json!({"model": "openai/gpt-4.1", "temperature": 0.7}),
        failures: Vec::new(),
        embedding: None,
        hidden: HiddenState {
            latent: Latent {
                tool_slowness: 1.0,
                load: 1.0,
                prompt_tokens: 4000.0,
                sandbox_flakiness: 0.0,
                broken_credential: None,
            },
            workload: Vec::new(),
            failure_rates: Vec::new(),
        },
    }
}

/// Draws initial configurations until one fails at least [`MIN_FAILURE_RATE`] of its runs (at
/// most 30 tries): people ask for recommendations about configurations that fail.
pub(crate) fn draw_failing_config<R: Rng + ?Sized>(
    rng: &mut R,
    latent: &Latent,
    profiles: &[ScenarioProfile],
    needed: &[&'static str],
    domain: &str,
) -> Value {
    let mut config = draw_initial_config(rng, needed, domain);
    for _ in 0..30 {
        let failing = AgentSpec::parse(&config)
            .map(|spec| {
                1.0 - evaluate(&spec, latent, profiles)
                    .failure_rates
                    .iter()
                    .map(|r| 1.0 - r)
                    .product::<f64>()
            })
            .unwrap_or(0.0);
        if failing >= MIN_FAILURE_RATE {
            break;
        }
        config = draw_initial_config(rng, needed, domain);
    }
    config
}

/// The truth's view of a scenario.
pub(crate) fn profile_of(scenario: &ScenarioSpec) -> ScenarioProfile {
    ScenarioProfile {
        expected_tools: scenario.expected_tools,
        difficulty: scenario.difficulty,
    }
}

/// Picks `size` distinct scenarios (indices), three times likelier from the user's own domain.
pub(crate) fn draw_workload<R: Rng + ?Sized>(
    rng: &mut R,
    scenarios: &[ScenarioSpec],
    domain: &str,
    size: usize,
) -> Vec<usize> {
    let mut weights: Vec<f64> = scenarios
        .iter()
        .map(|s| if s.domain == domain { 3.0 } else { 1.0 })
        .collect();
    let mut chosen = Vec::new();
    while chosen.len() < size {
        let Some(i) = weighted_index(rng, &weights) else {
            break;
        };
        weights[i] = 0.0;
        chosen.push(i);
    }
    chosen
}

/// The union of the workload's expected tools, in first-seen order.
pub(crate) fn needed_tools(workload: &[&ScenarioSpec]) -> Vec<&'static str> {
    let mut tools = Vec::new();
    for scenario in workload {
        for tool in scenario.expected_tools {
            if !tools.contains(tool) {
                tools.push(*tool);
            }
        }
    }
    tools
}

/// Tools whose calls carry credentials that can expire.
const CREDENTIALED_TOOLS: &[&str] = &[
    "crm_lookup",
    "email_send",
    "http_request",
    "sql_query",
    "calendar_lookup",
    "ticket_update",
];

/// Draws the hidden circumstances of a configuration that serves `needed` tools.
pub(crate) fn draw_latent<R: Rng + ?Sized>(rng: &mut R, needed: &[&'static str]) -> Latent {
    let credentialed: Vec<&'static str> = needed
        .iter()
        .copied()
        .filter(|t| CREDENTIALED_TOOLS.contains(t))
        .collect();
    Latent {
        tool_slowness: normal(rng, 0.0, 0.45).exp(),
        load: normal(rng, 0.0, 0.5).exp(),
        prompt_tokens: normal(rng, 5000f64.ln(), 0.8).exp(),
        sandbox_flakiness: if chance(rng, 0.3) {
            uniform(rng, 0.03, 0.2)
        } else {
            0.0
        },
        broken_credential: if chance(rng, 0.12) {
            pick(rng, &credentialed).copied()
        } else {
            None
        },
    }
}

/// The index of the first item of greatest true acceptance: the oracle's pick over a menu whose
/// truths are already computed (ties go to the earlier item, as in [`Environment::best_of`]).
pub fn first_best(truths: &[f64]) -> Option<usize> {
    let mut best: Option<(usize, f64)> = None;
    for (i, &p) in truths.iter().enumerate() {
        if best.is_none_or(|(_, top)| p > top) {
            best = Some((i, p));
        }
    }
    best.map(|(i, _)| i)
}
