//! The key/value cache for incremental decoding: fixed-capacity buffers plus per-row padding state.

use tch::{Device, Kind, TchError, Tensor};

use super::blocks::LayerCache;
use super::config::Config;

/// Keys and values of every layer for a batch of sequences, preallocated to `capacity` positions
/// so that decoding writes in place instead of concatenating (which would copy the whole cache on
/// every step).
///
/// Besides the tensors it remembers, per row, which cached positions are real tokens (left padding
/// is masked out of every later step) and the position id the row's next real token gets, so a
/// left-padded row rotates and attends exactly like its unpadded prompt.
///
/// Fill it through [`super::CausalLm::forward`] (which runs cached calls without autograd).
#[derive(Debug)]
pub struct KvCache {
    /// Per layer, `[b, kv_heads, capacity, head_dim]`.
    keys: Vec<Tensor>,
    /// Per layer, `[b, kv_heads, capacity, head_dim]`.
    values: Vec<Tensor>,
    /// `[b, capacity]` bool: true where the cached position holds a real (non-padding) token.
    key_mask: Tensor,
    /// `[b]` i64: the position id of each row's next real token (its count of real tokens so far).
    next_position: Tensor,
    /// Positions `[0, len)` are filled.
    len: i64,
    capacity: i64,
}

impl KvCache {
    /// An empty cache for `batch` rows of up to `capacity` positions (prompt + generated tokens,
    /// padding included), in `kind` on `device`.
    pub fn new(
        config: &Config,
        batch: i64,
        capacity: i64,
        device: Device,
        kind: Kind,
    ) -> Result<Self, TchError> {
        let shape = [batch, config.num_key_value_heads, capacity, config.head_dim];
        let layers = usize::try_from(config.num_hidden_layers).unwrap_or(0);
        let mut keys = Vec::with_capacity(layers);
        let mut values = Vec::with_capacity(layers);
        for _ in 0..layers {
            keys.push(Tensor::f_zeros(shape, (kind, device))?);
            values.push(Tensor::f_zeros(shape, (kind, device))?);
        }
        Ok(Self {
            keys,
            values,
            key_mask: Tensor::f_zeros([batch, capacity], (Kind::Bool, device))?,
            next_position: Tensor::f_zeros([batch], (Kind::Int64, device))?,
            len: 0,
            capacity,
        })
    }

    /// Rows in the cache.
    pub fn batch_size(&self) -> i64 {
        self.key_mask.size()[0]
    }

    /// Positions filled so far (padding included).
    pub fn len(&self) -> i64 {
        self.len
    }

    /// Whether nothing has been cached yet.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Most positions the cache can hold.
    pub fn capacity(&self) -> i64 {
        self.capacity
    }

    /// `[b, len]` bool: which cached positions are real tokens.
    pub fn key_mask(&self) -> Tensor {
        self.key_mask.narrow(1, 0, self.len)
    }

    /// `[b]` i64: the position id each row's next real token will get.
    pub fn next_positions(&self) -> &Tensor {
        &self.next_position
    }

    /// Repeats every row `times` times consecutively (row r becomes rows r·times … r·times+times-1),
    /// so `times` samples per prompt share one prefill. Memory grows by `times`.
    pub fn repeat_interleave(&self, times: i64) -> Result<Self, TchError> {
        let repeat = |tensor: &Tensor| tensor.f_repeat_interleave_self_int(times, 0, None);
        Ok(Self {
            keys: self.keys.iter().map(repeat).collect::<Result<_, _>>()?,
            values: self.values.iter().map(repeat).collect::<Result<_, _>>()?,
            key_mask: repeat(&self.key_mask)?,
            next_position: repeat(&self.next_position)?,
            len: self.len,
            capacity: self.capacity,
        })
    }

    /// Keeps only the rows at `rows` (i64 indices, in that order), e.g. to drop finished sequences.
    pub fn select_rows(&self, rows: &Tensor) -> Result<Self, TchError> {
        let rows = rows.f_to_device(self.key_mask.device())?;
        let select = |tensor: &Tensor| tensor.f_index_select(0, &rows);
        Ok(Self {
            keys: self.keys.iter().map(select).collect::<Result<_, _>>()?,
            values: self.values.iter().map(select).collect::<Result<_, _>>()?,
            key_mask: select(&self.key_mask)?,
            next_position: select(&self.next_position)?,
            len: self.len,
            capacity: self.capacity,
        })
    }

    /// Whether the buffers have `config`'s layer count, kv heads and head width.
    pub(crate) fn fits(&self, config: &Config) -> bool {
        let layers_match = i64::try_from(self.keys.len()) == Ok(config.num_hidden_layers);
        layers_match
            && self.keys.iter().all(|keys| {
                let size = keys.size();
                size.get(1) == Some(&config.num_key_value_heads)
                    && size.get(3) == Some(&config.head_dim)
            })
    }

    /// The view layer `layer` writes into during a call that starts at `self.len`.
    pub(crate) fn layer(&self, layer: usize) -> Option<LayerCache<'_>> {
        Some(LayerCache {
            keys: self.keys.get(layer)?,
            values: self.values.get(layer)?,
            past: self.len,
        })
    }

    /// Records a call's `new_mask` `[b, t]` (bool) once every layer has written its keys/values.
    pub(crate) fn advance(&mut self, new_mask: &Tensor) {
        let seq = new_mask.size()[1];
        self.key_mask.narrow(1, self.len, seq).copy_(new_mask);
        self.next_position += new_mask.sum_dim_intlist(1, false, Kind::Int64);
        self.len += seq;
    }
}
