//! Rotary position embeddings (default and llama3-scaled), computed in f32 as transformers does.

use std::f64::consts::PI;

use tch::{Device, Kind, Tensor};

use super::config::{Rope, RopeScaling};

/// The inverse frequencies of one head's rotary embedding; cos/sin are derived per forward from
/// each row's position ids, so left-padded rows rotate exactly like their unpadded prompt.
#[derive(Debug)]
pub struct RotaryEmbedding {
    /// `[head_dim / 2]`, f32.
    inv_freq: Tensor,
}

impl RotaryEmbedding {
    /// Builds the frequencies for `head_dim` on `device`, following transformers'
    /// `_compute_default_rope_parameters` / `_compute_llama3_parameters` op for op in f32 so that
    /// reference logits match to float rounding.
    pub fn new(rope: &Rope, head_dim: i64, device: Device) -> Self {
        let exponents = Tensor::arange_start_step(0, head_dim, 2, (Kind::Int64, device))
            .to_kind(Kind::Float)
            / head_dim as f64;
        let inv_freq = Tensor::pow_scalar(rope.theta, &exponents).reciprocal();
        let inv_freq = match rope.scaling {
            RopeScaling::Default => inv_freq,
            RopeScaling::Llama3 {
                factor,
                low_freq_factor,
                high_freq_factor,
                original_max_position_embeddings: old_context,
            } => {
                let low_freq_wavelen = old_context / low_freq_factor;
                let high_freq_wavelen = old_context / high_freq_factor;
                let wavelen = inv_freq.reciprocal() * (2.0 * PI);
                // Long wavelengths (low frequencies) are divided by `factor`; short ones kept.
                let scaled =
                    inv_freq.where_self(&wavelen.le(low_freq_wavelen), &(&inv_freq / factor));
                let smooth = ((wavelen.reciprocal() * old_context) - low_freq_factor)
                    / (high_freq_factor - low_freq_factor);
                let smoothed =
                    (smooth.ones_like() - &smooth) * &scaled / factor + &smooth * &scaled;
                let medium = wavelen
                    .ge(high_freq_wavelen)
                    .logical_and(&wavelen.le(low_freq_wavelen));
                smoothed.where_self(&medium, &scaled)
            }
        };
        Self { inv_freq }
    }

    /// cos and sin for `positions` `[b, t]` (i64), shaped `[b, 1, t, head_dim]` for broadcasting
    /// over heads, computed in f32 and cast to `kind`.
    pub fn cos_sin(&self, positions: &Tensor, kind: Kind) -> (Tensor, Tensor) {
        let freqs = positions.to_kind(Kind::Float).unsqueeze(-1) * &self.inv_freq;
        let angles = Tensor::cat(&[&freqs, &freqs], -1).unsqueeze(1);
        (angles.cos().to_kind(kind), angles.sin().to_kind(kind))
    }
}

/// Rotates `xs` `[b, heads, t, head_dim]` by the angles whose cos/sin are given.
pub fn apply_rotary(xs: &Tensor, cos: &Tensor, sin: &Tensor) -> Tensor {
    let half = xs.size()[3] / 2;
    let first = xs.narrow(-1, 0, half);
    let second = xs.narrow(-1, half, half);
    let rotated = Tensor::cat(&[&(-second), &first], -1);
    xs * cos + rotated * sin
}
