//! Block-causal self-attention over the preallocated KV cache, as every SDAR family has it
//! (Qwen3's: q/k/v stacked into one product, q/k RMSNorm, RoPE in the rotate-half convention,
//! grouped KV heads): the cache, the pass inputs, the mask, the RoPE tables and the block.

use anyhow::{bail, Result};
use candle_core::{DType, Device, Tensor};
use candle_nn::ops::{rms_norm, softmax_last_dim};
use candle_nn::rotary_emb::rope;

use super::config::ModelConfig;
use super::loader::Loader;
use super::linear::Linear;
use super::ops;

/// The device-side inputs of one forward pass. [`Model::forward`](super::Model::forward) builds them from host ids;
/// a caller that replays a captured CUDA graph keeps them in fixed buffers and rewrites them.
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
    pub(super) kv: Vec<Tensor>,
    /// RoPE cos/sin rows for every position the cache can hold.
    pub(super) cos: Tensor,
    pub(super) sin: Tensor,
    pub(super) len: usize,
    pub(super) capacity: usize,
}

impl KvCache {
    /// Whether `t` more positions fit after the committed ones: an error saying how many do not.
    pub(super) fn room_for(&self, t: usize) -> anyhow::Result<()> {
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
    /// already written (see [`Model::forward_input`](super::Model::forward_input)).
    pub fn advance(&mut self, t: usize) -> Result<()> {
        if self.len + t > self.capacity {
            bail!("KV cache overflow: {} + {t} positions > capacity {}", self.len, self.capacity);
        }
        self.len += t;
        Ok(())
    }
}

impl PassInput {
    /// Host-side contents of a pass of `t` positions at `start` that attends over the whole
    /// cache (`keys == capacity`): its positions and its `[t, capacity]` mask, which hides the
    /// slots not written yet (`>= start + t`) and later blocks. Its shape depends only on `t`
    /// and `capacity`, so one captured graph serves every block of a decode.
    pub fn window(start: usize, t: usize, block: usize, capacity: usize) -> (Vec<u32>, Vec<f32>) {
        let positions = (start..start + t).map(|p| p as u32).collect();
        let mask = block_causal_mask(start, t, block, capacity).unwrap_or_else(|| vec![0.0; t * capacity]);
        (positions, mask)
    }
}

/// The shape of a layer's attention: what the fused ops and the generic chains need to know.
#[derive(Clone, Copy, Debug)]
pub struct Heads {
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    /// The q/k RMSNorms' epsilon.
    pub eps: f32,
}

impl Heads {
    pub fn of(cfg: &ModelConfig) -> Self {
        Heads { heads: cfg.num_attention_heads, kv_heads: cfg.kv_heads(), head_dim: cfg.head_dim(), eps: cfg.rms_norm_eps as f32 }
    }

    /// The attention op over `keys` cache slots.
    pub fn attention_op(&self, keys: usize) -> ops::Attention {
        let scale = (1.0 / (self.head_dim as f64).sqrt()) as f32;
        ops::Attention { heads: self.heads, kv_heads: self.kv_heads, head_dim: self.head_dim, keys, scale }
    }
}

/// One layer's self-attention: `self_attn.{q,k,v,o}_proj` and `self_attn.{q,k}_norm`.
pub struct SelfAttention {
    /// q, k and v projections stacked: one matmul, `[hidden, heads*d + 2*kv_heads*d]`.
    pub qkv_proj: Linear,
    pub o_proj: Linear,
    pub q_norm: Tensor,
    pub k_norm: Tensor,
}

impl SelfAttention {
    /// The tensors under `prefix` (`model.layers.N.self_attn`).
    pub fn load(b: &Loader, prefix: &str, cfg: &ModelConfig) -> Result<Self> {
        let (h, d) = (cfg.hidden_size, cfg.head_dim());
        let (q_out, kv_out) = (cfg.num_attention_heads * d, cfg.kv_heads() * d);
        let qkv = [
            (format!("{prefix}.q_proj.weight"), q_out),
            (format!("{prefix}.k_proj.weight"), kv_out),
            (format!("{prefix}.v_proj.weight"), kv_out),
        ];
        Ok(SelfAttention {
            qkv_proj: b.proj(&qkv, h)?,
            o_proj: b.proj(&[(format!("{prefix}.o_proj.weight"), h)], q_out)?,
            q_norm: b.get(&format!("{prefix}.q_norm.weight"), &[d])?,
            k_norm: b.get(&format!("{prefix}.k_norm.weight"), &[d])?,
        })
    }

    pub fn qkv_op(&self, s: &Heads) -> ops::QkvPrep {
        ops::QkvPrep {
            heads: s.heads,
            kv_heads: s.kv_heads,
            head_dim: s.head_dim,
            eps: s.eps,
            q_norm: self.q_norm.clone(),
            k_norm: self.k_norm.clone(),
        }
    }

    /// The block's output `[T, hidden]` for the normed input `x`, writing the pass's K/V into
    /// `kv` (this layer's cache) at `input.positions`. `fused`: the fused ops of ops.rs, else
    /// the generic candle chains they are checked against.
    pub fn forward(&self, x: &Tensor, (cos, sin): (&Tensor, &Tensor), kv: &Tensor, input: &PassInput, s: &Heads, fused: bool) -> Result<Tensor> {
        let (t, d, kvh, heads) = (x.dim(0)?, s.head_dim, s.kv_heads, s.heads);
        // One matmul for q, k, v, then every head as [H + 2 KV, T, d]: q and k normalised and
        // rotated, v as is.
        let qkv = self.qkv_proj.forward(x)?;
        let all = if fused { ops::qkv_prep(&qkv, cos, sin, &self.qkv_op(s))? } else { self.qkv_prep_generic(&qkv, cos, sin, s)? };
        let q = all.narrow(0, 0, heads)?;
        // k|v heads are the [2, KV, T, d] block of this pass: to their slots in place; only the
        // caller's commit makes them part of the prefix.
        let kv_new = all.narrow(0, heads, 2 * kvh)?.reshape((2, kvh, t, d))?;
        ops::kv_write(kv, &kv_new, &input.positions)?;
        let out = if fused && ops::attention_takes(q.device(), input.keys, d) {
            ops::attention(&q, kv, input.mask.as_ref(), &s.attention_op(input.keys))?
        } else {
            attention_generic(&q, kv, input, s)?
        };
        Ok(self.o_proj.forward(&out)?)
    }

    /// This attention with packed projections unpacked into rows ([`Linear::unpacked_pair`]);
    /// `None` where neither is packed.
    pub fn unpacked(&self) -> Result<Option<SelfAttention>> {
        let Some((qkv_proj, o_proj)) = Linear::unpacked_pair(&self.qkv_proj, &self.o_proj)? else { return Ok(None) };
        Ok(Some(SelfAttention { qkv_proj, o_proj, q_norm: self.q_norm.clone(), k_norm: self.k_norm.clone() }))
    }

    /// [`ops::qkv_prep`] as generic candle ops.
    fn qkv_prep_generic(&self, qkv: &Tensor, cos: &Tensor, sin: &Tensor, s: &Heads) -> Result<Tensor> {
        let (t, d, kvh, heads) = (qkv.dim(0)?, s.head_dim, s.kv_heads, s.heads);
        let x = qkv.reshape((t, heads + 2 * kvh, d))?.transpose(0, 1)?.contiguous()?;
        let normed = |from: usize, n: usize, w: &Tensor| -> Result<Tensor> {
            let h = rms_norm(&x.narrow(0, from, n)?, w, s.eps)?.unsqueeze(0)?;
            Ok(rope(&h, cos, sin)?.squeeze(0)?)
        };
        let q = normed(0, heads, &self.q_norm)?;
        let k = normed(heads, kvh, &self.k_norm)?;
        let v = x.narrow(0, heads + kvh, kvh)?;
        Ok(Tensor::cat(&[&q, &k, &v], 0)?)
    }
}

/// [`ops::attention`] as generic candle ops.
fn attention_generic(q: &Tensor, kv: &Tensor, input: &PassInput, s: &Heads) -> Result<Tensor> {
    let (heads, t, d) = q.dims3()?;
    let kvh = s.kv_heads;
    let group = heads / kvh;
    let keys = input.keys;
    let scale = 1.0 / (s.head_dim as f64).sqrt();
    let k_all = kv.get(0)?.narrow(1, 0, keys)?;
    let v_all = kv.get(1)?.narrow(1, 0, keys)?;
    // GQA without copying K/V: the `group` query heads sharing a KV head become extra rows.
    let q = q.reshape((kvh, group * t, d))?;
    let mut scores = (q.matmul(&k_all.t()?)? * scale)?;
    if let Some(mask) = &input.mask {
        scores = scores.reshape((kvh, group, t, keys))?.broadcast_add(mask)?.reshape((kvh, group * t, keys))?;
    }
    let probs = softmax_last_dim(&scores)?;
    let out = probs.matmul(&v_all)?; // [kvh, group*t, d]
    Ok(out.reshape((heads, t, d))?.transpose(0, 1)?.reshape((t, heads * d))?)
}

/// Row-major `[T, keys]` additive mask for `T` queries at `start..start+T` over cache slots
/// `0..keys`: a query sees every slot of its own and earlier blocks that the pass has written
/// (`< start + T`). `None` when nothing is masked (one block, `keys == start + T`).
pub fn block_causal_mask(start: usize, t: usize, block: usize, keys: usize) -> Option<Vec<f32>> {
    let end = start + t;
    let last_block = (end - 1) / block;
    if start / block == last_block && keys <= end {
        return None;
    }
    let mut m = vec![0f32; t * keys];
    for i in 0..t {
        let qb = (start + i) / block;
        for j in 0..keys {
            if j >= end || j / block > qb {
                m[i * keys + j] = f32::NEG_INFINITY;
            }
        }
    }
    Some(m)
}

/// The columns `start..start+T` of [`block_causal_mask`] over `keys = start + T` (`[T, T]`, the
/// pass's own slots; every earlier column is visible), or `None` where that mask is.
pub fn block_causal_inner(start: usize, t: usize, block: usize) -> Option<Vec<f32>> {
    if t == 0 || start / block == (start + t - 1) / block {
        return None;
    }
    let mut m = vec![0f32; t * t];
    for i in 0..t {
        for j in 0..t {
            if (start + j) / block > (start + i) / block {
                m[i * t + j] = f32::NEG_INFINITY;
            }
        }
    }
    Some(m)
}

/// cos/sin tables `[positions, d/2]` in the rotate-half convention, computed in f32 the way
/// transformers does so that parity holds at long positions too.
pub(super) fn rope_tables(theta: f64, d: usize, positions: usize, dtype: DType, device: &Device) -> Result<(Tensor, Tensor)> {
    let half = d / 2;
    let inv_freq: Vec<f32> =
        (0..half).map(|i| 1.0 / (theta as f32).powf((2 * i) as f32 / d as f32)).collect();
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The in-pass part of the block-causal mask is the whole mask's last `T` columns, and
    /// `None` exactly where the whole mask is.
    #[test]
    fn the_inner_mask_is_the_whole_masks_own_columns() {
        for (start, t, block) in [(0, 12, 4), (512, 512, 4), (8, 5, 4), (6, 5, 4), (4, 4, 4), (0, 16, 16), (1024, 1024, 1024), (3, 9, 2)] {
            let keys = start + t;
            let (whole, inner) = (block_causal_mask(start, t, block, keys), block_causal_inner(start, t, block));
            assert_eq!(whole.is_none(), inner.is_none(), "start {start} t {t} block {block}");
            if let (Some(w), Some(i)) = (whole, inner) {
                for r in 0..t {
                    assert!(w[r * keys..r * keys + start].iter().all(|v| *v == 0.0), "the committed columns are visible");
                    assert_eq!(&w[r * keys + start..(r + 1) * keys], &i[r * t..(r + 1) * t], "start {start} t {t} block {block} row {r}");
                }
            }
        }
    }
}
