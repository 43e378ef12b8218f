//! The Qwen3 decoder that SDAR checkpoints use, with SDAR's block-causal attention over a
//! preallocated KV cache. One implementation for every device; `forward` reads top to bottom.

use anyhow::{bail, Result};
use candle_core::{DType, Device, Tensor};
use candle_nn::ops::{rms_norm, softmax_last_dim};
use candle_nn::rotary_emb::rope;

use super::config::ModelConfig;
use super::gemv::{Epilogue, GemvInto};
use super::linear::{Bf16Panels, Linear};
use super::ops;
use super::weights::WeightSource;

struct Layer {
    input_norm: Tensor,
    /// q, k and v projections stacked: one matmul, `[hidden, heads*d + 2*kv_heads*d]`.
    qkv_proj: Linear,
    o_proj: Linear,
    q_norm: Tensor,
    k_norm: Tensor,
    post_norm: Tensor,
    /// gate and up projections stacked: one matmul, `[hidden, 2*intermediate]`.
    gate_up_proj: Linear,
    down_proj: Linear,
}

/// The device-side inputs of one forward pass. [`Qwen3::forward`] builds them from host ids;
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

pub struct Qwen3 {
    embed: Tensor,
    layers: Vec<Layer>,
    norm: Tensor,
    lm_head: Linear,
    rope_theta: f64,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    intermediate: usize,
    vocab: usize,
    /// lm_head is the embedding matrix.
    tied: bool,
    /// Use the fused ops of `ops.rs` (default) rather than chains of generic candle ops.
    fused: bool,
    /// The input and post-attention norm weights live in the q/k/v and gate|up projections
    /// ([`Qwen3::fold_norms`]): what the streamed layer needs.
    norms_folded: bool,
    eps: f32,
    max_positions: usize,
    dtype: DType,
    device: Device,
}

/// K/V of every committed position, per layer, preallocated for the whole decode: one
/// `[2, kv_heads, capacity, head_dim]` tensor per layer (K then V), written in place.
/// Positions `[len, len + T)` are scratch for a pass that does not store.
pub struct KvCache {
    kv: Vec<Tensor>,
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

    /// Commits the `t` positions after the prefix, whose K/V a pass over [`PassInput`]s has
    /// already written (see [`Qwen3::forward_input`]).
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

impl Qwen3 {
    pub fn load(cfg: &ModelConfig, w: &dyn WeightSource, dtype: DType, device: &Device) -> Result<Self> {
        let (h, d, i) = (cfg.hidden_size, cfg.head_dim(), cfg.intermediate_size);
        let (q_out, kv_out) = (cfg.num_attention_heads * d, cfg.kv_heads() * d);
        let get = |name: &str, shape: &[usize]| w.get(name, shape, dtype, device);
        let packed = bf16_weights_here(device, dtype);
        let rows = gemv_here(device, dtype);
        // A projection from `[out, in]` checkpoint tensors stacked along `out`: bf16 panels
        // (see linear.rs) where the CPU computes in f32 from bf16 weights; kept `[out, in]` for
        // the GPU's gemv kernel; else stored transposed, `[in, out]` and contiguous, so that it
        // is a plain matmul and the CPU's gemm does not re-pack the weight on every pass.
        let linear = |stacked: Tensor, bf16: bool| -> Result<Linear> {
            if bf16 {
                return Ok(Linear::Bf16(Bf16Panels::from_tensor(&stacked)?));
            }
            if rows {
                return Ok(Linear::Rows(stacked.contiguous()?));
            }
            Ok(Linear::Dense(stacked.t()?.contiguous()?))
        };
        let bf16 = |name: &str| packed && w.stored(name) == Some(DType::BF16);
        let proj = |parts: &[(String, usize)], inp: usize| -> Result<Linear> {
            let keep = parts.iter().all(|(n, _)| bf16(n));
            // Panels are made from the stored bf16 values directly, not through f32.
            let dt = if keep { DType::BF16 } else { dtype };
            let ts = parts.iter().map(|(n, out)| w.get(n, &[*out, inp], dt, device)).collect::<Result<Vec<_>>>()?;
            linear(Tensor::cat(&ts, 0)?, keep)
        };
        let one = |name: String, out: usize| [(name, out)];
        let mut layers = Vec::with_capacity(cfg.num_hidden_layers);
        for l in 0..cfg.num_hidden_layers {
            let p = format!("model.layers.{l}");
            let qkv = [
                (format!("{p}.self_attn.q_proj.weight"), q_out),
                (format!("{p}.self_attn.k_proj.weight"), kv_out),
                (format!("{p}.self_attn.v_proj.weight"), kv_out),
            ];
            let gate_up = [(format!("{p}.mlp.gate_proj.weight"), i), (format!("{p}.mlp.up_proj.weight"), i)];
            layers.push(Layer {
                input_norm: get(&format!("{p}.input_layernorm.weight"), &[h])?,
                qkv_proj: proj(&qkv, h)?,
                o_proj: proj(&one(format!("{p}.self_attn.o_proj.weight"), h), q_out)?,
                q_norm: get(&format!("{p}.self_attn.q_norm.weight"), &[d])?,
                k_norm: get(&format!("{p}.self_attn.k_norm.weight"), &[d])?,
                post_norm: get(&format!("{p}.post_attention_layernorm.weight"), &[h])?,
                gate_up_proj: proj(&gate_up, h)?,
                down_proj: proj(&one(format!("{p}.mlp.down_proj.weight"), h), i)?,
            });
        }
        let embed_name = "model.embed_tokens.weight";
        let embed = get(embed_name, &[cfg.vocab_size, h])?;
        // Some tied checkpoints still ship lm_head; an untied one must. Tied: the embedding
        // already loaded (a second read would be a second draw from random weights).
        let tied = cfg.tie_word_embeddings && !w.contains("lm_head.weight");
        let lm_head = if tied {
            linear(embed.clone(), bf16(embed_name))?
        } else {
            // lm_head is cuBLAS's on every path (too wide for the gemv kernel), so it keeps
            // the plain `[in, out]` layout the cuBLAS path has always used for it
            match proj(&one("lm_head.weight".to_string(), cfg.vocab_size), h)? {
                Linear::Rows(w) => Linear::Dense(w.t()?.contiguous()?),
                other => other,
            }
        };
        let mut m = Qwen3 {
            embed,
            layers,
            norm: get("model.norm.weight", &[h])?,
            lm_head,
            rope_theta: cfg.rope_theta,
            heads: cfg.num_attention_heads,
            kv_heads: cfg.kv_heads(),
            head_dim: d,
            intermediate: i,
            vocab: cfg.vocab_size,
            tied,
            fused: fused_here(device, dtype),
            norms_folded: false,
            eps: cfg.rms_norm_eps as f32,
            max_positions: cfg.max_position_embeddings,
            dtype,
            device: device.clone(),
        };
        if rows {
            m.fold_norms()?;
        }
        Ok(m)
    }

    pub fn device(&self) -> &Device {
        &self.device
    }

    pub fn dtype(&self) -> DType {
        self.dtype
    }

    pub fn vocab_size(&self) -> usize {
        self.vocab
    }

    pub fn kv_heads(&self) -> usize {
        self.kv_heads
    }

    /// Bytes of every weight (embedding and lm_head included; tied ones once).
    pub fn weight_bytes(&self) -> usize {
        let size = |t: &Tensor| t.elem_count() * t.dtype().size_in_bytes();
        let mut n = size(&self.embed) + size(&self.norm);
        if !self.tied {
            n += self.lm_head.bytes();
        }
        for l in &self.layers {
            n += [&l.input_norm, &l.q_norm, &l.k_norm, &l.post_norm].into_iter().map(size).sum::<usize>();
            n += [&l.qkv_proj, &l.o_proj, &l.gate_up_proj, &l.down_proj].into_iter().map(Linear::bytes).sum::<usize>();
        }
        n
    }

    pub fn new_cache(&self, capacity: usize) -> Result<KvCache> {
        if capacity > self.max_positions {
            bail!(
                "a decode of {capacity} positions exceeds the model's {} positions \
                 (max_position_embeddings); lower --max-new-tokens or shorten the prompt",
                self.max_positions
            );
        }
        let shape = (2, self.kv_heads, capacity, self.head_dim);
        // K/V of every layer plus the cos/sin tables, checked before allocating.
        let bytes = [2, self.kv_heads, capacity, self.head_dim, self.layers.len() + 1, self.dtype.size_in_bytes()]
            .into_iter()
            .try_fold(1usize, usize::checked_mul);
        crate::limits::fits_in_memory(&format!("a KV cache of {capacity} positions"), bytes, &self.device)?;
        let zeros = || Tensor::zeros(shape, self.dtype, &self.device);
        let n = self.layers.len();
        let (cos, sin) = rope_tables(self.rope_theta, self.head_dim, capacity, self.dtype, &self.device)?;
        Ok(KvCache {
            kv: (0..n).map(|_| zeros()).collect::<candle_core::Result<_>>()?,
            cos,
            sin,
            len: 0,
            capacity,
        })
    }

    /// Final hidden states `[T, hidden]` of `ids`, placed right after the cache's committed
    /// positions. Every cached position is visible; among `ids`, attention is block-causal with
    /// blocks of `block` positions counted from position 0. The K/V of the first `keep` ids
    /// are committed (the rest stay scratch).
    pub fn forward(&self, ids: &[u32], cache: &mut KvCache, block: usize, keep: usize) -> Result<Tensor> {
        let (start, t) = (cache.len, ids.len());
        if keep > t {
            bail!("a pass over {t} positions cannot store {keep}");
        }
        if start + t > cache.capacity {
            bail!("KV cache overflow: {} + {t} positions > capacity {}", start, cache.capacity);
        }
        let positions: Vec<u32> = (start..start + t).map(|p| p as u32).collect();
        let keys = start + t;
        let mask = match block_causal_mask(start, t, block, keys) {
            None => None,
            Some(m) => Some(Tensor::from_vec(m, (t, keys), &self.device)?.to_dtype(self.dtype)?),
        };
        let input = PassInput {
            ids: Tensor::from_slice(ids, t, &self.device)?,
            positions: Tensor::from_vec(positions, t, &self.device)?,
            keys,
            mask,
        };
        let hidden = self.forward_input(&input, cache)?;
        cache.len += keep;
        Ok(hidden)
    }

    /// The forward pass over device-side inputs. Writes the pass's K/V into the cache slots
    /// `input.positions` and leaves `cache.len` alone: the caller commits by advancing it.
    /// Launches the same kernels with the same arguments whatever the tensors hold, so a CUDA
    /// graph captured once can replay it.
    pub fn forward_input(&self, input: &PassInput, cache: &KvCache) -> Result<Tensor> {
        if input.keys > cache.capacity {
            bail!("attention over {} keys > cache capacity {}", input.keys, cache.capacity);
        }
        let mut x = self.embed.index_select(&input.ids, 0)?;
        let cos = cache.cos.index_select(&input.positions, 0)?;
        let sin = cache.sin.index_select(&input.positions, 0)?;
        if let Some(ws) = self.workspace(x.dim(0)?, input.keys)? {
            return self.forward_streamed(input, cache, &ws, x, (&cos, &sin));
        }
        // Residual stream `x`; `h` its normed input to the next block. The add of each residual
        // and the norm after it are one op when fused.
        let mut h = rms_norm(&x, &self.layers[0].input_norm, self.eps)?;
        for (l, layer) in self.layers.iter().enumerate() {
            let attn = self.attention(layer, &h, &cos, &sin, cache, l, input)?;
            (x, h) = self.add_norm(&x, &attn, &layer.post_norm)?;
            let mlp = self.mlp(layer, &h)?;
            let next = self.layers.get(l + 1).map_or(&self.norm, |n| &n.input_norm);
            (x, h) = self.add_norm(&x, &mlp, next)?;
        }
        Ok(h)
    }

    /// The scratch of a streamed pass of `t` rows over `keys` keys, or `None` where the pass
    /// runs the standard layer: the streamed one needs every projection kept `[out, in]` for the
    /// gemv kernel ([`Linear::Rows`]), the fused ops, and the kernels to take these shapes.
    fn workspace(&self, t: usize, keys: usize) -> Result<Option<Workspace>> {
        if !self.norms_folded || !self.fused || self.dtype != DType::BF16 || t > super::gemv::MAX_ROWS {
            return Ok(None);
        }
        if keys + self.head_dim > ops::ATTENTION_MAX_KEYS_PLUS_D {
            return Ok(None);
        }
        let l = &self.layers[0];
        let (Some(qkv), Some(o), Some(gate_up), Some(down)) = (l.qkv_proj.rows(), l.o_proj.rows(), l.gate_up_proj.rows(), l.down_proj.rows()) else {
            return Ok(None);
        };
        let (d, h, kvh) = (self.head_dim, self.heads, self.kv_heads);
        let hidden = self.embed.dim(1)?;
        // SAFETY: uninitialised, but every kernel of the pass writes its whole buffer before
        // the next reads it (zeroing them was one memset node each in the graph)
        let buf = |shape: &[usize]| unsafe { Tensor::empty(shape, self.dtype, &self.device) };
        let ws = Workspace {
            qkv: buf(&[t, (h + 2 * kvh) * d])?,
            q: buf(&[h, t, d])?,
            attn: buf(&[t, h * d])?,
            mid: buf(&[t, hidden])?,
            out: buf(&[t, hidden])?,
            act: buf(&[t, self.intermediate])?,
        };
        // `mid` stands in for the layer input: the same shape, dtype and layout
        let fits = ws.products(&ws.mid, self.eps).iter().zip([qkv, o, gate_up, down]).all(|((op, input, _), w)| op.fits(input, w));
        Ok(fits.then_some(ws))
    }

    /// Whether a pass of `t` rows over `keys` keys runs [`Qwen3::forward_streamed`].
    pub fn streams(&self, t: usize, keys: usize) -> bool {
        matches!(self.workspace(t, keys), Ok(Some(_)))
    }

    /// The layers as six kernels each, every one writing into `ws` (or the cache), so that a
    /// captured graph holds no allocation between them and, under programmatic dependent
    /// launch (sm_90's default, `UNMASK_PDL=0` off), each launch overlaps the tail of the one
    /// before: the q/k/v product with the input RMSNorm folded
    /// in; q/k norm, RoPE and the K/V to their cache slots; attention; the o product plus the
    /// residual; the gate|up product with the post-attention norm folded in and silu(gate) *
    /// up; the down product plus the residual. The norms' weights are in the projections
    /// ([`Qwen3::fold_norms`]); each norm is the scale of its product's rows, so the values
    /// round at other points than in the standard layer (tests check the two against each
    /// other within bf16 error).
    fn forward_streamed(&self, input: &PassInput, cache: &KvCache, ws: &Workspace, embedded: Tensor, (cos, sin): (&Tensor, &Tensor)) -> Result<Tensor> {
        let mut x = embedded;
        let d = self.head_dim;
        let attn = ops::Attention {
            heads: self.heads,
            kv_heads: self.kv_heads,
            head_dim: d,
            keys: input.keys,
            scale: (1.0 / (d as f64).sqrt()) as f32,
        };
        for (l, layer) in self.layers.iter().enumerate() {
            let run = |(op, input, out): (GemvInto, &Tensor, &Tensor), p: &Linear| -> Result<()> {
                let w = p.rows().ok_or_else(|| anyhow::anyhow!("layer {l}: a projection is not [out, in]"))?;
                Ok(op.run(out, input, w)?)
            };
            let [qkv, o, gate_up, down] = ws.products(&x, self.eps);
            run(qkv, &layer.qkv_proj)?;
            ops::qkv_prep_into_cache(&ws.q, &cache.kv[l], (&ws.qkv, cos, sin), &input.positions, &self.qkv_op(layer))?;
            ops::attention_into(&ws.attn, &ws.q, &cache.kv[l], input.mask.as_ref(), &input.positions, &attn)?;
            run(o, &layer.o_proj)?;
            run(gate_up, &layer.gate_up_proj)?;
            run(down, &layer.down_proj)?;
            x = ws.out.clone();
        }
        Ok(rms_norm(&x, &self.norm, self.eps)?)
    }

    /// Keeps every layer's projections `[out, in]` ([`Linear::Rows`]) with the norms folded in
    /// ([`Qwen3::fold_norms`]), as the GPU loads them by default in bf16, so that block passes
    /// run the streamed layer (and on the CPU its reference bodies, which is how tests compare
    /// it with the standard layer). bf16 only.
    pub fn use_row_weights(&mut self) -> Result<()> {
        if self.dtype != DType::BF16 {
            bail!("row weights are for the bf16 gemv kernel; this model computes in {:?}", self.dtype);
        }
        for l in &mut self.layers {
            for p in [&mut l.qkv_proj, &mut l.o_proj, &mut l.gate_up_proj, &mut l.down_proj] {
                *p = match std::mem::replace(p, Linear::Rows(self.norm.clone())) {
                    Linear::Dense(w) => Linear::Rows(w.t()?.contiguous()?),
                    Linear::Rows(w) => Linear::Rows(w),
                    Linear::Bf16(_) => bail!("bf16 panels are the f32 CPU path's"),
                };
            }
        }
        self.fold_norms()
    }

    /// Folds each layer's input and post-attention RMSNorm weights into the projections that
    /// read their output (q/k/v and gate|up: `W[n, k] w[k]`, rounded to bf16) and leaves
    /// weights of ones in their place, so the standard layer computes the same function and
    /// the streamed layer's products only scale their rows by 1 / rms. Once.
    fn fold_norms(&mut self) -> Result<()> {
        if self.norms_folded {
            return Ok(());
        }
        for l in &mut self.layers {
            for (p, w) in [(&mut l.qkv_proj, &mut l.input_norm), (&mut l.gate_up_proj, &mut l.post_norm)] {
                let Linear::Rows(rows) = p else { bail!("norms fold only into [out, in] projections") };
                *rows = rows.broadcast_mul(&w.unsqueeze(0)?)?.contiguous()?;
                *w = w.ones_like()?;
            }
        }
        self.norms_folded = true;
        Ok(())
    }

    fn qkv_op(&self, layer: &Layer) -> ops::QkvPrep {
        ops::QkvPrep {
            heads: self.heads,
            kv_heads: self.kv_heads,
            head_dim: self.head_dim,
            eps: self.eps,
            q_norm: layer.q_norm.clone(),
            k_norm: layer.k_norm.clone(),
        }
    }

    /// Logits `[T, vocab]` in f32 for hidden states from [`Qwen3::forward`].
    pub fn logits(&self, hidden: &Tensor) -> Result<Tensor> {
        Ok(self.logits_raw(hidden)?.to_dtype(DType::F32)?)
    }

    /// Logits `[T, vocab]` in the compute dtype (what the device sampler reads).
    pub fn logits_raw(&self, hidden: &Tensor) -> Result<Tensor> {
        Ok(self.lm_head.forward(hidden)?)
    }

    /// Whether this model runs the fused ops (`UNMASK_FUSED=0`/`=1` overrides the device default).
    pub fn fused(&self) -> bool {
        self.fused
    }

    /// Switches between the fused ops and the generic chains (for comparisons); the fused ops
    /// stay off for dtypes their CUDA kernels do not take.
    pub fn set_fused(&mut self, on: bool) {
        self.fused = on && (self.device.is_cpu() || ops::cuda_dtype_ok(self.dtype));
    }

    #[allow(clippy::too_many_arguments)]
    fn attention(
        &self,
        layer: &Layer,
        x: &Tensor,
        cos: &Tensor,
        sin: &Tensor,
        cache: &KvCache,
        l: usize,
        input: &PassInput,
    ) -> Result<Tensor> {
        let (t, d, kvh, heads) = (x.dim(0)?, self.head_dim, self.kv_heads, self.heads);
        // One matmul for q, k, v, then every head as [H + 2 KV, T, d]: q and k normalised and
        // rotated, v as is.
        let qkv = layer.qkv_proj.forward(x)?;
        let all = if self.fused {
            ops::qkv_prep(&qkv, cos, sin, &self.qkv_op(layer))?
        } else {
            self.qkv_prep_generic(layer, &qkv, cos, sin)?
        };
        let q = all.narrow(0, 0, heads)?;
        // k|v heads are the [2, KV, T, d] block of this pass: to their slots in place; only the
        // caller's commit makes them part of the prefix.
        let kv_new = all.narrow(0, heads, 2 * kvh)?.reshape((2, kvh, t, d))?;
        ops::kv_write(&cache.kv[l], &kv_new, &input.positions)?;
        let keys = input.keys;
        let scale = 1.0 / (d as f64).sqrt();
        let out = if self.fused && keys + d <= ops::ATTENTION_MAX_KEYS_PLUS_D {
            let op = ops::Attention { heads, kv_heads: kvh, head_dim: d, keys, scale: scale as f32 };
            ops::attention(&q, &cache.kv[l], input.mask.as_ref(), &op)?
        } else {
            self.attention_generic(&q, &cache.kv[l], input, scale)?
        };
        Ok(layer.o_proj.forward(&out)?)
    }

    /// [`ops::qkv_prep`] as generic candle ops.
    fn qkv_prep_generic(&self, layer: &Layer, qkv: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor> {
        let (t, d, kvh, heads) = (qkv.dim(0)?, self.head_dim, self.kv_heads, self.heads);
        let x = qkv.reshape((t, heads + 2 * kvh, d))?.transpose(0, 1)?.contiguous()?;
        let normed = |from: usize, n: usize, w: &Tensor| -> Result<Tensor> {
            let h = rms_norm(&x.narrow(0, from, n)?, w, self.eps)?.unsqueeze(0)?;
            Ok(rope(&h, cos, sin)?.squeeze(0)?)
        };
        let q = normed(0, heads, &layer.q_norm)?;
        let k = normed(heads, kvh, &layer.k_norm)?;
        let v = x.narrow(0, heads + kvh, kvh)?;
        Ok(Tensor::cat(&[&q, &k, &v], 0)?)
    }

    /// [`ops::attention`] as generic candle ops.
    fn attention_generic(&self, q: &Tensor, kv: &Tensor, input: &PassInput, scale: f64) -> Result<Tensor> {
        let (heads, t, d) = q.dims3()?;
        let kvh = self.kv_heads;
        let group = heads / kvh;
        let keys = input.keys;
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

    /// `(x + delta, rms_norm(x + delta) * w)`.
    fn add_norm(&self, x: &Tensor, delta: &Tensor, w: &Tensor) -> Result<(Tensor, Tensor)> {
        if self.fused && x.dim(1)? <= 12 * 1024 {
            return Ok(ops::add_rms_norm(x, delta, w, &ops::AddRmsNorm { eps: self.eps })?);
        }
        let x = (x + delta)?;
        let h = rms_norm(&x, w, self.eps)?;
        Ok((x, h))
    }

    fn mlp(&self, layer: &Layer, x: &Tensor) -> candle_core::Result<Tensor> {
        if let Some(h) = layer.gate_up_proj.forward_silu_mul(x)? {
            return layer.down_proj.forward(&h);
        }
        let gate_up = layer.gate_up_proj.forward(x)?;
        let h = if self.fused {
            ops::silu_mul(&gate_up, &ops::SiluMul { intermediate: self.intermediate })?
        } else {
            let gate = candle_nn::ops::silu(&gate_up.narrow(1, 0, self.intermediate)?)?;
            (gate * gate_up.narrow(1, self.intermediate, self.intermediate)?)?
        };
        layer.down_proj.forward(&h)
    }
}

/// Buffers a streamed pass writes, allocated before its first layer (so in a captured graph
/// their allocations come first, not between kernels): the q/k/v product, the prepared q heads
/// `[H, T, d]`, attention's output, the residual stream after attention (`mid`) and after the
/// MLP (`out`, the next layer's input), and the MLP's activation.
struct Workspace {
    qkv: Tensor,
    q: Tensor,
    attn: Tensor,
    mid: Tensor,
    out: Tensor,
    act: Tensor,
}

impl Workspace {
    /// A layer's four products as the streamed layer runs them, each `(op, input, output)`, for
    /// the layer input `x`: q|k|v (the input norm folded in), o (plus the residual `x`),
    /// gate|up (the post-attention norm folded in, then SiLU) and down (plus `mid`). One list
    /// for both the run and the check that the kernel takes every product.
    fn products<'a>(&'a self, x: &'a Tensor, eps: f32) -> [(GemvInto<'a>, &'a Tensor, &'a Tensor); 4] {
        let (rms, plain) = (Some(eps), Epilogue::Plain);
        [
            (GemvInto { epilogue: plain, rms, residual: None }, x, &self.qkv),
            (GemvInto { epilogue: plain, rms: None, residual: Some(x) }, &self.attn, &self.mid),
            (GemvInto { epilogue: Epilogue::SiluMul, rms, residual: None }, &self.mid, &self.act),
            (GemvInto { epilogue: plain, rms: None, residual: Some(&self.mid) }, &self.act, &self.out),
        ]
    }
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

/// Fused ops unless turned off (`UNMASK_FUSED=0`), or their CUDA kernels cannot take this
/// dtype or compile here. On every device: on the H200 a forward costs 1.87 ms fused against
/// 2.56 ms with the generic chains (docs/perf.md, run 5).
fn fused_here(device: &Device, dtype: DType) -> bool {
    let wanted = ops::fused_override().unwrap_or(true);
    if !wanted {
        return false;
    }
    if device.is_cpu() {
        return true;
    }
    if !ops::cuda_dtype_ok(dtype) {
        return false;
    }
    #[cfg(feature = "cuda")]
    if let Device::Cuda(d) = device {
        if let Err(e) = super::ops_cuda::probe(d) {
            eprintln!("unmask: fused kernels unavailable, using generic ops: {e}");
            return false;
        }
    }
    true
}

/// Whether projections stay `[out, in]` for the gemv kernel ([`Linear::Rows`]), with the
/// norms folded in, so that block passes run the streamed layer: on a GPU in bf16 where the
/// kernel compiles, unless `UNMASK_GEMV=0` (cuBLAS and the standard layer, for comparisons).
/// On the H200 with programmatic dependent launch it is the faster path: 1.560 against 1.739
/// ms per forward, 128-token decodes (docs/perf.md, run 7).
fn gemv_here(device: &Device, dtype: DType) -> bool {
    if device.is_cpu() || dtype != DType::BF16 || std::env::var("UNMASK_GEMV").as_deref() == Ok("0") {
        return false;
    }
    #[cfg(feature = "cuda")]
    if let Device::Cuda(d) = device {
        if let Err(e) = super::gemv_cuda::probe(d) {
            eprintln!("unmask: gemv kernel unavailable, using cuBLAS: {e}");
            return false;
        }
    }
    true
}

/// Whether projections stored in bf16 stay bf16 ([`Linear::Bf16`]): on the CPU computing in f32,
/// unless `UNMASK_BF16_WEIGHTS=0` (for comparisons: the widened f32 weights through gemm).
fn bf16_weights_here(device: &Device, dtype: DType) -> bool {
    device.is_cpu() && dtype == DType::F32 && std::env::var("UNMASK_BF16_WEIGHTS").as_deref() != Ok("0")
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

