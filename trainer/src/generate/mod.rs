//! Sampling k completions per prompt through the KV cache: one left-padded prefill per prompt
//! batch shared by the k samples, single-token decode steps, temperature/top-k/top-p, eos and
//! stop-string stops, per-token policy log-probs, seeded draws that do not depend on what else
//! is in the batch, and optionally a grammar ([`crate::grammar`]): each step's logits are masked
//! to the tokens the sample's grammar state allows before temperature and filtering, so every
//! sample is in the grammar's language and its log-probs are those of the masked distribution.
//!
//! ```ignore
//! let mut request = GenerationRequest::new(vec![prompt_a, prompt_b]);
//! request.num_samples = 8;
//! request.max_new_tokens = 256;
//! request.temperature = 1.0;
//! request.eos_token_ids = model.config().eos_token_ids.iter().copied().collect();
//! let generation = generate(&model, &request)?;
//! for sample in &generation.samples { /* sample.tokens, sample.logprobs, sample.finish_reason */ }
//! ```

pub mod sampling;

use std::collections::BTreeSet;
use std::fmt;
use std::time::{Duration, Instant};

use rand::{RngCore, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tch::{Device, Kind, TchError, Tensor};

use crate::grammar::{
    Grammar, GrammarError, TokenMatcher, TokenSet, panic_message, stack_token_sets,
};
use crate::model::{CausalLm, KvCache, Logits, ModelError};
use sampling::{SamplingParams, choose};

/// Turns generated token ids into text, so stop strings can be matched. The tokenizer implements
/// it; any `Fn(&[i64]) -> String` does too (tests use a fake decoder).
pub trait TokenDecoder {
    /// The text of `ids` (lossy where ids split a character).
    fn decode(&self, ids: &[i64]) -> String;
}

impl<F: Fn(&[i64]) -> String> TokenDecoder for F {
    fn decode(&self, ids: &[i64]) -> String {
        self(ids)
    }
}

/// Stop a sample as soon as its decoded completion contains any of `strings`.
pub struct StopStrings<'a> {
    /// Non-empty strings; the completion keeps the tokens up to and including the one that
    /// completed the match (as Hugging Face's `StopStringCriteria` does), the text is not cut.
    pub strings: Vec<String>,
    /// Decodes a completion's token ids.
    pub decoder: &'a dyn TokenDecoder,
}

impl fmt::Debug for StopStrings<'_> {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter
            .debug_struct("StopStrings")
            .field("strings", &self.strings)
            .finish_non_exhaustive()
    }
}

/// What to do with rows that finished while others still decode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FinishedRows {
    /// Finished rows keep stepping on a pad token with their outputs frozen; the batch never
    /// shrinks and the cache is never copied.
    KeepStepping,
    /// Once at least half of the batch's rows have finished, copy the cache down to the unfinished
    /// rows ([`KvCache::select_rows`]), so later steps compute only those. Halving bounds the
    /// copying to about twice the cache's size over a whole generation. The default: on the CPU
    /// (tiny-qwen2, 2 prompts × 16 samples, scattered eos) it decoded in 17.5 ms against 26.5 ms
    /// for [`Self::KeepStepping`], computing 547 rows instead of 1728 over the same 54 steps.
    /// A latency-bound GPU step gains less, but the copy is cheap there too.
    #[default]
    DropWhenHalfFinished,
}

/// When each decode step works out its rows' allowed tokens (constrained requests only).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum GrammarSchedule {
    /// [`Self::BesideForward`] where the forward leaves a core free for it: on CUDA (the forward
    /// is kernel launches the GPU runs on), or on the CPU when libtorch's intra-op threads are
    /// fewer than the machine's cores; [`Self::AfterForward`] otherwise. Measured on this 2-core
    /// CPU (tiny preset, k = 8): with one torch thread beside the forward cut the grammar's cost
    /// to the decode loop from 26% of generation time to 3% (0.47 → 0.36 ms per token); with
    /// two, the grammar's thread only took a core from the forward (0.51 → 0.52 ms per token).
    #[default]
    Auto,
    /// On a second thread while the model computes the step's logits, as vLLM and SGLang overlap
    /// their grammar masks with the forward: the allowed sets depend only on the tokens so far,
    /// not on the logits, so the two are independent. The decode loop waits only for whatever of
    /// the grammar's work outlasts the forward.
    BesideForward,
    /// After the forward, on the decode loop's thread.
    AfterForward,
}

impl GrammarSchedule {
    /// The schedule [`Self::Auto`] stands for on `device`; the others stand for themselves.
    pub fn resolve(self, device: Device) -> Self {
        match self {
            Self::Auto => {
                let cores = std::thread::available_parallelism().map_or(1, usize::from);
                let torch_threads = usize::try_from(tch::get_num_threads()).unwrap_or(cores);
                if device.is_cuda() || torch_threads < cores {
                    Self::BesideForward
                } else {
                    Self::AfterForward
                }
            }
            other => other,
        }
    }
}

/// A batch of prompts to complete, k samples each. Build with [`GenerationRequest::new`] and set
/// the fields that differ from its defaults.
#[derive(Debug)]
pub struct GenerationRequest<'a> {
    /// Token ids of each prompt, unpadded, of any lengths; left-padded internally.
    pub prompts: Vec<Vec<i64>>,
    /// Samples per prompt (k ≥ 1); they share one prefill of their prompt.
    pub num_samples: usize,
    /// Most tokens generated per sample (≥ 1).
    pub max_new_tokens: usize,
    /// 0 means greedy (top_k and top_p are then moot); otherwise a positive, finite divisor of
    /// the logits.
    pub temperature: f64,
    /// Keep the `top_k` most likely tokens; 0 is off.
    pub top_k: usize,
    /// Nucleus sampling threshold in (0, 1]; 1.0 is off.
    pub top_p: f64,
    /// Generating any of these ends a sample (the token is kept in its output). Empty: never.
    pub eos_token_ids: BTreeSet<i64>,
    /// Fills the left padding of shorter prompts and the input of finished rows; it is always
    /// masked out, so any id inside the vocabulary does.
    pub pad_token_id: i64,
    /// Optional stop strings, matched on decoded text.
    pub stop: Option<StopStrings<'a>>,
    /// Seeds every draw; see [`Self::prompt_keys`].
    pub seed: u64,
    /// Per prompt, the key of its random streams: sample `s` of a prompt with key `p` draws its
    /// uniforms from a ChaCha8 stream seeded by (`seed`, `p`, `s`), so it comes out the same
    /// whatever else is batched with it (up to float rounding of the logits, which differs between
    /// batch shapes by ~1e-6). `None` uses each prompt's index in [`Self::prompts`]; pass global
    /// ids (e.g. dataset indices) when a batch may be split or regrouped.
    pub prompt_keys: Option<Vec<u64>>,
    /// Finished-row policy, a speed choice only: the same tokens come out either way (log-probs
    /// agree to float rounding, as a smaller batch may take other GEMM blockings).
    pub finished_rows: FinishedRows,
    /// Grammars the samples are constrained to: none (unconstrained), one for every prompt, or
    /// one per prompt in [`Self::prompts`]' order. Their vocabulary must be the model's and their
    /// stop ids should be among `eos_token_ids`, so a sample ends where its grammar does.
    pub grammars: &'a [Grammar],
    /// When the grammar's allowed sets are computed, a speed choice only: the same sets, so the
    /// same tokens and log-probs, come out either way.
    pub grammar_schedule: GrammarSchedule,
}

impl GenerationRequest<'_> {
    /// The grammar prompt `prompt_index`'s samples follow, if any (see [`Self::grammars`]).
    pub fn grammar_of(&self, prompt_index: usize) -> Option<&Grammar> {
        match self.grammars {
            [] => None,
            [shared] => Some(shared),
            per_prompt => per_prompt.get(prompt_index),
        }
    }

    /// `prompts` with 1 sample each, 16 new tokens, temperature 1, no top-k/top-p, no eos, pad 0,
    /// seed 0.
    pub fn new(prompts: Vec<Vec<i64>>) -> Self {
        Self {
            prompts,
            num_samples: 1,
            max_new_tokens: 16,
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            eos_token_ids: BTreeSet::new(),
            pad_token_id: 0,
            stop: None,
            seed: 0,
            prompt_keys: None,
            finished_rows: FinishedRows::default(),
            grammars: &[],
            grammar_schedule: GrammarSchedule::default(),
        }
    }

    fn sampling_params(&self) -> SamplingParams {
        SamplingParams {
            temperature: self.temperature,
            top_k: self.top_k,
            top_p: self.top_p,
        }
    }
}

/// Why a sample ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinishReason {
    /// It generated one of the eos ids (the last token of its output).
    Eos,
    /// Its decoded text came to contain the stop string at this index of [`StopStrings::strings`].
    StopString(usize),
    /// It reached `max_new_tokens`.
    Length,
}

/// One completion.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    /// Index of its prompt in [`GenerationRequest::prompts`].
    pub prompt_index: usize,
    /// Which of the prompt's k samples (0-based).
    pub sample_index: usize,
    /// The generated ids, no padding; ends with the eos token when it stopped on one.
    pub tokens: Vec<i64>,
    /// Per token, its log-prob under the model's distribution at temperature 1, before
    /// top-k/top-p: `log_softmax` of the raw logits in f32 (masked to the grammar's tokens when
    /// the request has one).
    pub logprobs: Vec<f32>,
    /// Per token, its log-prob under the distribution it was drawn from (grammar mask,
    /// temperature, top-k, top-p applied and renormalised); 0 when greedy. With top-k and top-p
    /// off this is the policy at the sampling temperature, what the RL loss scores.
    pub sampling_logprobs: Vec<f32>,
    /// Per token, the set it was drawn from (constrained requests only; empty otherwise): the
    /// trainer masks its log-probs with the same sets.
    pub allowed: Vec<TokenSet>,
    /// Why it ended.
    pub finish_reason: FinishReason,
}

/// Work done and time spent, for throughput figures (tokens/s = `new_tokens` / total time).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct GenerationCounters {
    /// Forward calls over whole prompts (length > 1); one per request.
    pub prefill_forwards: u64,
    /// Real prompt tokens prefilled (padding excluded).
    pub prefill_tokens: u64,
    /// Positions prefilled including left padding (prompts × longest prompt).
    pub prefill_padded_tokens: u64,
    /// Single-token forward calls.
    pub decode_steps: u64,
    /// Rows computed over all decode steps (finished rows still stepping included); with
    /// `decode_steps` it shows what dropping finished rows saved.
    pub decode_rows: u64,
    /// Times the batch was shrunk to its unfinished rows.
    pub compactions: u64,
    /// Tokens returned over all samples.
    pub new_tokens: u64,
    /// Wall time of the prefill (device synchronised).
    pub prefill_time: Duration,
    /// Wall time of the decode loop, sampling included.
    pub decode_time: Duration,
    /// Host time the decode loop spent on the grammar (constrained requests only): the first
    /// step's allowed sets, waiting for the later steps' sets where they outlasted the forward
    /// ([`GrammarSchedule::BesideForward`]) or computing them after it, the mask tensor, masking
    /// the logits and advancing the matchers. On CUDA the masking kernel itself runs
    /// asynchronously and is not all counted here.
    pub mask_time: Duration,
    /// Host time the allowed sets took on the second thread beside the forward
    /// ([`GrammarSchedule::BesideForward`]); only the part that outlasted the forward is also in
    /// `mask_time`.
    pub mask_beside_forward: Duration,
}

impl GenerationCounters {
    /// New tokens per second of total wall time.
    pub fn tokens_per_second(&self) -> f64 {
        let seconds = (self.prefill_time + self.decode_time).as_secs_f64();
        if seconds > 0.0 {
            self.new_tokens as f64 / seconds
        } else {
            0.0
        }
    }
}

/// Every sample of a request, ordered by prompt then sample index, and the counters.
#[derive(Debug, Clone, PartialEq)]
pub struct Generation {
    /// `prompts.len() × num_samples` completions; sample `s` of prompt `p` is at `p · k + s`.
    pub samples: Vec<Sample>,
    /// Work and time.
    pub counters: GenerationCounters,
}

/// Why a request could not be generated.
#[derive(Debug, thiserror::Error)]
pub enum GenerateError {
    /// `prompts` is empty.
    #[error("generation request has no prompts")]
    NoPrompts,
    /// A prompt has no tokens.
    #[error("prompt {index} of the generation request is empty")]
    EmptyPrompt {
        /// The prompt's index.
        index: usize,
    },
    /// `num_samples` is 0.
    #[error("num_samples must be at least 1, got 0")]
    NoSamples,
    /// `max_new_tokens` is 0.
    #[error("max_new_tokens must be at least 1, got 0")]
    NoNewTokens,
    /// A prompt plus its completion would pass the model's position limit.
    #[error(
        "prompt {index} has {prompt_len} tokens; with max_new_tokens {max_new_tokens} it needs {needed} positions but the model's max_position_embeddings is {limit}"
    )]
    TooLong {
        /// The prompt's index.
        index: usize,
        /// Its length.
        prompt_len: usize,
        /// The request's max_new_tokens.
        max_new_tokens: usize,
        /// prompt_len + max_new_tokens.
        needed: u64,
        /// The model's max_position_embeddings.
        limit: i64,
    },
    /// temperature is negative, NaN or infinite.
    #[error("temperature must be 0 (greedy) or positive and finite, got {0}")]
    InvalidTemperature(f64),
    /// top_p is outside (0, 1].
    #[error("top_p must be in (0, 1], got {0}")]
    InvalidTopP(f64),
    /// A token id (named by `field`) is outside the vocabulary.
    #[error("{field} is token id {id}, outside the model's vocabulary [0, {vocab_size})")]
    TokenOutOfRange {
        /// Where it is, e.g. `prompt 1 position 3`, `eos_token_ids`, `pad_token_id`.
        field: String,
        /// The id.
        id: i64,
        /// The model's vocab_size.
        vocab_size: i64,
    },
    /// `prompt_keys` does not have one key per prompt.
    #[error("prompt_keys has {keys} entries but the request has {prompts} prompts")]
    PromptKeys {
        /// Entries in prompt_keys.
        keys: usize,
        /// Prompts in the request.
        prompts: usize,
    },
    /// A stop string is empty (it would stop every sample at once).
    #[error("stop string {index} is empty")]
    EmptyStopString {
        /// Its index in the stop strings.
        index: usize,
    },
    /// The grammar's vocabulary is not the model's.
    #[error("the grammar ranges over {grammar} token ids but the model's vocab_size is {model}")]
    GrammarVocabulary {
        /// The grammar's vocabulary size.
        grammar: usize,
        /// The model's.
        model: i64,
    },
    /// Neither one grammar for every prompt nor one per prompt.
    #[error("{grammars} grammars for {prompts} prompts: pass one for all of them or one each")]
    GrammarCount {
        /// Grammars passed.
        grammars: usize,
        /// Prompts of the request.
        prompts: usize,
    },
    /// A sample's grammar state failed (a dead end, or a token it refused).
    #[error("grammar: {0}")]
    Grammar(#[from] GrammarError),
    /// The model failed.
    #[error(transparent)]
    Model(#[from] ModelError),
    /// libtorch failed outside the model.
    #[error("libtorch: {0}")]
    Torch(#[from] TchError),
}

/// Samples `request.num_samples` completions of every prompt. See [`GenerationRequest`] for the
/// knobs and [`Sample`] for what comes back. Runs without autograd.
pub fn generate(
    model: &CausalLm,
    request: &GenerationRequest<'_>,
) -> Result<Generation, GenerateError> {
    validate(model, request)?;
    tch::no_grad(|| Decoder::new(model, request)?.run())
}

fn validate(model: &CausalLm, request: &GenerationRequest<'_>) -> Result<(), GenerateError> {
    let config = model.config();
    let vocab_size = config.vocab_size;
    let check_id = |id: i64, field: &dyn Fn() -> String| {
        if (0..vocab_size).contains(&id) {
            Ok(())
        } else {
            Err(GenerateError::TokenOutOfRange {
                field: field(),
                id,
                vocab_size,
            })
        }
    };
    if request.prompts.is_empty() {
        return Err(GenerateError::NoPrompts);
    }
    if request.num_samples == 0 {
        return Err(GenerateError::NoSamples);
    }
    if request.max_new_tokens == 0 {
        return Err(GenerateError::NoNewTokens);
    }
    let temperature = request.temperature;
    if !(temperature.is_finite() && temperature >= 0.0) {
        return Err(GenerateError::InvalidTemperature(temperature));
    }
    // NaN fails both comparisons, so it is rejected too.
    if !(request.top_p > 0.0 && request.top_p <= 1.0) {
        return Err(GenerateError::InvalidTopP(request.top_p));
    }
    for (index, prompt) in request.prompts.iter().enumerate() {
        if prompt.is_empty() {
            return Err(GenerateError::EmptyPrompt { index });
        }
        let needed = prompt.len() as u64 + request.max_new_tokens as u64;
        if needed > u64::try_from(config.max_position_embeddings).unwrap_or(0) {
            return Err(GenerateError::TooLong {
                index,
                prompt_len: prompt.len(),
                max_new_tokens: request.max_new_tokens,
                needed,
                limit: config.max_position_embeddings,
            });
        }
        for (position, &id) in prompt.iter().enumerate() {
            check_id(id, &|| format!("prompt {index} position {position}"))?;
        }
    }
    for &id in &request.eos_token_ids {
        check_id(id, &|| "eos_token_ids".to_owned())?;
    }
    check_id(request.pad_token_id, &|| "pad_token_id".to_owned())?;
    if let Some(keys) = &request.prompt_keys
        && keys.len() != request.prompts.len()
    {
        return Err(GenerateError::PromptKeys {
            keys: keys.len(),
            prompts: request.prompts.len(),
        });
    }
    if let Some(stop) = &request.stop
        && let Some(index) = stop.strings.iter().position(String::is_empty)
    {
        return Err(GenerateError::EmptyStopString { index });
    }
    let grammars = request.grammars.len();
    if grammars > 1 && grammars != request.prompts.len() {
        return Err(GenerateError::GrammarCount {
            grammars,
            prompts: request.prompts.len(),
        });
    }
    if let Some(grammar) = request
        .grammars
        .iter()
        .find(|grammar| i64::try_from(grammar.vocab_size()).ok() != Some(vocab_size))
    {
        return Err(GenerateError::GrammarVocabulary {
            grammar: grammar.vocab_size(),
            model: vocab_size,
        });
    }
    Ok(())
}

/// One sample being generated.
struct SampleState {
    sample: Sample,
    rng: ChaCha8Rng,
    finished: bool,
    /// Where the sample is in the request's grammar.
    matcher: Option<TokenMatcher>,
    /// The tokens that end the completion before its token limit, once it came near it (see
    /// [`allowed_sets`]); each step allows only the first.
    closing: Vec<i64>,
    /// No closing path was found within the tokens left: the sample samples on, and may be cut.
    closing_failed: bool,
}

impl SampleState {
    fn new(
        seed: u64,
        prompt_key: u64,
        prompt_index: usize,
        sample_index: usize,
        matcher: Option<TokenMatcher>,
    ) -> Self {
        // A 256-bit ChaCha key from the triple: distinct triples get unrelated streams.
        let mut key = [0u8; 32];
        key[..8].copy_from_slice(&seed.to_le_bytes());
        key[8..16].copy_from_slice(&prompt_key.to_le_bytes());
        key[16..24].copy_from_slice(&(sample_index as u64).to_le_bytes());
        key[24..].copy_from_slice(b"arc-gen1");
        Self {
            sample: Sample {
                prompt_index,
                sample_index,
                tokens: Vec::new(),
                logprobs: Vec::new(),
                sampling_logprobs: Vec::new(),
                allowed: Vec::new(),
                finish_reason: FinishReason::Length,
            },
            rng: ChaCha8Rng::from_seed(key),
            finished: false,
            matcher,
            closing: Vec::new(),
            closing_failed: false,
        }
    }

    /// A uniform in the open interval (0, 1) from the top 24 bits (f32's mantissa), so the
    /// inverse-CDF draw never lands on a zero-probability token.
    fn uniform(&mut self) -> f32 {
        let bits = self.rng.next_u32() >> 8;
        (bits as f32 + 0.5) / (1u32 << 24) as f32
    }
}

/// The state of one [`generate`] call.
struct Decoder<'m, 'r, 'a> {
    model: &'m CausalLm,
    request: &'r GenerationRequest<'a>,
    params: SamplingParams,
    states: Vec<SampleState>,
    /// `rows[r]` is the sample the cache's row `r` belongs to.
    rows: Vec<usize>,
    counters: GenerationCounters,
    /// Tokens decoded for stop-string matching: enough to hold the longest stop string even when
    /// every token is a single byte of a multi-byte character.
    stop_window: usize,
    /// The request's [`GrammarSchedule`], resolved for the model's device.
    grammar_schedule: GrammarSchedule,
}

impl<'m, 'r, 'a> Decoder<'m, 'r, 'a> {
    fn new(model: &'m CausalLm, request: &'r GenerationRequest<'a>) -> Result<Self, GenerateError> {
        let samples = request.num_samples;
        let mut states = Vec::with_capacity(request.prompts.len() * samples);
        for prompt_index in 0..request.prompts.len() {
            let key = request
                .prompt_keys
                .as_ref()
                .and_then(|keys| keys.get(prompt_index).copied())
                .unwrap_or(prompt_index as u64);
            for sample_index in 0..samples {
                let matcher = request
                    .grammar_of(prompt_index)
                    .map(Grammar::matcher)
                    .transpose()?;
                states.push(SampleState::new(
                    request.seed,
                    key,
                    prompt_index,
                    sample_index,
                    matcher,
                ));
            }
        }
        let stop_window = request.stop.as_ref().map_or(0, |stop| {
            stop.strings.iter().map(String::len).max().unwrap_or(0) + 8
        });
        Ok(Self {
            model,
            request,
            params: request.sampling_params(),
            rows: (0..states.len()).collect(),
            states,
            counters: GenerationCounters::default(),
            stop_window,
            grammar_schedule: request.grammar_schedule.resolve(model.runtime().device),
        })
    }

    fn run(mut self) -> Result<Generation, GenerateError> {
        let device = self.model.runtime().device;
        let samples = self.request.num_samples as i64;
        let max_new = self.request.max_new_tokens as i64;

        let started = Instant::now();
        let (ids, mask, width) = self.left_padded()?;
        let prompts = self.request.prompts.len() as i64;
        let mut cache = self.model.new_cache(prompts, width + max_new)?;
        let last = self.model.forward(
            &ids.f_to_device(device)?,
            Some(&mask.f_to_device(device)?),
            Some(&mut cache),
            Logits::Last,
        )?;
        // The k samples of a prompt share its keys/values and its first distribution.
        let mut cache = cache.repeat_interleave(samples)?;
        let mut logits = last.f_repeat_interleave_self_int(samples, 0, None)?;
        synchronize(device);
        self.counters.prefill_forwards = 1;
        self.counters.prefill_tokens = self.request.prompts.iter().map(|p| p.len() as u64).sum();
        self.counters.prefill_padded_tokens = (prompts * width) as u64;
        self.counters.prefill_time = started.elapsed();

        let started = Instant::now();
        let mask_started = Instant::now();
        let mut allowed = self.allowed_sets()?;
        if allowed.is_some() {
            self.counters.mask_time += mask_started.elapsed();
        }
        loop {
            self.choose_and_record(&logits, allowed.as_deref())?;
            if self.rows.iter().all(|&sample| self.states[sample].finished) {
                break;
            }
            cache = self.maybe_drop_finished(cache)?;
            let (input, mask) = self.next_input()?;
            let input = input.f_to_device(device)?;
            let mask = mask.map(|mask| mask.f_to_device(device)).transpose()?;
            (logits, allowed) = self.forward_and_allowed(&input, mask.as_ref(), &mut cache)?;
            self.counters.decode_steps += 1;
            self.counters.decode_rows += self.rows.len() as u64;
        }
        self.counters.decode_time = started.elapsed();
        self.counters.new_tokens = self
            .states
            .iter()
            .map(|state| state.sample.tokens.len() as u64)
            .sum();
        Ok(Generation {
            samples: self.states.into_iter().map(|state| state.sample).collect(),
            counters: self.counters,
        })
    }

    /// `[prompts, width]` ids left-padded with the pad id, the matching 0/1 mask, and the width.
    fn left_padded(&self) -> Result<(Tensor, Tensor, i64), TchError> {
        let prompts = &self.request.prompts;
        let width = prompts.iter().map(Vec::len).max().unwrap_or(0);
        let mut ids = Vec::with_capacity(prompts.len() * width);
        let mut mask = Vec::with_capacity(prompts.len() * width);
        for prompt in prompts {
            let pad = width - prompt.len();
            ids.extend(std::iter::repeat_n(self.request.pad_token_id, pad));
            ids.extend_from_slice(prompt);
            mask.extend(std::iter::repeat_n(false, pad));
            mask.extend(std::iter::repeat_n(true, prompt.len()));
        }
        let shape = [prompts.len() as i64, width as i64];
        Ok((
            Tensor::from_slice(&ids).f_reshape(shape)?,
            Tensor::from_slice(&mask).f_reshape(shape)?,
            width as i64,
        ))
    }

    /// Chooses the next token of every cache row from `logits` `[rows, vocab]`, appends it to the
    /// unfinished samples and settles which of them finish.
    /// The next step's logits from `input`, and its rows' allowed sets when the request has a
    /// grammar, computed as [`GenerationRequest::grammar_schedule`] says.
    fn forward_and_allowed(
        &mut self,
        input: &Tensor,
        mask: Option<&Tensor>,
        cache: &mut KvCache,
    ) -> Result<(Tensor, Option<Vec<TokenSet>>), GenerateError> {
        let model = self.model;
        let forward = |cache: &mut KvCache| model.forward(input, mask, Some(cache), Logits::Last);
        let Some(vocab_size) = self.grammar_vocab_size() else {
            return Ok((forward(cache)?, None));
        };
        if self.grammar_schedule == GrammarSchedule::AfterForward {
            let logits = forward(cache)?;
            let started = Instant::now();
            let sets = allowed_sets(
                &mut self.states,
                &self.rows,
                vocab_size,
                self.request.max_new_tokens,
            )?;
            self.counters.mask_time += started.elapsed();
            return Ok((logits, Some(sets)));
        }
        let (states, rows) = (&mut self.states, &self.rows);
        let max_new_tokens = self.request.max_new_tokens;
        let (logits, sets, work, waited) = std::thread::scope(|scope| {
            let worker = scope.spawn(move || {
                let started = Instant::now();
                let sets = allowed_sets(states, rows, vocab_size, max_new_tokens);
                (sets, started.elapsed())
            });
            let logits = forward(cache);
            let waiting = Instant::now();
            let joined = worker.join();
            let waited = waiting.elapsed();
            let (sets, work) = joined.map_err(|payload| {
                GenerateError::Grammar(GrammarError::Matcher(format!(
                    "the thread computing the allowed tokens panicked: {}",
                    panic_message(payload.as_ref())
                )))
            })?;
            Ok::<_, GenerateError>((logits, sets, work, waited))
        })?;
        self.counters.mask_beside_forward += work;
        self.counters.mask_time += waited;
        Ok((logits?, Some(sets?)))
    }

    /// The vocabulary size of the request's grammars, when it has any (validated to be the
    /// model's for every one).
    fn grammar_vocab_size(&self) -> Option<usize> {
        self.request.grammars.first().map(Grammar::vocab_size)
    }

    /// Each cache row's allowed next tokens when the request has a grammar.
    fn allowed_sets(&mut self) -> Result<Option<Vec<TokenSet>>, GenerateError> {
        self.grammar_vocab_size()
            .map(|vocab_size| {
                allowed_sets(
                    &mut self.states,
                    &self.rows,
                    vocab_size,
                    self.request.max_new_tokens,
                )
            })
            .transpose()
    }

    fn choose_and_record(
        &mut self,
        logits: &Tensor,
        allowed: Option<&[TokenSet]>,
    ) -> Result<(), GenerateError> {
        let uniforms: Vec<f32> = if self.params.is_greedy() {
            vec![0.5; self.rows.len()]
        } else {
            self.rows
                .iter()
                .map(|&sample| {
                    let state = &mut self.states[sample];
                    // Finished rows must not consume their stream (they are done with it anyway).
                    if state.finished { 0.5 } else { state.uniform() }
                })
                .collect()
        };
        let mask_started = Instant::now();
        let masked;
        let logits = match allowed {
            Some(sets) => {
                let refs: Vec<&TokenSet> = sets.iter().collect();
                let mask = stack_token_sets(&refs, logits.device())?;
                masked = logits.f_masked_fill(&mask.f_logical_not()?, f64::NEG_INFINITY)?;
                &masked
            }
            None => logits,
        };
        let mut mask_time = if allowed.is_some() {
            mask_started.elapsed()
        } else {
            Duration::ZERO
        };
        let chosen = choose(logits, &self.params, &Tensor::from_slice(&uniforms))?;
        // One device→host copy per step: ids are exact in f64.
        let host = Tensor::f_stack(
            &[
                chosen.tokens.f_to_kind(Kind::Double)?,
                chosen.policy_logprobs.f_to_kind(Kind::Double)?,
                chosen.sampling_logprobs.f_to_kind(Kind::Double)?,
            ],
            0,
        )?
        .f_to_device(Device::Cpu)?;
        let host = Vec::<f64>::try_from(host.f_flatten(0, -1)?)?;
        let rows = self.rows.len();
        for (row, &sample) in self.rows.iter().enumerate() {
            let token = host[row] as i64;
            let state = &mut self.states[sample];
            if state.finished {
                continue;
            }
            state.sample.tokens.push(token);
            state.sample.logprobs.push(host[rows + row] as f32);
            state
                .sample
                .sampling_logprobs
                .push(host[2 * rows + row] as f32);
            if let (Some(matcher), Some(sets)) = (state.matcher.as_mut(), allowed) {
                let consume_started = Instant::now();
                matcher.consume(token)?;
                state.sample.allowed.push(sets[row].clone());
                if !state.closing.is_empty() {
                    // The set allowed only the closing way's next token.
                    state.closing.remove(0);
                }
                mask_time += consume_started.elapsed();
            }
            if let Some(reason) =
                finish_reason(&state.sample.tokens, self.request, self.stop_window)
            {
                state.sample.finish_reason = reason;
                state.finished = true;
            }
        }
        self.counters.mask_time += mask_time;
        Ok(())
    }

    /// Shrinks the cache to the unfinished rows when the policy says so.
    fn maybe_drop_finished(&mut self, cache: KvCache) -> Result<KvCache, TchError> {
        let unfinished: Vec<i64> = (0..self.rows.len())
            .filter(|&row| !self.states[self.rows[row]].finished)
            .map(|row| row as i64)
            .collect();
        let shrink = match self.request.finished_rows {
            FinishedRows::KeepStepping => false,
            FinishedRows::DropWhenHalfFinished => 2 * unfinished.len() <= self.rows.len(),
        };
        if !shrink {
            return Ok(cache);
        }
        self.rows = unfinished
            .iter()
            .map(|&row| self.rows[row as usize])
            .collect();
        self.counters.compactions += 1;
        cache.select_rows(&Tensor::from_slice(&unfinished))
    }

    /// The next step's `[rows, 1]` input: each unfinished row's last token, pad for finished rows,
    /// with a mask only when some row is finished.
    fn next_input(&self) -> Result<(Tensor, Option<Tensor>), TchError> {
        let mut ids = Vec::with_capacity(self.rows.len());
        let mut real = Vec::with_capacity(self.rows.len());
        for &sample in &self.rows {
            let state = &self.states[sample];
            if state.finished {
                ids.push(self.request.pad_token_id);
                real.push(false);
            } else {
                ids.push(
                    state
                        .sample
                        .tokens
                        .last()
                        .copied()
                        .unwrap_or(self.request.pad_token_id),
                );
                real.push(true);
            }
        }
        let rows = ids.len() as i64;
        let ids = Tensor::from_slice(&ids).f_reshape([rows, 1])?;
        let mask = if real.iter().all(|&real| real) {
            None
        } else {
            Some(Tensor::from_slice(&real).f_reshape([rows, 1])?)
        };
        Ok((ids, mask))
    }
}

/// Whether a sample whose completion is now `tokens` ends here, and why. Eos wins over a stop
/// string completed by the same token; the length limit comes last.
/// Within this many tokens of `max_new_tokens`, a constrained sample looks for a way to end.
const CLOSING_WINDOW: usize = 32;
/// It takes that way once the way is this close to the tokens left: one more free token could
/// lengthen it (a new list item, a key), and this is the room left for that.
const CLOSING_SLACK: usize = 8;

/// Each cache row's allowed next tokens: the sample's grammar state for unfinished rows, every
/// token of the `vocab_size` for finished ones (their token is unused). Touches only the
/// samples' states, so it may run beside the forward.
///
/// Near `max_new_tokens` a constrained sample is closed by construction rather than cut: within
/// [`CLOSING_WINDOW`] tokens of the limit it asks its matcher for a short way to end
/// ([`TokenMatcher::closing_path`]); once that way's length plus [`CLOSING_SLACK`] reaches the
/// tokens left, every further step allows only the way's next token. A forced step's allowed
/// set is that one token, and it is recorded as the step's set, so its log-prob under the mask
/// is 0 and the loss, which reads the recorded sets, trains nothing on it.
fn allowed_sets(
    states: &mut [SampleState],
    rows: &[usize],
    vocab_size: usize,
    max_new_tokens: usize,
) -> Result<Vec<TokenSet>, GenerateError> {
    let mut sets = Vec::with_capacity(rows.len());
    for &sample in rows {
        let state = &mut states[sample];
        let set = match (&mut state.matcher, state.finished) {
            (Some(matcher), false) => {
                if state.closing.is_empty() && !state.closing_failed {
                    let left = max_new_tokens.saturating_sub(state.sample.tokens.len());
                    if left <= CLOSING_WINDOW {
                        match matcher.closing_path(left)? {
                            Some(path) if path.len() + CLOSING_SLACK >= left => {
                                state.closing = path;
                            }
                            Some(_) => {}
                            None => state.closing_failed = true,
                        }
                    }
                }
                match state.closing.first() {
                    Some(&token) => TokenSet::only(token, vocab_size),
                    None => matcher.allowed()?,
                }
            }
            _ => TokenSet::full(vocab_size),
        };
        sets.push(set);
    }
    Ok(sets)
}

fn finish_reason(
    tokens: &[i64],
    request: &GenerationRequest<'_>,
    stop_window: usize,
) -> Option<FinishReason> {
    let &last = tokens.last()?;
    if request.eos_token_ids.contains(&last) {
        return Some(FinishReason::Eos);
    }
    if let Some(stop) = &request.stop {
        // Any earlier match would have stopped the sample already, so a match in the decoded tail
        // is a new one; the tail keeps decoding cost flat as completions grow.
        let tail = &tokens[tokens.len().saturating_sub(stop_window)..];
        let text = stop.decoder.decode(tail);
        if let Some(index) = stop.strings.iter().position(|s| text.contains(s.as_str())) {
            return Some(FinishReason::StopString(index));
        }
    }
    if tokens.len() >= request.max_new_tokens {
        return Some(FinishReason::Length);
    }
    None
}

/// Waits for queued CUDA work so wall times mean something; a no-op on the CPU.
fn synchronize(device: Device) {
    if let Device::Cuda(index) = device {
        tch::Cuda::synchronize(index as i64);
    }
}
