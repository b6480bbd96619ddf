//! Per-row next-token selection on device: temperature, Hugging Face's top-k and top-p (nucleus)
//! filters, inverse-CDF draws from caller-supplied uniforms, and the log-probs the RL loss needs.

use tch::{Kind, TchError, Tensor};

/// How the next token is chosen from a row's logits. Validated by the generator before use.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SamplingParams {
    /// 0 means greedy (argmax; top-k and top-p then change nothing); otherwise logits are divided
    /// by it before filtering.
    pub temperature: f64,
    /// Keep only the `top_k` largest logits (ties with the k-th kept too, as in HF); 0 is off.
    pub top_k: usize,
    /// Keep the smallest set of tokens whose cumulative probability reaches `top_p` (at least one);
    /// 1.0 is off.
    pub top_p: f64,
}

impl SamplingParams {
    /// Whether the token is the argmax, so no uniform draw is consumed.
    pub fn is_greedy(&self) -> bool {
        self.temperature == 0.0
    }
}

/// The chosen tokens of one decode step and their log-probs, all `[rows]`, on the logits' device.
#[derive(Debug)]
pub struct Chosen {
    /// i64 token ids.
    pub tokens: Tensor,
    /// f32 log-prob of each token under the model's own distribution: `log_softmax` of the raw
    /// logits at temperature 1, no filtering. This is the policy log-prob the RL loss uses.
    pub policy_logprobs: Tensor,
    /// f32 log-prob of each token under the distribution it was actually drawn from (after
    /// temperature, top-k and top-p); 0 for greedy, which draws from a point mass.
    pub sampling_logprobs: Tensor,
}

/// Hugging Face's `TopKLogitsWarper`: logits below the `k`-th largest of their row become -inf
/// (ties with the k-th value stay). `k` = 0 or `k` ≥ vocab leaves the row unchanged.
pub fn top_k_filter(logits: &Tensor, k: usize) -> Result<Tensor, TchError> {
    let vocab = logits.size().last().copied().unwrap_or(0);
    let k = i64::try_from(k).unwrap_or(i64::MAX);
    if k == 0 || k >= vocab {
        return Ok(logits.shallow_clone());
    }
    let (values, _) = logits.f_topk(k, -1, true, true)?;
    let kth = values.f_narrow(-1, k - 1, 1)?;
    let removed = logits.f_lt_tensor(&kth)?;
    logits.f_masked_fill(&removed, f64::NEG_INFINITY)
}

/// Hugging Face's `TopPLogitsWarper`: sort each row ascending, and remove every token whose
/// ascending cumulative probability is ≤ 1 − `top_p`; the most likely token always stays. What
/// remains is the smallest set, taken from the most likely down, whose probability reaches
/// `top_p`. `top_p` ≥ 1 leaves the row unchanged.
pub fn top_p_filter(logits: &Tensor, top_p: f64) -> Result<Tensor, TchError> {
    if top_p >= 1.0 {
        return Ok(logits.shallow_clone());
    }
    let vocab = logits.size().last().copied().unwrap_or(0);
    let (sorted, order) = logits.f_sort(-1, false)?;
    let cumulative = sorted
        .f_softmax(-1, Kind::Float)?
        .f_cumsum(-1, Kind::Float)?;
    let remove_sorted = cumulative.f_le(1.0 - top_p)?;
    // The last (largest) position always stays, whatever rounding did to the sum.
    let _ = remove_sorted.f_narrow(-1, vocab - 1, 1)?.f_fill_(0)?;
    let removed = remove_sorted.f_scatter(-1, &order, &remove_sorted)?;
    logits.f_masked_fill(&removed, f64::NEG_INFINITY)
}

/// Temperature, then top-k, then top-p, in the order Hugging Face's generate applies them (checked
/// against transformers 5.23's warpers on random rows with ties: same kept sets and values); the
/// result is in f32 with -inf on removed tokens. Temperature 0 (greedy) skips the scaling rather
/// than dividing by zero.
pub fn processed_logits(logits: &Tensor, params: &SamplingParams) -> Result<Tensor, TchError> {
    let upcast = logits.f_to_kind(Kind::Float)?;
    let scaled = if params.is_greedy() {
        upcast
    } else {
        upcast.f_div_scalar(params.temperature)?
    };
    let kept = top_k_filter(&scaled, params.top_k)?;
    top_p_filter(&kept, params.top_p)
}

/// Inverse-CDF sampling: for each row, the first token whose cumulative probability reaches
/// `uniform · total`. `probs` is `[rows, vocab]` (non-negative, need not sum exactly to 1) and
/// `uniform` `[rows]` must lie in the open interval (0, 1), which guarantees the chosen token has
/// positive probability: its cumulative value is ≥ the threshold > the one before it.
pub fn inverse_cdf(probs: &Tensor, uniform: &Tensor) -> Result<Tensor, TchError> {
    let vocab = probs.size().last().copied().unwrap_or(0);
    let cdf = probs.f_cumsum(-1, Kind::Float)?;
    let total = cdf.f_narrow(-1, vocab - 1, 1)?;
    let threshold = uniform
        .f_to_device(probs.device())?
        .f_to_kind(Kind::Float)?
        .f_unsqueeze(-1)?
        .f_mul(&total)?;
    cdf.f_lt_tensor(&threshold)?
        .f_sum_dim_intlist(-1, false, Kind::Int64)?
        .f_clamp_max(vocab - 1)
}

/// Chooses one token per row of `logits` `[rows, vocab]` (any float kind; upcast to f32 here so
/// bf16 logits never reach a softmax). `uniform` `[rows]` in (0, 1) drives the draws and is
/// ignored when greedy.
pub fn choose(
    logits: &Tensor,
    params: &SamplingParams,
    uniform: &Tensor,
) -> Result<Chosen, TchError> {
    let logits = logits.f_to_kind(Kind::Float)?;
    let policy = logits.f_log_softmax(-1, Kind::Float)?;
    let (tokens, sampling_logprobs) = if params.is_greedy() {
        let tokens = logits.f_argmax(-1, false)?;
        let zeros = tokens.f_zeros_like()?.f_to_kind(Kind::Float)?;
        (tokens, zeros)
    } else {
        let processed = processed_logits(&logits, params)?;
        let tokens = inverse_cdf(&processed.f_softmax(-1, Kind::Float)?, uniform)?;
        let sampling = processed
            .f_log_softmax(-1, Kind::Float)?
            .f_gather(-1, &tokens.f_unsqueeze(-1)?, false)?
            .f_squeeze_dim(-1)?;
        (tokens, sampling)
    };
    let policy_logprobs = policy
        .f_gather(-1, &tokens.f_unsqueeze(-1)?, false)?
        .f_squeeze_dim(-1)?;
    Ok(Chosen {
        tokens,
        policy_logprobs,
        sampling_logprobs,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kept(filtered: &Tensor) -> Vec<Vec<bool>> {
        let finite = filtered.isfinite();
        (0..finite.size()[0])
            .map(|row| Vec::<bool>::try_from(finite.get(row)).unwrap())
            .collect()
    }

    /// Rows with known probabilities (softmax of log p is p), so the nucleus is computable by hand.
    fn log_probs(rows: &[&[f64]]) -> Tensor {
        let flat: Vec<f32> = rows
            .iter()
            .flat_map(|row| row.iter().map(|p| p.ln() as f32))
            .collect();
        Tensor::from_slice(&flat).reshape([rows.len() as i64, -1])
    }

    #[test]
    fn top_p_keeps_the_smallest_set_reaching_p() {
        let logits = log_probs(&[
            // 0.5 alone < 0.7, 0.5 + 0.25 ≥ 0.7: keep tokens 2 and 0.
            &[0.25, 0.1, 0.5, 0.15],
            // The top token alone already exceeds 0.7: only it stays.
            &[0.05, 0.8, 0.1, 0.05],
            // Ascending cumsum 0.1, 0.3, 0.6, 1.0: token 0 goes, token 1 sits on the 0.3 boundary.
            &[0.1, 0.2, 0.3, 0.4],
        ]);
        let filtered = top_p_filter(&logits, 0.7).unwrap();
        let kept = kept(&filtered);
        assert_eq!(kept[0], [true, false, true, false]);
        assert_eq!(kept[1], [false, true, false, false]);
        // HF removes a token when its ascending cumsum ≤ 1 − p = 0.3; token 1's is 0.3 only up to
        // f32 rounding, so (in HF too) its fate is rounding's; the others are clear-cut.
        assert!(kept[2][2] && kept[2][3] && !kept[2][0]);
        // Kept logits are untouched.
        let diff = (filtered.get(0).get(2) - logits.get(0).get(2)).abs();
        assert!(diff.double_value(&[]) == 0.0);
    }

    #[test]
    fn top_p_always_keeps_the_top_token_and_one_is_off() {
        let logits = log_probs(&[&[0.1, 0.6, 0.3]]);
        assert_eq!(
            kept(&top_p_filter(&logits, 1e-9).unwrap())[0],
            [false, true, false]
        );
        assert_eq!(kept(&top_p_filter(&logits, 1.0).unwrap())[0], [true; 3]);
        // p just above the top two's mass keeps all three.
        assert_eq!(kept(&top_p_filter(&logits, 0.95).unwrap())[0], [true; 3]);
    }

    #[test]
    fn top_k_keeps_the_k_largest_and_their_ties() {
        let logits = Tensor::from_slice(&[1.0f32, 5.0, 3.0, 3.0, -2.0, 4.0]).reshape([1, 6]);
        assert_eq!(
            kept(&top_k_filter(&logits, 2).unwrap())[0],
            [false, true, false, false, false, true]
        );
        // The 3rd largest is 3.0, tied: both stay, as in HF (`scores < kth` is removed).
        assert_eq!(
            kept(&top_k_filter(&logits, 3).unwrap())[0],
            [false, true, true, true, false, true]
        );
        assert_eq!(kept(&top_k_filter(&logits, 0).unwrap())[0], [true; 6]);
        assert_eq!(kept(&top_k_filter(&logits, 99).unwrap())[0], [true; 6]);
    }

    #[test]
    fn inverse_cdf_picks_the_interval_holding_the_uniform() {
        // Zero-probability tokens (removed by a filter) are never chosen, even at the extremes.
        let probs = Tensor::from_slice(&[0.0f32, 0.25, 0.0, 0.75, 0.0]).reshape([1, 5]);
        let pick = |u: f32| {
            inverse_cdf(&probs, &Tensor::from_slice(&[u]))
                .unwrap()
                .int64_value(&[0])
        };
        assert_eq!(pick(1e-7), 1);
        assert_eq!(pick(0.2499), 1);
        assert_eq!(pick(0.2501), 3);
        assert_eq!(pick(0.9999999), 3);
    }

    #[test]
    fn choose_reports_policy_and_sampling_logprobs() {
        let logits = log_probs(&[&[0.1, 0.6, 0.3]]);
        let uniform = Tensor::from_slice(&[0.5f32]);
        let greedy = SamplingParams {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
        };
        let chosen = choose(&logits, &greedy, &uniform).unwrap();
        assert_eq!(chosen.tokens.int64_value(&[0]), 1);
        assert!((chosen.policy_logprobs.double_value(&[0]) - 0.6f64.ln()).abs() < 1e-6);
        assert_eq!(chosen.sampling_logprobs.double_value(&[0]), 0.0);

        // Top-k 2 at temperature 1 renormalises to [0, 2/3, 1/3]: u = 0.9 falls in token 2's slice.
        let sampled = SamplingParams {
            temperature: 1.0,
            top_k: 2,
            top_p: 1.0,
        };
        let chosen = choose(&logits, &sampled, &Tensor::from_slice(&[0.9f32])).unwrap();
        assert_eq!(chosen.tokens.int64_value(&[0]), 2);
        assert!((chosen.policy_logprobs.double_value(&[0]) - 0.3f64.ln()).abs() < 1e-6);
        let renormalised = (0.3f64 / 0.9).ln();
        assert!((chosen.sampling_logprobs.double_value(&[0]) - renormalised).abs() < 1e-6);
    }

    #[test]
    fn bf16_logits_are_upcast_before_the_softmax() {
        // CUDA models return bf16 logits; the log-probs must come out in f32 all the same.
        let logits = log_probs(&[&[0.1, 0.6, 0.3]]).to_kind(Kind::BFloat16);
        let params = SamplingParams {
            temperature: 0.8,
            top_k: 0,
            top_p: 0.9,
        };
        let chosen = choose(&logits, &params, &Tensor::from_slice(&[0.2f32])).unwrap();
        assert_eq!(chosen.policy_logprobs.kind(), Kind::Float);
        assert_eq!(chosen.sampling_logprobs.kind(), Kind::Float);
        assert_eq!(chosen.tokens.int64_value(&[0]), 1);
        // bf16 keeps ~3 significant digits of the logits themselves.
        assert!((chosen.policy_logprobs.double_value(&[0]) - 0.6f64.ln()).abs() < 1e-2);
    }
}
