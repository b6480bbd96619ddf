//! The platform history as a lazy stream of ingest records.
//!
//! Each configuration lives through a few rounds: its current version is evaluated in one or two
//! simulations over its workload, a recommender proposes 1–3 diffs, the owner reviews them (the
//! acceptance model decides), and an approved diff becomes the next version — whose simulations
//! then show the diff's true effect. Records come out in reference order, one round at a time,
//! so memory holds one round (a few dozen records), never the history.

use std::collections::VecDeque;

use chrono::{DateTime, Duration, Utc};
use rand::Rng;
use rand_chacha::ChaCha8Rng;
use serde_json::{Value, json};

use crate::domain::agent_config::{apply_merge_patch, config_hash};
use crate::domain::records::{
    ApprovalStatus, ConfigDiff, ConfigVersion, Configuration, GeneratedBy, IngestRecord, OrgId,
    RecordData, Scenario, Simulation, User,
};

use super::agent::AgentSpec;
use super::candidates::{Candidate, candidate_diffs};
use super::catalogue::OrgProfile;
use super::environment::{
    draw_failing_config, draw_latent, draw_workload, needed_tools, profile_of,
};
use super::failure::ObservedFailure;
use super::sampling::{
    chance, int_between, normal, pick, round_to, stream_rng, uniform, uuid, weighted_index,
};
use super::trajectory::{RunSetting, simulate_run};
use super::truth::{GroundTruth, HiddenState, ScenarioProfile, evaluate, sorted_rates};
use super::{ConfigTruth, STREAM_CONFIG_BASE, World};

/// Days over which configurations are created; their later rounds run on for a few weeks, so the
/// history spans about five months.
const CREATION_SPAN_DAYS: f64 = 125.0;
/// Probability that a proposal slot after the first gets the historical recommender's informed
/// guess rather than a random candidate.
const INFORMED_PROPOSAL: f64 = 0.6;
/// How wrong the historical recommender's guesses are: it ranks candidates by their acceptance
/// probability times a log-normal error of this sigma.
const INFORMED_ERROR: f64 = 0.25;
/// Rounds where fewer runs than this fail rarely prompt anyone to ask for a recommendation.
const QUIET_FAILURE_SHARE: f64 = 0.35;

/// How much a configuration will be exercised; drawn first from its stream, so planning the
/// history (counting outcomes) needs nothing else.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ConfigPlan {
    pub org: usize,
    pub workload_size: usize,
    /// Simulations per round; the number of rounds is its length.
    pub sims_per_round: Vec<usize>,
}

impl ConfigPlan {
    pub fn outcomes(&self) -> usize {
        self.sims_per_round.iter().sum::<usize>() * self.workload_size
    }
}

pub(crate) fn draw_plan<R: Rng + ?Sized>(rng: &mut R, orgs: &[OrgProfile]) -> ConfigPlan {
    let org = int_between(rng, 0, orgs.len().saturating_sub(1) as u64) as usize;
    let available = orgs.get(org).map_or(1, |o| o.scenarios.len()).max(1);
    let workload_size = (int_between(rng, 5, 10) as usize).min(available);
    let rounds = int_between(rng, 2, 6) as usize;
    let sims_per_round = (0..rounds)
        .map(|_| if chance(rng, 0.35) { 2 } else { 1 })
        .collect();
    ConfigPlan {
        org,
        workload_size,
        sims_per_round,
    }
}

/// A configuration's opening draws: who owns it, what it runs, its hidden circumstances.
#[derive(Debug, Clone)]
pub(crate) struct ConfigOpening {
    pub rng: ChaCha8Rng,
    pub plan: ConfigPlan,
    pub config_id: String,
    pub name: String,
    pub owner: usize,
    pub workload: Vec<usize>,
    pub hidden: HiddenState,
    pub config: Value,
    pub created_at: DateTime<Utc>,
}

impl ConfigOpening {
    pub fn truth(&self, world: &World) -> ConfigTruth {
        let org = &world.orgs[self.plan.org];
        ConfigTruth {
            config_id: self.config_id.clone(),
            user: org.users[self.owner].clone(),
            hidden: self.hidden.clone(),
            initial_config: self.config.clone(),
        }
    }
}

pub(crate) fn open_config(world: &World, k: usize) -> ConfigOpening {
    let params = world.params();
    let mut rng = stream_rng(params.seed, STREAM_CONFIG_BASE + k as u64);
    let plan = draw_plan(&mut rng, &world.orgs);
    let org = &world.orgs[plan.org];
    let config_id = uuid(&mut rng);
    let owner = int_between(&mut rng, 0, org.users.len().saturating_sub(1) as u64) as usize;
    let domain = org
        .users
        .get(owner)
        .map_or(org.domain, |u| domain_name(&u.domain, org.domain));
    let workload = draw_workload(&mut rng, &org.scenarios, domain, plan.workload_size);
    let specs: Vec<_> = workload.iter().map(|i| &org.scenarios[*i]).collect();
    let needed = needed_tools(&specs);
    let latent = draw_latent(&mut rng, &needed);
    let profiles: Vec<ScenarioProfile> = specs.iter().map(|s| profile_of(s)).collect();
    let config = draw_failing_config(&mut rng, &latent, &profiles, &needed, domain);
    let failure_rates = AgentSpec::parse(&config)
        .map(|spec| sorted_rates(&evaluate(&spec, &latent, &profiles).failure_rates))
        .unwrap_or_default();
    let purpose = pick(&mut rng, PURPOSES).copied().unwrap_or("support");
    let name = format!("{domain}-{purpose}-agent-{}", k + 1);
    let fraction = if world.configuration_count() > 0 {
        k as f64 / world.configuration_count() as f64
    } else {
        0.0
    };
    let offset_minutes =
        fraction * CREATION_SPAN_DAYS * 1440.0 + uniform(&mut rng, 0.0, 36.0 * 60.0);
    let created_at = params.start + Duration::minutes(offset_minutes as i64);
    ConfigOpening {
        rng,
        plan,
        config_id,
        name,
        owner,
        workload,
        hidden: HiddenState {
            latent,
            workload: profiles,
            failure_rates,
        },
        config,
        created_at,
    }
}

/// A user's domain as the catalogue's static label (users may carry any string).
fn domain_name(user_domain: &str, fallback: &'static str) -> &'static str {
    super::catalogue::DOMAINS
        .iter()
        .copied()
        .find(|d| *d == user_domain)
        .unwrap_or(fallback)
}

const PURPOSES: &[&str] = &[
    "support",
    "analyst",
    "ops",
    "research",
    "billing",
    "triage",
    "assistant",
];

/// A configuration being written out, round by round.
#[derive(Debug)]
struct ActiveConfig {
    index: usize,
    opening: ConfigOpening,
    version_id: String,
    version_number: i32,
    round: usize,
    clock: DateTime<Utc>,
}

/// The history stream. See [`World::history`].
#[derive(Debug)]
pub struct History<'w> {
    world: &'w World,
    queue: VecDeque<IngestRecord>,
    prelude_done: bool,
    next_config: usize,
    outcomes_left: usize,
    active: Option<ActiveConfig>,
}

impl<'w> History<'w> {
    pub(crate) fn new(world: &'w World) -> Self {
        Self {
            world,
            queue: VecDeque::new(),
            prelude_done: false,
            next_config: 0,
            outcomes_left: world.params().outcomes,
            active: None,
        }
    }

    /// Users, then scenarios, of every organization.
    fn prelude(&mut self) {
        for (i, org) in self.world.orgs.iter().enumerate() {
            let org_id = self.world.org_id(i);
            for user in &org.users {
                self.queue.push_back(record(
                    org_id,
                    RecordData::User(User {
                        user_id: user.user_id.clone(),
                        user_role: Some(user.role.clone()),
                        domain: Some(user.domain.clone()),
                    }),
                ));
            }
            for scenario in &org.scenarios {
                self.queue.push_back(record(
                    org_id,
                    RecordData::Scenario(Scenario {
                        scenario_id: scenario.scenario_id.clone(),
                        name: scenario.name.clone(),
                        description: Some(scenario.task_prompt.clone()),
                        expected_tools: scenario
                            .expected_tools
                            .iter()
                            .map(|t| (*t).to_owned())
                            .collect(),
                        difficulty_level: Some(scenario.difficulty_level.to_owned()),
                        domain: Some(scenario.domain.to_owned()),
                        scenario_embedding: None,
                    }),
                ));
            }
        }
    }

    fn start_config(&mut self, k: usize) -> ActiveConfig {
        let opening = open_config(self.world, k);
        let org_id = self.world.org_id(opening.plan.org);
        let org = &self.world.orgs[opening.plan.org];
        let mut rng = opening.rng.clone();
        let version_id = uuid(&mut rng);
        let created_at = opening.created_at;
        self.queue.push_back(record(
            org_id,
            RecordData::Configuration(Configuration {
                config_id: opening.config_id.clone(),
                name: opening.name.clone(),
                user_id: org.users.get(opening.owner).map(|u| u.user_id.clone()),
                is_active: true,
                latest_version_id: None,
                modal_app_id: None,
                sandbox_config: None,
                created_at: Some(created_at),
            }),
        ));
        self.queue.push_back(version_record(
            org_id,
            &opening.config_id,
            &version_id,
            1,
            &opening.config,
            GeneratedBy::Manual,
            created_at + Duration::minutes(5),
        ));
        let mut opening = opening;
        opening.rng = rng;
        ActiveConfig {
            index: k,
            opening,
            version_id,
            version_number: 1,
            round: 0,
            clock: created_at + Duration::hours(1),
        }
    }

    /// Writes one round of `active` into the queue; true when the configuration is done.
    fn round(&mut self, active: &mut ActiveConfig) -> bool {
        let world = self.world;
        let org_id = world.org_id(active.opening.plan.org);
        let org = &world.orgs[active.opening.plan.org];
        let config = active.opening.config.clone();
        let Ok(spec) = AgentSpec::parse(&config) else {
            // Every version comes from a validated diff, so this does not happen; ending the
            // configuration is the safe answer if it ever did.
            return true;
        };
        let rng = &mut active.opening.rng;
        let sims = active
            .opening
            .plan
            .sims_per_round
            .get(active.round)
            .copied()
            .unwrap_or(0);
        let mut observed: Vec<ObservedFailure> = Vec::new();
        let (mut runs_done, mut runs_failed) = (0usize, 0usize);
        for s in 0..sims {
            if self.outcomes_left == 0 {
                break;
            }
            let count = active.opening.workload.len().min(self.outcomes_left);
            let simulation_id = uuid(rng);
            let sim_start = active.clock
                + Duration::minutes((s as f64 * 180.0 + uniform(rng, 0.0, 120.0)) as i64);
            let mut clock = sim_start;
            let mut runs = Vec::with_capacity(count);
            for &j in &active.opening.workload[..count] {
                let scenario = &org.scenarios[j];
                let profile = profile_of(scenario);
                let setting = RunSetting {
                    spec: &spec,
                    latent: &active.opening.hidden.latent,
                    scenario,
                    profile: &profile,
                    embedder: world.embedder.as_ref(),
                };
                let outcome_id = uuid(rng);
                let run = simulate_run(rng, &setting, outcome_id, &simulation_id, clock);
                let took = run.outcome.execution_time_ms.unwrap_or(0).max(0);
                clock += Duration::milliseconds(took)
                    + Duration::milliseconds(int_between(rng, 500, 5000) as i64);
                runs.push(run);
            }
            let n = runs.len().max(1) as f64;
            let score = runs
                .iter()
                .map(|r| r.outcome.reliability_score)
                .sum::<f64>()
                / n;
            let cost: f64 = runs.iter().filter_map(|r| r.outcome.cost_usd).sum();
            let time_ms: i64 = runs
                .iter()
                .filter_map(|r| r.outcome.execution_time_ms)
                .sum();
            self.queue.push_back(record(
                org_id,
                RecordData::Simulation(Simulation {
                    simulation_id: simulation_id.clone(),
                    config_version_id: active.version_id.clone(),
                    status: "completed".to_owned(),
                    overall_score: Some(round_to(score, 4).clamp(0.0, 1.0)),
                    execution_time_ms: Some(time_ms),
                    total_cost_usd: Some(round_to(cost, 8)),
                    scenario_set: Some(
                        runs.iter().map(|r| r.outcome.scenario_id.clone()).collect(),
                    ),
                    metadata: Some(json!({
                        "agent_model": spec.model.name,
                        "trigger": pick(rng, &["ci", "nightly", "manual"]).copied().unwrap_or("ci"),
                    })),
                    created_at: Some(sim_start),
                }),
            ));
            runs_done += runs.len();
            for run in runs {
                runs_failed += usize::from(run.failure.is_some());
                self.queue
                    .push_back(record(org_id, RecordData::Outcome(Box::new(run.outcome))));
                if let Some((pattern, failure)) = run.failure {
                    self.queue
                        .push_back(record(org_id, RecordData::FailurePattern(pattern)));
                    if observed.len() < 5 {
                        observed.push(failure);
                    }
                }
            }
            self.outcomes_left -= count;
        }
        if self.outcomes_left == 0 {
            return true;
        }

        let last_round = active.round + 1 >= active.opening.plan.sims_per_round.len();
        let candidates = candidate_diffs(&config, &observed);
        let owner = &org.users[active.opening.owner];
        let truth = GroundTruth;
        let hidden = &active.opening.hidden;
        let acceptance =
            |c: &Candidate| truth.acceptance_probability(owner, hidden, &config, &c.diff);
        // A round that mostly works rarely prompts a recommendation (then only cost-saving ideas).
        let quiet =
            (runs_failed as f64) < QUIET_FAILURE_SHARE * runs_done as f64 && !chance(rng, 0.3);
        let wanted = if quiet {
            0
        } else {
            weighted_index(rng, &[0.0, 0.65, 0.25, 0.1]).unwrap_or(1)
        };
        let wanted = wanted.min(candidates.len());
        let mut chosen: Vec<usize> = Vec::new();
        for _ in 0..wanted * 4 {
            if chosen.len() >= wanted {
                break;
            }
            // The recommender's top pick always comes from its informed ranking; further slots
            // are sometimes filler.
            let pick_index = if chosen.is_empty() || chance(rng, INFORMED_PROPOSAL) {
                // The historical recommender's informed but imperfect guess.
                let scores: Vec<f64> = candidates
                    .iter()
                    .map(|c| acceptance(c) * normal(rng, 0.0, INFORMED_ERROR).exp())
                    .collect();
                (0..candidates.len())
                    .filter(|i| !chosen.contains(i))
                    .max_by(|a, b| scores[*a].total_cmp(&scores[*b]))
            } else {
                Some(int_between(rng, 0, candidates.len().saturating_sub(1) as u64) as usize)
            };
            if let Some(i) = pick_index.filter(|i| !chosen.contains(i)) {
                chosen.push(i);
            }
        }

        // The owner reviews in order and stops at the first approval; the rest stay pending, as
        // do all proposals of a last round that nobody got to.
        let unreviewed = last_round && chance(rng, 0.15);
        let proposed_at = active.clock + Duration::hours(int_between(rng, 6, 30) as i64);
        let mut approved: Option<(Value, String)> = None;
        for (slot, &i) in chosen.iter().enumerate() {
            let candidate = &candidates[i];
            let status = if unreviewed || approved.is_some() {
                ApprovalStatus::Pending
            } else if chance(rng, acceptance(candidate)) {
                ApprovalStatus::Approved
            } else {
                ApprovalStatus::Rejected
            };
            let version_after = (status == ApprovalStatus::Approved).then(|| uuid(rng));
            if let Some(after) = &version_after {
                let mut patched = config.clone();
                apply_merge_patch(&mut patched, &candidate.diff);
                approved = Some((patched, after.clone()));
            }
            let effect = truth.effect(hidden, &config, &candidate.diff);
            let predicted_delta = effect.reliability_delta + normal(rng, 0.0, 0.08);
            let predicted_cost = effect.cost_delta_usd_per_run * (1.0 + normal(rng, 0.0, 0.2));
            self.queue.push_back(record(
                org_id,
                RecordData::ConfigDiff(ConfigDiff {
                    diff_id: uuid(rng),
                    config_id: active.opening.config_id.clone(),
                    version_before: active.version_id.clone(),
                    version_after,
                    diff_yaml: None,
                    change_summary: candidate.description.clone(),
                    diff: candidate.diff.clone(),
                    recommendation_type: Some(candidate.recommendation_type.as_str().to_owned()),
                    impact_prediction: Some(json!({
                        "expected_reliability_delta": (predicted_delta * 1000.0).round() / 1000.0,
                        "expected_cost_delta_usd": (predicted_cost * 1e6).round() / 1e6,
                    })),
                    llm_generated: chance(rng, 0.85),
                    approval_status: status,
                    approved_by: (status == ApprovalStatus::Approved)
                        .then(|| owner.user_id.clone()),
                    created_at: proposed_at + Duration::minutes(10 * slot as i64),
                }),
            ));
        }
        if let Some((patched, version_id)) = approved {
            active.version_number += 1;
            self.queue.push_back(version_record(
                org_id,
                &active.opening.config_id,
                &version_id,
                active.version_number,
                &patched,
                GeneratedBy::LlmRecommendation,
                proposed_at + Duration::hours(2),
            ));
            active.opening.config = patched;
            active.version_id = version_id;
        }
        active.clock = proposed_at + Duration::minutes((uniform(rng, 1.0, 6.0) * 1440.0) as i64);
        active.round += 1;
        last_round
    }
}

impl Iterator for History<'_> {
    type Item = IngestRecord;

    fn next(&mut self) -> Option<IngestRecord> {
        loop {
            if let Some(next) = self.queue.pop_front() {
                return Some(next);
            }
            if !self.prelude_done {
                self.prelude_done = true;
                self.prelude();
                continue;
            }
            if let Some(mut active) = self.active.take() {
                if !self.round(&mut active) {
                    self.active = Some(active);
                }
                continue;
            }
            if self.outcomes_left == 0 || self.next_config >= self.world.configuration_count() {
                return None;
            }
            let k = self.next_config;
            self.next_config += 1;
            let active = self.start_config(k);
            debug_assert_eq!(active.index, k);
            self.active = Some(active);
        }
    }
}

fn record(org: &OrgId, data: RecordData) -> IngestRecord {
    IngestRecord {
        org: org.clone(),
        data,
    }
}

fn version_record(
    org: &OrgId,
    config_id: &str,
    version_id: &str,
    version_number: i32,
    config: &Value,
    generated_by: GeneratedBy,
    created_at: DateTime<Utc>,
) -> IngestRecord {
    record(
        org,
        RecordData::ConfigVersion(ConfigVersion {
            version_id: version_id.to_owned(),
            config_id: config_id.to_owned(),
            version_number,
            parsed_config: config.clone(),
            generated_by,
            raw_yaml: None,
            config_hash: Some(config_hash(config)),
            created_at: Some(created_at),
        }),
    )
}
