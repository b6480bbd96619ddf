//! One scenario run of one configuration: which failure modes strike and whether retries save
//! the run (sampled with the ground truth's own probabilities), and the outcome record with the
//! platform's full `TrajectoryData` that a run like that leaves behind.

use chrono::{DateTime, Duration, Utc};
use rand::Rng;
use serde_json::{Value, json};

use crate::domain::records::{
    DecisionPoint, ErrorEvent, FailurePattern, LlmInteraction, Outcome, OutcomeStatus, ToolCall,
    Trajectory,
};

use super::agent::AgentSpec;
use super::catalogue::{INVENTED_TOOLS, ScenarioSpec};
use super::embedding::ErrorEmbedder;
use super::failure::{FailureFacts, FailureMode, ObservedFailure, RenderedFailure, render_message};
use super::sampling::{
    chance, int_between, mean_one_factor, normal, pick, round_to, uniform, uuid, weighted_index,
};
use super::truth::{
    FAILED_SCORE_MEAN, LATENCY_SIGMA, Latent, RunShape, SCORE_NOISE, ScenarioProfile,
    context_need_tokens, median_latency_s, missing_tools, mode_odds, success_score_mean,
    tool_timeout_probability, used_tools,
};

/// Most repeated calls a looping run records (keeps pathological lines bounded).
const MAX_LOOP_STEPS: usize = 40;

/// What a run needs to know about its situation.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RunSetting<'a> {
    pub spec: &'a AgentSpec<'a>,
    pub latent: &'a Latent,
    pub scenario: &'a ScenarioSpec,
    pub profile: &'a ScenarioProfile,
    pub embedder: Option<&'a ErrorEmbedder>,
}

/// A finished run: the outcome and, when it failed, its failure pattern and what a client
/// would report about it.
#[derive(Debug, Clone)]
pub(crate) struct RunRecord {
    pub outcome: Outcome,
    pub failure: Option<(FailurePattern, ObservedFailure)>,
}

/// One mode striking a run: how many retries it took and whether one of them succeeded.
#[derive(Debug, Clone, Copy)]
struct Incident {
    mode: FailureMode,
    retries: u32,
    recovered: bool,
}

/// Samples which modes strike, in the order a run meets them. The run dies of the first mode
/// that no retry recovers; later modes never get the chance.
fn sample_incidents<R: Rng + ?Sized>(rng: &mut R, setting: &RunSetting<'_>) -> Vec<Incident> {
    let odds = mode_odds(setting.spec, setting.latent, setting.profile);
    let mut incidents = Vec::new();
    for mode in FailureMode::ALL {
        let i = mode.index();
        if !chance(rng, odds.first[i]) {
            continue;
        }
        let mut retries = 0;
        let mut recovered = false;
        while retries + 1 < setting.spec.max_attempts {
            retries += 1;
            if chance(rng, odds.recover[i]) {
                recovered = true;
                break;
            }
        }
        incidents.push(Incident {
            mode,
            retries,
            recovered,
        });
        if !recovered {
            break;
        }
    }
    incidents
}

/// The facts a failure of `mode` would mention in this setting.
pub(crate) fn failure_facts<R: Rng + ?Sized>(
    rng: &mut R,
    setting: &RunSetting<'_>,
    mode: FailureMode,
    attempt: u32,
) -> FailureFacts {
    let spec = setting.spec;
    let used = used_tools(spec, setting.profile);
    let configured = spec.tool_names();
    let tool = match mode {
        FailureMode::ToolTimeout => {
            let weights: Vec<f64> = used
                .iter()
                .map(|t| tool_timeout_probability(spec, setting.latent, setting.profile, t))
                .collect();
            weighted_index(rng, &weights)
                .map_or_else(|| first_or(&used, "web_search"), |i| used[i].to_owned())
        }
        FailureMode::HallucinatedTool => match missing_tools(spec, setting.profile).first() {
            Some(missing) if chance(rng, 0.8) => (*missing).to_owned(),
            _ => pick(rng, INVENTED_TOOLS)
                .copied()
                .unwrap_or("web_browser")
                .to_owned(),
        },
        FailureMode::ToolAuth => setting
            .latent
            .broken_credential
            .unwrap_or("crm_lookup")
            .to_owned(),
        FailureMode::SandboxFailure => "code_exec".to_owned(),
        _ => pick(rng, &used).map_or_else(|| first_or(&used, "web_search"), |t| (*t).to_owned()),
    };
    let window = u64::from(spec.model.context_window);
    let need = context_need_tokens(spec, setting.latent, setting.profile);
    FailureFacts {
        timeout_s: spec.tool_timeout_s(&tool),
        nearest_tool: configured
            .first()
            .cloned()
            .unwrap_or_else(|| "web_search".to_owned()),
        available_tools: configured,
        model: spec.model.name.to_owned(),
        provider: spec.model.provider.to_owned(),
        tokens: (need.max(window as f64) * uniform(rng, 1.01, 1.3)).round() as u64,
        context_window: window,
        attempt: attempt.max(1),
        max_attempts: spec.max_attempts,
        tool,
    }
}

fn first_or(tools: &[&str], fallback: &str) -> String {
    tools.first().copied().unwrap_or(fallback).to_owned()
}

/// One step of a clean run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    Plan,
    Tool(&'static str),
    AfterTool(&'static str),
    Answer,
}

/// Where in the run an incident of `mode` happens (an index into the steps).
fn incident_step<R: Rng + ?Sized>(
    rng: &mut R,
    steps: &[Step],
    mode: FailureMode,
    facts: &FailureFacts,
) -> usize {
    let tool_steps: Vec<usize> = (0..steps.len())
        .filter(|i| matches!(steps[*i], Step::Tool(_)))
        .collect();
    let llm_steps: Vec<usize> = (0..steps.len())
        .filter(|i| !matches!(steps[*i], Step::Tool(_)))
        .collect();
    let step_of_tool = |name: &str| {
        steps
            .iter()
            .position(|s| matches!(s, Step::Tool(t) if *t == name))
    };
    match mode {
        FailureMode::ContextOverflow => 0,
        FailureMode::RateLimit | FailureMode::ProviderError => {
            pick(rng, &llm_steps).copied().unwrap_or(0)
        }
        FailureMode::ToolTimeout | FailureMode::MalformedToolArgs | FailureMode::ToolAuth => {
            step_of_tool(&facts.tool).unwrap_or(0)
        }
        FailureMode::SandboxFailure => steps
            .iter()
            .position(|s| matches!(s, Step::Tool("code_exec" | "file_read" | "pdf_extract")))
            .unwrap_or(0),
        FailureMode::HallucinatedTool => pick(rng, &tool_steps)
            .copied()
            .unwrap_or(steps.len().saturating_sub(1)),
        FailureMode::Looping => tool_steps.last().copied().unwrap_or(0),
        FailureMode::OutputFormat => steps.len().saturating_sub(1),
    }
}

/// Builds the trajectory while a run unfolds.
struct Recorder<'s, 'a> {
    setting: &'s RunSetting<'a>,
    shape: RunShape,
    clock_ms: f64,
    llm_calls: usize,
    planned_calls: f64,
    tokens_in: i64,
    tokens_out: i64,
    cost_usd: f64,
    llm_ms: f64,
    tool_ms: Vec<(String, f64)>,
    tool_calls: Vec<ToolCall>,
    llm_interactions: Vec<LlmInteraction>,
    decision_points: Vec<DecisionPoint>,
    error_events: Vec<ErrorEvent>,
}

impl<'s, 'a> Recorder<'s, 'a> {
    fn new(setting: &'s RunSetting<'a>) -> Self {
        let shape = RunShape::of(setting.spec, setting.latent, setting.profile);
        Self {
            setting,
            planned_calls: shape.calls,
            shape,
            clock_ms: 0.0,
            llm_calls: 0,
            tokens_in: 0,
            tokens_out: 0,
            cost_usd: 0.0,
            llm_ms: 0.0,
            tool_ms: Vec::new(),
            tool_calls: Vec::new(),
            llm_interactions: Vec::new(),
            decision_points: Vec::new(),
            error_events: Vec::new(),
        }
    }

    /// One billed LLM call. Input grows along the run (70% of the mean at the start, 130% at the
    /// end of a clean run), so the mean over a clean run is the ground truth's per-call figure.
    fn llm<R: Rng + ?Sized>(&mut self, rng: &mut R, prompt: String, response: String) {
        let span = (self.planned_calls - 1.0).max(1.0);
        let position = (self.llm_calls as f64 / span).min(1.0);
        let tokens_in =
            (self.shape.tokens_in_per_call * (0.7 + 0.6 * position) * mean_one_factor(rng, 0.2))
                .round();
        let tokens_out = (self.shape.tokens_out_per_call * mean_one_factor(rng, 0.4))
            .round()
            .max(1.0);
        let model = self.setting.spec.model;
        let duration = 250.0
            + tokens_out * model.ms_per_output_token * mean_one_factor(rng, 0.25)
            + tokens_in * 0.01;
        self.cost_usd +=
            (tokens_in * model.price_in_per_1k + tokens_out * model.price_out_per_1k) / 1000.0;
        self.tokens_in += tokens_in as i64;
        self.tokens_out += tokens_out as i64;
        self.llm_calls += 1;
        self.llm_ms += duration;
        self.clock_ms += duration;
        self.llm_interactions.push(LlmInteraction {
            model: model.name.to_owned(),
            prompt,
            response,
            tokens_in: tokens_in as i64,
            tokens_out: tokens_out as i64,
            duration_ms: duration.round(),
            timestamp: None,
            trace_context: None,
        });
    }

    fn tool_call(
        &mut self,
        name: &str,
        input: Value,
        output: Value,
        duration_ms: f64,
        success: bool,
    ) {
        let duration_ms = duration_ms.max(1.0).round();
        self.clock_ms += duration_ms;
        match self.tool_ms.iter_mut().find(|(n, _)| n == name) {
            Some((_, total)) => *total += duration_ms,
            None => self.tool_ms.push((name.to_owned(), duration_ms)),
        }
        self.tool_calls.push(ToolCall {
            tool_name: name.to_owned(),
            tool_input: input,
            tool_output: output,
            duration_ms,
            success,
            timestamp: None,
            trace_context: None,
        });
    }

    /// A successful call of a configured tool, its latency kept under the tool's timeout.
    fn successful_tool<R: Rng + ?Sized>(&mut self, rng: &mut R, name: &str) {
        let median = median_latency_s(self.setting.latent, self.setting.profile, name);
        let timeout = self.setting.spec.tool_timeout_s(name);
        let mut seconds = median * normal(rng, 0.0, LATENCY_SIGMA).exp();
        if seconds >= timeout {
            seconds = timeout * uniform(rng, 0.6, 0.98);
        }
        let input = tool_input(rng, name);
        let output = tool_output(rng, name);
        self.tool_call(name, input, output, seconds * 1000.0, true);
    }

    fn decide(&mut self, tool: &str, rationale: &str) {
        let options: Vec<Value> = self
            .setting
            .spec
            .tools
            .iter()
            .take(6)
            .map(|t| json!(t.name))
            .collect();
        self.decision_points.push(DecisionPoint {
            decision_type: "tool_selection".to_owned(),
            options,
            selected: json!(tool),
            rationale: Some(rationale.to_owned()),
            timestamp: None,
            trace_context: None,
        });
    }

    /// The step done right.
    fn clean_step<R: Rng + ?Sized>(&mut self, rng: &mut R, steps: &[Step], i: usize) {
        let scenario = self.setting.scenario;
        match steps[i] {
            Step::Plan => {
                let plan: Vec<&str> = steps
                    .iter()
                    .filter_map(|s| {
                        if let Step::Tool(t) = s {
                            Some(*t)
                        } else {
                            None
                        }
                    })
                    .collect();
                let response = if plan.is_empty() {
                    "I can answer this directly from the context provided.".to_owned()
                } else {
                    format!("Plan: call {} and then answer.", plan.join(", then "))
                };
                self.llm(rng, scenario.task_prompt.clone(), response);
            }
            Step::Tool(name) => {
                let rationale = pick(rng, RATIONALES)
                    .copied()
                    .unwrap_or("needed for the task");
                self.decide(name, rationale);
                self.successful_tool(rng, name);
            }
            Step::AfterTool(name) => {
                let next = steps[i + 1..].iter().find_map(|s| {
                    if let Step::Tool(t) = s {
                        Some(*t)
                    } else {
                        None
                    }
                });
                let response = match next {
                    Some(next) => format!("Got the {name} result; next I need {next}."),
                    None => "I have everything I need to answer.".to_owned(),
                };
                let items = int_between(rng, 1, 12);
                self.llm(
                    rng,
                    format!("Observation from {name}: ok ({items} items)"),
                    response,
                );
            }
            Step::Answer => {
                let answer = format!(
                    "{{\"answer\": \"{} resolved\", \"confidence\": {:.2}}}",
                    scenario.name,
                    uniform(rng, 0.6, 0.97)
                );
                self.llm(
                    rng,
                    format!("Compose the final answer for: {}", scenario.name),
                    answer,
                );
            }
        }
    }

    /// One failed attempt of `mode` at step `i`, as the trajectory shows it.
    fn failed_attempt<R: Rng + ?Sized>(
        &mut self,
        rng: &mut R,
        mode: FailureMode,
        facts: &FailureFacts,
        message: &str,
    ) {
        match mode {
            FailureMode::ToolTimeout => {
                let input = tool_input(rng, &facts.tool);
                self.tool_call(
                    &facts.tool,
                    input,
                    Value::Null,
                    facts.timeout_s * 1000.0 + uniform(rng, 1.0, 40.0),
                    false,
                );
            }
            FailureMode::MalformedToolArgs => {
                let broken = format!(
                    "{{\"query\": \"{}",
                    pick(rng, QUERY_WORDS).copied().unwrap_or("refund")
                );
                self.tool_call(
                    &facts.tool,
                    Value::String(broken),
                    json!({"error": message}),
                    uniform(rng, 2.0, 40.0),
                    false,
                );
            }
            FailureMode::HallucinatedTool => {
                let input = json!({"query": pick(rng, QUERY_WORDS).copied().unwrap_or("order")});
                self.tool_call(
                    &facts.tool,
                    input,
                    json!({"error": message}),
                    uniform(rng, 1.0, 5.0),
                    false,
                );
            }
            FailureMode::ToolAuth => {
                if self.setting.spec.has_tool(&facts.tool) {
                    let input = tool_input(rng, &facts.tool);
                    self.tool_call(
                        &facts.tool,
                        input,
                        json!({"error": message}),
                        uniform(rng, 80.0, 400.0),
                        false,
                    );
                }
            }
            FailureMode::SandboxFailure => {
                if self.setting.spec.has_tool(&facts.tool) {
                    let input = tool_input(rng, &facts.tool);
                    self.tool_call(
                        &facts.tool,
                        input,
                        Value::Null,
                        uniform(rng, 200.0, 9000.0),
                        false,
                    );
                } else {
                    self.clock_ms += uniform(rng, 200.0, 5000.0);
                }
            }
            FailureMode::Looping => {
                let repeats = (self.shape.loop_calls as usize).min(MAX_LOOP_STEPS);
                let input = tool_input(rng, &facts.tool);
                for _ in 0..repeats {
                    self.llm(
                        rng,
                        format!("Observation from {}: same result as before", facts.tool),
                        format!("Let me call {} again to be sure.", facts.tool),
                    );
                    if self.setting.spec.has_tool(&facts.tool) {
                        let seconds = median_latency_s(
                            self.setting.latent,
                            self.setting.profile,
                            &facts.tool,
                        )
                        .min(facts.timeout_s * 0.9);
                        self.tool_call(
                            &facts.tool,
                            input.clone(),
                            tool_output(rng, &facts.tool),
                            seconds * 1000.0,
                            true,
                        );
                    }
                }
            }
            FailureMode::OutputFormat => {
                let bad = pick(rng, MALFORMED_ANSWERS).copied().unwrap_or("Sure!");
                self.llm(
                    rng,
                    format!(
                        "Compose the final answer for: {}",
                        self.setting.scenario.name
                    ),
                    bad.to_owned(),
                );
            }
            // Provider-side rejections are not billed and leave no interaction, only time.
            FailureMode::RateLimit | FailureMode::ProviderError | FailureMode::ContextOverflow => {
                self.clock_ms += uniform(rng, 80.0, 1500.0);
            }
        }
    }
}

/// Runs `setting.scenario` once and records everything a real run would.
pub(crate) fn simulate_run<R: Rng + ?Sized>(
    rng: &mut R,
    setting: &RunSetting<'_>,
    outcome_id: String,
    simulation_id: &str,
    start: DateTime<Utc>,
) -> RunRecord {
    let spec = setting.spec;
    let incidents = sample_incidents(rng, setting);
    let used = used_tools(spec, setting.profile);
    let mut steps = vec![Step::Plan];
    for tool in &used {
        steps.push(Step::Tool(tool));
        steps.push(Step::AfterTool(tool));
    }
    steps.push(Step::Answer);

    // Place every incident at its step, with the facts and message it shows.
    let mut placed: Vec<(usize, Incident, FailureFacts, RenderedFailure)> = incidents
        .iter()
        .map(|incident| {
            let attempt = incident.retries + 1;
            let facts = failure_facts(rng, setting, incident.mode, attempt);
            let step = incident_step(rng, &steps, incident.mode, &facts);
            let rendered = render_message(incident.mode, &facts, rng);
            (step, *incident, facts, rendered)
        })
        .collect();
    // The fatal incident (last sampled) stops the run where it happens; recovered ones that would
    // come later never happen.
    if let Some(fatal_step) = placed.last().filter(|p| !p.1.recovered).map(|p| p.0) {
        placed.retain(|p| p.0 <= fatal_step || !p.1.recovered);
    }

    let mut recorder = Recorder::new(setting);
    let mut retry_count = 0u32;
    let mut fatal: Option<(Incident, FailureFacts, RenderedFailure)> = None;
    'steps: for i in 0..steps.len() {
        for (step, incident, facts, rendered) in &placed {
            if *step != i {
                continue;
            }
            let failed_attempts = if incident.recovered {
                incident.retries
            } else {
                incident.retries + 1
            };
            for _ in 0..failed_attempts {
                recorder.failed_attempt(rng, incident.mode, facts, &rendered.message);
            }
            if incident.retries > 0 {
                recorder.decision_points.push(DecisionPoint {
                    decision_type: "retry".to_owned(),
                    options: vec![json!("retry"), json!("abort")],
                    selected: json!("retry"),
                    rationale: Some(format!(
                        "{} looks transient; retry policy allows {} attempts",
                        incident.mode.error_type(),
                        spec.max_attempts
                    )),
                    timestamp: None,
                    trace_context: None,
                });
            }
            retry_count += incident.retries;
            recorder.error_events.push(ErrorEvent {
                error_type: incident.mode.error_type().to_owned(),
                error_message: rendered.message.clone(),
                recovery_attempted: incident.retries > 0,
                recovery_successful: incident.recovered,
                timestamp: None,
                trace_context: None,
            });
            if !incident.recovered {
                fatal = Some((*incident, facts.clone(), rendered.clone()));
                break 'steps;
            }
        }
        recorder.clean_step(rng, &steps, i);
    }

    let status = fatal
        .as_ref()
        .map_or(OutcomeStatus::Success, |(incident, _, _)| {
            incident.mode.outcome_status()
        });
    let reliability_score = match fatal {
        None => success_score_mean(spec, setting.profile) + uniform(rng, -SCORE_NOISE, SCORE_NOISE),
        Some(_) => FAILED_SCORE_MEAN + uniform(rng, -0.1, 0.1),
    }
    .clamp(0.0, 1.0);
    let reliability_score = round_to(reliability_score, 4);
    let duration_ms = recorder.clock_ms.round();
    let mut latency = serde_json::Map::new();
    for (name, ms) in &recorder.tool_ms {
        latency.insert(format!("tool_{name}"), json!(ms.round()));
    }
    latency.insert("llm_inference".to_owned(), json!(recorder.llm_ms.round()));
    let successes = recorder.tool_calls.iter().filter(|c| c.success).count();
    let tool_success_rate = if recorder.tool_calls.is_empty() {
        1.0
    } else {
        successes as f64 / recorder.tool_calls.len() as f64
    };
    let trajectory = Trajectory {
        scenario_id: Some(setting.scenario.scenario_id.clone()),
        scenario_name: Some(setting.scenario.name.clone()),
        task_prompt: Some(setting.scenario.task_prompt.clone()),
        start_time: start,
        end_time: Some(start + Duration::milliseconds(duration_ms as i64)),
        duration_ms: Some(duration_ms),
        status: status.as_str().to_owned(),
        tool_calls: recorder.tool_calls,
        llm_interactions: recorder.llm_interactions,
        decision_points: recorder.decision_points,
        error_events: recorder.error_events,
        token_usage: Some(json!({
            "input": recorder.tokens_in,
            "output": recorder.tokens_out,
            "total": recorder.tokens_in + recorder.tokens_out,
        })),
        latency_breakdown: Some(Value::Object(latency)),
        spans: None,
        trace_tree: None,
        tool_selection_rationale: None,
        parameter_choices: None,
        error_recovery_attempts: (retry_count > 0).then(|| json!(retry_count)),
    };
    let failure = fatal.as_ref().map(|(incident, facts, rendered)| {
        let mode = incident.mode;
        let tool = mode.concerns_a_tool().then(|| facts.tool.clone());
        let pattern = FailurePattern {
            pattern_id: uuid(rng),
            outcome_id: outcome_id.clone(),
            failure_type: mode.failure_type().to_owned(),
            failure_category: mode.error_category().as_str().to_owned(),
            error_message: rendered.message.clone(),
            error_embedding: setting
                .embedder
                .map(|e| e.embed(mode, tool.as_deref(), rng)),
            execution_time: Some(start),
            pattern_cluster_id: None,
            cluster_confidence: None,
            similar_failures_count: None,
            recovery_attempted: incident.retries > 0,
            recovery_successful: false,
            resolution_steps: None,
            llm_analysis: None,
        };
        let observed = ObservedFailure {
            failure_category: pattern.failure_category.clone(),
            error_message: rendered.message.clone(),
            tool_name: tool,
        };
        (pattern, observed)
    });
    let outcome = Outcome {
        outcome_id,
        simulation_id: simulation_id.to_owned(),
        scenario_id: setting.scenario.scenario_id.clone(),
        execution_time: start,
        status,
        reliability_score,
        execution_time_ms: Some(duration_ms as i64),
        tokens_used: Some(recorder.tokens_in + recorder.tokens_out),
        cost_usd: Some(round_to(recorder.cost_usd, 8)),
        retry_count: retry_count.min(i32::MAX as u32) as i32,
        error_code: fatal
            .as_ref()
            .map(|(_, _, rendered)| rendered.error_code.clone()),
        error_category: fatal
            .as_ref()
            .map(|(incident, _, _)| incident.mode.error_category()),
        metrics: Some(json!({
            "llm_calls": recorder.llm_calls,
            "tool_calls": trajectory.tool_calls.len(),
            "tool_success_rate": (tool_success_rate * 1000.0).round() / 1000.0,
        })),
        trajectory_embedding: None,
        trajectory,
    };
    RunRecord { outcome, failure }
}

const RATIONALES: &[&str] = &[
    "need fresh data before answering",
    "the task names a record I have to look up",
    "numbers must be computed, not guessed",
    "policy requires checking the source document",
    "the user asked for a confirmation to be sent",
];

const QUERY_WORDS: &[&str] = &[
    "refund order",
    "churn drivers",
    "ledger batch",
    "claim policy",
    "portfolio news",
    "sso setup",
];

const MALFORMED_ANSWERS: &[&str] = &[
    "Sure! Here is what I found about the request.",
    "{\"answer\": \"approved\", \"confidence\": high",
    "```json\n{\"decision\": ",
    "I'm sorry, but I can't help with that.",
];

/// A plausible input for a call of `tool`.
fn tool_input<R: Rng + ?Sized>(rng: &mut R, tool: &str) -> Value {
    let n = int_between(rng, 100, 99_999);
    match tool {
        "web_search" => {
            let topic = pick(rng, QUERY_WORDS).copied().unwrap_or("news");
            json!({"query": format!("{topic} {n}"), "max_results": 5})
        }
        "calculator" => json!({"expression": format!("{n} * {:.4}", uniform(rng, 0.01, 2.0))}),
        "sql_query" => {
            json!({"query": format!("SELECT * FROM transactions WHERE account_id = {n} LIMIT 50")})
        }
        "code_exec" => {
            let code = format!(
                "import pandas as pd\ndf = pd.read_csv('export_{n}.csv')\nprint(df.describe())"
            );
            json!({"language": "python", "code": code})
        }
        "file_read" => json!({"path": format!("/workspace/data/report_{n}.csv")}),
        "email_send" => {
            json!({"to": format!("customer{n}@example.com"), "subject": "Update on your request"})
        }
        "crm_lookup" => json!({"customer_id": format!("CUST-{n}")}),
        "vector_search" => {
            let query = pick(rng, QUERY_WORDS).copied().unwrap_or("policy");
            json!({"query": query, "top_k": 5, "index": "kb-main"})
        }
        "http_request" => {
            json!({"method": "GET", "url": format!("https://api.example.com/v1/items/{n}")})
        }
        "pdf_extract" => json!({"document_id": format!("doc_{n}"), "pages": "1-4"}),
        "calendar_lookup" => json!({"resource_id": format!("R-{n}"), "days_ahead": 14}),
        "ticket_update" => json!({"ticket_id": format!("TCK-{n}"), "status": "pending_customer"}),
        _ => json!({"input": format!("item {n}")}),
    }
}

/// A plausible (short) output of a successful call of `tool`.
fn tool_output<R: Rng + ?Sized>(rng: &mut R, tool: &str) -> Value {
    let n = int_between(rng, 1, 20);
    match tool {
        "calculator" => json!({"result": (uniform(rng, 1.0, 100_000.0) * 100.0).round() / 100.0}),
        "sql_query" => json!({"rows": n, "columns": ["id", "amount", "created_at"]}),
        "code_exec" => json!({"exit_code": 0, "stdout_lines": n}),
        "email_send" => json!({"status": "queued"}),
        "crm_lookup" => {
            let tier = pick(rng, &["gold", "silver", "bronze"])
                .copied()
                .unwrap_or("gold");
            json!({"found": true, "tier": tier})
        }
        "ticket_update" => json!({"updated": true}),
        _ => json!({"results": n}),
    }
}
