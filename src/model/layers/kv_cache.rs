//! The state a pass reads and writes besides the weights: the device-side inputs of a pass
//! ([`PassInput`]), the preallocated K/V of every layer ([`KvCache`]), and the rotary
//! embedding's tables, which the cache holds for every position it can.

use anyhow::{bail, Result};
use candle_core::{DType, Device, Tensor};

use super::attention::block_causal_mask;

/// The device-side inputs of one forward pass.
/// [`Model::forward`](crate::model::Model::forward) builds them from host ids; a caller that
/// replays a captured CUDA graph keeps them in fixed buffers and rewrites them.
pub struct PassInput {
    /// Token ids `[T]` u32.
    pub ids: Tensor,
    /// Absolute position of each id `[T]` u32: RoPE angle and the cache slot its K/V go to.
    pub positions: Tensor,
    /// Cache slots `[0, keys)` the queries attend over (at least every committed one and the
    /// pass's own).
    pub keys: usize,
    /// Additive `[T, keys]` mask (0 or -inf) in the model's dtype; `None`: every key visible.
    pub mask: Option<Tensor>,
}

/// K/V of every committed position, per layer, preallocated for the whole decode: one
/// `[2, kv_heads, capacity, head_dim]` tensor per layer (K then V), written in place.
/// Positions `[len, len + T)` are scratch for a pass that does not store.
pub struct KvCache {
    pub(crate) kv: Vec<Tensor>,
    /// RoPE cos/sin rows for every position the cache can hold.
    pub(crate) cos: Tensor,
    pub(crate) sin: Tensor,
    pub(crate) len: usize,
    pub(crate) capacity: usize,
}

impl KvCache {
    /// Zeroed K/V for `layers` layers of `kv_heads` heads of `head_dim`, and `rope`'s tables,
    /// for `capacity` positions; its size is checked against the device's memory first.
    pub fn new(
        layers: usize,
        (kv_heads, head_dim): (usize, usize),
        rope: &Rope,
        capacity: usize,
        dtype: DType,
        device: &Device,
    ) -> Result<Self> {
        let shape = (2, kv_heads, capacity, head_dim);
        crate::limits::fits_in_memory(
            &format!("a KV cache of {capacity} positions"),
            Self::bytes(layers, (kv_heads, head_dim), capacity, dtype),
            "",
            device,
            "lower --max-new-tokens",
        )?;
        let zeros = || Tensor::zeros(shape, dtype, device);
        let (cos, sin) = rope.tables(capacity, dtype, device)?;
        Ok(KvCache {
            kv: (0..layers).map(|_| zeros()).collect::<candle_core::Result<_>>()?,
            cos,
            sin,
            len: 0,
            capacity,
        })
    }

    /// Bytes of the cache [`KvCache::new`] allocates: K/V of every layer plus the cos/sin
    /// tables (`None`: more than a usize holds).
    pub fn bytes(
        layers: usize,
        (kv_heads, head_dim): (usize, usize),
        capacity: usize,
        dtype: DType,
    ) -> Option<usize> {
        [2, kv_heads, capacity, head_dim, layers.checked_add(1)?, dtype.size_in_bytes()]
            .into_iter()
            .try_fold(1usize, usize::checked_mul)
    }

    /// Whether `t` more positions fit after the committed ones: an error saying how many do not.
    pub(crate) fn room_for(&self, t: usize) -> anyhow::Result<()> {
        if self.len + t > self.capacity {
            bail!("KV cache overflow: {} + {t} positions > capacity {}", self.len, self.capacity);
        }
        Ok(())
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Forgets every committed position; the stale K/V are overwritten before they are read.
    pub fn clear(&mut self) {
        self.len = 0;
    }

    /// Commits the `t` positions after the prefix, whose K/V a pass over [`PassInput`]s has
    /// already written (see [`Model::forward_input`](crate::model::Model::forward_input)).
    pub fn advance(&mut self, t: usize) -> Result<()> {
        if self.len + t > self.capacity {
            bail!("KV cache overflow: {} + {t} positions > capacity {}", self.len, self.capacity);
        }
        self.len += t;
        Ok(())
    }
}

impl PassInput {
    /// The input of a pass over `ids` placed from position `from`, attending over every slot up
    /// to its last, with the additive `mask` (`[ids, from + ids]`) or none.
    pub fn new(
        ids: &[u32],
        from: usize,
        mask: Option<Vec<f32>>,
        dtype: DType,
        device: &Device,
    ) -> Result<Self> {
        let (t, keys) = (ids.len(), from + ids.len());
        Ok(PassInput {
            ids: Tensor::from_slice(ids, t, device)?,
            positions: Tensor::from_vec((from..keys).map(|p| p as u32).collect(), t, device)?,
            keys,
            mask: mask_tensor(mask, (t, keys), dtype, device)?,
        })
    }

    /// Host-side contents of a pass of `t` positions at `start` that attends over the whole
    /// cache (`keys == capacity`): its positions and its `[t, capacity]` mask, which hides the
    /// slots not written yet (`>= start + t`) and later blocks. Its shape depends only on `t`
    /// and `capacity`, so one captured graph serves every block of a decode.
    pub fn window(start: usize, t: usize, block: usize, capacity: usize) -> (Vec<u32>, Vec<f32>) {
        let positions = (start..start + t).map(|p| p as u32).collect();
        let mask =
            block_causal_mask(start, t, block, capacity).unwrap_or_else(|| vec![0.0; t * capacity]);
        (positions, mask)
    }
}

/// An additive mask of `shape` on `device`, in `dtype`.
pub fn mask_tensor(
    mask: Option<Vec<f32>>,
    shape: (usize, usize),
    dtype: DType,
    device: &Device,
) -> Result<Option<Tensor>> {
    Ok(match mask {
        None => None,
        Some(m) => Some(Tensor::from_vec(m, shape, device)?.to_dtype(dtype)?),
    })
}

/// Rotary position embedding in the rotate-half convention: base `theta` over the first `dims`
/// dimensions of each head, the rest passed through. Qwen3 rotates whole heads (`dims ==
/// head_dim`); LLaDA2 its first half (`partial_rotary_factor` 0.5), the frequencies then spread
/// over `dims`, not the head (transformers' default RoPE with a partial factor).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Rope {
    pub theta: f64,
    pub dims: usize,
}

impl Rope {
    /// cos/sin tables `[positions, dims/2]`, computed in f32 the way transformers does so that
    /// parity holds at long positions too.
    pub fn tables(
        &self,
        positions: usize,
        dtype: DType,
        device: &Device,
    ) -> Result<(Tensor, Tensor)> {
        let (d, half) = (self.dims, self.dims / 2);
        let inv_freq: Vec<f32> =
            (0..half).map(|i| 1.0 / (self.theta as f32).powf((2 * i) as f32 / d as f32)).collect();
        let mut cos = Vec::with_capacity(positions * half);
        let mut sin = Vec::with_capacity(positions * half);
        for p in 0..positions {
            for &f in &inv_freq {
                let a = p as f32 * f;
                cos.push(a.cos());
                sin.push(a.sin());
            }
        }
        let cos = Tensor::from_vec(cos, (positions, half), device)?.to_dtype(dtype)?;
        let sin = Tensor::from_vec(sin, (positions, half), device)?.to_dtype(dtype)?;
        Ok((cos, sin))
    }
}
