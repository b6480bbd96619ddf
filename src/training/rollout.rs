//! Rollouts: n sampled completions of each prompt from a policy, each decoded and graded. The RL
//! step learns from them ([`collect_rl_batch`]: sampling, grading, advantages and dynamic
//! sampling); `arc-rec eval` measures with them ([`rollout`]).

use std::cell::RefCell;
use std::collections::{BTreeSet, HashMap};

use rand::SeedableRng;
use rand::seq::SliceRandom;
use rand_chacha::ChaCha8Rng;

use objectives::{Estimator, Group, carries_signal, estimate};
use trainer::chat_policy::ChatPolicy;
use trainer::generate::{GenerationRequest, generate};
use trainer::grammar::{Grammar, TokenSet};

use super::metrics::RlMetrics;
use super::seeds::{EpochOrder, StepSeeds, Stream};
use super::settings::TrainSettings;
use crate::export::example::SYSTEM_PROMPT;
use crate::rft::dataset::Catalogues;
use crate::rft::schema::recommendation_schema_changing;
use crate::rft::{Grader, GraderKind, RftDataset, RftPrompt, Verdict};

/// A prompt with its tokens.
#[derive(Debug)]
pub struct PromptTokens<'a> {
    pub prompt: &'a RftPrompt,
    pub ids: Vec<i64>,
    /// Index in the data set: keys the prompt's sampling streams, so a sample does not depend on
    /// which other prompts share its batch.
    pub key: u64,
}

/// `prompts` (of `dataset`) rendered with the policy's chat template.
pub fn tokenize_prompts<'a>(
    policy: &ChatPolicy,
    dataset: &RftDataset,
    prompts: &[&'a RftPrompt],
) -> anyhow::Result<Vec<PromptTokens<'a>>> {
    let key_of: HashMap<&str, u64> = dataset
        .prompts
        .iter()
        .enumerate()
        .map(|(index, prompt)| (prompt.id.as_str(), index as u64))
        .collect();
    prompts
        .iter()
        .map(|&prompt| {
            Ok(PromptTokens {
                prompt,
                ids: policy.prompt_ids(SYSTEM_PROMPT, &prompt.user_turn)?,
                key: key_of.get(prompt.id.as_str()).copied().unwrap_or(0),
            })
        })
        .collect()
}

/// How completions are drawn.
#[derive(Debug, Clone, Copy)]
pub struct Sampling<'g> {
    /// Completions per prompt.
    pub n: usize,
    pub max_new_tokens: usize,
    /// 0 is greedy.
    pub temperature: f64,
    /// Seeds the draws (with each prompt's key).
    pub seed: u64,
    /// The recommendation grammar the completions are constrained to (`--constrained on`); each
    /// prompt's is narrowed to the diffs that change its configuration
    /// ([`recommendation_schema_changing`]).
    pub grammar: Option<&'g PromptGrammars>,
}

/// The recommendation grammar and each prompt's narrowing of it (diffs that change the prompt's
/// configuration), compiled once per configuration and kept. A grammar's lexer builds its states
/// lazily as samples meet them, so compiling a prompt's grammar afresh every step paid that again
/// each time: RL steps took 36% longer on the tiny preset than with one shared grammar.
#[derive(Debug)]
pub struct PromptGrammars {
    shared: Grammar,
    /// Each organization's model and tool names.
    catalogues: Catalogues,
    /// By organization and the configuration's JSON text: what a prompt's grammar depends on.
    by_config: RefCell<HashMap<(String, String), Grammar>>,
}

impl PromptGrammars {
    pub fn new(shared: Grammar, catalogues: Catalogues) -> Self {
        Self {
            shared,
            catalogues,
            by_config: RefCell::new(HashMap::new()),
        }
    }

    /// The grammar of `pick`'s samples (compiled on first use): diffs that change its
    /// configuration, naming only its organization's models and tools.
    pub fn for_prompt(&self, pick: &PromptTokens<'_>) -> anyhow::Result<Grammar> {
        let key = (
            pick.prompt.org.clone(),
            pick.prompt.current_config.to_string(),
        );
        if let Some(grammar) = self.by_config.borrow().get(&key) {
            return Ok(grammar.clone());
        }
        let schema = recommendation_schema_changing(
            &pick.prompt.current_config,
            self.catalogues.get(&pick.prompt.org),
        );
        let grammar = self.shared.recompile(&schema).map_err(|e| {
            anyhow::anyhow!(
                "--constrained on: the recommendation grammar for prompt {}: {e}",
                pick.prompt.id
            )
        })?;
        self.by_config.borrow_mut().insert(key, grammar.clone());
        Ok(grammar)
    }
}

/// One graded completion.
#[derive(Debug)]
pub struct GradedSample {
    pub tokens: Vec<i64>,
    /// Log-probs of `tokens` under the distribution they were drawn from: the policy at the
    /// sampling temperature, which the RL loss scores at too (its "old" log-probs); 0 for greedy.
    pub logprobs: Vec<f32>,
    /// Constrained samples: the set each token was drawn from (empty otherwise).
    pub allowed: Vec<TokenSet>,
    pub verdict: Verdict,
}

impl GradedSample {
    /// Whether the sample was drawn under the grammar.
    pub fn constrained(&self) -> bool {
        !self.allowed.is_empty()
    }
}

/// The n graded completions of one prompt.
#[derive(Debug)]
pub struct GradedGroup {
    pub samples: Vec<GradedSample>,
    /// Per sample, the id of its canonical answer: equal answers share an id below n, and each
    /// unparseable completion gets an id of its own from n up (so it never forms a majority with
    /// another).
    pub answers: Vec<u32>,
}

impl GradedGroup {
    pub fn rewards(&self) -> Vec<f64> {
        self.samples.iter().map(|s| s.verdict.reward).collect()
    }

    /// 1 for an accepted sample, else 0.
    pub fn accepted(&self) -> Vec<f64> {
        self.samples
            .iter()
            .map(|s| f64::from(u8::from(s.verdict.accepted)))
            .collect()
    }

    /// How many distinct answers (each unparseable completion counts as one).
    pub fn answer_classes(&self) -> usize {
        self.answers.iter().collect::<BTreeSet<_>>().len()
    }
}

/// A batch's rollouts, one group per prompt in order.
#[derive(Debug)]
pub struct Rollout {
    pub groups: Vec<GradedGroup>,
    /// Tokens generated in all.
    pub new_tokens: u64,
}

/// Samples `sampling.n` completions of every prompt and grades each; `verdict_key` keys the
/// world's acceptance draws.
pub fn rollout(
    policy: &ChatPolicy,
    prompts: &[&PromptTokens<'_>],
    sampling: Sampling<'_>,
    grader: &Grader,
    verdict_key: u64,
) -> anyhow::Result<Rollout> {
    let n = sampling.n;
    let mut request = GenerationRequest::new(prompts.iter().map(|p| p.ids.clone()).collect());
    request.num_samples = n;
    request.max_new_tokens = sampling.max_new_tokens;
    request.temperature = sampling.temperature;
    request.eos_token_ids = policy.stop_ids.iter().copied().collect();
    request.pad_token_id = policy.pad_id;
    request.seed = sampling.seed;
    request.prompt_keys = Some(prompts.iter().map(|p| p.key).collect());
    // Each prompt's samples follow the grammar narrowed to diffs that change its configuration.
    let grammars = match sampling.grammar {
        Some(grammars) => prompts
            .iter()
            .map(|pick| grammars.for_prompt(pick))
            .collect::<anyhow::Result<Vec<_>>>()?,
        None => Vec::new(),
    };
    request.grammars = &grammars;
    let generation = generate(&policy.model, &request)?;
    let mut samples = generation.samples.into_iter();
    let groups = prompts
        .iter()
        .map(|pick| {
            let mut ids: HashMap<String, u32> = HashMap::new();
            let mut answers = Vec::with_capacity(n);
            let graded = samples
                .by_ref()
                .take(n)
                .map(|sample| {
                    let text = policy.decode(&sample.tokens);
                    let verdict = grader.grade(pick.prompt, &text, verdict_key);
                    answers.push(match &verdict.answer {
                        Some(answer) => {
                            let next = ids.len() as u32;
                            *ids.entry(answer.clone()).or_insert(next)
                        }
                        None => (n + answers.len()) as u32,
                    });
                    GradedSample {
                        tokens: sample.tokens,
                        logprobs: sample.sampling_logprobs,
                        allowed: sample.allowed,
                        verdict,
                    }
                })
                .collect();
            GradedGroup {
                samples: graded,
                answers,
            }
        })
        .collect();
    Ok(Rollout {
        groups,
        new_tokens: generation.counters.new_tokens,
    })
}

/// One RL step's rollouts: every group drawn (for the batch's figures) and the ones the update
/// trains on, with their advantages.
#[derive(Debug)]
pub struct RlBatch<'p> {
    /// Every prompt drawn this step, in draw order, with its graded group.
    pub drawn: Vec<(&'p PromptTokens<'p>, GradedGroup)>,
    /// Indices into `drawn` of the groups the update trains on.
    pub kept: Vec<usize>,
    /// Per drawn group, its samples' advantages.
    pub advantages: Vec<Vec<f64>>,
    /// Sampling rounds of `prompts_per_step` prompts it took (1 without dynamic sampling).
    pub rounds: usize,
    /// Figures over every drawn group.
    pub figures: BatchFigures,
    /// Tokens generated in all.
    pub new_tokens: u64,
}

/// What an RL step's rollouts read.
#[derive(Debug)]
pub struct RlRolloutContext<'a, 'p> {
    pub settings: &'a TrainSettings,
    pub estimator: Estimator,
    pub grader: &'a Grader,
    pub prompts: &'p [PromptTokens<'p>],
    /// The grammars samples are drawn under (`--constrained on`), over the RL policy's tokenizer.
    pub grammar: Option<&'a PromptGrammars>,
}

/// Draws the step's prompts from `order` at `cursor` (advanced past every prompt drawn), samples
/// and grades n completions of each and computes their advantages. With dynamic sampling (DAPO)
/// it keeps drawing rounds of `prompts_per_step` prompts until that many groups carry signal (not
/// every advantage zero) or `max_sampling_rounds` rounds are spent, and trains on the first
/// `prompts_per_step` such groups; without it one round, whose zero-signal groups are left out
/// when `skip_zero_advantage_groups` says so.
pub fn collect_rl_batch<'p>(
    policy: &ChatPolicy,
    context: &RlRolloutContext<'_, 'p>,
    order: &mut EpochOrder,
    cursor: &mut u64,
    seeds: StepSeeds,
) -> anyhow::Result<RlBatch<'p>> {
    let settings = context.settings;
    let (n, k, per_round) = (settings.n, settings.k, settings.prompts_per_step);
    let rounds_allowed = if settings.dynamic_sampling {
        settings.max_sampling_rounds
    } else {
        1
    };
    let mut batch = RlBatch {
        drawn: Vec::new(),
        kept: Vec::new(),
        advantages: Vec::new(),
        rounds: 0,
        figures: BatchFigures::default(),
        new_tokens: 0,
    };
    while batch.rounds < rounds_allowed && batch.kept.len() < per_round {
        let round = batch.rounds as u64;
        // Round 0 keeps the seeds runs had before dynamic sampling existed.
        let extra: &[u64] = if round == 0 { &[] } else { &[round] };
        let picks: Vec<&'p PromptTokens<'p>> = (0..per_round)
            .map(|j| &context.prompts[order.at(*cursor + j as u64)])
            .collect();
        *cursor += per_round as u64;
        let sampling = Sampling {
            n,
            max_new_tokens: settings.max_new_tokens,
            temperature: settings.temperature,
            seed: seeds.of(Stream::Sampling, extra),
            grammar: context.grammar,
        };
        let verdict_key = seeds.of(Stream::Verdicts, extra);
        let rollout = rollout(policy, &picks, sampling, context.grader, verdict_key)?;
        batch.new_tokens += rollout.new_tokens;
        for (pick, group) in picks.into_iter().zip(rollout.groups) {
            let index = batch.drawn.len();
            let mut rng = ChaCha8Rng::seed_from_u64(seeds.of(Stream::TieBreak, &[index as u64]));
            let advantages = context
                .estimator
                .advantages(
                    Group {
                        rewards: &group.rewards(),
                        answers: &group.answers,
                    },
                    &mut rng,
                )
                .map_err(anyhow::Error::from)?;
            let signal = carries_signal(&advantages);
            batch.figures.add_group(&group, signal, n, k, &mut rng)?;
            let wanted = if settings.dynamic_sampling || settings.skip_zero_advantage_groups {
                signal
            } else {
                true
            };
            if wanted && batch.kept.len() < per_round {
                batch.kept.push(index);
            }
            batch.advantages.push(advantages);
            batch.drawn.push((pick, group));
        }
        batch.rounds += 1;
    }
    Ok(batch)
}

/// Sums over an RL step's drawn groups.
#[derive(Debug, Default)]
pub struct BatchFigures {
    groups: usize,
    samples: usize,
    signal_groups: usize,
    reward_sum: f64,
    reward_sq_sum: f64,
    accepted: f64,
    valid: f64,
    acceptance_probability: f64,
    learned_probability: f64,
    learned_lower_bound: f64,
    tokens: usize,
    longest: usize,
    negative_logprob_sum: f64,
    pass_at_k: f64,
    maj_at_k: f64,
}

impl BatchFigures {
    fn add_group(
        &mut self,
        group: &GradedGroup,
        signal: bool,
        n: usize,
        k: usize,
        rng: &mut ChaCha8Rng,
    ) -> anyhow::Result<()> {
        for sample in &group.samples {
            let verdict = &sample.verdict;
            self.samples += 1;
            self.reward_sum += verdict.reward;
            self.reward_sq_sum += verdict.reward * verdict.reward;
            self.accepted += f64::from(u8::from(verdict.accepted));
            self.valid += f64::from(u8::from(verdict.format_valid));
            self.acceptance_probability += verdict.acceptance_probability.unwrap_or(0.0);
            self.learned_probability += verdict.learned_probability.unwrap_or(0.0);
            self.learned_lower_bound += verdict.learned_lower_bound.unwrap_or(0.0);
            self.tokens += sample.tokens.len();
            self.longest = self.longest.max(sample.tokens.len());
            self.negative_logprob_sum -= sample.logprobs.iter().map(|&l| f64::from(l)).sum::<f64>();
        }
        self.groups += 1;
        self.signal_groups += usize::from(signal);
        let accepted = group.accepted();
        let correct = accepted.iter().filter(|&&a| a > 0.0).count();
        self.pass_at_k += estimate::pass_at_k(n, correct, k)?;
        let mut priority: Vec<usize> = (0..group.answer_classes()).collect();
        priority.shuffle(rng);
        self.maj_at_k += estimate::majority_at_k(&accepted, &group.answers, &priority, k)?;
        Ok(())
    }

    /// The step's RL figures; `kl`, `clip_fraction` and the draw counts come from elsewhere.
    pub fn metrics(&self, grader: &Grader, kl: f64, clip_fraction: f64) -> RlMetrics {
        let learned = grader.kind() == GraderKind::Learned;
        let groups = self.groups.max(1) as f64;
        let samples = self.samples.max(1) as f64;
        let reward_mean = self.reward_sum / samples;
        RlMetrics {
            reward_mean,
            reward_std: (self.reward_sq_sum / samples - reward_mean * reward_mean)
                .max(0.0)
                .sqrt(),
            pass_at_1: self.accepted / samples,
            pass_at_k: self.pass_at_k / groups,
            maj_at_k: self.maj_at_k / groups,
            nonzero_advantage_fraction: self.signal_groups as f64 / groups,
            kl,
            entropy: self.negative_logprob_sum / (self.tokens as f64).max(1.0),
            clip_fraction,
            format_validity: self.valid / samples,
            completion_tokens_mean: self.tokens as f64 / samples,
            completion_tokens_max: self.longest,
            acceptance_probability: grader
                .world_truths()
                .is_some()
                .then(|| self.acceptance_probability / samples),
            learned_probability: learned.then(|| self.learned_probability / samples),
            learned_lower_bound: learned.then(|| self.learned_lower_bound / samples),
            prompts_drawn: Some(self.groups),
            kl_coef: None,
            kl_average: None,
            max_abs_log_ratio: None,
            sampler_gap: None,
            forbidden_mass: None,
            optimizer_steps: None,
        }
    }
}

/// The recommendation grammar over `policy`'s tokenizer, when `constrained`, ready to narrow per
/// prompt.
pub fn recommendation_grammar(
    policy: &ChatPolicy,
    constrained: bool,
    catalogues: &Catalogues,
) -> anyhow::Result<Option<PromptGrammars>> {
    if !constrained {
        return Ok(None);
    }
    let grammar = policy
        .grammar(&crate::rft::schema::recommendation_schema())
        .map_err(|e| anyhow::anyhow!("--constrained on: {e}"))?;
    Ok(Some(PromptGrammars::new(grammar, catalogues.clone())))
}
