//! Thompson-sampling ranking with an ε floor, Monte-Carlo propensities and explanations.
//!
//! Requests never touch the d×d posterior. After updates the caller refreshes a bank of M
//! posterior draws Θ (M×d); a request then scores every candidate under every draw. Because
//! x = vec(z ⊗ c), x·θ = cᵀ(Θᵣᵀz) where Θᵣ is θ reshaped to |z|×|c|: contracting the bank with z
//! once (M·d) and multiplying by the candidate matrix (K×|c| by |c|×M) gives the same K×M score
//! matrix as the naive K×d by d×M product at a fraction of the cost.
//!
//! The policy: with probability 1−ε pick one bank draw uniformly and show the top k under it;
//! with probability ε show a uniformly random ordering. Since the draw is uniform over the bank,
//! the fraction of draws that put candidate a at position p *is* the probability of that event
//! under the TS branch, so the logged propensity
//! `P(a at p) = (1−ε)·count(a, p)/M + ε/K` is exact for the policy as run, sums to 1 over
//! candidates for every position, and is at least ε/K.

use std::collections::BTreeMap;
use std::fmt;

use ndarray::{Array2, Array3, Axis};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

use crate::error::{BanditError, Result};
use crate::features::{FeatureLayout, interaction_into};
use crate::model::{ModelKind, Observation, Posterior, dot};

/// Most posterior draws a bank may hold.
pub const MAX_MC_SAMPLES: usize = 65_536;

/// An observation may lie at most this many half-lives after the decay clock; its weight
/// 2^(Δt/half-life) stays below 2^64, harmless next to the 1e24 bound on feature products.
pub const MAX_HALF_LIVES_AHEAD: f64 = 64.0;

/// How the policy models, explores and forgets.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PolicyConfig {
    /// The likelihood: linear (default) or logistic with a Laplace approximation.
    pub model: ModelKind,
    /// λ, the prior precision: θ ~ N(0, v²λ⁻¹I) before any data.
    pub prior_precision: f64,
    /// v, the scale of posterior draws: θ̃ ~ N(μ, v²Λ⁻¹). The theoretical LinTS value is far too
    /// large in practice; 0.3–1 works, tune it off-policy.
    pub noise_scale: f64,
    /// ε, the probability of a uniformly random ordering (keeps every propensity ≥ ε/K).
    pub epsilon: f64,
    /// M, the number of posterior draws in the bank (and of Monte-Carlo propensity samples).
    pub mc_samples: usize,
    /// Half-life of evidence in seconds; `None` never forgets.
    pub half_life_s: Option<f64>,
}

impl Default for PolicyConfig {
    fn default() -> Self {
        Self {
            model: ModelKind::Linear,
            prior_precision: 1.0,
            noise_scale: 0.5,
            epsilon: 0.05,
            mc_samples: 256,
            half_life_s: Some(30.0 * 86_400.0),
        }
    }
}

impl PolicyConfig {
    /// Checks every field's range; the error names the field.
    pub fn validate(&self) -> Result<()> {
        let invalid = |field, reason: &str| {
            Err(BanditError::Invalid {
                field,
                reason: reason.to_owned(),
            })
        };
        if !(self.prior_precision.is_finite() && self.prior_precision > 0.0) {
            return invalid("prior_precision", "must be a finite number > 0");
        }
        if !(self.noise_scale.is_finite() && self.noise_scale > 0.0) {
            return invalid("noise_scale", "must be a finite number > 0");
        }
        if !(0.0..=1.0).contains(&self.epsilon) {
            return invalid("epsilon", "must lie in [0, 1]");
        }
        if !(1..=MAX_MC_SAMPLES).contains(&self.mc_samples) {
            return invalid("mc_samples", "must lie in 1..=65536");
        }
        if let Some(h) = self.half_life_s
            && !(h.is_finite() && h > 0.0)
        {
            return invalid("half_life_s", "must be a finite number > 0 (or absent)");
        }
        Ok(())
    }
}

/// Why one item scored as it did.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Explanation {
    /// Per feature group ("candidate", "cluster", "config", "user"), x_g·θ̃_g under the draw that
    /// produced the reported score, and "prior" for a candidate ranked with a non-zero
    /// [`ScoreOffset`] (its mean + sd·e under that draw); they sum to that score.
    pub contributions: BTreeMap<String, f64>,
    /// Posterior standard deviation of the score, v·sqrt(xᵀΛ⁻¹x), estimated from the bank's
    /// draws (see [`ThompsonPolicy::posterior_sd`] for the exact value).
    pub posterior_sd: f64,
}

/// One shown item.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RankedItem {
    /// Index into the request's candidate list.
    pub candidate: usize,
    /// 0-based position in the shown list.
    pub position: usize,
    /// x·θ̃ under the request's draw (expected reward, or log-odds for the logistic model).
    pub score: f64,
    /// x·μ, the posterior mean score.
    pub mean_score: f64,
    /// Probability that the policy puts this candidate at this position.
    pub propensity: f64,
    /// Per-group contributions and uncertainty.
    pub explanation: Explanation,
}

/// A candidate's own prior score, added to x·θ̃: `mean + sd·e` with e ~ N(0, 1) drawn per
/// posterior draw and candidate. A candidate the shared model knows nothing specific about (the
/// recommender model's new idea) enters at what another model (the learned grader) expects of
/// it, explored in proportion to that model's uncertainty. What the offset holds is the caller's
/// (serving: the prior mean, corrected by the candidate's own answers, with the shared model
/// learning the residual reward − prior mean, so the prior is never a second copy of the
/// evidence).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct ScoreOffset {
    /// Added to every draw's score (and to the mean score).
    pub mean: f64,
    /// Scale of the per-draw noise; 0 adds `mean` only.
    pub sd: f64,
}

impl ScoreOffset {
    /// Checks both fields are finite and `sd ≥ 0`; the error names candidate `index`.
    fn check(&self, index: usize) -> Result<()> {
        let bounded = |v: f64| v.is_finite() && v.abs() <= crate::MAX_ABS_VALUE;
        if !(bounded(self.mean) && bounded(self.sd) && self.sd >= 0.0) {
            return Err(BanditError::Invalid {
                field: "offsets",
                reason: format!(
                    "candidate {index}: mean {} and sd {} must be finite within ±1e6, sd ≥ 0",
                    self.mean, self.sd
                ),
            });
        }
        Ok(())
    }
}

/// A floor of exploration: with probability `share` the first slot goes to one of the `eligible`
/// candidates, drawn uniformly, and the rest of the list is the policy's own (its draw's order, or
/// the ε branch's shuffle) with that candidate left out; otherwise the policy ranks as usual.
/// Ideas nobody has answered yet (a new recommender model's) are then shown first in a share of
/// decisions, whatever the posterior thinks of them, and the logged propensities are still the
/// exact probabilities of the policy as run:
///
/// P(a at 0) = (1−s)·P_pol(a at 0) + s·[a ∈ U]/|U|, and for p ≥ 1
/// P(a at p) = (1−s)·P_pol(a at p) + s/|U| · Σ_{u ∈ U, u ≠ a} P_pol(a at p−1 of the list without u),
///
/// where P_pol is the Thompson-sampling-with-ε policy's probability (counted over the bank, as
/// for the plain ranking).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ExplorationFloor {
    /// s, the probability that the floor chooses the first item (0 turns it off).
    pub share: f64,
    /// U, indices into the request's candidates that the floor may put first; none turns it off.
    pub eligible: Vec<usize>,
}

impl ExplorationFloor {
    /// True when the floor can choose anything.
    fn active(&self) -> bool {
        self.share > 0.0 && !self.eligible.is_empty()
    }

    /// Checks `share` lies in [0, 1] and every eligible index is a candidate, once.
    fn check(&self, n: usize) -> Result<()> {
        let invalid = |reason: String| {
            Err(BanditError::Invalid {
                field: "floor",
                reason,
            })
        };
        if !(0.0..=1.0).contains(&self.share) {
            return invalid(format!("share {} must lie in [0, 1]", self.share));
        }
        let mut seen = vec![false; n];
        for &a in &self.eligible {
            match seen.get_mut(a) {
                None => return invalid(format!("eligible candidate {a} of {n} does not exist")),
                Some(true) => return invalid(format!("eligible candidate {a} is listed twice")),
                Some(flag) => *flag = true,
            }
        }
        Ok(())
    }
}

/// The answer to one ranking request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Ranking {
    /// The shown items, best first: min(k, K) of them.
    pub items: Vec<RankedItem>,
    /// True when the ε branch chose a uniformly random ordering.
    pub explored: bool,
    /// True when the [`ExplorationFloor`] chose the first item.
    #[serde(default)]
    pub floor_pick: bool,
    /// The bank draw whose scores are reported (and which ordered the list unless `explored`).
    pub draw: usize,
    /// Seed of the bank the ranking used; with the seed of the request and the policy state it
    /// reproduces the ranking.
    pub bank_seed: u64,
    /// `propensities[a][p]`: probability that candidate a is shown at position p, for every
    /// candidate (K rows of min(k, K)), so other policies can be evaluated off-line.
    pub propensities: Vec<Vec<f64>>,
}

/// A contextual Thompson-sampling ranker over a shared Bayesian model of x = vec(z ⊗ c).
#[derive(Clone)]
pub struct ThompsonPolicy {
    pub(crate) layout: FeatureLayout,
    pub(crate) config: PolicyConfig,
    pub(crate) posterior: Posterior,
    pub(crate) observations: u64,
    /// Time up to which evidence has been discounted; `None` before the first event.
    pub(crate) clock_s: Option<f64>,
    /// The M draws, laid out (|z|, M, |c|): bank[[i, m, j]] = θ̃ₘ[i·|c| + j]. Contracting with
    /// z is then |z| long axpys over contiguous M·|c| slabs.
    bank: Array3<f64>,
    pub(crate) bank_seed: u64,
    bank_stale: bool,
}

impl fmt::Debug for ThompsonPolicy {
    // The bank and the precision hold ~10⁵ numbers each; print their shape, not their contents.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ThompsonPolicy")
            .field("layout", &self.layout)
            .field("config", &self.config)
            .field("dim", &self.posterior.d)
            .field("observations", &self.observations)
            .field("clock_s", &self.clock_s)
            .field("bank_seed", &self.bank_seed)
            .field("bank_stale", &self.bank_stale)
            .finish_non_exhaustive()
    }
}

/// Scores of every candidate under every draw and the per-draw top-k counts.
struct BankScores {
    /// M×K row-major, row m = the scores under draw m.
    scores: Vec<f64>,
    /// K×k, count[a·k + p] = number of draws that put candidate a at position p.
    counts: Vec<u32>,
    /// K×k, summed over the floor's eligible u: draws that put candidate a at position p of
    /// the list headed by u (empty without a floor).
    floor_counts: Vec<u32>,
    /// The top-k list under `chosen` draw.
    chosen_top: Vec<usize>,
    k: usize,
}

impl ThompsonPolicy {
    /// A policy at its prior, with a bank drawn from seed 0.
    pub fn new(layout: FeatureLayout, config: PolicyConfig) -> Result<Self> {
        layout.validate()?;
        config.validate()?;
        let d = layout.dim();
        let posterior = Posterior::prior(config.model, d, config.prior_precision);
        Ok(Self::assemble(layout, config, posterior, 0, None, 0))
    }

    /// Builds a policy around a posterior and draws its bank from `bank_seed`.
    pub(crate) fn assemble(
        layout: FeatureLayout,
        config: PolicyConfig,
        posterior: Posterior,
        observations: u64,
        clock_s: Option<f64>,
        bank_seed: u64,
    ) -> Self {
        let mut policy = Self {
            bank: Array3::zeros((
                layout.context_dims(),
                config.mc_samples,
                layout.candidate_dims,
            )),
            layout,
            config,
            posterior,
            observations,
            clock_s,
            bank_seed,
            bank_stale: true,
        };
        policy.refresh_bank_seeded(bank_seed);
        policy
    }

    /// The feature layout.
    pub fn layout(&self) -> &FeatureLayout {
        &self.layout
    }

    /// The configuration.
    pub fn config(&self) -> &PolicyConfig {
        &self.config
    }

    /// d, the length of x and θ.
    pub fn dim(&self) -> usize {
        self.posterior.d
    }

    /// Observations applied since the prior (discounted ones included).
    pub fn observations(&self) -> u64 {
        self.observations
    }

    /// Time up to which evidence has been discounted (`last_decay_s`).
    pub fn clock_s(&self) -> Option<f64> {
        self.clock_s
    }

    /// Posterior mean μ.
    pub fn mean(&self) -> &[f64] {
        &self.posterior.mean
    }

    /// Posterior precision Λ, row-major d×d.
    pub fn precision(&self) -> &[f64] {
        &self.posterior.precision
    }

    /// η = Λμ (b = Σ w·r·x for the linear model).
    pub fn natural_mean(&self) -> &[f64] {
        &self.posterior.eta
    }

    /// Seed of the current bank of draws.
    pub fn bank_seed(&self) -> u64 {
        self.bank_seed
    }

    /// True when the posterior changed since the bank was drawn. Ranking from a stale bank is
    /// still valid Thompson sampling with delayed updates (Chapelle & Li found TS robust to
    /// that), and its propensities stay exact for the bank it used.
    pub fn bank_is_stale(&self) -> bool {
        self.bank_stale
    }

    /// Applies one observation. Its weight is 2^(−(clock − t)/half-life) relative to the decay
    /// clock, so a late event counts exactly as if it had arrived before the decays that passed
    /// since its timestamp: for the linear model the state is a function of the *set* of
    /// observations and the clock, whatever the order of updates and decays (up to rounding).
    /// The first event starts the clock. Leaves the bank stale.
    pub fn update(&mut self, observation: &Observation) -> Result<()> {
        let (mut x, weight, clock) = self.prepare(observation, self.clock_s)?;
        self.posterior.update(&mut x, observation.reward, weight);
        self.clock_s = Some(clock);
        self.observations += 1;
        self.bank_stale = true;
        Ok(())
    }

    /// Resets to the prior with the clock at `now_s` and applies `observations` sorted by
    /// (timestamp, id), so every replica rebuilding from the same feedback log reaches the same
    /// bits, for the logistic model too. All observations are checked before anything changes.
    pub fn rebuild(&mut self, observations: &[Observation], now_s: f64) -> Result<()> {
        self.rebuild_weighted(observations, &[], now_s)
    }

    /// [`ThompsonPolicy::rebuild`] with a weight per observation (`weights` empty: all 1), which
    /// multiplies its decay weight: an observation of weight w counts as w copies of it (e.g. an
    /// importance weight 1/propensity, to fit as if every candidate had been shown alike). Each
    /// weight must be finite and > 0.
    pub fn rebuild_weighted(
        &mut self,
        observations: &[Observation],
        weights: &[f64],
        now_s: f64,
    ) -> Result<()> {
        check_time("now_s", now_s)?;
        if !weights.is_empty() {
            if weights.len() != observations.len() {
                return Err(BanditError::Dimension {
                    block: "weights".to_owned(),
                    expected: observations.len(),
                    actual: weights.len(),
                });
            }
            if let Some(bad) = weights.iter().position(|w| !(w.is_finite() && *w > 0.0)) {
                return Err(BanditError::Invalid {
                    field: "weights",
                    reason: format!(
                        "weight {bad} is {}; each must be finite and > 0",
                        weights[bad]
                    ),
                });
            }
        }
        let mut order: Vec<usize> = (0..observations.len()).collect();
        order.sort_by(|&a, &b| {
            let (a, b) = (&observations[a], &observations[b]);
            a.timestamp_s
                .total_cmp(&b.timestamp_s)
                .then_with(|| a.id.cmp(&b.id))
        });
        let mut prepared = Vec::with_capacity(observations.len());
        for &i in &order {
            let (x, weight, _) = self.prepare(&observations[i], Some(now_s))?;
            let importance = weights.get(i).copied().unwrap_or(1.0);
            prepared.push((x, observations[i].reward, weight * importance));
        }
        let mut posterior =
            Posterior::prior(self.config.model, self.dim(), self.config.prior_precision);
        for (mut x, reward, weight) in prepared {
            posterior.update(&mut x, reward, weight);
        }
        self.posterior = posterior;
        self.clock_s = Some(now_s);
        self.observations = observations.len() as u64;
        self.bank_stale = true;
        Ok(())
    }

    /// Discounts evidence up to `now_s`: with γ = 0.5^((now − clock)/half-life),
    /// Λ ← γΛ + (1−γ)λI and η ← γη, then refactors Λ (O(d³), about a millisecond at d = 300).
    /// Meant to run periodically, not per request. A time at or before the clock changes
    /// nothing; without a half-life only the clock moves.
    ///
    /// Replicas agree when they call this at the same times — e.g. at fixed epoch boundaries
    /// derived from timestamps (`floor(now / epoch) · epoch`) — because update weights are taken
    /// relative to the clock: the linear state is then a function of (observation set, clock).
    pub fn decay_to(&mut self, now_s: f64) -> Result<()> {
        check_time("now_s", now_s)?;
        let Some(clock) = self.clock_s else {
            self.clock_s = Some(now_s);
            return Ok(());
        };
        if now_s <= clock {
            return Ok(());
        }
        if let Some(h) = self.config.half_life_s {
            let gamma = 0.5f64.powf((now_s - clock) / h);
            self.posterior.discount(gamma)?;
            self.bank_stale = true;
        }
        self.clock_s = Some(now_s);
        Ok(())
    }

    /// Redraws the bank with a seed taken from `rng`.
    pub fn refresh_bank<R: Rng + ?Sized>(&mut self, rng: &mut R) {
        let seed = rng.random::<u64>();
        self.refresh_bank_seeded(seed);
    }

    /// Redraws the bank deterministically: the same posterior and seed give the same draws on
    /// every replica (ChaCha8). Costs M triangular solves, O(M·d²).
    pub fn refresh_bank_seeded(&mut self, seed: u64) {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let m = self.config.mc_samples;
        let cd = self.layout.candidate_dims;
        let draws = self
            .posterior
            .sample_columns(self.config.noise_scale, m, &mut rng);
        // draws is d×M (column m = θ̃ₘ); x index i·|c| + j sits at row i·|c| + j.
        self.bank = Array3::from_shape_fn((self.layout.context_dims(), m, cd), |(i, m_, j)| {
            draws[(i * cd + j) * m + m_]
        });
        self.bank_seed = seed;
        self.bank_stale = false;
    }

    /// Ranks `candidates` for context `z` and returns the top `k` (fewer when there are fewer
    /// candidates; none for k = 0 or no candidates). See the module documentation for the
    /// policy and its propensities.
    pub fn rank<C: AsRef<[f64]>, R: Rng + ?Sized>(
        &self,
        z: &[f64],
        candidates: &[C],
        k: usize,
        rng: &mut R,
    ) -> Result<Ranking> {
        self.rank_with_offsets(z, candidates, &[], k, rng)
    }

    /// [`ThompsonPolicy::rank`] with a [`ScoreOffset`] per candidate (`offsets` empty: none, the
    /// same ranking as `rank` from the same generator). Every bank draw m scores candidate a as
    /// x_a·θ̃ₘ + mean_a + sd_a·e_{m,a}; the e are drawn from `rng` after the coin and the draw
    /// index, only when some sd > 0, so the logged seed still reproduces the ranking and the
    /// propensities stay exact for the policy as run.
    pub fn rank_with_offsets<C: AsRef<[f64]>, R: Rng + ?Sized>(
        &self,
        z: &[f64],
        candidates: &[C],
        offsets: &[ScoreOffset],
        k: usize,
        rng: &mut R,
    ) -> Result<Ranking> {
        self.rank_with_floor(z, candidates, offsets, None, k, rng)
    }

    /// [`ThompsonPolicy::rank_with_offsets`] under an [`ExplorationFloor`] (`None`, or one with
    /// no eligible candidate or share 0: the same ranking from the same generator). The floor's
    /// coin and pick are drawn after everything else, so the policy's own draws stay as they were.
    pub fn rank_with_floor<C: AsRef<[f64]>, R: Rng + ?Sized>(
        &self,
        z: &[f64],
        candidates: &[C],
        offsets: &[ScoreOffset],
        floor: Option<&ExplorationFloor>,
        k: usize,
        rng: &mut R,
    ) -> Result<Ranking> {
        self.check_request(z, candidates)?;
        let n = candidates.len();
        if !offsets.is_empty() {
            if offsets.len() != n {
                return Err(BanditError::Dimension {
                    block: "offsets".to_owned(),
                    expected: n,
                    actual: offsets.len(),
                });
            }
            for (i, offset) in offsets.iter().enumerate() {
                offset.check(i)?;
            }
        }
        if let Some(floor) = floor {
            floor.check(n)?;
        }
        let floor = floor.filter(|f| f.active());
        let shown = k.min(n);
        if shown == 0 {
            return Ok(Ranking {
                items: Vec::new(),
                explored: false,
                floor_pick: false,
                draw: 0,
                bank_seed: self.bank_seed,
                propensities: vec![Vec::new(); n],
            });
        }
        // Fixed order of random draws (coin, draw, offset noise, shuffle, floor coin and pick)
        // so a seed reproduces the ranking.
        let explored = rng.random::<f64>() < self.config.epsilon;
        let draw = rng.random_range(0..self.config.mc_samples);
        let offset_scores = offset_scores(offsets, self.config.mc_samples, rng);
        let eligible = floor.map(|f| f.eligible.as_slice());
        let bank = self.score_bank(
            z,
            candidates,
            offset_scores.as_deref(),
            shown,
            draw,
            eligible,
        );
        let mut order = if explored {
            let mut all: Vec<usize> = (0..n).collect();
            for i in 0..shown {
                let j = rng.random_range(i..n);
                all.swap(i, j);
            }
            all.truncate(shown);
            all
        } else {
            bank.chosen_top.clone()
        };
        let picked = floor.and_then(|f| {
            (rng.random::<f64>() < f.share)
                .then(|| f.eligible[rng.random_range(0..f.eligible.len())])
        });
        if let Some(u) = picked {
            order.retain(|&a| a != u);
            order.insert(0, u);
            order.truncate(shown);
        }
        let propensities = self.propensities_from(&bank, n, floor);
        let mean_w = contract(&self.posterior.mean, z, self.layout.candidate_dims);
        let items = order
            .iter()
            .enumerate()
            .map(|(position, &a)| {
                let c = candidates[a].as_ref();
                let offset = offsets.get(a).copied().unwrap_or_default();
                let mut explanation =
                    self.explain(z, c, draw, self.score_sd(&bank.scores, n, a, z, c, offset));
                if let Some(extra) = offset_scores
                    .as_ref()
                    .filter(|_| offset != ScoreOffset::default())
                {
                    explanation
                        .contributions
                        .insert("prior".to_owned(), extra[draw * n + a]);
                }
                RankedItem {
                    candidate: a,
                    position,
                    score: bank.scores[draw * n + a],
                    mean_score: dot(&mean_w, c) + offset.mean,
                    propensity: propensities[a][position],
                    explanation,
                }
            })
            .collect();
        Ok(Ranking {
            items,
            explored,
            floor_pick: picked.is_some(),
            draw,
            bank_seed: self.bank_seed,
            propensities,
        })
    }

    /// [`ThompsonPolicy::rank`] with a ChaCha8 generator seeded from `seed`: log the seed and
    /// the same state (and bank seed) reproduces the ranking.
    pub fn rank_seeded<C: AsRef<[f64]>>(
        &self,
        z: &[f64],
        candidates: &[C],
        k: usize,
        seed: u64,
    ) -> Result<Ranking> {
        self.rank(z, candidates, k, &mut ChaCha8Rng::seed_from_u64(seed))
    }

    /// The K × min(k, K) matrix of P(candidate a at position p) under this policy, for
    /// evaluating it off-line on data another policy logged.
    pub fn propensity_matrix<C: AsRef<[f64]>>(
        &self,
        z: &[f64],
        candidates: &[C],
        k: usize,
    ) -> Result<Vec<Vec<f64>>> {
        self.check_request(z, candidates)?;
        let n = candidates.len();
        let shown = k.min(n);
        if shown == 0 {
            return Ok(vec![Vec::new(); n]);
        }
        let bank = self.score_bank(z, candidates, None, shown, 0, None);
        Ok(self.propensities_from(&bank, n, None))
    }

    /// The posterior mean score x·μ of candidate `c` in context `z` (x = z ⊗ c): what a ranking
    /// reports as [`RankedItem::mean_score`], for one pair without ranking. With
    /// [`ThompsonPolicy::posterior_sd`] it is the score's Gaussian posterior, e.g. for a lower
    /// confidence bound of a candidate no ranking has shown.
    pub fn mean_score(&self, z: &[f64], c: &[f64]) -> Result<f64> {
        self.layout.check_context(z)?;
        self.layout.check_candidate(0, c)?;
        let mean_w = contract(&self.posterior.mean, z, self.layout.candidate_dims);
        Ok(dot(&mean_w, c))
    }

    /// The posterior mean score of a sum of interaction vectors Σx (each from
    /// [`FeatureLayout::interaction`]): Σ x·μ, what the posterior mean predicts now of those
    /// observations together, in one dot product however many were summed. An empty sum scores 0.
    pub fn mean_score_of_sum(&self, interactions: &[f64]) -> Result<f64> {
        if interactions.is_empty() {
            return Ok(0.0);
        }
        if interactions.len() != self.dim() {
            return Err(BanditError::Dimension {
                block: "interaction sum".to_owned(),
                expected: self.dim(),
                actual: interactions.len(),
            });
        }
        Ok(dot(&self.posterior.mean, interactions))
    }

    /// The exact posterior standard deviation of the score of candidate `c` in context `z`,
    /// v·sqrt(xᵀΛ⁻¹x), through a triangular solve with the Cholesky factor: O(d²), and it
    /// streams the whole factor through the cache. Rankings report the bank's Monte-Carlo
    /// estimate of the same quantity instead (free, since the bank scores every candidate).
    pub fn posterior_sd(&self, z: &[f64], c: &[f64]) -> Result<f64> {
        self.layout.check_context(z)?;
        self.layout.check_candidate(0, c)?;
        Ok(self.exact_sd(z, c))
    }

    fn exact_sd(&self, z: &[f64], c: &[f64]) -> f64 {
        let mut x = vec![0.0; self.dim()];
        interaction_into(z, c, &mut x);
        self.config.noise_scale * self.posterior.mahalanobis(&mut x)
    }

    /// The posterior SD reported with a ranking: from the bank when it has enough draws for a
    /// useful estimate, else exact.
    /// The offset's noise is independent of θ̃, so its variance adds to the exact one (the
    /// bank's scores already hold it).
    fn score_sd(
        &self,
        scores: &[f64],
        n: usize,
        a: usize,
        z: &[f64],
        c: &[f64],
        offset: ScoreOffset,
    ) -> f64 {
        if self.config.mc_samples >= MIN_DRAWS_FOR_SD {
            bank_sd(scores, n, a)
        } else {
            self.exact_sd(z, c).hypot(offset.sd)
        }
    }

    fn explain(&self, z: &[f64], c: &[f64], m: usize, posterior_sd: f64) -> Explanation {
        let contributions = self
            .layout
            .context_groups()
            .into_iter()
            .map(|(name, range)| {
                let total: f64 = range
                    .map(|i| {
                        let theta_block = self.bank.index_axis(Axis(0), i);
                        let block_dot: f64 =
                            theta_block.row(m).iter().zip(c).map(|(t, c)| t * c).sum();
                        z[i] * block_dot
                    })
                    .sum();
                (name.to_owned(), total)
            })
            .collect();
        Explanation {
            contributions,
            posterior_sd,
        }
    }

    fn check_request<C: AsRef<[f64]>>(&self, z: &[f64], candidates: &[C]) -> Result<()> {
        self.layout.check_context(z)?;
        for (i, c) in candidates.iter().enumerate() {
            self.layout.check_candidate(i, c.as_ref())?;
        }
        Ok(())
    }

    /// Scores all candidates under all draws and counts, per draw, who lands at which of the
    /// first `k` positions (ties broken by candidate index, the same rule the ranking uses).
    /// With `floor_eligible`, also counts where each candidate lands behind each eligible u put
    /// first (the draw's list without u, one position down), summed over u.
    fn score_bank<C: AsRef<[f64]>>(
        &self,
        z: &[f64],
        candidates: &[C],
        offsets: Option<&[f64]>,
        k: usize,
        chosen: usize,
        floor_eligible: Option<&[usize]>,
    ) -> BankScores {
        let cd = self.layout.candidate_dims;
        let m = self.config.mc_samples;
        let n = candidates.len();
        // W[m] = Θᵣ[m]ᵀ z, the per-draw weights on candidate features.
        let mut w = Array2::<f64>::zeros((m, cd));
        for (&zi, slab) in z.iter().zip(self.bank.outer_iter()) {
            if zi != 0.0 {
                w.scaled_add(zi, &slab);
            }
        }
        let c = Array2::from_shape_fn((n, cd), |(a, j)| candidates[a].as_ref()[j]);
        let scores = w.dot(&c.t());
        // One flat row-major M×K buffer: the top-k scan below is the hot loop of a request and
        // wants plain slices, not strided views. `dot` returns standard layout, so the first
        // branch is the one taken; the second only keeps this total.
        let mut scores = if scores.is_standard_layout() {
            scores.into_raw_vec_and_offset().0
        } else {
            scores.iter().copied().collect()
        };
        if let Some(offsets) = offsets {
            for (score, offset) in scores.iter_mut().zip(offsets) {
                *score += offset;
            }
        }
        let mut counts = vec![0u32; n * k];
        let mut floor_counts = vec![0u32; if floor_eligible.is_some() { n * k } else { 0 }];
        let mut top: Vec<usize> = Vec::with_capacity(k + 1);
        let mut chosen_top = Vec::new();
        for (draw, row) in scores.chunks_exact(n).enumerate() {
            top_k(row, k, &mut top);
            for (p, &a) in top.iter().enumerate() {
                counts[a * k + p] += 1;
            }
            for &u in floor_eligible.unwrap_or_default() {
                // The list without u keeps the others' order: one place down behind u, less
                // one for those u stood before.
                let at_u = top.iter().position(|&b| b == u);
                for (i, &a) in top.iter().enumerate() {
                    let position = match at_u {
                        Some(j) if j == i => continue,
                        Some(j) if j < i => i,
                        _ => i + 1,
                    };
                    if position < k {
                        floor_counts[a * k + position] += 1;
                    }
                }
            }
            if draw == chosen {
                chosen_top.clone_from(&top);
            }
        }
        BankScores {
            scores,
            counts,
            floor_counts,
            chosen_top,
            k,
        }
    }

    /// P(a at p) for the policy as run: (1−ε)·count(a, p)/M + ε/K, mixed with the
    /// [`ExplorationFloor`]'s branch when one is active (see its documentation).
    fn propensities_from(
        &self,
        bank: &BankScores,
        n: usize,
        floor: Option<&ExplorationFloor>,
    ) -> Vec<Vec<f64>> {
        let eps = self.config.epsilon;
        let m = self.config.mc_samples as f64;
        let uniform = eps / n as f64;
        let mut propensities: Vec<Vec<f64>> = bank
            .counts
            .chunks_exact(bank.k)
            .map(|row| {
                row.iter()
                    .map(|&c| (1.0 - eps) * (f64::from(c) / m) + uniform)
                    .collect()
            })
            .collect();
        let Some(floor) = floor else {
            return propensities;
        };
        let s = floor.share;
        let picks = floor.eligible.len() as f64;
        let mut is_eligible = vec![false; n];
        for &u in &floor.eligible {
            is_eligible[u] = true;
        }
        for (a, row) in propensities.iter_mut().enumerate() {
            // How many of the eligible u leave a behind them (all but a itself).
            let others = picks - f64::from(u8::from(is_eligible[a]));
            for (p, value) in row.iter_mut().enumerate() {
                let behind = if p == 0 {
                    f64::from(u8::from(is_eligible[a])) / picks
                } else {
                    // Under the ε branch the rest is a uniform ordering of the n − 1 others.
                    let counted = f64::from(bank.floor_counts[a * bank.k + p]);
                    ((1.0 - eps) * counted / m + eps * others / (n - 1) as f64) / picks
                };
                *value = (1.0 - s) * *value + s * behind;
            }
        }
        propensities
    }

    /// Checks an observation and returns its x, its weight relative to `clock` (the event's own
    /// time when there is no clock yet) and the clock to keep.
    fn prepare(
        &self,
        observation: &Observation,
        clock: Option<f64>,
    ) -> Result<(Vec<f64>, f64, f64)> {
        let t = observation.timestamp_s;
        check_time("timestamp_s", t)?;
        self.layout.check_context(&observation.context)?;
        self.layout.check_candidate(0, &observation.candidate)?;
        self.posterior.check_reward(observation.reward)?;
        let clock = clock.unwrap_or(t);
        let weight = match self.config.half_life_s {
            None => 1.0,
            Some(h) => {
                let ahead = (t - clock) / h;
                if ahead > MAX_HALF_LIVES_AHEAD {
                    return Err(BanditError::ClockBehind {
                        timestamp_s: t,
                        clock_s: clock,
                        half_lives: ahead,
                    });
                }
                ahead.exp2()
            }
        };
        let mut x = vec![0.0; self.dim()];
        interaction_into(&observation.context, &observation.candidate, &mut x);
        Ok((x, weight, clock))
    }
}

/// Writes into `top` the indices of the `k` highest scores, best first; ties go to the lower
/// index (the rule both the ranking and the propensity counts use, so they agree exactly).
fn top_k(row: &[f64], k: usize, top: &mut Vec<usize>) {
    top.clear();
    let mut threshold = f64::NEG_INFINITY;
    for (a, &s) in row.iter().enumerate() {
        // Most candidates miss a full top-k; one comparison against the k-th score rejects them.
        // Candidates arrive in index order, so "strictly greater" keeps earlier ties first.
        if top.len() == k && !s.total_cmp(&threshold).is_gt() {
            continue;
        }
        let at = top
            .iter()
            .position(|&b| s.total_cmp(&row[b]).is_gt())
            .unwrap_or(top.len());
        top.insert(at, a);
        top.truncate(k);
        if let Some(&last) = top.last() {
            threshold = row[last];
        }
    }
}

/// Θᵣᵀz for one weight vector: w[j] = Σᵢ z[i]·θ[i·|c| + j].
fn contract(theta: &[f64], z: &[f64], cd: usize) -> Vec<f64> {
    let mut w = vec![0.0; cd];
    for (block, &zi) in theta.chunks_exact(cd.max(1)).zip(z) {
        for (r, &t) in w.iter_mut().zip(block) {
            *r += zi * t;
        }
    }
    w
}

fn check_time(field: &'static str, t: f64) -> Result<()> {
    if t.is_finite() {
        Ok(())
    } else {
        Err(BanditError::BadValue {
            block: field.into(),
            index: 0,
            value: t,
        })
    }
}

/// Fewest bank draws whose spread is used as the posterior SD (relative error ≈ 12% at 32).
const MIN_DRAWS_FOR_SD: usize = 32;

/// Standard deviation over the bank's draws of candidate `a`'s score: a Monte-Carlo estimate of
/// v·sqrt(xᵀΛ⁻¹x) with relative error about 1/sqrt(2M) (4% at M = 256).
/// The M×K (draw-major) matrix of offset scores mean_a + sd_a·e_{m,a}, `None` without offsets.
/// The e are drawn from `rng` (draw by draw, candidate by candidate) only when some sd > 0.
fn offset_scores<R: Rng + ?Sized>(
    offsets: &[ScoreOffset],
    draws: usize,
    rng: &mut R,
) -> Option<Vec<f64>> {
    if offsets.is_empty() {
        return None;
    }
    let noisy = offsets.iter().any(|o| o.sd > 0.0);
    let mut scores = Vec::with_capacity(draws * offsets.len());
    for _ in 0..draws {
        for offset in offsets {
            let e: f64 = if noisy {
                rng.sample(rand_distr::StandardNormal)
            } else {
                0.0
            };
            scores.push(offset.mean + offset.sd * e);
        }
    }
    Some(scores)
}

fn bank_sd(scores: &[f64], n: usize, a: usize) -> f64 {
    let m = scores.len() / n.max(1);
    if m < 2 {
        return 0.0;
    }
    let column = (0..m).map(|row| scores[row * n + a]);
    let mean = column.clone().sum::<f64>() / m as f64;
    let var = column.map(|s| (s - mean) * (s - mean)).sum::<f64>() / (m - 1) as f64;
    var.sqrt()
}
