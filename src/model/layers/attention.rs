//! Block-causal self-attention over the preallocated KV cache, the form every family here has:
//! q, k and v as one product (stacked from three tensors, or one fused tensor), q/k RMSNorm
//! per head, rotary embedding (kv_cache.rs's [`Rope`], over the whole head or its first part),
//! grouped KV heads; and the block-causal masks. A family's file says which tensors make up the
//! q|k|v product ([`AttentionTensors`]).

use anyhow::Result;
use candle_core::Tensor;
use candle_nn::ops::{rms_norm, softmax_last_dim};
use candle_nn::rotary_emb::rope;

use super::kv_cache::{PassInput, Rope};
use crate::model::config::ModelConfig;
use crate::model::linear::Linear;
use crate::model::loader::Loader;
use crate::model::ops;

/// The shape of a layer's attention: what the fused ops and the generic chains need to know.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Heads {
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    /// The q/k RMSNorms' epsilon.
    pub eps: f32,
}

impl Heads {
    /// The fields every Qwen3-style config.json spells alike: `num_attention_heads`,
    /// `num_key_value_heads`, `head_dim`, and `rms_norm_eps` for the q/k norms.
    pub fn of(cfg: &ModelConfig) -> Self {
        Heads {
            heads: cfg.num_attention_heads,
            kv_heads: cfg.kv_heads(),
            head_dim: cfg.head_dim(),
            eps: cfg.rms_norm_eps as f32,
        }
    }

    /// Rows of the q product and of each of the k and v products: `(heads d, kv_heads d)`.
    pub fn widths(&self) -> (usize, usize) {
        (self.heads * self.head_dim, self.kv_heads * self.head_dim)
    }

    /// The attention op over `keys` cache slots.
    pub fn attention_op(&self, keys: usize) -> ops::Attention {
        let scale = (1.0 / (self.head_dim as f64).sqrt()) as f32;
        ops::Attention {
            heads: self.heads,
            kv_heads: self.kv_heads,
            head_dim: self.head_dim,
            keys,
            scale,
        }
    }
}

/// A checkpoint's names for one layer's attention tensors (each `[out, in]`).
pub struct AttentionTensors {
    /// The parts of the q|k|v product, stacked along `out` in this order: `(name, rows)`. Three
    /// (q, k, v: Qwen3's `q_proj`, `k_proj`, `v_proj`) or one already fused (`[q | k | v]`).
    pub qkv: Vec<(String, usize)>,
    pub o: String,
    /// The q and k RMSNorm weights `[head_dim]`, shared by every head.
    pub q_norm: String,
    pub k_norm: String,
}

/// One layer's self-attention.
pub struct SelfAttention {
    /// q, k and v projections stacked: one matmul, `[hidden, heads*d + 2*kv_heads*d]`.
    pub qkv_proj: Linear,
    pub o_proj: Linear,
    pub q_norm: Tensor,
    pub k_norm: Tensor,
    pub heads: Heads,
    pub rope: Rope,
}

impl SelfAttention {
    /// The tensors `names` (in that order) of an attention over `hidden` wide rows.
    pub fn load(
        b: &Loader,
        names: &AttentionTensors,
        hidden: usize,
        heads: Heads,
        rope: Rope,
    ) -> Result<Self> {
        let (d, (q_out, _)) = (heads.head_dim, heads.widths());
        Ok(SelfAttention {
            qkv_proj: b.proj(&names.qkv, hidden)?,
            o_proj: b.proj(&[(names.o.clone(), hidden)], q_out)?,
            q_norm: b.get(&names.q_norm, &[d])?,
            k_norm: b.get(&names.k_norm, &[d])?,
            heads,
            rope,
        })
    }

    pub fn qkv_op(&self) -> ops::QkvPrep {
        let s = &self.heads;
        ops::QkvPrep {
            heads: s.heads,
            kv_heads: s.kv_heads,
            head_dim: s.head_dim,
            rotary: self.rope.dims,
            eps: s.eps,
            q_norm: self.q_norm.clone(),
            k_norm: self.k_norm.clone(),
        }
    }

    /// The block's output `[T, hidden]` for the normed input `x`, writing the pass's K/V into
    /// `kv` (this layer's cache) at `input.positions`. `fused`: the fused ops of ops.rs, else
    /// the generic candle chains they are checked against.
    pub fn forward(
        &self,
        x: &Tensor,
        (cos, sin): (&Tensor, &Tensor),
        kv: &Tensor,
        input: &PassInput,
        fused: bool,
    ) -> Result<Tensor> {
        let s = &self.heads;
        let (t, d, kvh, heads) = (x.dim(0)?, s.head_dim, s.kv_heads, s.heads);
        // One matmul for q, k, v, then every head as [H + 2 KV, T, d]: q and k normalised and
        // rotated, v as is.
        let qkv = self.qkv_proj.forward(x)?;
        let all = if fused {
            ops::qkv_prep(&qkv, cos, sin, &self.qkv_op())?
        } else {
            self.qkv_prep_generic(&qkv, cos, sin, s)?
        };
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
        let Some((qkv_proj, o_proj)) = Linear::unpacked_pair(&self.qkv_proj, &self.o_proj)? else {
            return Ok(None);
        };
        Ok(Some(SelfAttention {
            qkv_proj,
            o_proj,
            q_norm: self.q_norm.clone(),
            k_norm: self.k_norm.clone(),
            heads: self.heads,
            rope: self.rope,
        }))
    }

    /// [`ops::qkv_prep`] as generic candle ops.
    fn qkv_prep_generic(
        &self,
        qkv: &Tensor,
        cos: &Tensor,
        sin: &Tensor,
        s: &Heads,
    ) -> Result<Tensor> {
        let (t, d, kvh, heads) = (qkv.dim(0)?, s.head_dim, s.kv_heads, s.heads);
        let x = qkv.reshape((t, heads + 2 * kvh, d))?.transpose(0, 1)?.contiguous()?;
        let rot = self.rope.dims;
        let normed = |from: usize, n: usize, w: &Tensor| -> Result<Tensor> {
            let h = rms_norm(&x.narrow(0, from, n)?, w, s.eps)?;
            let turned = rope(&h.narrow(2, 0, rot)?.contiguous()?.unsqueeze(0)?, cos, sin)?;
            let turned = turned.squeeze(0)?;
            // a partial rotary embedding passes the rest of the head through
            Ok(if rot == d {
                turned
            } else {
                Tensor::cat(&[&turned, &h.narrow(2, rot, d - rot)?], 2)?
            })
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
        scores = scores.reshape((kvh, group, t, keys))?.broadcast_add(mask)?.reshape((
            kvh,
            group * t,
            keys,
        ))?;
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The in-pass part of the block-causal mask is the whole mask's last `T` columns, and
    /// `None` exactly where the whole mask is.
    #[test]
    fn the_inner_mask_is_the_whole_masks_own_columns() {
        for (start, t, block) in [
            (0, 12, 4),
            (512, 512, 4),
            (8, 5, 4),
            (6, 5, 4),
            (4, 4, 4),
            (0, 16, 16),
            (1024, 1024, 1024),
            (3, 9, 2),
        ] {
            let keys = start + t;
            let (whole, inner) =
                (block_causal_mask(start, t, block, keys), block_causal_inner(start, t, block));
            assert_eq!(whole.is_none(), inner.is_none(), "start {start} t {t} block {block}");
            if let (Some(w), Some(i)) = (whole, inner) {
                for r in 0..t {
                    assert!(
                        w[r * keys..r * keys + start].iter().all(|v| *v == 0.0),
                        "the committed columns are visible"
                    );
                    assert_eq!(
                        &w[r * keys + start..(r + 1) * keys],
                        &i[r * t..(r + 1) * t],
                        "start {start} t {t} block {block} row {r}"
                    );
                }
            }
        }
    }
}
