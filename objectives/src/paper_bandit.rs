//! The paper's bandit experiment (Tang et al. 2025, §3.3 and Figure 1): 100 actions with fixed
//! rewards drawn from N(0, 1), a softmax policy over logits that start at zero, k samples per
//! update and the exact gradient of each estimator from those samples,
//! Σ_i A_i ∇_θ log π(y_i) = Σ_i A_i (e_{y_i} − π). Every `every` steps the policy's exact mean
//! reward, exact pass@k (the expected maximum of k draws) and exact KL(π ‖ π₀) to the uniform
//! initial policy are recorded, then averaged over seeds.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, StandardNormal};
use serde::Serialize;

use crate::advantage::{center, max_loo, mean_loo};

/// The policy-gradient variants of Figure 1.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Method {
    /// Eq. 2 with f = mean: A_i = (r_i − mean of the others)/k.
    MeanEq2,
    /// The same without the 1/k: r_i − mean of the others (RLOO as usually written). The paper
    /// does not say which of the two Figure 1 used.
    MeanRloo,
    /// Eq. 2 with f = max.
    PassAtK,
    /// Eq. 3: pass@k's advantages minus their mean.
    BiasedPassAtK,
}

impl Method {
    pub const ALL: [Method; 4] = [
        Method::MeanEq2,
        Method::MeanRloo,
        Method::PassAtK,
        Method::BiasedPassAtK,
    ];

    /// A short label for tables and plots.
    pub fn label(self) -> &'static str {
        match self {
            Method::MeanEq2 => "mean PG (Eq.2, 1/k)",
            Method::MeanRloo => "mean PG (RLOO)",
            Method::PassAtK => "pass@k PG",
            Method::BiasedPassAtK => "biased pass@k PG",
        }
    }

    /// Whether this variant optimises the mean (rather than a k-sample objective).
    pub fn is_mean(self) -> bool {
        matches!(self, Method::MeanEq2 | Method::MeanRloo)
    }

    fn advantages(self, rewards: &[f64], k: usize) -> Vec<f64> {
        match self {
            Method::MeanEq2 => mean_loo(rewards),
            Method::MeanRloo => mean_loo(rewards).iter().map(|a| a * k as f64).collect(),
            Method::PassAtK => max_loo(rewards, k),
            Method::BiasedPassAtK => center(&max_loo(rewards, k)),
        }
    }
}

/// The experiment's settings; the defaults are the paper's.
#[derive(Debug, Clone, Serialize)]
pub struct BanditConfig {
    /// Number of actions |Y|.
    pub actions: usize,
    /// Samples per update (also the k of the reported pass@k).
    pub k: usize,
    /// Step size of the gradient ascent on the logits.
    pub learning_rate: f64,
    /// Updates per run.
    pub steps: usize,
    /// Record the exact metrics every this many steps (and at step 0).
    pub every: usize,
    /// Independent runs (each its own rewards and samples), averaged.
    pub seeds: u64,
    /// The first seed; runs use `first_seed .. first_seed + seeds`.
    pub first_seed: u64,
}

impl Default for BanditConfig {
    fn default() -> Self {
        BanditConfig {
            actions: 100,
            k: 4,
            learning_rate: 1.0,
            steps: 1000,
            every: 20,
            seeds: 30,
            first_seed: 0,
        }
    }
}

/// A setting the experiment cannot run with.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{field} = {value}: {reason}")]
pub struct BanditConfigError {
    pub field: &'static str,
    pub value: String,
    pub reason: &'static str,
}

impl BanditConfig {
    fn validate(&self) -> Result<(), BanditConfigError> {
        let fail = |field, value: String, reason| {
            Err(BanditConfigError {
                field,
                value,
                reason,
            })
        };
        if self.actions < 2 {
            return fail(
                "actions",
                self.actions.to_string(),
                "needs at least 2 actions",
            );
        }
        if self.k < 2 || self.k > crate::MAX_GROUP {
            return fail(
                "k",
                self.k.to_string(),
                "leave-one-out estimators need 2 <= k <= 512",
            );
        }
        if !(self.learning_rate.is_finite() && self.learning_rate > 0.0) {
            return fail(
                "learning_rate",
                self.learning_rate.to_string(),
                "must be a positive number",
            );
        }
        if self.steps == 0 || self.every == 0 || self.seeds == 0 {
            let (field, value) = if self.steps == 0 {
                ("steps", self.steps)
            } else if self.every == 0 {
                ("every", self.every)
            } else {
                ("seeds", self.seeds as usize)
            };
            return fail(field, value.to_string(), "must be at least 1");
        }
        Ok(())
    }
}

/// One recorded step, averaged over seeds, with standard errors of the mean.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Point {
    pub step: usize,
    pub mean_reward: f64,
    pub mean_reward_se: f64,
    pub pass_at_k: f64,
    pub pass_at_k_se: f64,
    pub kl: f64,
    pub kl_se: f64,
}

/// One method's averaged trajectory.
#[derive(Debug, Clone, Serialize)]
pub struct Curve {
    pub method: Method,
    pub label: &'static str,
    pub points: Vec<Point>,
}

impl Curve {
    /// The point recorded at `step`, if one was.
    pub fn at_step(&self, step: usize) -> Option<&Point> {
        self.points.iter().find(|p| p.step == step)
    }

    /// pass@k where the averaged KL first reaches `kl`, linearly interpolated between recorded
    /// points; `None` when the run never got that far from π₀.
    pub fn pass_at_k_at_kl(&self, kl: f64) -> Option<f64> {
        self.points.windows(2).find_map(|w| {
            let (a, b) = (w[0], w[1]);
            (a.kl <= kl && kl <= b.kl && b.kl > a.kl).then(|| {
                let t = (kl - a.kl) / (b.kl - a.kl);
                a.pass_at_k + t * (b.pass_at_k - a.pass_at_k)
            })
        })
    }

    /// The largest KL the averaged run reached.
    pub fn max_kl(&self) -> f64 {
        self.points.iter().map(|p| p.kl).fold(0.0, f64::max)
    }
}

/// The averaged curves and what they show.
#[derive(Debug, Clone, Serialize)]
pub struct Experiment {
    /// One per method of [`Method::ALL`], a point every `every` steps (and the last step).
    pub curves: Vec<Curve>,
    /// Read off the curves at every step, so comparisons at equal KL are not interpolated
    /// across the large early jumps.
    pub findings: Findings,
    /// The curves with a point at every step (for charts; not serialised).
    #[serde(skip)]
    pub dense: Vec<Curve>,
}

/// Runs every method of [`Method::ALL`] on every seed and averages.
pub fn run(config: &BanditConfig) -> Result<Experiment, BanditConfigError> {
    config.validate()?;
    let count = config.seeds as f64;
    let mean_se = |sum: f64, squares: f64| {
        let mean = sum / count;
        let variance = if count > 1.0 {
            ((squares - count * mean * mean) / (count - 1.0)).max(0.0)
        } else {
            0.0
        };
        (mean, (variance / count).sqrt())
    };
    let mut dense = Vec::new();
    for method in Method::ALL {
        // Per step and metric: Σ and Σ² over seeds.
        let mut sums = vec![[0.0f64; 6]; config.steps + 1];
        for seed in config.first_seed..config.first_seed + config.seeds {
            for (sum, metrics) in sums.iter_mut().zip(run_seed(config, method, seed)) {
                for (m, value) in metrics.iter().enumerate() {
                    sum[2 * m] += value;
                    sum[2 * m + 1] += value * value;
                }
            }
        }
        let points = sums
            .iter()
            .enumerate()
            .map(|(step, s)| {
                let (mean_reward, mean_reward_se) = mean_se(s[0], s[1]);
                let (pass_at_k, pass_at_k_se) = mean_se(s[2], s[3]);
                let (kl, kl_se) = mean_se(s[4], s[5]);
                Point {
                    step,
                    mean_reward,
                    mean_reward_se,
                    pass_at_k,
                    pass_at_k_se,
                    kl,
                    kl_se,
                }
            })
            .collect();
        dense.push(Curve {
            method,
            label: method.label(),
            points,
        });
    }
    let findings = Findings::of(&dense, config.every.min(config.steps));
    let curves = dense
        .iter()
        .map(|curve| Curve {
            points: (curve.points.iter().copied())
                .filter(|p| p.step % config.every == 0 || p.step == config.steps)
                .collect(),
            ..curve.clone()
        })
        .collect();
    Ok(Experiment {
        curves,
        findings,
        dense,
    })
}

/// pass@k of every method at one KL level.
#[derive(Debug, Clone, Serialize)]
pub struct EqualKl {
    pub kl: f64,
    /// In the order of the curves; `None` where a method never got that far from π₀.
    pub pass_at_k: Vec<Option<f64>>,
}

/// How the pass@k variants compare with one mean variant at equal KL.
#[derive(Debug, Clone, Serialize)]
pub struct VersusMean {
    pub mean_method: Method,
    /// Per level of [`Findings::equal_kl`]: both pass@k variants above this mean variant.
    pub k_sample_higher: Vec<bool>,
    /// The smallest level from which on both pass@k variants stay above it (`None`: not even
    /// at the last common level).
    pub higher_from_kl: Option<f64>,
}

/// The paper's two qualitative claims, read off the averaged curves at every step.
#[derive(Debug, Clone, Serialize)]
pub struct Findings {
    /// Where "fastest in the first steps" is judged (the first recorded step after 0).
    pub early_step: usize,
    /// Each method's mean reward at `early_step`, in the order of the curves.
    pub early_mean_reward: Vec<f64>,
    /// The method with the highest mean reward at `early_step`.
    pub fastest_early: Method,
    /// Claim 1: a mean variant raises the mean reward fastest early on.
    pub mean_fastest_early: bool,
    /// pass@k at KL levels every method reached.
    pub equal_kl: Vec<EqualKl>,
    /// Claim 2, against each mean variant.
    pub versus_mean: Vec<VersusMean>,
    /// Claim 2 in full: both pass@k variants above both mean variants at every common level.
    pub k_sample_higher_at_equal_kl: bool,
}

/// KL levels at which pass@k is compared (those every method reached are kept).
const KL_LEVELS: [f64; 14] = [
    0.05, 0.1, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0, 4.5, 5.0,
];

impl Findings {
    /// Reads the claims off `curves` (one per method, a point at every step), judging speed at
    /// `early_step`.
    pub fn of(curves: &[Curve], early_step: usize) -> Findings {
        let early_mean_reward: Vec<f64> = curves
            .iter()
            .map(|c| {
                c.at_step(early_step)
                    .map_or(f64::NEG_INFINITY, |p| p.mean_reward)
            })
            .collect();
        let fastest_early = curves
            .iter()
            .zip(&early_mean_reward)
            .max_by(|a, b| a.1.total_cmp(b.1))
            .map_or(Method::MeanRloo, |(c, _)| c.method);
        let reach = curves
            .iter()
            .map(Curve::max_kl)
            .fold(f64::INFINITY, f64::min);
        let equal_kl: Vec<EqualKl> = KL_LEVELS
            .iter()
            .filter(|&&kl| kl <= reach)
            .map(|&kl| EqualKl {
                kl,
                pass_at_k: curves.iter().map(|c| c.pass_at_k_at_kl(kl)).collect(),
            })
            .collect();
        let versus_mean: Vec<VersusMean> = curves
            .iter()
            .enumerate()
            .filter(|(_, c)| c.method.is_mean())
            .map(|(mean_index, mean_curve)| {
                let k_sample_higher: Vec<bool> = equal_kl
                    .iter()
                    .map(|level| {
                        let Some(baseline) = level.pass_at_k[mean_index] else {
                            return false;
                        };
                        curves
                            .iter()
                            .zip(&level.pass_at_k)
                            .all(|(c, v)| c.method.is_mean() || v.is_some_and(|v| v > baseline))
                    })
                    .collect();
                let from = k_sample_higher
                    .iter()
                    .rposition(|&higher| !higher)
                    .map_or(0, |last_lower| last_lower + 1);
                VersusMean {
                    mean_method: mean_curve.method,
                    higher_from_kl: equal_kl.get(from).map(|level| level.kl),
                    k_sample_higher,
                }
            })
            .collect();
        let k_sample_higher_at_equal_kl = !equal_kl.is_empty()
            && versus_mean
                .iter()
                .all(|v| v.k_sample_higher.iter().all(|&h| h));
        Findings {
            early_step,
            early_mean_reward,
            fastest_early,
            mean_fastest_early: fastest_early.is_mean(),
            equal_kl,
            versus_mean,
            k_sample_higher_at_equal_kl,
        }
    }
}

/// One run: [mean reward, pass@k, KL] at every step, 0 to `steps`.
fn run_seed(config: &BanditConfig, method: Method, seed: u64) -> Vec<[f64; 3]> {
    let rewards: Vec<f64> = {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        (0..config.actions)
            .map(|_| StandardNormal.sample(&mut rng))
            .collect()
    };
    let mut by_reward: Vec<usize> = (0..config.actions).collect();
    by_reward.sort_by(|&a, &b| rewards[a].total_cmp(&rewards[b]));
    // Every method draws from the same stream, so their first updates see the same samples.
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    rng.set_stream(1);
    let mut logits = vec![0.0f64; config.actions];
    let mut policy = vec![0.0f64; config.actions];
    let mut trace = Vec::with_capacity(config.steps + 1);
    let mut samples = vec![0usize; config.k];
    let mut sample_rewards = vec![0.0f64; config.k];
    for step in 0..=config.steps {
        softmax(&logits, &mut policy);
        trace.push([
            policy.iter().zip(&rewards).map(|(p, r)| p * r).sum(),
            expected_max_of_draws(&policy, &rewards, &by_reward, config.k),
            kl_to_uniform(&policy),
        ]);
        if step == config.steps {
            break;
        }
        for (sample, reward) in samples.iter_mut().zip(sample_rewards.iter_mut()) {
            *sample = draw(&policy, &mut rng);
            *reward = rewards[*sample];
        }
        let advantages = method.advantages(&sample_rewards, config.k);
        // θ += η Σ_i A_i (e_{y_i} − π).
        let total: f64 = advantages.iter().sum();
        for (logit, p) in logits.iter_mut().zip(&policy) {
            *logit -= config.learning_rate * total * p;
        }
        for (&sample, a) in samples.iter().zip(&advantages) {
            logits[sample] += config.learning_rate * a;
        }
    }
    trace
}

fn softmax(logits: &[f64], out: &mut [f64]) {
    let max = logits.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let mut total = 0.0;
    for (o, l) in out.iter_mut().zip(logits) {
        *o = (l - max).exp();
        total += *o;
    }
    for o in out.iter_mut() {
        *o /= total;
    }
}

/// An action drawn from `policy` by inverting its CDF.
fn draw<R: Rng>(policy: &[f64], rng: &mut R) -> usize {
    let u: f64 = rng.random();
    let mut cumulative = 0.0;
    for (action, p) in policy.iter().enumerate() {
        cumulative += p;
        if u < cumulative {
            return action;
        }
    }
    // Rounding left the CDF a hair below 1: the last action with any mass.
    policy.iter().rposition(|&p| p > 0.0).unwrap_or(0)
}

/// E[max of k independent draws from `policy`] = Σ_j r_(j) (F_j^k − F_{j−1}^k) with actions
/// sorted by reward and F their cumulative probability.
fn expected_max_of_draws(policy: &[f64], rewards: &[f64], by_reward: &[usize], k: usize) -> f64 {
    let k = i32::try_from(k).unwrap_or(i32::MAX);
    let mut below = 0.0f64;
    let mut value = 0.0;
    for &action in by_reward {
        let upto = (below + policy[action]).min(1.0);
        value += rewards[action] * (upto.powi(k) - below.powi(k));
        below = upto;
    }
    value
}

/// KL(π ‖ uniform) = Σ π ln(π |Y|).
fn kl_to_uniform(policy: &[f64]) -> f64 {
    let n = policy.len() as f64;
    policy
        .iter()
        .filter(|&&p| p > 0.0)
        .map(|&p| p * (p * n).ln())
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exact_pass_at_k_matches_enumeration() {
        let policy = [0.1, 0.2, 0.3, 0.4];
        let rewards: [f64; 4] = [0.5, -1.0, 2.0, 0.0];
        let by_reward = [1, 3, 0, 2];
        // All 4^3 ordered triples.
        let mut want = 0.0;
        for a in 0..4 {
            for b in 0..4 {
                for c in 0..4 {
                    let p = policy[a] * policy[b] * policy[c];
                    want += p * rewards[a].max(rewards[b]).max(rewards[c]);
                }
            }
        }
        let got = expected_max_of_draws(&policy, &rewards, &by_reward, 3);
        assert!((got - want).abs() < 1e-12, "{got} vs {want}");
    }

    #[test]
    fn kl_of_uniform_is_zero_and_of_a_point_mass_is_ln_n() {
        assert!(kl_to_uniform(&[0.25; 4]).abs() < 1e-15);
        assert!((kl_to_uniform(&[1.0, 0.0, 0.0, 0.0]) - 4f64.ln()).abs() < 1e-15);
    }

    #[test]
    fn bad_settings_are_named() {
        let err = run(&BanditConfig {
            k: 1,
            ..BanditConfig::default()
        })
        .unwrap_err();
        assert_eq!(err.field, "k");
        let err = run(&BanditConfig {
            learning_rate: f64::NAN,
            ..BanditConfig::default()
        })
        .unwrap_err();
        assert_eq!(err.field, "learning_rate");
        let err = run(&BanditConfig {
            seeds: 0,
            ..BanditConfig::default()
        })
        .unwrap_err();
        assert_eq!(err.to_string(), "seeds = 0: must be at least 1");
    }

    #[test]
    fn the_policy_starts_uniform_and_improves() {
        let experiment = run(&BanditConfig {
            seeds: 3,
            steps: 100,
            ..BanditConfig::default()
        })
        .unwrap();
        for curve in &experiment.curves {
            let start = curve.at_step(0).unwrap();
            let end = curve.at_step(100).unwrap();
            assert!(start.kl.abs() < 1e-12);
            assert!(end.mean_reward > start.mean_reward, "{}", curve.label);
            assert!(end.pass_at_k > start.pass_at_k, "{}", curve.label);
        }
    }
}
