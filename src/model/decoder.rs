//! The decoder skeleton every family shares: embedding, layers of block-causal self-attention
//! and a feed-forward block ([`Mlp`], ffn.rs: dense SwiGLU or a sparse mixture of experts), final
//! RMSNorm, lm_head. A family's file (qwen3.rs, qwen3_moe.rs) says which [`Mlp`] each layer
//! has and under which tensor names; registry.rs picks the family from config.json. One
//! implementation for every device; `forward` reads top to bottom.

use anyhow::{bail, Result};
use candle_core::{DType, Device, Tensor};
use candle_nn::ops::rms_norm;

use super::attention::{block_causal_inner, block_causal_mask, rope_tables, Heads, KvCache, PassInput, SelfAttention};
use super::config::ModelConfig;
use super::ffn::Mlp;
use super::gemv::{Epilogue, GemvInto, WeightLayout};
use super::linear::Linear;
use super::loader::Loader;
use super::moe::{MoeBlock, Route};
use super::ops;
use super::paths::{fused_here, PathChoices};
use super::weights::WeightSource;
use super::Compute;

/// One sparse layer's routing of a pass: each row's experts and weights.
#[derive(Clone, Debug, PartialEq)]
pub struct LayerRoutes {
    pub layer: usize,
    pub rows: Vec<Route>,
}

impl LayerRoutes {
    /// How many distinct experts the rows were routed to: the experts whose weights the layer
    /// read.
    pub fn distinct_experts(&self) -> usize {
        let mut all: Vec<u32> = self.rows.iter().flat_map(|r| r.experts.iter().copied()).collect();
        all.sort_unstable();
        all.dedup();
        all.len()
    }
}

pub struct Layer {
    input_norm: Tensor,
    attn: SelfAttention,
    post_norm: Tensor,
    mlp: Mlp,
}

pub struct Model {
    embed: Tensor,
    layers: Vec<Layer>,
    norm: Tensor,
    lm_head: Linear,
    rope_theta: f64,
    heads: Heads,
    vocab: usize,
    /// lm_head is the embedding matrix.
    tied: bool,
    /// Use the fused ops of `ops.rs` (default) rather than chains of generic candle ops.
    fused: bool,
    /// The input and post-attention norm weights live in the q/k/v and gate|up projections
    /// ([`Model::fold_norms`]): what the streamed layer needs.
    norms_folded: bool,
    eps: f32,
    max_positions: usize,
    dtype: DType,
    device: Device,
    /// The routing tables of the grouped MoE kernels, one per layer, and their counters
    /// (moe_grouped.rs): made when the norms are folded into a model with sparse layers.
    moe_tables: Option<Tensor>,
    /// How the streamed layer's projections lie: rows, until [`Model::relayout`].
    layout: WeightLayout,
    /// The device paths it was loaded with (paths.rs).
    paths: PathChoices,
}

impl Model {
    /// The model of the family config.json names (registry.rs), from `w`.
    pub fn load(cfg: &ModelConfig, w: &dyn WeightSource, compute: impl Into<Compute>, device: &Device) -> Result<Self> {
        let family = super::registry::family(cfg)?;
        Self::build(cfg, w, compute.into(), device, |b, l| (family.mlp)(cfg, b, l))
    }

    /// The skeleton with layer `l`'s feed-forward block from `mlp(loader, l)`; every other
    /// tensor under the names all Qwen3-style checkpoints share.
    pub fn build(cfg: &ModelConfig, w: &dyn WeightSource, compute: Compute, device: &Device, mlp: impl Fn(&Loader, usize) -> Result<Mlp>) -> Result<Self> {
        let h = cfg.hidden_size;
        let dtype = compute.dtype;
        let b = Loader::new(w, compute, device);
        let mut layers = Vec::with_capacity(cfg.num_hidden_layers);
        for l in 0..cfg.num_hidden_layers {
            let p = format!("model.layers.{l}");
            layers.push(Layer {
                input_norm: b.get(&format!("{p}.input_layernorm.weight"), &[h])?,
                attn: SelfAttention::load(&b, &format!("{p}.self_attn"), cfg)?,
                post_norm: b.get(&format!("{p}.post_attention_layernorm.weight"), &[h])?,
                mlp: mlp(&b, l)?,
            });
        }
        let embed_name = "model.embed_tokens.weight";
        let embed = b.embedding(embed_name, &[cfg.vocab_size, h])?;
        // Some tied checkpoints still ship lm_head; an untied one must. Tied: the embedding
        // already loaded (a second read would be a second draw from random weights), or its
        // mapped bytes.
        let tied = cfg.tie_word_embeddings && !w.contains("lm_head.weight");
        let lm_head = if tied {
            match b.bf16(embed_name).then(|| b.mapped_panels(&[(embed_name.to_string(), cfg.vocab_size)], h)).flatten() {
                Some(p) => Linear::Bf16(p),
                None => b.linear(embed.clone(), b.bf16(embed_name))?,
            }
        } else {
            // lm_head is cuBLAS's on every path (too wide for the gemv kernel), so it keeps
            // the plain `[in, out]` layout the cuBLAS path has always used for it
            match b.proj(&[("lm_head.weight".to_string(), cfg.vocab_size)], h)? {
                Linear::Rows(w) => Linear::Dense(w.t()?.contiguous()?),
                other => other,
            }
        };
        let mut m = Model {
            embed,
            layers,
            norm: b.get("model.norm.weight", &[h])?,
            lm_head,
            rope_theta: cfg.rope_theta,
            heads: Heads::of(cfg),
            vocab: cfg.vocab_size,
            tied,
            fused: fused_here(device, dtype, &compute.paths),
            norms_folded: false,
            eps: cfg.rms_norm_eps as f32,
            max_positions: cfg.max_position_embeddings,
            dtype,
            device: device.clone(),
            moe_tables: None,
            layout: WeightLayout::Rows,
            paths: compute.paths,
        };
        if b.rows && m.streamable() {
            m.fold_norms()?;
            if m.paths.packed {
                m.relayout(WeightLayout::Packed)?;
            }
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
        self.heads.kv_heads
    }

    /// Whether every layer's feed-forward block is one the streamed layer runs.
    fn streamable(&self) -> bool {
        self.layers.iter().all(|l| l.mlp.streamable())
    }

    /// Distinct experts the grouped MoE kernels touched, summed over passes, and the passes
    /// (each sparse layer of a pass counts once), since the model was loaded: `None` for a
    /// dense model or one that does not run the grouped kernels. Reads the device counters.
    pub fn moe_stats(&self) -> Result<Option<(u64, u64)>> {
        let Some(t) = &self.moe_tables else { return Ok(None) };
        Ok(Some(super::moe_grouped::read_stats(t)?))
    }

    /// Bytes of every weight (embedding and lm_head included; tied ones once).
    pub fn weight_bytes(&self) -> usize {
        let size = |t: &Tensor| t.elem_count() * t.dtype().size_in_bytes();
        let mut n = size(&self.embed) + size(&self.norm);
        if !self.tied {
            n += self.lm_head.bytes();
        }
        for l in &self.layers {
            n += [&l.input_norm, &l.attn.q_norm, &l.attn.k_norm, &l.post_norm].into_iter().map(size).sum::<usize>();
            n += l.attn.qkv_proj.bytes() + l.attn.o_proj.bytes() + l.mlp.bytes();
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
        let (kvh, d) = (self.heads.kv_heads, self.heads.head_dim);
        let shape = (2, kvh, capacity, d);
        // K/V of every layer plus the cos/sin tables, checked before allocating.
        let bytes = [2, kvh, capacity, d, self.layers.len() + 1, self.dtype.size_in_bytes()]
            .into_iter()
            .try_fold(1usize, usize::checked_mul);
        crate::limits::fits_in_memory(&format!("a KV cache of {capacity} positions"), bytes, &self.device)?;
        let zeros = || Tensor::zeros(shape, self.dtype, &self.device);
        let n = self.layers.len();
        let (cos, sin) = rope_tables(self.rope_theta, d, capacity, self.dtype, &self.device)?;
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
        Ok(self.forward_routed(ids, cache, block, keep)?.0)
    }

    /// [`Model::forward`], and the pass's routing in every sparse layer (none for a dense
    /// model). The routes are the host-side values the MoE block computes with, so keeping
    /// them costs nothing beyond these vectors.
    pub fn forward_routed(&self, ids: &[u32], cache: &mut KvCache, block: usize, keep: usize) -> Result<(Tensor, Vec<LayerRoutes>)> {
        let (start, t) = (cache.len, ids.len());
        if keep > t {
            bail!("a pass over {t} positions cannot store {keep}");
        }
        cache.room_for(t)?;
        let input = self.pass_input(ids, start, block_causal_mask(start, t, block, start + t))?;
        let routed = self.forward_input_routed(&input, cache)?;
        cache.len += keep;
        Ok(routed)
    }

    /// The forward pass over device-side inputs. Writes the pass's K/V into the cache slots
    /// `input.positions` and leaves `cache.len` alone: the caller commits by advancing it.
    /// Launches the same kernels with the same arguments whatever the tensors hold, so a CUDA
    /// graph captured once can replay it.
    pub fn forward_input(&self, input: &PassInput, cache: &KvCache) -> Result<Tensor> {
        Ok(self.pass(input, cache, false)?.0)
    }

    /// [`Model::forward_input`] and its routing (see [`Model::forward_routed`]). A streamed pass
    /// reads its routing tables back from the device, so this one is not for graph capture.
    pub fn forward_input_routed(&self, input: &PassInput, cache: &KvCache) -> Result<(Tensor, Vec<LayerRoutes>)> {
        self.pass(input, cache, true)
    }

    /// The device-side input of a pass over `ids` placed from position `from`, attending over
    /// every slot up to its last, with the additive `mask` (`[ids, from + ids]`) or none.
    fn pass_input(&self, ids: &[u32], from: usize, mask: Option<Vec<f32>>) -> Result<PassInput> {
        let (t, keys) = (ids.len(), from + ids.len());
        Ok(PassInput {
            ids: Tensor::from_slice(ids, t, &self.device)?,
            positions: Tensor::from_vec((from..keys).map(|p| p as u32).collect(), t, &self.device)?,
            keys,
            mask: self.mask_tensor(mask, (t, keys))?,
        })
    }

    /// An additive mask of `shape` on the device, in the compute dtype.
    fn mask_tensor(&self, mask: Option<Vec<f32>>, shape: (usize, usize)) -> Result<Option<Tensor>> {
        Ok(match mask {
            None => None,
            Some(m) => Some(Tensor::from_vec(m, shape, &self.device)?.to_dtype(self.dtype)?),
        })
    }

    /// A pass's rows embedded in the compute dtype, and their RoPE rows `(cos, sin)`.
    fn embedded(&self, input: &PassInput, cache: &KvCache) -> Result<(Tensor, (Tensor, Tensor))> {
        let x = self.embed.index_select(&input.ids, 0)?.to_dtype(self.dtype)?;
        Ok((x, (cache.cos.index_select(&input.positions, 0)?, cache.sin.index_select(&input.positions, 0)?)))
    }

    /// The forward pass, and (`routes`) the routing of its sparse layers.
    fn pass(&self, input: &PassInput, cache: &KvCache, routes: bool) -> Result<(Tensor, Vec<LayerRoutes>)> {
        if input.keys > cache.capacity {
            bail!("attention over {} keys > cache capacity {}", input.keys, cache.capacity);
        }
        let (mut x, (cos, sin)) = self.embedded(input, cache)?;
        if let Some(ws) = self.workspace(x.dim(0)?, input.keys)? {
            let t = x.dim(0)?;
            let h = self.forward_streamed(input, cache, &ws, x, (&cos, &sin))?;
            return Ok((h, if routes { self.streamed_routes(t)? } else { Vec::new() }));
        }
        // Residual stream `x`; `h` its normed input to the next block. The add of each residual
        // and the norm after it are one op when fused.
        let mut h = rms_norm(&x, &self.layers[0].input_norm, self.eps)?;
        let mut routing = Vec::new();
        for l in 0..self.layers.len() {
            let routes;
            (x, h, routes) = self.standard_layer(l, (&self.layers[l].attn, &self.layers[l].mlp), (&x, &h), (&cos, &sin), &cache.kv[l], input)?;
            routing.extend(routes.map(|rows| LayerRoutes { layer: l, rows }));
        }
        Ok((h, routing))
    }

    /// Layer `l` of the standard layer over the residual stream `x` and its normed `h`, with the
    /// layer's attention and feed-forward block given (the layer's own, or unpacked copies):
    /// the next `(x, h)` (`h` normed by the next layer's input norm, or the final norm) and the
    /// routes of a sparse block.
    #[allow(clippy::type_complexity)]
    fn standard_layer(
        &self,
        l: usize,
        (attn, mlp): (&SelfAttention, &Mlp),
        (x, h): (&Tensor, &Tensor),
        rope: (&Tensor, &Tensor),
        kv: &Tensor,
        input: &PassInput,
    ) -> Result<(Tensor, Tensor, Option<Vec<Route>>)> {
        let a = attn.forward(h, rope, kv, input, &self.heads, self.fused)?;
        let (x, h) = self.add_norm(x, &a, &self.layers[l].post_norm)?;
        let (m, routes) = mlp.forward(&h, self.fused)?;
        let next = self.layers.get(l + 1).map_or(&self.norm, |n| &n.input_norm);
        let (x, h) = self.add_norm(&x, &m, next)?;
        Ok((x, h, routes))
    }

    /// Commits `ids` (after the cache's committed positions) in passes of `chunk` rows (a
    /// multiple of `block`), as one committed [`Model::forward`] a chunk would, value for value,
    /// but layer by layer: every chunk through layer 0, then every chunk through layer 1, ...
    /// (a chunk's attention at layer `l` sees the K/V the chunks before it wrote there). So a
    /// packed layer is unpacked into rows once for the whole prompt (its products take many
    /// rows: cuBLAS), not once a chunk. Meanwhile it holds every chunk's residual stream and
    /// normed input (`2 x ids x hidden` values: 0.5 GB for 32k positions of SDAR-8B in bf16)
    /// and the in-chunk part of each chunk's mask; a chunk's whole `[chunk, keys]` mask is
    /// made when it is used.
    pub fn store_chunks(&self, ids: &[u32], chunk: usize, cache: &mut KvCache, block: usize) -> Result<()> {
        let start = cache.len;
        if chunk == 0 || block == 0 {
            bail!("storing in chunks of {chunk} rows, blocks of {block}: both must be at least 1");
        }
        cache.room_for(ids.len())?;
        let mut parts = Vec::new();
        for (c, piece) in ids.chunks(chunk).enumerate() {
            let (from, t) = (start + c * chunk, piece.len());
            let input = self.pass_input(piece, from, None)?;
            let (x, rope) = self.embedded(&input, cache)?;
            let h = rms_norm(&x, &self.layers[0].input_norm, self.eps)?;
            let inner = self.mask_tensor(block_causal_inner(from, t, block), (t, t))?;
            parts.push((input, inner, rope, x, h));
        }
        // the committed columns of every mask: all visible
        let visible = Tensor::zeros((chunk, start + ids.len()), self.dtype, &self.device)?;
        for (l, layer) in self.layers.iter().enumerate() {
            let attn = layer.attn.unpacked()?;
            let mlp = match &layer.mlp {
                Mlp::Dense(m) => m.unpacked()?.map(Mlp::Dense),
                Mlp::Sparse(m) => m.unpacked()?.map(Mlp::Sparse),
            };
            let blocks = (attn.as_ref().unwrap_or(&layer.attn), mlp.as_ref().unwrap_or(&layer.mlp));
            for (input, inner, (cos, sin), x, h) in parts.iter_mut() {
                let (t, from) = (input.ids.dim(0)?, input.keys - input.ids.dim(0)?);
                let mask = match inner {
                    Some(m) if from > 0 => Some(Tensor::cat(&[&visible.narrow(0, 0, t)?.narrow(1, 0, from)?, &*m], 1)?),
                    other => other.clone(),
                };
                let input = PassInput { ids: input.ids.clone(), positions: input.positions.clone(), keys: input.keys, mask };
                let (nx, nh, _) = self.standard_layer(l, blocks, (x, h), (cos, sin), &cache.kv[l], &input)?;
                (*x, *h) = (nx, nh);
            }
        }
        cache.len += ids.len();
        Ok(())
    }

    /// The scratch of a streamed pass of `t` rows over `keys` keys, or `None` where the pass
    /// runs the standard layer: the streamed one needs every projection kept for the gemv
    /// kernel ([`Linear::Rows`] or [`Linear::Packed`]), the fused ops, and the kernels to take
    /// these shapes.
    fn workspace(&self, t: usize, keys: usize) -> Result<Option<Workspace>> {
        if !self.norms_folded || !self.fused || self.dtype != DType::BF16 || t > super::gemv::MAX_ROWS {
            return Ok(None);
        }
        if !ops::cuda_attention_takes(keys, self.heads.head_dim) && !self.long_attention(keys) || !self.streamable() {
            return Ok(None);
        }
        let (d, h, kvh) = (self.heads.head_dim, self.heads.heads, self.heads.kv_heads);
        let hidden = self.embed.dim(1)?;
        // SAFETY: uninitialised, but every kernel of the pass writes its whole buffer before
        // the next reads it (zeroing them was one memset node each in the graph)
        let buf = |shape: &[usize], dt: DType| unsafe { Tensor::empty(shape, dt, &self.device) };
        let dense = self.layers.iter().find_map(|l| l.mlp.dense().map(|m| (l, m)));
        let sparse = self.layers.iter().find_map(|l| l.mlp.sparse());
        let moe = match sparse {
            Some(m) => {
                let Some((_, router)) = m.grouped() else { return Ok(None) };
                let (e, k, i) = (router.dim(0)?, m.top_k(), m.intermediate());
                Some(MoeWorkspace {
                    router: buf(&[t, e], self.dtype)?,
                    act: buf(&[t * k, i], self.dtype)?,
                    part: buf(&[t * k, hidden], DType::F32)?,
                })
            }
            None => None,
        };
        let ws = Workspace {
            qkv: buf(&[t, (h + 2 * kvh) * d], self.dtype)?,
            q: buf(&[h, t, d], self.dtype)?,
            attn: buf(&[t, h * d], self.dtype)?,
            mid: buf(&[t, hidden], self.dtype)?,
            out: buf(&[t, hidden], self.dtype)?,
            act: buf(&[t, dense.map_or(0, |(_, m)| m.intermediate)], self.dtype)?,
            moe,
        };
        // `mid` stands in for the layer input: the same shape, dtype and layout. The
        // attention products of any layer; the MLP products of a dense layer if there is one.
        let l0 = &self.layers[0];
        let [qkv_p, o_p, gate_up_p, down_p] = ws.products(&ws.mid, self.eps);
        let fits = |(op, input, _): &(GemvInto, &Tensor, &Tensor), w: Option<&Tensor>| w.is_some_and(|w| op.fits(input, w));
        let mut ok = fits(&qkv_p, l0.attn.qkv_proj.gemv_weight()) && fits(&o_p, l0.attn.o_proj.gemv_weight());
        if let Some((_, m)) = dense {
            ok &= fits(&gate_up_p, m.gate_up_proj.gemv_weight()) && fits(&down_p, m.down_proj.gemv_weight());
        }
        if let (Some(m), Some(mw)) = (sparse, &ws.moe) {
            ok &= moe_fits(m, &ws.mid, mw, self.eps);
        }
        Ok(ok.then_some(ws))
    }

    /// Whether the streamed layer's attention takes `keys` keys past the fused kernel's limit:
    /// the GPU's split-K kernels do (cuda/ops.rs, `split_applies`).
    fn long_attention(&self, keys: usize) -> bool {
        #[cfg(feature = "cuda")]
        if self.device.is_cuda() {
            return super::cuda::ops::split_applies(&self.heads.attention_op(keys));
        }
        let _ = keys;
        false
    }

    /// Whether a pass of `t` rows over `keys` keys can be captured as a CUDA graph: the streamed
    /// layer always; the standard layer unless a sparse block routes on the host.
    pub fn capturable(&self, t: usize, keys: usize) -> bool {
        self.streams(t, keys) || self.layers.iter().all(|l| l.mlp.sparse().is_none())
    }

    /// Whether a pass of `t` rows over `keys` keys runs [`Model::forward_streamed`].
    pub fn streams(&self, t: usize, keys: usize) -> bool {
        matches!(self.workspace(t, keys), Ok(Some(_)))
    }

    /// The layers as six kernels each (five where q/k prep folds into attention, on the GPU up
    /// to 512 keys: ops.rs, `prep_attention_into`), every one writing into `ws` (or the cache),
    /// so that a captured graph holds no allocation between them and, under programmatic
    /// dependent launch (sm_90's default, `UNMASK_PDL=0` off), each launch overlaps the tail of
    /// the one before: the q/k/v product with the input RMSNorm folded
    /// in; q/k norm, RoPE and the K/V to their cache slots; attention; the o product plus the
    /// residual; the gate|up product with the post-attention norm folded in and silu(gate) *
    /// up; the down product plus the residual. The norms' weights are in the projections
    /// ([`Model::fold_norms`]); each norm is the scale of its product's rows, so the values
    /// round at other points than in the standard layer (tests check the two against each
    /// other within bf16 error).
    fn forward_streamed(&self, input: &PassInput, cache: &KvCache, ws: &Workspace, embedded: Tensor, (cos, sin): (&Tensor, &Tensor)) -> Result<Tensor> {
        let mut x = embedded;
        let attn = self.heads.attention_op(input.keys);
        for (l, layer) in self.layers.iter().enumerate() {
            let run = |(op, input, out): (GemvInto, &Tensor, &Tensor), p: &Linear| -> Result<()> {
                let w = p.gemv_weight().ok_or_else(|| anyhow::anyhow!("layer {l}: a projection is not the gemv kernel's"))?;
                Ok(op.run(out, input, w)?)
            };
            let [qkv, o, gate_up, down] = ws.products(&x, self.eps);
            run(qkv, &layer.attn.qkv_proj)?;
            let prep = layer.attn.qkv_op(&self.heads);
            ops::prep_attention_into(&ws.attn, &ws.q, &cache.kv[l], (&ws.qkv, cos, sin), input.mask.as_ref(), &input.positions, &prep, &attn)?;
            run(o, &layer.attn.o_proj)?;
            match &layer.mlp {
                Mlp::Dense(mlp) => {
                    run(gate_up, &mlp.gate_up_proj)?;
                    run(down, &mlp.down_proj)?;
                }
                Mlp::Sparse(moe) => self.moe_streamed(l, moe, ws)?,
            }
            x = ws.out.clone();
        }
        Ok(rms_norm(&x, &self.norm, self.eps)?)
    }

    /// A sparse layer's feed-forward block in the streamed layer, `ws.out = ws.mid + moe(ws.mid)`,
    /// as three ops (moe_grouped.rs): the router product with the post-attention norm folded
    /// in; the routing into this layer's table and the grouped gate|up of every (row, choice)
    /// slot; the grouped down products times their weights, summed, plus the residual (on the
    /// GPU five kernels with the router's: cuda/moe.rs; the down kernel reads the table before
    /// it waits for gate|up, so nothing may rewrite it between the two). Nothing comes back to
    /// the host.
    fn moe_streamed(&self, l: usize, moe: &MoeBlock, ws: &Workspace) -> Result<()> {
        use super::moe_grouped::{ExpertsDownInto, ExpertsUpInto};
        let (Some((g, router)), Some(mw), Some(tables)) = (moe.grouped(), &ws.moe, &self.moe_tables) else {
            bail!("layer {l}: the streamed layer needs the MoE block's grouped form");
        };
        let k = moe.top_k();
        GemvInto { epilogue: Epilogue::Plain, rms: Some(self.eps), residual: None }.run(&mw.router, &ws.mid, router)?;
        let up = ExpertsUpInto { tables, logits: &mw.router, layer: l, k, norm: moe.norm_topk_prob(), eps: self.eps };
        up.run(&mw.act, &ws.mid, &g.gate_up)?;
        ExpertsDownInto { tables, part: &mw.part, res: &ws.mid, layer: l, k }.run(&ws.out, &mw.act, &g.down)?;
        Ok(())
    }

    /// The routes the grouped kernels took in the last streamed pass of `t` rows, read back
    /// from the device tables (one copy per sparse layer): how a pass replayed from a captured
    /// graph reports its routing.
    pub fn streamed_routes(&self, t: usize) -> Result<Vec<LayerRoutes>> {
        let Some(tables) = &self.moe_tables else { return Ok(Vec::new()) };
        let all = super::moe_grouped::read_tables(tables, self.layers.len(), t)?;
        let routes = self.layers.iter().zip(all).enumerate().filter(|(_, (layer, _))| layer.mlp.sparse().is_some());
        Ok(routes
            .map(|(l, (_, table))| {
                let rows = (0..t)
                    .map(|r| {
                        let (experts, weights) = table.row(r).unzip();
                        Route { experts, weights }
                    })
                    .collect();
                LayerRoutes { layer: l, rows }
            })
            .collect())
    }

    /// Keeps every layer's projections `[out, in]` ([`Linear::Rows`]) with the norms folded in
    /// ([`Model::fold_norms`]), then packed for the gemv ([`Model::relayout`], unless
    /// `UNMASK_PACKED=0`), as the GPU loads them by default in bf16, so that block passes run
    /// the streamed layer (and on the CPU its reference bodies, which is how tests compare it
    /// with the standard layer). bf16 only.
    pub fn use_row_weights(&mut self) -> Result<()> {
        if self.dtype != DType::BF16 {
            bail!("row weights are for the bf16 gemv kernel; this model computes in {:?}", self.dtype);
        }
        let norm = self.norm.clone();
        let to_rows = |p: &mut Linear| -> Result<()> {
            *p = match std::mem::replace(p, Linear::Rows(norm.clone())) {
                Linear::Dense(w) => Linear::Rows(w.t()?.contiguous()?),
                p @ (Linear::Rows(_) | Linear::Packed(_)) => p,
                Linear::Bf16(_) => bail!("bf16 panels are the f32 CPU path's"),
            };
            Ok(())
        };
        for l in &mut self.layers {
            to_rows(&mut l.attn.qkv_proj)?;
            to_rows(&mut l.attn.o_proj)?;
            match &mut l.mlp {
                Mlp::Dense(mlp) => {
                    to_rows(&mut mlp.gate_up_proj)?;
                    to_rows(&mut mlp.down_proj)?;
                }
                Mlp::Sparse(moe) => {
                    moe.for_each_proj(&mut |p| to_rows(p))?;
                    moe.group()?;
                }
            }
        }
        self.fold_norms()?;
        if self.paths.packed {
            self.relayout(WeightLayout::Packed)?;
        }
        Ok(())
    }

    /// Whether every projection the streamed layer reads through the gemv is packed
    /// ([`Model::relayout`]).
    pub fn packed(&self) -> bool {
        let packed = Linear::is_packed;
        !self.layers.is_empty()
            && self.layers.iter().all(|l| {
                let mlp = match &l.mlp {
                    Mlp::Dense(m) => packed(&m.gate_up_proj) && packed(&m.down_proj),
                    Mlp::Sparse(moe) => moe.packed(),
                };
                packed(&l.attn.qkv_proj) && packed(&l.attn.o_proj) && mlp
            })
    }

    /// Re-lays the streamed layer's projections (q|k|v, o, a dense block's gate|up and down, a
    /// sparse block's grouped experts) out in layout `to`: the gemv kernel's packed order
    /// (gemv.rs, `WeightLayout::Packed`; each projection where its shape allows) or back in
    /// rows. Packing comes after [`Model::fold_norms`], which scales rows. MoE routers keep
    /// their rows (the host router reads them).
    fn relayout(&mut self, to: WeightLayout) -> Result<()> {
        let norm = self.norm.clone();
        let each = |p: &mut Linear, halves: usize| -> Result<()> {
            let old = std::mem::replace(p, Linear::Rows(norm.clone()));
            *p = match to {
                WeightLayout::Packed => old.pack(halves)?,
                WeightLayout::Rows => old.unpacked()?.unwrap_or(old),
            };
            Ok(())
        };
        for l in &mut self.layers {
            each(&mut l.attn.qkv_proj, 1)?;
            each(&mut l.attn.o_proj, 1)?;
            match (&mut l.mlp, to) {
                (Mlp::Dense(mlp), _) => {
                    each(&mut mlp.gate_up_proj, 2)?;
                    each(&mut mlp.down_proj, 1)?;
                }
                (Mlp::Sparse(moe), WeightLayout::Packed) => moe.pack()?,
                (Mlp::Sparse(moe), WeightLayout::Rows) => moe.unpack()?,
            }
        }
        self.layout = to;
        Ok(())
    }

    /// Packs the streamed layer's weights (`on`) or lays them back in rows, where that changes
    /// anything: a model without the streamed layer's rows, or run with `UNMASK_PACKED=0`, stays
    /// as it is. Returns whether the weights moved (graphs captured before point at freed
    /// memory). Packed weights serve the passes the gemv takes in one launch; the decode
    /// chooses (`ModelDenoiser`).
    pub fn set_packed(&mut self, on: bool) -> Result<bool> {
        let want = if on && self.paths.packed { WeightLayout::Packed } else { WeightLayout::Rows };
        if !self.norms_folded || want == self.layout {
            return Ok(false);
        }
        self.relayout(want)?;
        Ok(true)
    }

    /// Folds each layer's input and post-attention RMSNorm weights into the projections that
    /// read their output (q/k/v and gate|up: `W[n, k] w[k]`, rounded to bf16) and leaves
    /// weights of ones in their place, so the standard layer computes the same function and
    /// the streamed layer's products only scale their rows by 1 / rms. Once.
    fn fold_norms(&mut self) -> Result<()> {
        if self.norms_folded {
            return Ok(());
        }
        let fold = |p: &mut Linear, w: &mut Tensor| -> Result<()> {
            let Linear::Rows(rows) = p else { bail!("norms fold only into [out, in] projections") };
            *rows = rows.broadcast_mul(&w.unsqueeze(0)?)?.contiguous()?;
            *w = w.ones_like()?;
            Ok(())
        };
        for l in &mut self.layers {
            fold(&mut l.attn.qkv_proj, &mut l.input_norm)?;
            match &mut l.mlp {
                Mlp::Dense(mlp) => fold(&mut mlp.gate_up_proj, &mut l.post_norm)?,
                Mlp::Sparse(moe) => {
                    moe.fold_norm(&l.post_norm)?;
                    l.post_norm = l.post_norm.ones_like()?;
                }
            }
        }
        if self.layers.iter().any(|l| l.mlp.sparse().is_some()) {
            self.moe_tables = Some(super::moe_grouped::new_tables(self.layers.len(), &self.device)?);
        }
        self.norms_folded = true;
        Ok(())
    }

    /// Logits `[T, vocab]` in f32 for hidden states from [`Model::forward`].
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

    /// `(x + delta, rms_norm(x + delta) * w)`.
    fn add_norm(&self, x: &Tensor, delta: &Tensor, w: &Tensor) -> Result<(Tensor, Tensor)> {
        if self.fused && x.dim(1)? <= 12 * 1024 {
            return Ok(ops::add_rms_norm(x, delta, w, &ops::AddRmsNorm { eps: self.eps })?);
        }
        let x = (x + delta)?;
        let h = rms_norm(&x, w, self.eps)?;
        Ok((x, h))
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
    /// Sparse layers' buffers, where the model has any.
    moe: Option<MoeWorkspace>,
}

/// A sparse layer's buffers in a streamed pass: router logits `[T, experts]`, the experts'
/// activations per (row, choice) slot `[T k, I]`, their weighted down products `[T k, H]` f32.
struct MoeWorkspace {
    router: Tensor,
    act: Tensor,
    part: Tensor,
}

/// Whether the grouped kernels take a sparse layer of this shape: the router through the
/// norm-folded gemv, hidden and I multiples of the gemv's K step, the pass's slots within
/// the routing table.
fn moe_fits(m: &MoeBlock, mid: &Tensor, mw: &MoeWorkspace, eps: f32) -> bool {
    use super::gemv::K_STEP;
    use super::moe_grouped::{MAX_CHOICES, MAX_EXPERTS, MAX_SLOTS};
    let Some((g, router)) = m.grouped() else { return false };
    let (Ok(t), Some((e, i2, h, _))) = (mid.dim(0), super::gemv::experts_dims(g.gate_up.dims())) else { return false };
    let router_op = GemvInto { epilogue: Epilogue::Plain, rms: Some(eps), residual: None };
    router_op.fits(mid, router)
        && mw.act.dim(1).is_ok_and(|i| 2 * i == i2)
        && h % K_STEP == 0
        && (i2 / 2) % K_STEP == 0
        && e <= MAX_EXPERTS
        && m.top_k() <= MAX_CHOICES
        && t * m.top_k() <= MAX_SLOTS
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
