//! The projection used everywhere in the decoder: a frozen `x Wᵀ + b`, optionally plus a LoRA adapter.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use tch::nn::{self, Init};
use tch::{Kind, TchError, Tensor};

/// The kind of LoRA adapters (and so of their AdamW moments), whatever the base's kind.
pub const ADAPTER_KIND: Kind = Kind::Float;

/// The projections LoRA may adapt, by the last component of their checkpoint name.
pub const LORA_TARGETS: [&str; 7] = [
    "q_proj",
    "k_proj",
    "v_proj",
    "o_proj",
    "gate_proj",
    "up_proj",
    "down_proj",
];

/// PEFT-style LoRA hyper-parameters.
#[derive(Debug, Clone, PartialEq)]
pub struct LoraConfig {
    /// Rank of the update `B·A`.
    pub r: i64,
    /// The update is scaled by `alpha / r`.
    pub alpha: f64,
    /// Dropout on the adapter's input (training forward only).
    pub dropout: f64,
    /// Which projections get adapters, by short name (`q_proj`, …, `down_proj`).
    pub target_modules: Vec<String>,
}

impl Default for LoraConfig {
    fn default() -> Self {
        Self {
            r: 16,
            alpha: 32.0,
            dropout: 0.0,
            target_modules: LORA_TARGETS.iter().map(|name| (*name).to_owned()).collect(),
        }
    }
}

impl LoraConfig {
    /// `alpha / r`, the factor on the adapter's output.
    pub fn scaling(&self) -> f64 {
        self.alpha / self.r as f64
    }

    /// Whether the projection called `module` (e.g. `q_proj`) gets an adapter.
    pub fn targets(&self, module: &str) -> bool {
        self.target_modules.iter().any(|target| target == module)
    }
}

/// One switch shared by every adapter of a model: off, the model computes the frozen base policy
/// (the RL reference) from the same weights, with no second copy in memory.
#[derive(Debug, Clone)]
pub struct AdapterSwitch(Arc<AtomicBool>);

impl Default for AdapterSwitch {
    fn default() -> Self {
        Self(Arc::new(AtomicBool::new(true)))
    }
}

impl AdapterSwitch {
    /// Whether adapters contribute to forward passes.
    pub fn enabled(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }

    /// Turns every adapter sharing this switch on or off.
    pub fn set_enabled(&self, enabled: bool) {
        self.0.store(enabled, Ordering::Relaxed);
    }
}

/// The low-rank update `(alpha / r) · dropout(x) Aᵀ Bᵀ`, computed in f32 and cast to the base's
/// kind.
///
/// The adapters are f32 whatever the base's kind, as PEFT keeps them by default
/// (`autocast_adapter_dtype`): over a bf16 base, a bf16 adapter would round away every update
/// smaller than 2⁻⁸ of its value (a step of 1e-5 on an entry of 0.1), and AdamW's moments, made
/// like their parameter, would lose the small second moments that set the step size.
#[derive(Debug)]
struct LoraAdapter {
    /// `[r, in_features]`, kaiming-uniform(a=√5) as PEFT initialises it.
    a: Tensor,
    /// `[out_features, r]`, zeros so a fresh adapter leaves the model unchanged.
    b: Tensor,
    scaling: f64,
    dropout: f64,
    switch: AdapterSwitch,
}

/// A linear projection whose `weight`/`bias` are checkpoint tensors (frozen) and which may carry a
/// trainable LoRA adapter stored next to it as `lora_A.weight` / `lora_B.weight`.
#[derive(Debug)]
pub struct Linear {
    weight: Tensor,
    bias: Option<Tensor>,
    lora: Option<LoraAdapter>,
}

/// Adds a frozen variable of the store's kind; checkpoint loading overwrites it in place.
pub(crate) fn frozen(path: &nn::Path<'_>, name: &str, dims: &[i64]) -> Result<Tensor, TchError> {
    let zeros = Tensor::f_zeros(dims, (path.kind(), path.device()))?;
    Ok(path.add(name, zeros, false))
}

impl Linear {
    /// Declares `<path>.weight` `[out, in]` (and `<path>.bias` `[out]` when `bias`), frozen.
    pub fn new(
        path: nn::Path<'_>,
        in_features: i64,
        out_features: i64,
        bias: bool,
    ) -> Result<Self, TchError> {
        let weight = frozen(&path, "weight", &[out_features, in_features])?;
        let bias = if bias {
            Some(frozen(&path, "bias", &[out_features])?)
        } else {
            None
        };
        Ok(Self {
            weight,
            bias,
            lora: None,
        })
    }

    /// Wraps an existing weight (the tied LM head reuses the embedding matrix).
    pub(crate) fn from_weight(weight: Tensor) -> Self {
        Self {
            weight,
            bias: None,
            lora: None,
        }
    }

    /// The frozen `[out, in]` weight.
    pub fn weight(&self) -> &Tensor {
        &self.weight
    }

    /// Whether a LoRA adapter is attached.
    pub fn has_adapter(&self) -> bool {
        self.lora.is_some()
    }

    /// Creates trainable `<path>.lora_A.weight` `[r, in]` and `<path>.lora_B.weight` `[out, r]`.
    /// Replaces any adapter already attached to this projection in this struct (the old variables
    /// stay in the store under tch's de-duplicated names, so attach once per model).
    pub fn attach_lora(
        &mut self,
        path: &nn::Path<'_>,
        config: &LoraConfig,
        switch: &AdapterSwitch,
    ) -> Result<(), TchError> {
        let (out_features, in_features) = self.weight.size2()?;
        // kaiming_uniform(a=√5) on [r, in]: gain √(2/(1+5)) times √(3/fan_in) = 1/√in.
        let bound = 1.0 / (in_features as f64).sqrt();
        let device = path.device();
        let a = nn::f_init(
            Init::Uniform {
                lo: -bound,
                up: bound,
            },
            &[config.r, in_features],
            device,
            ADAPTER_KIND,
        )?;
        let a = path.sub("lora_A").add("weight", a, true);
        let b = nn::f_init(
            Init::Const(0.0),
            &[out_features, config.r],
            device,
            ADAPTER_KIND,
        )?;
        let b = path.sub("lora_B").add("weight", b, true);
        self.lora = Some(LoraAdapter {
            a,
            b,
            scaling: config.scaling(),
            dropout: config.dropout,
            switch: switch.clone(),
        });
        Ok(())
    }

    /// `x Wᵀ + b`, plus the adapter's update when one is attached and enabled; `train` turns on
    /// the adapter's dropout.
    pub fn forward(&self, xs: &Tensor, train: bool) -> Tensor {
        let base = xs.linear(&self.weight, self.bias.as_ref());
        match &self.lora {
            Some(lora) if lora.switch.enabled() => {
                let input = xs.to_kind(ADAPTER_KIND);
                let dropped = if train && lora.dropout > 0.0 {
                    input.dropout(lora.dropout, true)
                } else {
                    input
                };
                let update = dropped
                    .linear::<Tensor>(&lora.a, None)
                    .linear::<Tensor>(&lora.b, None);
                base + (update * lora.scaling).to_kind(xs.kind())
            }
            _ => base,
        }
    }
}

/// Checks `LoraConfig` before any variable is created.
pub(crate) fn validate_lora(config: &LoraConfig) -> Result<(), String> {
    if config.r <= 0 {
        return Err(format!("LoRA rank r must be positive, found {}", config.r));
    }
    if !(0.0..1.0).contains(&config.dropout) {
        return Err(format!(
            "LoRA dropout must be in [0, 1), found {}",
            config.dropout
        ));
    }
    if config.target_modules.is_empty() {
        return Err("LoRA target_modules is empty".into());
    }
    if let Some(unknown) = config
        .target_modules
        .iter()
        .find(|name| !LORA_TARGETS.contains(&name.as_str()))
    {
        return Err(format!(
            "unknown LoRA target module {unknown:?}; known are {LORA_TARGETS:?}"
        ));
    }
    Ok(())
}

/// Attaches adapters to those of a block's `(name, projection)` pairs that `lora` targets; the
/// adapter variables go under `path / name`, next to the projection's weight.
pub(crate) fn attach_targeted<'p>(
    path: &nn::Path<'_>,
    projections: impl IntoIterator<Item = (&'static str, &'p mut Linear)>,
    lora: &LoraConfig,
    switch: &AdapterSwitch,
) -> Result<(), TchError> {
    for (name, projection) in projections {
        if lora.targets(name) {
            projection.attach_lora(&(path / name), lora, switch)?;
        }
    }
    Ok(())
}
