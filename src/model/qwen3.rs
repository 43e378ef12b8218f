//! The Qwen3 decoder that SDAR checkpoints use, with SDAR's block-causal attention over a
//! preallocated KV cache. One implementation for every device; `forward` reads top to bottom.

use anyhow::{bail, Result};
use candle_core::{DType, Device, Tensor};
use candle_nn::ops::{rms_norm, softmax_last_dim};
use candle_nn::rotary_emb::rope;

use super::config::ModelConfig;
use super::weights::Weights;

struct Layer {
    input_norm: Tensor,
    q_proj: Tensor,
    k_proj: Tensor,
    v_proj: Tensor,
    o_proj: Tensor,
    q_norm: Tensor,
    k_norm: Tensor,
    post_norm: Tensor,
    gate_proj: Tensor,
    up_proj: Tensor,
    down_proj: Tensor,
}

pub struct Qwen3 {
    embed: Tensor,
    layers: Vec<Layer>,
    norm: Tensor,
    lm_head: Tensor,
    rope_theta: f64,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    eps: f32,
    max_positions: usize,
    dtype: DType,
    device: Device,
}

/// K/V of every committed position, per layer, preallocated for the whole decode.
/// Positions `[len, len + T)` are scratch for a pass that does not store.
pub struct KvCache {
    k: Vec<Tensor>,
    v: Vec<Tensor>,
    /// RoPE cos/sin rows for every position the cache can hold.
    cos: Tensor,
    sin: Tensor,
    len: usize,
    capacity: usize,
}

impl KvCache {
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
}

impl Qwen3 {
    pub fn load(cfg: &ModelConfig, w: &Weights, dtype: DType, device: &Device) -> Result<Self> {
        let (h, d, i) = (cfg.hidden_size, cfg.head_dim(), cfg.intermediate_size);
        let (q_out, kv_out) = (cfg.num_attention_heads * d, cfg.kv_heads() * d);
        let get = |name: &str, shape: &[usize]| w.get(name, shape, dtype, device);
        let getl = |name: &str, shape: &[usize]| -> Result<Tensor> { Ok(w.get(name, shape, dtype, device)?.t()?.contiguous()?) };
        let mut layers = Vec::with_capacity(cfg.num_hidden_layers);
        for l in 0..cfg.num_hidden_layers {
            let p = format!("model.layers.{l}");
            layers.push(Layer {
                input_norm: get(&format!("{p}.input_layernorm.weight"), &[h])?,
                q_proj: getl(&format!("{p}.self_attn.q_proj.weight"), &[q_out, h])?,
                k_proj: getl(&format!("{p}.self_attn.k_proj.weight"), &[kv_out, h])?,
                v_proj: getl(&format!("{p}.self_attn.v_proj.weight"), &[kv_out, h])?,
                o_proj: getl(&format!("{p}.self_attn.o_proj.weight"), &[h, q_out])?,
                q_norm: get(&format!("{p}.self_attn.q_norm.weight"), &[d])?,
                k_norm: get(&format!("{p}.self_attn.k_norm.weight"), &[d])?,
                post_norm: get(&format!("{p}.post_attention_layernorm.weight"), &[h])?,
                gate_proj: getl(&format!("{p}.mlp.gate_proj.weight"), &[i, h])?,
                up_proj: getl(&format!("{p}.mlp.up_proj.weight"), &[i, h])?,
                down_proj: getl(&format!("{p}.mlp.down_proj.weight"), &[h, i])?,
            });
        }
        let embed = get("model.embed_tokens.weight", &[cfg.vocab_size, h])?;
        // Some tied checkpoints still ship lm_head; an untied one must.
        let lm_head = if cfg.tie_word_embeddings && !w.contains("lm_head.weight") {
            embed.t()?.contiguous()?
        } else {
            getl("lm_head.weight", &[cfg.vocab_size, h])?
        };
        Ok(Qwen3 {
            embed,
            layers,
            norm: get("model.norm.weight", &[h])?,
            lm_head,
            rope_theta: cfg.rope_theta,
            heads: cfg.num_attention_heads,
            kv_heads: cfg.kv_heads(),
            head_dim: d,
            eps: cfg.rms_norm_eps as f32,
            max_positions: cfg.max_position_embeddings,
            dtype,
            device: device.clone(),
        })
    }

    pub fn device(&self) -> &Device {
        &self.device
    }

    pub fn dtype(&self) -> DType {
        self.dtype
    }

    pub fn new_cache(&self, capacity: usize) -> Result<KvCache> {
        if capacity > self.max_positions {
            bail!(
                "a decode of {capacity} positions exceeds the model's {} positions \
                 (max_position_embeddings); lower --max-new-tokens or shorten the prompt",
                self.max_positions
            );
        }
        let shape = (self.kv_heads, capacity, self.head_dim);
        let zeros = || Tensor::zeros(shape, self.dtype, &self.device);
        let n = self.layers.len();
        let (cos, sin) = rope_tables(self.rope_theta, self.head_dim, capacity, self.dtype, &self.device)?;
        Ok(KvCache {
            k: (0..n).map(|_| zeros()).collect::<candle_core::Result<_>>()?,
            v: (0..n).map(|_| zeros()).collect::<candle_core::Result<_>>()?,
            cos,
            sin,
            len: 0,
            capacity,
        })
    }

    /// Final hidden states `[T, hidden]` of `ids`, placed right after the cache's committed
    /// positions. Every cached position is visible; among `ids`, attention is block-causal with
    /// blocks of `block` positions counted from position 0. `store` commits their K/V.
    pub fn forward(&self, ids: &[u32], cache: &mut KvCache, block: usize, store: bool) -> Result<Tensor> {
        let (start, t) = (cache.len, ids.len());
        if start + t > cache.capacity {
            bail!("KV cache overflow: {} + {t} positions > capacity {}", start, cache.capacity);
        }
        let ids = Tensor::from_slice(ids, t, &self.device)?;
        let mut x = self.embed.index_select(&ids, 0)?;
        let mask = self.block_causal_mask(start, t, block)?;
        let cos = cache.cos.narrow(0, start, t)?;
        let sin = cache.sin.narrow(0, start, t)?;
        for (l, layer) in self.layers.iter().enumerate() {
            let h = rms_norm(&x, &layer.input_norm, self.eps)?;
            let attn = self.attention(layer, &h, &cos, &sin, cache, l, mask.as_ref())?;
            x = (x + attn)?;
            let h = rms_norm(&x, &layer.post_norm, self.eps)?;
            x = (x + mlp(layer, &h)?)?;
        }
        if store {
            cache.len += t;
        }
        Ok(rms_norm(&x, &self.norm, self.eps)?)
    }

    /// Logits `[T, vocab]` in f32 for hidden states from [`Qwen3::forward`].
    pub fn logits(&self, hidden: &Tensor) -> Result<Tensor> {
        Ok(linear(hidden, &self.lm_head)?.to_dtype(DType::F32)?)
    }

    #[allow(clippy::too_many_arguments)]
    fn attention(
        &self,
        layer: &Layer,
        x: &Tensor,
        cos: &Tensor,
        sin: &Tensor,
        cache: &mut KvCache,
        l: usize,
        mask: Option<&Tensor>,
    ) -> Result<Tensor> {
        let (t, d, kvh) = (x.dim(0)?, self.head_dim, self.kv_heads);
        let group = self.heads / kvh;
        // [T, heads*d] -> per-head RMSNorm -> [1, heads, T, d] -> RoPE.
        let q = linear(x, &layer.q_proj)?.reshape((t, self.heads, d))?;
        let q = rms_norm(&q, &layer.q_norm, self.eps)?.transpose(0, 1)?.unsqueeze(0)?.contiguous()?;
        let q = rope(&q, cos, sin)?;
        let k = linear(x, &layer.k_proj)?.reshape((t, kvh, d))?;
        let k = rms_norm(&k, &layer.k_norm, self.eps)?.transpose(0, 1)?.unsqueeze(0)?.contiguous()?;
        let k = rope(&k, cos, sin)?.squeeze(0)?;
        let v = linear(x, &layer.v_proj)?.reshape((t, kvh, d))?.transpose(0, 1)?.contiguous()?;
        // Write this pass's K/V after the committed prefix; only `store` advances past them.
        cache.k[l].slice_set(&k, 1, cache.len)?;
        cache.v[l].slice_set(&v, 1, cache.len)?;
        let keys = cache.len + t;
        let k_all = cache.k[l].narrow(1, 0, keys)?;
        let v_all = cache.v[l].narrow(1, 0, keys)?;
        // GQA without copying K/V: the `group` query heads sharing a KV head become extra rows.
        let q = q.reshape((kvh, group * t, d))?;
        let scale = 1.0 / (d as f64).sqrt();
        let mut scores = (q.matmul(&k_all.t()?)? * scale)?;
        if let Some(mask) = mask {
            scores = scores.reshape((kvh, group, t, keys))?.broadcast_add(mask)?.reshape((kvh, group * t, keys))?;
        }
        let probs = softmax_last_dim(&scores)?;
        let out = probs.matmul(&v_all)?; // [kvh, group*t, d]
        let out = out.reshape((self.heads, t, d))?.transpose(0, 1)?.reshape((t, self.heads * d))?;
        Ok(linear(&out, &layer.o_proj)?)
    }

    /// `[T, start+T]` additive mask, or `None` when every key is visible to every query (the
    /// new positions lie in one block, the common denoising case).
    fn block_causal_mask(&self, start: usize, t: usize, block: usize) -> Result<Option<Tensor>> {
        let last_block = (start + t - 1) / block;
        if start / block == last_block {
            return Ok(None);
        }
        let keys = start + t;
        let mut m = vec![0f32; t * keys];
        for i in 0..t {
            let qb = (start + i) / block;
            for j in 0..keys {
                if j / block > qb {
                    m[i * keys + j] = f32::NEG_INFINITY;
                }
            }
        }
        Ok(Some(Tensor::from_vec(m, (t, keys), &self.device)?.to_dtype(self.dtype)?))
    }
}

fn linear(x: &Tensor, w: &Tensor) -> candle_core::Result<Tensor> {
    x.matmul(w)
}

fn mlp(layer: &Layer, x: &Tensor) -> candle_core::Result<Tensor> {
    let gate = candle_nn::ops::silu(&linear(x, &layer.gate_proj)?)?;
    let up = linear(x, &layer.up_proj)?;
    linear(&(gate * up)?, &layer.down_proj)
}

/// cos/sin tables `[positions, d/2]` in the rotate-half convention, computed in f32 the way
/// transformers does so that parity holds at long positions too.
fn rope_tables(theta: f64, d: usize, positions: usize, dtype: DType, device: &Device) -> Result<(Tensor, Tensor)> {
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

