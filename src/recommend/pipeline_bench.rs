//! `arc-rec bench pipeline`: the platform plan's headline, measured on the synthetic world.
//!
//! Simulated platform traffic: every round the world draws a failure context (organization,
//! user, configuration, failures, embedding); each arm places it in the organization's failure
//! clusters as serving does, generates its candidates (the heuristics', plus one model's stored
//! candidates for that cluster), shows its top-1 and learns from the simulated answer. Arms
//! differ only in their menu: heuristics alone, or heuristics and one model version's ideas
//! (each entering at its learned-grader prior, learned as a residual and corrected by its own
//! answers, exactly as serving does).
//! Every bandit arm starts as serving starts a new organization: from the platform's logged
//! decisions of the world's history ([`warm_start`], serving's `recommend::warm_start`).
//! Beside them: random order of the heuristic candidates (the platform before arc-rec) and the
//! menu oracles (the truly best candidate of each menu). Every arm sees the same contexts;
//! answers are drawn from the world's acceptance model with a stream per arm, and arms are
//! scored by the world's *true* acceptance probability of what they showed (less noisy than the
//! drawn answers). Each model menu's priors are scored too ([`PriorQuality`]): what serving
//! knows of an idea before it shows it, against the idea's truth.

use std::collections::HashMap;

use bandit::{Observation, PolicyConfig, ThompsonPolicy};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::Serialize;

use super::benchmark::input_of;
use super::engine::{
    Evidence, Prepared, RecommendError, learning_reward, offsets_for, prepare, rank,
};
use super::features::layout;
use super::placement::place;
use super::warm_start::{LoggedDecision, WarmStartCounts, observations};
use crate::candidates::CandidateIndex;
use crate::clustering::ClusterModel;
use crate::domain::{Candidate, CandidateSource};
use crate::world::{Context, Environment, first_best};

/// An organization's serving data: its candidate statistics and clustering model.
#[derive(Debug, Clone)]
pub struct OrgData {
    pub index: CandidateIndex,
    pub clusters: Option<ClusterModel>,
}

/// A model's candidates, per organization, each for its cluster (`None`: any).
#[derive(Debug, Clone)]
pub struct ModelMenu {
    pub name: String,
    pub candidates: HashMap<String, Vec<(Option<String>, Candidate)>>,
}

impl ModelMenu {
    /// The organizations the menu has candidates for that `orgs` lacks (their candidates go
    /// unused).
    pub fn strangers(&self, orgs: &HashMap<String, OrgData>) -> Vec<&str> {
        self.candidates
            .keys()
            .filter(|org| !orgs.contains_key(*org))
            .map(String::as_str)
            .collect()
    }
}

/// How to run the bench.
#[derive(Debug, Clone)]
pub struct PipelineConfig {
    pub rounds: usize,
    /// Seeds the contexts, the answers and the policies' draws.
    pub seed: u64,
    /// Feedback is applied (and the posterior bank refreshed) every this many rounds.
    pub feedback_batch: usize,
    /// The first rounds reported apart (cold start).
    pub cold_start: usize,
    /// Serving's policy configuration.
    pub policy: PolicyConfig,
    /// Points of each arm's acceptance curve.
    pub curve_points: usize,
    /// What every bandit arm learns before round 1 ([`warm_start`]); `None` starts each from
    /// nothing.
    pub warm_start: Option<PipelineWarmStart>,
}

/// The platform's logged decisions as serving's warm start learns them, for every organization
/// of the world.
#[derive(Debug, Clone, Default)]
pub struct PipelineWarmStart {
    /// Every organization's matched decisions, stamped at the traffic's first round.
    pub observations: Vec<Observation>,
    /// Read, matched and matched by lever, over all organizations.
    pub counts: WarmStartCounts,
}

/// Serving's warm start for the bench: each organization's `logged` decisions placed in its
/// failure clusters and matched to its candidates (`recommend::warm_start::observations`, as a
/// learner does for a new organization), all stamped at clock 0, where the traffic starts — the
/// log counts alike and as old as its end, as in serving. Decisions of an organization `orgs`
/// lacks are read, not matched.
pub fn warm_start(orgs: &HashMap<String, OrgData>, logged: &[LoggedDecision]) -> PipelineWarmStart {
    let mut by_org: std::collections::BTreeMap<&str, Vec<LoggedDecision>> = Default::default();
    for decision in logged {
        by_org
            .entry(decision.org.as_str())
            .or_default()
            .push(decision.clone());
    }
    let mut warm = PipelineWarmStart::default();
    for (org, decisions) in by_org {
        let Some(data) = orgs.get(org) else {
            warm.counts.logged += decisions.len() as u64;
            continue;
        };
        let (learned, counts) = observations(&data.index, data.clusters.as_ref(), &decisions);
        warm.counts.logged += counts.logged;
        warm.counts.matched += counts.matched;
        warm.counts.lever_matched += counts.lever_matched;
        warm.observations
            .extend(learned.into_iter().map(|o| Observation {
                timestamp_s: 0.0,
                ..o
            }));
    }
    warm
}

/// What an arm does with its menu.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ArmKind {
    /// Serving's Thompson-sampling bandit, learning from its answers.
    Thompson,
    /// A uniformly random candidate of the menu.
    Random,
    /// The candidate of the menu the world most likely accepts.
    Oracle,
}

/// One arm's results. Acceptance figures are the world's true acceptance probability of the
/// shown top-1 (0 for a round with nothing to show), averaged.
#[derive(Debug, Clone, Serialize)]
pub struct ArmResult {
    pub arm: String,
    pub kind: ArmKind,
    /// The menu: `heuristics` or `heuristics + <model>`.
    pub menu: String,
    /// The first `cold_start` rounds.
    pub cold_start: f64,
    /// The last quarter of the rounds.
    pub last_quarter: f64,
    pub all: f64,
    /// Drawn answers' acceptance rate in the last quarter (what feedback saw).
    pub drawn_last_quarter: f64,
    /// Share of the last quarter's top-1 picks that were the model's candidates.
    pub model_share_last_quarter: f64,
    /// Mean true acceptance of the last quarter's model-sourced picks (`None`: none).
    pub model_pick_acceptance: Option<f64>,
    /// Mean true acceptance of the last quarter's heuristic picks (`None`: none).
    pub heuristic_pick_acceptance: Option<f64>,
    /// Why a bandit arm's last-quarter model-sourced picks were picked (`None` for random order
    /// and the oracles).
    pub model_picks_by_reason: Option<PicksByReason>,
    /// A bandit arm with a model's candidates, round by round against the heuristics-only
    /// bandit (a) in the last quarter (`None` for (a) itself, random order and the oracles).
    pub against_heuristics_arm: Option<PairedRounds>,
    /// How well the model's priced ideas' priors told their worth, over every round's menu
    /// (bandit arms with a model's candidates only; `None` also when no idea was priced).
    pub prior_quality: Option<PriorQuality>,
    /// Rounds the arm could not rank (a bandit error); must be 0.
    pub errors: usize,
    /// Mean model candidates on the menu per round.
    pub mean_model_candidates: f64,
    /// (round, mean true acceptance over the rounds since the previous point).
    pub curve: Vec<(f64, f64)>,
}

/// Why a bandit put a candidate first: its ε-uniform order, or its posterior draw — which
/// either agreed with the posterior mean's first (the model's estimate preferred it) or not
/// (the draw explored).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PickReason {
    /// The ε-uniform order.
    Uniform,
    /// The draw put first what the posterior mean also ranks first.
    Mean,
    /// The draw put first what the posterior mean does not.
    Draw,
}

/// One reason's model-sourced picks in the last quarter.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct ReasonPicks {
    pub picks: usize,
    /// Their mean true acceptance.
    pub acceptance: Option<f64>,
    /// The mean true acceptance of what the posterior mean ranked first in the same rounds
    /// (for `mean`, the best heuristic by the mean instead: what the pick displaced).
    pub alternative_acceptance: Option<f64>,
    /// Their mean score (the posterior mean with the candidate's prior and corrections) less
    /// their true acceptance: how far the bandit overrated what it picked.
    pub overrating: Option<f64>,
}

/// A bandit arm's last-quarter model-sourced picks, by [`PickReason`]: where an arm that adds
/// a model's candidates loses to the heuristics-only arm.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct PicksByReason {
    pub uniform: ReasonPicks,
    pub mean: ReasonPicks,
    pub draw: ReasonPicks,
}

/// A model arm's last quarter paired round by round with the heuristics-only bandit (a): every
/// arm sees the same contexts, so the arm's true acceptance less (a)'s in the same round is its
/// gain there, split by where its own top-1 came from. `model_rounds × model_gain +
/// heuristic_rounds × heuristic_gain` is the whole last quarter's gain over (a) (in rounds):
/// the first part is what showing the model's ideas gained or lost against what (a) showed
/// instead (a paired form of the model-versus-heuristic picks), the second what the model's
/// answers changed in how the arm ranks the heuristics.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct PairedRounds {
    /// Rounds whose top-1 was a model idea.
    pub model_rounds: usize,
    /// Their mean true acceptance less (a)'s top-1 in the same rounds (`None`: no such round).
    pub model_gain: Option<f64>,
    /// Rounds whose top-1 was a heuristic.
    pub heuristic_rounds: usize,
    /// Their mean true acceptance less (a)'s top-1 in the same rounds (`None`: no such round).
    pub heuristic_gain: Option<f64>,
}

/// How well a model menu's priors (the learned grader's P(accept) that `arc-rec candidates`
/// stored with each idea) told the ideas' true worth, over every round's menu: each (round,
/// priced idea) is one pair of prior mean and the world's true acceptance in that round's
/// context. What serving ranks an unseen idea by until feedback prices it, so a prior that
/// cannot tell a good idea from a bad one leaves the bandit to learn each by showing it.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct PriorQuality {
    /// (round, priced idea) pairs.
    pub pairs: usize,
    /// Mean prior P(accept) over the pairs.
    pub mean_prior: f64,
    /// Mean true acceptance over the pairs (`mean_prior` less it: how far the priors overrate).
    pub mean_truth: f64,
    /// Pearson correlation of prior and truth over the pairs (`None`: either is constant).
    pub correlation: Option<f64>,
    /// Of the pairs of priced ideas in the same round whose true acceptance differs, the share
    /// the priors order the same way (ties in prior count half): 0.5 is no ranking power, 1
    /// orders every such pair right (`None`: no such pair).
    pub concordance: Option<f64>,
    /// Mean true acceptance of the idea with the highest prior in each round.
    pub prior_first_truth: f64,
    /// Mean true acceptance of the truly best priced idea in each round.
    pub best_truth: f64,
}

/// Sums for a [`PriorQuality`], a round's priced ideas at a time.
#[derive(Debug, Clone, Copy, Default)]
struct PriorTally {
    pairs: usize,
    prior: f64,
    truth: f64,
    prior_sq: f64,
    truth_sq: f64,
    cross: f64,
    ordered_pairs: usize,
    concordant: f64,
    rounds: usize,
    prior_first_truth: f64,
    best_truth: f64,
}

impl PriorTally {
    /// One round's priced ideas: (prior mean, true acceptance) each.
    fn add_round(&mut self, ideas: &[(f64, f64)]) {
        let Some(&(_, first_truth)) = ideas
            .iter()
            .reduce(|best, x| if x.0 > best.0 { x } else { best })
        else {
            return;
        };
        self.rounds += 1;
        self.prior_first_truth += first_truth;
        self.best_truth += ideas.iter().map(|x| x.1).fold(f64::NEG_INFINITY, f64::max);
        for (i, &(prior, truth)) in ideas.iter().enumerate() {
            self.pairs += 1;
            self.prior += prior;
            self.truth += truth;
            self.prior_sq += prior * prior;
            self.truth_sq += truth * truth;
            self.cross += prior * truth;
            for &(other_prior, other_truth) in &ideas[i + 1..] {
                if truth == other_truth {
                    continue;
                }
                self.ordered_pairs += 1;
                self.concordant += if prior == other_prior {
                    0.5
                } else if (prior > other_prior) == (truth > other_truth) {
                    1.0
                } else {
                    0.0
                };
            }
        }
    }

    fn finish(&self) -> Option<PriorQuality> {
        if self.pairs == 0 {
            return None;
        }
        let n = self.pairs as f64;
        let (mean_prior, mean_truth) = (self.prior / n, self.truth / n);
        let var_prior = self.prior_sq / n - mean_prior * mean_prior;
        let var_truth = self.truth_sq / n - mean_truth * mean_truth;
        let covariance = self.cross / n - mean_prior * mean_truth;
        let correlation = (var_prior > 1e-12 && var_truth > 1e-12)
            .then(|| (covariance / (var_prior * var_truth).sqrt()).clamp(-1.0, 1.0));
        let rounds = self.rounds as f64;
        Some(PriorQuality {
            pairs: self.pairs,
            mean_prior,
            mean_truth,
            correlation,
            concordance: (self.ordered_pairs > 0)
                .then(|| self.concordant / self.ordered_pairs as f64),
            prior_first_truth: self.prior_first_truth / rounds,
            best_truth: self.best_truth / rounds,
        })
    }
}

/// How one Thompson round's pick came about (see [`PickReason`]).
#[derive(Debug, Clone, Copy, PartialEq)]
struct PickTrace {
    reason: PickReason,
    /// The pick's mean score less its true acceptance.
    overrating: f64,
    /// The true acceptance of the alternative ([`ReasonPicks::alternative_acceptance`]).
    alternative: Option<f64>,
}

/// The whole report.
#[derive(Debug, Clone, Serialize)]
pub struct PipelineReport {
    pub rounds: usize,
    pub seed: u64,
    pub cold_start_rounds: usize,
    pub last_quarter_rounds: usize,
    pub mean_heuristic_candidates: f64,
    /// Rounds whose context had no clustering model or could not be placed (then ranked
    /// without a cluster, as serving does).
    pub unplaced_rounds: usize,
    /// The logged decisions every bandit arm learned before round 1 (`None`: none).
    pub warm_start: Option<WarmStartCounts>,
    pub arms: Vec<ArmResult>,
}

/// One arm's running state.
struct Arm {
    name: String,
    kind: ArmKind,
    /// Index into the menus: 0 = heuristics only, i = heuristics + model i − 1.
    menu: usize,
    policy: Option<Box<ThompsonPolicy>>,
    pending: Vec<Observation>,
    /// Each priced candidate id's own evidence, and each model version's pooled (its
    /// corrections, as in serving).
    evidence: Evidence,
    rng: ChaCha8Rng,
    truth: Vec<f64>,
    drawn: Vec<bool>,
    from_model: Vec<Option<bool>>,
    /// Thompson arms: how each round's pick came about.
    traces: Vec<Option<PickTrace>>,
    errors: usize,
    model_candidates: usize,
}

/// Runs the bench: `orgs` holds each organization's serving data, `menus` the model menus.
pub fn run(
    environment: &Environment,
    orgs: &HashMap<String, OrgData>,
    menus: &[ModelMenu],
    config: &PipelineConfig,
) -> Result<PipelineReport, RecommendError> {
    let mut arms = arms(menus, config)?;
    let mut contexts = ChaCha8Rng::seed_from_u64(config.seed);
    let (mut heuristic_total, mut unplaced) = (0usize, 0usize);
    // One tally per model menu (menu i + 1 of the prepared ones; the heuristics' has no priors).
    let mut priors = vec![PriorTally::default(); menus.len()];
    let empty = Prepared {
        context: Vec::new(),
        candidates: Vec::new(),
    };
    for round in 0..config.rounds {
        let ctx = environment.next_context(&mut contexts);
        let prepared = org_menus(&ctx, orgs.get(&ctx.org), menus, &mut unplaced);
        heuristic_total += prepared.first().map_or(0, |p| p.candidates.len());
        // Every item's true acceptance in this context, once per menu: the priors' tally, the
        // oracle arms and every arm's pick read it.
        let truths = menu_truths(environment, &ctx, &prepared);
        for ((menu, truth), tally) in prepared.iter().zip(&truths).skip(1).zip(&mut priors) {
            let priced: Vec<(f64, f64)> = menu
                .candidates
                .iter()
                .zip(truth)
                .filter_map(|((c, _), &truth)| Some((c.source.prior()?.mean, truth)))
                .collect();
            tally.add_round(&priced);
        }
        for arm in &mut arms {
            let menu = prepared.get(arm.menu).unwrap_or(&empty);
            let menu_truths = truths.get(arm.menu).map_or(&[][..], Vec::as_slice);
            arm.model_candidates += menu.candidates.iter().filter(|(c, _)| is_model(c)).count();
            play(arm, environment, &ctx, menu, menu_truths, round, config);
        }
    }
    let rounds = Rounds {
        heuristic_total,
        unplaced,
    };
    Ok(report(arms, menus, &priors, rounds, config))
}

/// Every arm, each with its own random stream: random order, the bandit on each menu, then the
/// oracle of each menu.
fn arms(menus: &[ModelMenu], config: &PipelineConfig) -> Result<Vec<Arm>, RecommendError> {
    let mut specs = vec![
        ("random heuristic order".to_owned(), ArmKind::Random, 0),
        ("(a) heuristics".to_owned(), ArmKind::Thompson, 0),
    ];
    for (i, menu) in menus.iter().enumerate() {
        specs.push((format!("+ {}", menu.name), ArmKind::Thompson, i + 1));
    }
    specs.push(("menu oracle: heuristics".to_owned(), ArmKind::Oracle, 0));
    for (i, menu) in menus.iter().enumerate() {
        specs.push((
            format!("menu oracle: + {}", menu.name),
            ArmKind::Oracle,
            i + 1,
        ));
    }
    specs
        .into_iter()
        .enumerate()
        .map(|(i, (name, kind, menu))| new_arm(name, kind, menu, i as u64 + 1, config))
        .collect()
}

/// An arm on `menu` drawing from random stream `stream`; a bandit arm starts warm when the run
/// does.
fn new_arm(
    name: String,
    kind: ArmKind,
    menu: usize,
    stream: u64,
    config: &PipelineConfig,
) -> Result<Arm, RecommendError> {
    let policy = match kind {
        ArmKind::Thompson => {
            let mut policy = ThompsonPolicy::new(layout(), config.policy)?;
            if let Some(warm) = &config.warm_start {
                policy.rebuild(&warm.observations, 0.0)?;
            }
            policy.refresh_bank_seeded(config.seed ^ 0x5eed);
            Some(Box::new(policy))
        }
        ArmKind::Random | ArmKind::Oracle => None,
    };
    Ok(Arm {
        name,
        kind,
        menu,
        policy,
        pending: Vec::new(),
        evidence: Evidence::default(),
        rng: ChaCha8Rng::seed_from_u64(config.seed.wrapping_mul(31).wrapping_add(stream)),
        truth: Vec::with_capacity(config.rounds),
        drawn: Vec::with_capacity(config.rounds),
        from_model: Vec::with_capacity(config.rounds),
        traces: Vec::with_capacity(config.rounds),
        errors: 0,
        model_candidates: 0,
    })
}

/// Each menu item's true acceptance in `ctx`, menu by menu.
fn menu_truths(environment: &Environment, ctx: &Context, prepared: &[Prepared]) -> Vec<Vec<f64>> {
    prepared
        .iter()
        .map(|menu| {
            menu.candidates
                .iter()
                .map(|(c, _)| environment.acceptance_probability(ctx, &c.diff))
                .collect()
        })
        .collect()
}

/// What the rounds counted beside the arms.
#[derive(Debug, Clone, Copy)]
struct Rounds {
    /// Heuristic candidates over all rounds.
    heuristic_total: usize,
    /// Rounds whose context could not be placed.
    unplaced: usize,
}

/// The report of the arms after the last round.
fn report(
    arms: Vec<Arm>,
    menus: &[ModelMenu],
    priors: &[PriorTally],
    rounds: Rounds,
    config: &PipelineConfig,
) -> PipelineReport {
    let menu_names: Vec<String> = std::iter::once("heuristics".to_owned())
        .chain(menus.iter().map(|m| format!("heuristics + {}", m.name)))
        .collect();
    let quarter = (config.rounds / 4).max(1).min(config.rounds);
    let cold = config.cold_start.min(config.rounds);
    // (a), the bandit on the heuristics alone: what every model arm is paired with.
    let heuristics_arm: Option<Vec<f64>> = arms
        .iter()
        .find(|a| a.kind == ArmKind::Thompson && a.menu == 0)
        .map(|a| a.truth.clone());
    let results = arms
        .into_iter()
        .map(|arm| {
            let prior_quality = arm
                .menu
                .checked_sub(1)
                .and_then(|i| priors.get(i))
                .and_then(PriorTally::finish);
            summarize(
                arm,
                &menu_names,
                cold,
                quarter,
                heuristics_arm.as_deref(),
                prior_quality,
                config,
            )
        })
        .collect();
    PipelineReport {
        rounds: config.rounds,
        seed: config.seed,
        cold_start_rounds: cold,
        last_quarter_rounds: quarter,
        mean_heuristic_candidates: rounds.heuristic_total as f64 / config.rounds.max(1) as f64,
        unplaced_rounds: rounds.unplaced,
        warm_start: config.warm_start.as_ref().map(|w| w.counts),
        arms: results,
    }
}

fn is_model(candidate: &Candidate) -> bool {
    matches!(candidate.source, CandidateSource::Model { .. })
}

/// The context's menus, prepared as serving prepares a request: heuristics only, then with each
/// model's candidates for the context's cluster. An organization the database does not know
/// gets empty menus.
fn org_menus(
    ctx: &Context,
    org: Option<&OrgData>,
    menus: &[ModelMenu],
    unplaced: &mut usize,
) -> Vec<Prepared> {
    let Some(org) = org else {
        return Vec::new();
    };
    let mut input = input_of(ctx);
    let placement = org.clusters.as_ref().and_then(|model| {
        place(model, ctx.embedding.as_deref(), &input.failures)
            .ok()
            .flatten()
    });
    if placement.is_none() {
        *unplaced += 1;
    }
    let cluster = placement.as_ref().map(|p| p.cluster_id.clone());
    input.cluster_key = placement.as_ref().map(|p| p.label.clone());
    input.reduced_embedding = placement.map(|p| p.reduced);
    let mut prepared = vec![prepare(&org.index, &input)];
    for menu in menus {
        input.model_candidates = menu
            .candidates
            .get(&ctx.org)
            .into_iter()
            .flatten()
            .filter(|(for_cluster, _)| for_cluster.is_none() || *for_cluster == cluster)
            .map(|(_, c)| c.clone())
            .collect();
        prepared.push(prepare(&org.index, &input));
    }
    prepared
}

/// One round of one arm: pick, draw the answer, record, learn. `truths` is each menu item's
/// true acceptance in `ctx`.
fn play(
    arm: &mut Arm,
    environment: &Environment,
    ctx: &Context,
    menu: &Prepared,
    truths: &[f64],
    round: usize,
    config: &PipelineConfig,
) {
    let (pick, trace) = pick(arm, menu, truths);
    arm.traces.push(trace);
    let Some(pick) = pick else {
        arm.truth.push(0.0);
        arm.drawn.push(false);
        arm.from_model.push(None);
        return;
    };
    let candidate = &menu.candidates[pick].0;
    let truth = truths[pick];
    let answer = environment.feedback(ctx, &candidate.diff, &mut arm.rng);
    arm.truth.push(truth);
    arm.drawn.push(answer.accepted);
    arm.from_model.push(Some(is_model(candidate)));
    learn(arm, menu, pick, answer.accepted, round, config);
}

/// The arm's pick of `menu` (an index; `None`: nothing shown) and, for a bandit's model-sourced
/// pick, how it came about.
fn pick(arm: &mut Arm, menu: &Prepared, truths: &[f64]) -> (Option<usize>, Option<PickTrace>) {
    let items = menu.candidates.len();
    match arm.kind {
        _ if items == 0 => (None, None),
        ArmKind::Random => (Some(arm.rng.random_range(0..items)), None),
        ArmKind::Oracle => (first_best(truths), None),
        ArmKind::Thompson => {
            let seed = arm.rng.random();
            let ranked = arm
                .policy
                .as_deref()
                .map(|policy| rank(policy, menu.clone(), 1, seed, &arm.evidence, None));
            let Some(Ok(output)) = ranked else {
                arm.errors += 1;
                return (None, None);
            };
            let first = output.shown.first();
            let mut trace = None;
            if let (Some(shown), Some(policy)) = (first, arm.policy.as_deref())
                && is_model(&shown.candidate)
            {
                trace = trace_pick(policy, &arm.evidence, menu, &output.ranking, shown, |i| {
                    truths[i]
                });
                if trace.is_none() {
                    arm.errors += 1;
                }
            }
            (first.map(|s| s.item.candidate), trace)
        }
    }
}

/// A bandit arm learns the answer to its pick of `menu`: a priced candidate's evidence at once,
/// the policy in batches (its draws refreshed after each).
fn learn(
    arm: &mut Arm,
    menu: &Prepared,
    pick: usize,
    accepted: bool,
    round: usize,
    config: &PipelineConfig,
) {
    let Some(policy) = arm.policy.as_deref_mut() else {
        return;
    };
    let (candidate, features) = &menu.candidates[pick];
    let prior = candidate.source.prior();
    let observation = Observation {
        id: format!("{round}"),
        timestamp_s: round as f64 * 60.0,
        context: menu.context.clone(),
        candidate: features.clone(),
        reward: learning_reward(accepted, prior.map(|p| p.mean)),
    };
    if prior.is_some()
        && arm
            .evidence
            .record(
                policy.layout(),
                &candidate.candidate_id,
                candidate.source.model_version_id(),
                &observation,
            )
            .is_err()
    {
        arm.errors += 1;
    }
    arm.pending.push(observation);
    if arm.pending.len() >= config.feedback_batch {
        for observation in arm.pending.drain(..) {
            if policy.update(&observation).is_err() {
                arm.errors += 1;
            }
        }
        policy.refresh_bank_seeded(config.seed.wrapping_add(round as u64));
    }
}

/// How a Thompson arm's model-sourced pick `shown` came about: ε's uniform order, or the draw —
/// agreeing with the posterior mean's first or not — with the true acceptance (`truth` of a
/// menu index) of what it displaced. `None` when the means cannot be computed (the ranking
/// itself would have failed first).
fn trace_pick(
    policy: &ThompsonPolicy,
    evidence: &Evidence,
    menu: &Prepared,
    ranking: &bandit::Ranking,
    shown: &super::engine::Shown,
    truth: impl Fn(usize) -> f64,
) -> Option<PickTrace> {
    let offsets = offsets_for(policy, &menu.candidates, evidence).ok()?;
    let means: Vec<f64> = menu
        .candidates
        .iter()
        .enumerate()
        .map(|(i, (_, c))| {
            policy
                .mean_score(&menu.context, c)
                .map(|m| m + offsets.get(i).map_or(0.0, |o| o.mean))
        })
        .collect::<Result<_, _>>()
        .ok()?;
    let best = |keep: &dyn Fn(usize) -> bool| {
        (0..means.len())
            .filter(|&i| keep(i))
            .max_by(|&a, &b| means[a].total_cmp(&means[b]))
    };
    let pick = shown.item.candidate;
    let mean_first = best(&|_| true)?;
    let (reason, alternative) = if ranking.explored {
        (PickReason::Uniform, Some(mean_first))
    } else if mean_first == pick {
        let heuristic = best(&|i| !is_model(&menu.candidates[i].0));
        (PickReason::Mean, heuristic)
    } else {
        (PickReason::Draw, Some(mean_first))
    };
    Some(PickTrace {
        reason,
        overrating: means[pick] - truth(pick),
        alternative: alternative.map(truth),
    })
}

fn mean(values: impl Iterator<Item = f64>) -> Option<f64> {
    let (mut n, mut sum) = (0usize, 0.0);
    for v in values {
        n += 1;
        sum += v;
    }
    (n > 0).then(|| sum / n as f64)
}

/// `arm`'s rounds from `tail` on, each less `heuristics_arm`'s true acceptance in the same
/// round, split by the source of `arm`'s top-1 (see [`PairedRounds`]).
fn paired_rounds(arm: &Arm, heuristics_arm: &[f64], tail: usize) -> PairedRounds {
    let gains = |from_model: bool| -> Vec<f64> {
        (tail..arm.truth.len())
            .filter(|&i| arm.from_model[i] == Some(from_model))
            .filter_map(|i| heuristics_arm.get(i).map(|base| arm.truth[i] - base))
            .collect()
    };
    let (model, heuristic) = (gains(true), gains(false));
    PairedRounds {
        model_rounds: model.len(),
        model_gain: mean(model.iter().copied()),
        heuristic_rounds: heuristic.len(),
        heuristic_gain: mean(heuristic.iter().copied()),
    }
}

fn summarize(
    arm: Arm,
    menu_names: &[String],
    cold: usize,
    quarter: usize,
    heuristics_arm: Option<&[f64]>,
    prior_quality: Option<PriorQuality>,
    config: &PipelineConfig,
) -> ArmResult {
    let rounds = arm.truth.len();
    let tail = rounds.saturating_sub(quarter);
    let last = || (tail..rounds).map(|i| (arm.truth[i], arm.from_model[i]));
    let picks = last().filter(|(_, m)| m.is_some()).count();
    let by_reason = |reason: PickReason| {
        let traced: Vec<(f64, PickTrace)> = (tail..rounds)
            .filter(|&i| arm.from_model[i] == Some(true))
            .filter_map(|i| {
                arm.traces
                    .get(i)
                    .copied()
                    .flatten()
                    .map(|t| (arm.truth[i], t))
            })
            .filter(|(_, t)| t.reason == reason)
            .collect();
        ReasonPicks {
            picks: traced.len(),
            acceptance: mean(traced.iter().map(|(truth, _)| *truth)),
            alternative_acceptance: mean(traced.iter().filter_map(|(_, t)| t.alternative)),
            overrating: mean(traced.iter().map(|(_, t)| t.overrating)),
        }
    };
    let model_picks_by_reason = (arm.kind == ArmKind::Thompson).then(|| PicksByReason {
        uniform: by_reason(PickReason::Uniform),
        mean: by_reason(PickReason::Mean),
        draw: by_reason(PickReason::Draw),
    });
    let against_heuristics_arm = heuristics_arm
        .filter(|_| arm.kind == ArmKind::Thompson && arm.menu > 0)
        .map(|base| paired_rounds(&arm, base, tail));
    let model_picks = last().filter(|(_, m)| *m == Some(true)).count();
    let points = config.curve_points.clamp(1, rounds.max(1));
    let width = rounds.div_ceil(points).max(1);
    let curve = arm
        .truth
        .chunks(width)
        .enumerate()
        .filter_map(|(i, chunk)| {
            mean(chunk.iter().copied()).map(|m| ((i * width + chunk.len()) as f64, m))
        })
        .collect();
    ArmResult {
        menu: menu_names.get(arm.menu).cloned().unwrap_or_default(),
        kind: arm.kind,
        cold_start: mean(arm.truth[..cold.min(rounds)].iter().copied()).unwrap_or(0.0),
        last_quarter: mean(arm.truth[tail..].iter().copied()).unwrap_or(0.0),
        all: mean(arm.truth.iter().copied()).unwrap_or(0.0),
        drawn_last_quarter: mean(arm.drawn[tail..].iter().map(|&a| f64::from(u8::from(a))))
            .unwrap_or(0.0),
        model_share_last_quarter: if picks == 0 {
            0.0
        } else {
            model_picks as f64 / picks as f64
        },
        model_pick_acceptance: mean(last().filter(|(_, m)| *m == Some(true)).map(|(t, _)| t)),
        heuristic_pick_acceptance: mean(last().filter(|(_, m)| *m == Some(false)).map(|(t, _)| t)),
        model_picks_by_reason,
        against_heuristics_arm,
        prior_quality: prior_quality.filter(|_| arm.kind == ArmKind::Thompson && arm.menu > 0),
        errors: arm.errors,
        mean_model_candidates: arm.model_candidates as f64 / rounds.max(1) as f64,
        curve,
        arm: arm.name,
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::domain::{CandidatePrior, RecommendationType};
    use crate::world::{World, WorldParams};

    fn world() -> World {
        World::new(WorldParams {
            seed: 5,
            outcomes: 300,
            ..WorldParams::default()
        })
        .unwrap()
    }

    fn orgs(world: &World) -> HashMap<String, OrgData> {
        world
            .params()
            .orgs
            .iter()
            .map(|org| {
                let data = OrgData {
                    index: CandidateIndex::empty(org),
                    clusters: None,
                };
                (org.clone(), data)
            })
            .collect()
    }

    /// One model idea for every organization: a longer timeout, priced at `prior`.
    fn menu(world: &World, name: &str, prior: Option<CandidatePrior>) -> ModelMenu {
        let diff = json!({"timeout_s": 600});
        let kind = RecommendationType::TimeoutAdjustment;
        let candidate = Candidate {
            candidate_id: Candidate::id_for(kind, &diff),
            recommendation_type: kind,
            diff,
            description: "model idea".into(),
            expected_reliability_delta: 0.0,
            expected_cost_delta_usd: 0.0,
            evidence_count: 0,
            source: CandidateSource::Model {
                model_version_id: name.into(),
                prior,
            },
        };
        ModelMenu {
            name: name.into(),
            candidates: world
                .params()
                .orgs
                .iter()
                .map(|org| (org.clone(), vec![(None, candidate.clone())]))
                .collect(),
        }
    }

    fn config(rounds: usize) -> PipelineConfig {
        PipelineConfig {
            rounds,
            seed: 3,
            feedback_batch: 10,
            cold_start: 50,
            policy: crate::recommend::features::policy_config(),
            curve_points: rounds,
            warm_start: None,
        }
    }

    fn arm<'a>(report: &'a PipelineReport, name: &str) -> &'a ArmResult {
        report.arms.iter().find(|a| a.arm == name).unwrap()
    }

    #[test]
    fn arms_report_their_windows_sources_and_menus_consistently() {
        let world = world();
        let environment = Environment::new(&world);
        let menus = [
            menu(&world, "m1", Some(CandidatePrior { mean: 0.8, sd: 0.1 })),
            menu(&world, "m2", None),
        ];
        let report = run(&environment, &orgs(&world), &menus, &config(400)).unwrap();
        assert!(report.mean_heuristic_candidates > 1.0, "{report:?}");
        assert_eq!(report.arms.len(), 7);
        for a in &report.arms {
            assert_eq!(a.errors, 0, "{a:?}");
            // The curve has one point per round here: the windows are its means.
            let values: Vec<f64> = a.curve.iter().map(|(_, v)| *v).collect();
            assert_eq!(values.len(), 400);
            let cold: f64 = values[..50].iter().sum::<f64>() / 50.0;
            let last: f64 = values[300..].iter().sum::<f64>() / 100.0;
            assert!((a.cold_start - cold).abs() < 1e-12, "{a:?}");
            assert!((a.last_quarter - last).abs() < 1e-12, "{a:?}");
            // The picks' acceptance splits by source and adds up to the arm's (every round
            // shows something here).
            let split = a.model_share_last_quarter * a.model_pick_acceptance.unwrap_or(0.0)
                + (1.0 - a.model_share_last_quarter) * a.heuristic_pick_acceptance.unwrap_or(0.0);
            assert!((split - a.last_quarter).abs() < 1e-9, "{a:?}");
            // Every last-quarter model pick of a bandit arm has one reason; the others have none.
            match (a.kind, a.model_picks_by_reason) {
                (ArmKind::Thompson, Some(by)) => {
                    let traced = by.uniform.picks + by.mean.picks + by.draw.picks;
                    let model_picks = (a.model_share_last_quarter * 100.0).round() as usize;
                    assert_eq!(traced, model_picks, "{a:?}");
                    for r in [by.uniform, by.mean, by.draw] {
                        assert_eq!(r.acceptance.is_some(), r.picks > 0, "{a:?}");
                        assert!(r.acceptance.is_none_or(|v| (0.0..=1.0).contains(&v)));
                    }
                }
                (ArmKind::Thompson, None) => panic!("a bandit arm without its reasons: {a:?}"),
                (_, by) => assert!(by.is_none(), "{a:?}"),
            }
        }
        // A model arm's rounds paired with (a) split its last-quarter gain over (a) by source
        // and add up to it; (a), random order and the oracles are paired with nothing.
        let heuristics_arm = arm(&report, "(a) heuristics");
        for name in ["+ m1", "+ m2"] {
            let a = arm(&report, name);
            let paired = a
                .against_heuristics_arm
                .expect("a model arm is paired with (a)");
            assert_eq!(paired.model_rounds + paired.heuristic_rounds, 100, "{a:?}");
            assert_eq!(
                paired.model_rounds,
                (a.model_share_last_quarter * 100.0).round() as usize
            );
            let gain = paired.model_rounds as f64 * paired.model_gain.unwrap_or(0.0)
                + paired.heuristic_rounds as f64 * paired.heuristic_gain.unwrap_or(0.0);
            let whole = 100.0 * (a.last_quarter - heuristics_arm.last_quarter);
            assert!((gain - whole).abs() < 1e-9, "{gain} against {whole}: {a:?}");
        }
        for a in report.arms.iter().filter(|a| !a.arm.starts_with('+')) {
            assert!(a.against_heuristics_arm.is_none(), "{a:?}");
            assert!(a.prior_quality.is_none(), "{a:?}");
        }
        // The priced menu's one idea every round: its prior is the constant 0.8, so no
        // correlation, no pair to order, and the prior's first is the best idea; the unpriced
        // menu has nothing to judge.
        let quality = arm(&report, "+ m1").prior_quality.expect("m1 is priced");
        assert_eq!(quality.pairs, 400);
        assert!((quality.mean_prior - 0.8).abs() < 1e-12, "{quality:?}");
        assert!((0.0..=1.0).contains(&quality.mean_truth), "{quality:?}");
        assert_eq!((quality.correlation, quality.concordance), (None, None));
        assert!((quality.prior_first_truth - quality.mean_truth).abs() < 1e-12);
        assert!((quality.best_truth - quality.mean_truth).abs() < 1e-12);
        assert!(arm(&report, "+ m2").prior_quality.is_none());
        // The priced idea is picked, and mostly because the mean (its prior 0.8) ranks it first.
        let priced = arm(&report, "+ m1").model_picks_by_reason.unwrap();
        assert!(
            priced.mean.picks > priced.draw.picks + priced.uniform.picks,
            "{priced:?}"
        );
        // Heuristic menus never show a model idea; the model menus hold the idea every round.
        for name in [
            "random heuristic order",
            "(a) heuristics",
            "menu oracle: heuristics",
        ] {
            let a = arm(&report, name);
            assert_eq!(a.model_share_last_quarter, 0.0, "{a:?}");
            assert_eq!(a.mean_model_candidates, 0.0, "{a:?}");
            assert_eq!(a.menu, "heuristics");
        }
        assert_eq!(arm(&report, "+ m1").mean_model_candidates, 1.0);
        assert_eq!(arm(&report, "+ m1").menu, "heuristics + m1");
        // The menu oracle is at least every pick from its menu, round by round.
        let oracle = arm(&report, "menu oracle: heuristics");
        for other in ["random heuristic order", "(a) heuristics"] {
            let other = arm(&report, other);
            for (o, x) in oracle.curve.iter().zip(&other.curve) {
                assert!(o.1 >= x.1 - 1e-12);
            }
        }
        // A richer menu's oracle is at least the poorer one's.
        let richer = arm(&report, "menu oracle: + m1");
        assert!(richer.all >= oracle.all - 1e-12);
        // The same seed gives the same report.
        let again = run(&environment, &orgs(&world), &menus, &config(400)).unwrap();
        assert_eq!(
            serde_json::to_string(&report).unwrap(),
            serde_json::to_string(&again).unwrap()
        );
    }

    #[test]
    fn prior_quality_pairs_each_rounds_priors_with_their_truth() {
        let mut tally = PriorTally::default();
        // Round 1 ordered right, round 2 wrong, round 3 a tie in prior (half), round 4 a tie
        // in truth (not a pair to order), round 5 nothing priced (not a round).
        let rounds: [&[(f64, f64)]; 5] = [
            &[(0.9, 0.8), (0.1, 0.2)],
            &[(0.5, 0.1), (0.4, 0.6)],
            &[(0.3, 0.5), (0.3, 0.7)],
            &[(0.2, 0.4), (0.6, 0.4)],
            &[],
        ];
        for round in rounds {
            tally.add_round(round);
        }
        let q = tally.finish().unwrap();
        let pairs: Vec<(f64, f64)> = rounds.iter().flat_map(|r| r.iter().copied()).collect();
        assert_eq!(q.pairs, 8);
        let n = pairs.len() as f64;
        let (mp, mt) = (
            pairs.iter().map(|p| p.0).sum::<f64>() / n,
            pairs.iter().map(|p| p.1).sum::<f64>() / n,
        );
        let cov = pairs.iter().map(|p| (p.0 - mp) * (p.1 - mt)).sum::<f64>();
        let sp = pairs.iter().map(|p| (p.0 - mp).powi(2)).sum::<f64>().sqrt();
        let st = pairs.iter().map(|p| (p.1 - mt).powi(2)).sum::<f64>().sqrt();
        assert!((q.mean_prior - mp).abs() < 1e-12 && (q.mean_truth - mt).abs() < 1e-12);
        assert!(
            (q.correlation.unwrap() - cov / (sp * st)).abs() < 1e-9,
            "{q:?}"
        );
        assert!((q.concordance.unwrap() - 1.5 / 3.0).abs() < 1e-12, "{q:?}");
        // The prior's firsts: 0.8, 0.1, the first of the tie (0.5), 0.4; the best: 0.8, 0.6,
        // 0.7, 0.4.
        assert!((q.prior_first_truth - (0.8 + 0.1 + 0.5 + 0.4) / 4.0).abs() < 1e-12);
        assert!((q.best_truth - (0.8 + 0.6 + 0.7 + 0.4) / 4.0).abs() < 1e-12);
        assert!(PriorTally::default().finish().is_none());
    }

    #[test]
    fn every_bandit_arm_starts_from_the_logged_decisions_as_serving_does() {
        let world = world();
        let environment = Environment::new(&world);
        let orgs = orgs(&world);
        let mut config = config(60);
        config.cold_start = 60;
        // No feedback within these rounds: what the arms know is the log.
        config.feedback_batch = 1_000;
        // People approved, in each of these contexts, the heuristic candidate the world likes
        // best and rejected the others, 20 times over.
        let indexes = orgs
            .iter()
            .map(|(org, data)| (org.clone(), data.index.clone()))
            .collect();
        let mut logged = crate::recommend::benchmark::oracle_log(
            &environment,
            &indexes,
            config.seed,
            config.rounds,
        );
        let matched = logged.len() as u64;
        // An organization outside the world: read, not learned.
        let mut stranger = logged[0].clone();
        stranger.org = "nobody".into();
        logged.push(stranger);
        let warm = warm_start(&orgs, &logged);
        let counts = WarmStartCounts {
            logged: matched + 1,
            matched,
            lever_matched: 0,
        };
        assert_eq!(warm.counts, counts);
        assert_eq!(warm.observations.len() as u64, matched);
        // Counted alike, as of the traffic's start.
        assert!(warm.observations.iter().all(|o| o.timestamp_s == 0.0));

        let menus = [menu(&world, "m", None)];
        let cold = run(&environment, &orgs, &menus, &config).unwrap();
        assert_eq!(cold.warm_start, None);
        config.warm_start = Some(warm);
        let warmed = run(&environment, &orgs, &menus, &config).unwrap();
        assert_eq!(warmed.warm_start, Some(counts));
        let oracle = arm(&warmed, "menu oracle: heuristics").cold_start;
        let (with, without) = (
            arm(&warmed, "(a) heuristics").cold_start,
            arm(&cold, "(a) heuristics").cold_start,
        );
        assert!(
            with > without && with >= 0.9 * oracle,
            "warm {with}, cold {without}, oracle {oracle}"
        );
        // The model arm learned the same log: its heuristic picks are as good.
        assert!(arm(&warmed, "+ m").cold_start > arm(&cold, "+ m").cold_start);
        for a in &warmed.arms {
            assert_eq!(a.errors, 0, "{a:?}");
        }
    }

    #[test]
    fn a_high_prior_gets_the_model_idea_shown_at_cold_start() {
        let world = world();
        let environment = Environment::new(&world);
        let confident = [menu(
            &world,
            "m",
            Some(CandidatePrior { mean: 1e3, sd: 0.0 }),
        )];
        let mut config = config(100);
        config.cold_start = 100;
        // No feedback arrives within these rounds, so nothing corrects the prior yet.
        config.feedback_batch = 1_000;
        let report = run(&environment, &orgs(&world), &confident, &config).unwrap();
        // Absurdly confident: shown first in every round the bandit did not explore (ε = 5%).
        let a = arm(&report, "+ m");
        assert!(a.model_share_last_quarter >= 0.8, "{a:?}");
        let unpriced = [menu(&world, "m", None)];
        let report = run(&environment, &orgs(&world), &unpriced, &config).unwrap();
        assert!(arm(&report, "+ m").model_share_last_quarter < 0.8);
    }
}
