//! The decoder's building blocks: RMSNorm, grouped-query attention, SwiGLU MLP, decoder layer.
//!
//! Each block declares its parameters under the checkpoint's names in `new(path, &config)` and is
//! evaluated by `forward`; LoRA adapters are attached afterwards by `attach_lora(path, …)` with the
//! same path, so adapter variables sit next to the module they adapt.

use tch::nn;
use tch::{Kind, TchError, Tensor};

use super::config::Config;
use super::linear::{AdapterSwitch, Linear, LoraConfig, attach_targeted, frozen};
use super::rope::apply_rotary;

/// Root-mean-square norm, computed in f32 and cast back to the input's kind as transformers does.
#[derive(Debug)]
pub struct RmsNorm {
    weight: Tensor,
    eps: f64,
}

impl RmsNorm {
    /// Declares `<path>.weight` `[size]`.
    pub fn new(path: nn::Path<'_>, size: i64, eps: f64) -> Result<Self, TchError> {
        Ok(Self {
            weight: frozen(&path, "weight", &[size])?,
            eps,
        })
    }

    /// `weight · (x / √(mean(x²) + eps))`.
    pub fn forward(&self, xs: &Tensor) -> Tensor {
        let kind = xs.kind();
        let xs = xs.to_kind(Kind::Float);
        let variance = xs.pow_tensor_scalar(2).mean_dim(-1, true, Kind::Float);
        let normed = xs * (variance + self.eps).rsqrt();
        &self.weight * normed.to_kind(kind)
    }
}

/// Where one layer reads and writes its cached keys and values during a cached forward.
#[derive(Debug)]
pub struct LayerCache<'a> {
    /// `[b, kv_heads, capacity, head_dim]`.
    pub keys: &'a Tensor,
    /// `[b, kv_heads, capacity, head_dim]`.
    pub values: &'a Tensor,
    /// Positions `[0, past)` already hold earlier tokens; this call writes `[past, past + t)`.
    pub past: i64,
}

/// The keys and values a forward attends to before its own tokens.
#[derive(Debug)]
pub enum Past<'a> {
    /// None: this call's tokens only.
    None,
    /// An inference cache: this call's keys/values are written into it and attention covers
    /// every cached position plus this call's tokens (no autograd through it).
    Cache(LayerCache<'a>),
    /// One shared prompt's keys and values `[1, kv_heads, p, head_dim]`, with autograd: every row
    /// of this call continues that prompt (the prompt is computed once for all its samples).
    Shared {
        /// `[1, kv_heads, p, head_dim]`, rotated.
        keys: &'a Tensor,
        /// `[1, kv_heads, p, head_dim]`.
        values: &'a Tensor,
    },
}

impl<'a> From<Option<LayerCache<'a>>> for Past<'a> {
    fn from(cache: Option<LayerCache<'a>>) -> Self {
        cache.map_or(Self::None, Self::Cache)
    }
}

/// What the attention of one forward may look at.
#[derive(Debug)]
pub enum AttentionMask {
    /// Plain causal attention over this call's tokens (no cache, no padding): lets SDPA use its
    /// fused causal kernels.
    Causal,
    /// Explicit `[b, 1, t, past + t]` boolean mask, true where a query may attend to a key.
    Explicit(Tensor),
}

/// Multi-head attention with grouped key/value heads and rotary embeddings.
#[derive(Debug)]
pub struct Attention {
    q_proj: Linear,
    k_proj: Linear,
    v_proj: Linear,
    o_proj: Linear,
    num_heads: i64,
    num_kv_heads: i64,
    head_dim: i64,
}

impl Attention {
    /// Declares `<path>.{q,k,v,o}_proj`, with biases as the config says.
    pub fn new(path: nn::Path<'_>, config: &Config) -> Result<Self, TchError> {
        let hidden = config.hidden_size;
        let q_width = config.num_attention_heads * config.head_dim;
        let kv_width = config.num_key_value_heads * config.head_dim;
        Ok(Self {
            q_proj: Linear::new(&path / "q_proj", hidden, q_width, config.qkv_bias)?,
            k_proj: Linear::new(&path / "k_proj", hidden, kv_width, config.qkv_bias)?,
            v_proj: Linear::new(&path / "v_proj", hidden, kv_width, config.qkv_bias)?,
            o_proj: Linear::new(&path / "o_proj", q_width, hidden, config.o_proj_bias)?,
            num_heads: config.num_attention_heads,
            num_kv_heads: config.num_key_value_heads,
            head_dim: config.head_dim,
        })
    }

    /// Attaches adapters to the projections `lora` targets.
    pub fn attach_lora(
        &mut self,
        path: &nn::Path<'_>,
        lora: &LoraConfig,
        switch: &AdapterSwitch,
    ) -> Result<(), TchError> {
        attach_targeted(
            path,
            [
                ("q_proj", &mut self.q_proj),
                ("k_proj", &mut self.k_proj),
                ("v_proj", &mut self.v_proj),
                ("o_proj", &mut self.o_proj),
            ],
            lora,
            switch,
        )
    }

    /// `xs` `[b, t, hidden]` → `[b, t, hidden]`. With a cache, this call's keys/values are written
    /// into it and attention covers every cached position plus this call's tokens.
    pub fn forward(
        &self,
        xs: &Tensor,
        cos: &Tensor,
        sin: &Tensor,
        mask: &AttentionMask,
        cache: Option<LayerCache<'_>>,
        train: bool,
    ) -> Tensor {
        self.forward_with(xs, cos, sin, mask, cache.into(), train).0
    }

    /// [`Self::forward`] after `past`'s keys and values; also returns this call's own rotated
    /// keys and values `[b, kv_heads, t, head_dim]` (what a later call's [`Past::Shared`] reads).
    pub fn forward_with(
        &self,
        xs: &Tensor,
        cos: &Tensor,
        sin: &Tensor,
        mask: &AttentionMask,
        past: Past<'_>,
        train: bool,
    ) -> (Tensor, Tensor, Tensor) {
        let (batch, seq, _) = xs.size3().expect("hidden states are [b, t, hidden]");
        let heads = |projected: Tensor, heads: i64| {
            projected
                .view([batch, seq, heads, self.head_dim])
                .transpose(1, 2)
        };
        let queries = heads(self.q_proj.forward(xs, train), self.num_heads);
        let keys = heads(self.k_proj.forward(xs, train), self.num_kv_heads);
        let values = heads(self.v_proj.forward(xs, train), self.num_kv_heads);
        let queries = apply_rotary(&queries, cos, sin);
        let keys = apply_rotary(&keys, cos, sin);

        let own = (keys.shallow_clone(), values.shallow_clone());
        let (keys, values) = match past {
            Past::Cache(cache) => {
                cache.keys.narrow(2, cache.past, seq).copy_(&keys);
                cache.values.narrow(2, cache.past, seq).copy_(&values);
                let total = cache.past + seq;
                (
                    cache.keys.narrow(2, 0, total),
                    cache.values.narrow(2, 0, total),
                )
            }
            Past::Shared {
                keys: shared_keys,
                values: shared_values,
            } => {
                let expand = |shared: &Tensor| {
                    let (_, kv_heads, len, head_dim) =
                        shared.size4().expect("shared keys are [1, kv, p, d]");
                    shared.expand([batch, kv_heads, len, head_dim], false)
                };
                (
                    Tensor::cat(&[expand(shared_keys), keys], 2),
                    Tensor::cat(&[expand(shared_values), values], 2),
                )
            }
            Past::None => (keys, values),
        };
        let keys = self.repeat_kv(keys);
        let values = self.repeat_kv(values);
        let attended = match mask {
            AttentionMask::Causal => Tensor::scaled_dot_product_attention::<Tensor>(
                &queries, &keys, &values, None, 0.0, true, None, false,
            ),
            AttentionMask::Explicit(mask) => Tensor::scaled_dot_product_attention(
                &queries,
                &keys,
                &values,
                Some(mask),
                0.0,
                false,
                None,
                false,
            ),
        };
        let merged = attended
            .transpose(1, 2)
            .reshape([batch, seq, self.num_heads * self.head_dim]);
        (self.o_proj.forward(&merged, train), own.0, own.1)
    }

    /// Repeats each key/value head for the query heads that share it. Materialised rather than
    /// SDPA's `enable_gqa` because every SDPA backend (including masked memory-efficient CUDA
    /// kernels) accepts equal head counts.
    fn repeat_kv(&self, xs: Tensor) -> Tensor {
        let groups = self.num_heads / self.num_kv_heads;
        if groups == 1 {
            return xs;
        }
        let (batch, kv_heads, seq, head_dim) = xs.size4().expect("keys are [b, kv, t, d]");
        xs.unsqueeze(2)
            .expand([batch, kv_heads, groups, seq, head_dim], false)
            .reshape([batch, kv_heads * groups, seq, head_dim])
    }
}

/// SwiGLU feed-forward: `down(silu(gate(x)) · up(x))`.
#[derive(Debug)]
pub struct Mlp {
    gate_proj: Linear,
    up_proj: Linear,
    down_proj: Linear,
}

impl Mlp {
    /// Declares `<path>.{gate,up,down}_proj`.
    pub fn new(path: nn::Path<'_>, config: &Config) -> Result<Self, TchError> {
        let (hidden, inner, bias) = (
            config.hidden_size,
            config.intermediate_size,
            config.mlp_bias,
        );
        Ok(Self {
            gate_proj: Linear::new(&path / "gate_proj", hidden, inner, bias)?,
            up_proj: Linear::new(&path / "up_proj", hidden, inner, bias)?,
            down_proj: Linear::new(&path / "down_proj", inner, hidden, bias)?,
        })
    }

    /// Attaches adapters to the projections `lora` targets.
    pub fn attach_lora(
        &mut self,
        path: &nn::Path<'_>,
        lora: &LoraConfig,
        switch: &AdapterSwitch,
    ) -> Result<(), TchError> {
        attach_targeted(
            path,
            [
                ("gate_proj", &mut self.gate_proj),
                ("up_proj", &mut self.up_proj),
                ("down_proj", &mut self.down_proj),
            ],
            lora,
            switch,
        )
    }

    /// `[b, t, hidden]` → `[b, t, hidden]`.
    pub fn forward(&self, xs: &Tensor, train: bool) -> Tensor {
        let gate = self.gate_proj.forward(xs, train).silu();
        self.down_proj
            .forward(&(gate * self.up_proj.forward(xs, train)), train)
    }
}

/// Pre-norm decoder layer: attention then MLP, each around a residual connection.
#[derive(Debug)]
pub struct DecoderLayer {
    input_layernorm: RmsNorm,
    self_attn: Attention,
    post_attention_layernorm: RmsNorm,
    mlp: Mlp,
}

impl DecoderLayer {
    /// Declares `<path>.{input_layernorm,self_attn,post_attention_layernorm,mlp}`.
    pub fn new(path: nn::Path<'_>, config: &Config) -> Result<Self, TchError> {
        let (hidden, eps) = (config.hidden_size, config.rms_norm_eps);
        Ok(Self {
            input_layernorm: RmsNorm::new(&path / "input_layernorm", hidden, eps)?,
            self_attn: Attention::new(&path / "self_attn", config)?,
            post_attention_layernorm: RmsNorm::new(
                &path / "post_attention_layernorm",
                hidden,
                eps,
            )?,
            mlp: Mlp::new(&path / "mlp", config)?,
        })
    }

    /// Attaches adapters to this layer's targeted projections.
    pub fn attach_lora(
        &mut self,
        path: &nn::Path<'_>,
        lora: &LoraConfig,
        switch: &AdapterSwitch,
    ) -> Result<(), TchError> {
        self.self_attn
            .attach_lora(&(path / "self_attn"), lora, switch)?;
        self.mlp.attach_lora(&(path / "mlp"), lora, switch)
    }

    /// `[b, t, hidden]` → `[b, t, hidden]`.
    pub fn forward(
        &self,
        xs: &Tensor,
        cos: &Tensor,
        sin: &Tensor,
        mask: &AttentionMask,
        cache: Option<LayerCache<'_>>,
        train: bool,
    ) -> Tensor {
        self.forward_with(xs, cos, sin, mask, cache.into(), train).0
    }

    /// [`Self::forward`] after `past`, also returning the attention's own keys and values (see
    /// [`Attention::forward_with`]).
    pub fn forward_with(
        &self,
        xs: &Tensor,
        cos: &Tensor,
        sin: &Tensor,
        mask: &AttentionMask,
        past: Past<'_>,
        train: bool,
    ) -> (Tensor, Tensor, Tensor) {
        let (attended, keys, values) = self.self_attn.forward_with(
            &self.input_layernorm.forward(xs),
            cos,
            sin,
            mask,
            past,
            train,
        );
        let xs = xs + attended;
        let mlp = self
            .mlp
            .forward(&self.post_attention_layernorm.forward(&xs), train);
        (xs + mlp, keys, values)
    }
}
