//! Rollouts: n sampled completions of each prompt from a policy, each decoded and graded. The RL
//! step learns from them; `arc-rec eval` measures with them.

use std::collections::{BTreeSet, HashMap};

use trainer::chat_policy::ChatPolicy;
use trainer::generate::{GenerationRequest, generate};

use crate::export::example::SYSTEM_PROMPT;
use crate::rft::{Grader, RftDataset, RftPrompt, Verdict};

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
pub struct Sampling {
    /// Completions per prompt.
    pub n: usize,
    pub max_new_tokens: usize,
    /// 0 is greedy.
    pub temperature: f64,
    /// Seeds the draws (with each prompt's key).
    pub seed: u64,
}

/// One graded completion.
#[derive(Debug)]
pub struct GradedSample {
    pub tokens: Vec<i64>,
    /// Policy log-probs of `tokens` (temperature 1), for the RL loss's ratio and the entropy.
    pub logprobs: Vec<f32>,
    pub verdict: Verdict,
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
    sampling: Sampling,
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
                        logprobs: sample.logprobs,
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
