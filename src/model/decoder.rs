//! The network a family builds ([`Decoder`]: embedding → layers → final norm → lm_head, and its
//! standard forward), and [`Model`], that network on a device: what the engine runs. A
//! family's file (qwen3.rs, qwen3_moe.rs, llada2.rs) builds the [`Decoder`] from its own tensor
//! names; registry.rs picks the family from config.json. Where the weights are laid out for it,
//! a pass may run the device's streamed layer instead of the standard one (fast/).

use anyhow::{bail, Result};
use candle_core::{DType, Device, Tensor};
use candle_nn::ops::rms_norm;

use super::config::ModelConfig;
use super::fast::{self, StreamedLayer};
use super::layers::attention::Heads;
use super::layers::decoder_layer::{DecoderLayer, LayerPass};
use super::layers::embedding::{Embedding, LmHead};
use super::layers::kv_cache::{KvCache, PassInput, Rope};
use super::layers::moe::LayerRoutes;
use super::loader::Loader;
use super::ops;
use super::paths::{fused_here, PathChoices};
use super::weights::WeightSource;
use super::Compute;

/// What a family builds from a checkpoint.
pub struct Decoder {
    pub embed: Embedding,
    pub layers: Vec<DecoderLayer>,
    /// The final RMSNorm's weight `[hidden]`.
    pub norm: Tensor,
    pub lm_head: LmHead,
    /// Every layer norm's epsilon and the final norm's.
    pub eps: f32,
    /// The longest sequence the checkpoint is made for (config.json `max_position_embeddings`).
    pub max_positions: usize,
}

impl Decoder {
    /// A pass's rows embedded in `dtype`, and their rotary rows `(cos, sin)`.
    pub fn embed(
        &self,
        input: &PassInput,
        cache: &KvCache,
        dtype: DType,
    ) -> Result<(Tensor, (Tensor, Tensor))> {
        let x = self.embed.forward(&input.ids, dtype)?;
        Ok((
            x,
            (
                cache.cos.index_select(&input.positions, 0)?,
                cache.sin.index_select(&input.positions, 0)?,
            ),
        ))
    }

    /// The standard forward from the embedded rows `x`: every layer in turn, then the final
    /// norm; and the routing of each sparse layer. `h` is the residual stream `x` normed for
    /// the block it enters.
    pub fn forward(
        &self,
        mut x: Tensor,
        pass: &LayerPass,
        cache: &KvCache,
    ) -> Result<(Tensor, Vec<LayerRoutes>)> {
        let mut h = rms_norm(&x, &self.layers[0].input_norm, self.eps)?;
        let mut routing = Vec::new();
        for (l, layer) in self.layers.iter().enumerate() {
            let routes;
            (x, h, routes) = layer.forward((&x, &h), self.next_norm(l), &cache.kv[l], pass)?;
            routing.extend(routes.map(|rows| LayerRoutes { layer: l, rows }));
        }
        Ok((h, routing))
    }

    /// The norm after layer `l`: the next layer's input norm, or the final norm.
    pub fn next_norm(&self, l: usize) -> &Tensor {
        self.layers.get(l + 1).map_or(&self.norm, |n| &n.input_norm)
    }

    /// The attention shape every layer shares ([`Decoder::check`]).
    pub fn heads(&self) -> &Heads {
        &self.layers[0].attn.heads
    }

    fn rope(&self) -> &Rope {
        &self.layers[0].attn.rope
    }

    /// What the rest of the decoder assumes of a family's network: layers, one attention shape
    /// and one rotary embedding (the cache holds one table), over an even number of a head's
    /// leading dimensions (what the q/k prep ops rotate: the whole head or its first part).
    fn check(&self) -> Result<()> {
        let Some(first) = self.layers.first() else { bail!("a model needs at least one layer") };
        let (heads, rope) = (first.attn.heads, first.attn.rope);
        if let Some(l) =
            self.layers.iter().position(|l| l.attn.heads != heads || l.attn.rope != rope)
        {
            bail!("layer {l}: its attention's shape or rotary embedding differs from layer 0's");
        }
        if rope.dims == 0 || !rope.dims.is_multiple_of(2) || rope.dims > heads.head_dim {
            bail!("rotary embedding over {} of {} dimensions a head: the q/k prep ops rotate an even number of them, at least 2", rope.dims, heads.head_dim);
        }
        Ok(())
    }

    /// Whether every layer's feed-forward block is one the streamed layer runs.
    pub fn streamable(&self) -> bool {
        self.layers.iter().all(|l| l.ffn.streamable())
    }

    /// Whether some layer's feed-forward block is a mixture of experts.
    pub fn has_sparse(&self) -> bool {
        self.layers.iter().any(|l| l.ffn.sparse().is_some())
    }
}

pub struct Model {
    net: Decoder,
    device: Device,
    dtype: DType,
    /// Use the fused ops of `ops.rs` (default) rather than chains of generic candle ops.
    fused: bool,
    /// The device's streamed layer, where the weights are laid out for it (fast/).
    streamed: Option<StreamedLayer>,
    /// The device paths it was loaded with (paths.rs).
    paths: PathChoices,
}

impl Model {
    /// The model of the family config.json names (registry.rs), from `w`. On a device whose
    /// projections stay `[out, in]` (paths.rs) the weights are laid out for the streamed layer.
    pub fn load(
        cfg: &ModelConfig,
        w: &dyn WeightSource,
        compute: impl Into<Compute>,
        device: &Device,
    ) -> Result<Self> {
        let family = super::registry::family(cfg)?;
        let compute = compute.into();
        let b = Loader::new(w, compute, device);
        let net = (family.load)(cfg, &b)?;
        net.check()?;
        let dtype = compute.dtype;
        let paths = compute.paths;
        let fused = fused_here(device, dtype, &paths);
        let mut m = Model { net, device: device.clone(), dtype, fused, streamed: None, paths };
        if b.rows && m.net.streamable() {
            m.streamed = Some(StreamedLayer::new(&mut m.net, device, dtype, m.paths.packed)?);
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
        self.net.embed.vocab()
    }

    pub fn kv_heads(&self) -> usize {
        self.net.heads().kv_heads
    }

    /// Bytes of every weight (embedding and lm_head included; tied ones once).
    pub fn weight_bytes(&self) -> usize {
        let size = |t: &Tensor| t.elem_count() * t.dtype().size_in_bytes();
        let head = if self.net.lm_head.tied { 0 } else { self.net.lm_head.proj.bytes() };
        self.net.embed.bytes()
            + size(&self.net.norm)
            + head
            + self.net.layers.iter().map(DecoderLayer::bytes).sum::<usize>()
    }

    pub fn new_cache(&self, capacity: usize) -> Result<KvCache> {
        if capacity > self.net.max_positions {
            bail!(
                "a decode of {capacity} positions exceeds the model's {} positions \
                 (max_position_embeddings); lower --max-new-tokens or shorten the prompt",
                self.net.max_positions
            );
        }
        let heads = self.net.heads();
        KvCache::new(
            self.net.layers.len(),
            (heads.kv_heads, heads.head_dim),
            self.net.rope(),
            capacity,
            self.dtype,
            &self.device,
        )
    }

    /// Final hidden states `[T, hidden]` of `ids`, placed right after the cache's committed
    /// positions. Every cached position is visible; among `ids`, attention is block-causal with
    /// blocks of `block` positions counted from position 0. The K/V of the first `keep` ids
    /// are committed (the rest stay scratch).
    pub fn forward(
        &self,
        ids: &[u32],
        cache: &mut KvCache,
        block: usize,
        keep: usize,
    ) -> Result<Tensor> {
        let input = self.input_after(cache, ids, block, keep)?;
        let (h, _) = self.run(&input, cache, true)?;
        cache.len += keep;
        Ok(h)
    }

    /// [`Model::forward`], and the pass's routing in every sparse layer (none for a dense
    /// model). The routes are the host-side values the MoE block computes with, so keeping
    /// them costs nothing beyond these vectors.
    pub fn forward_routed(
        &self,
        ids: &[u32],
        cache: &mut KvCache,
        block: usize,
        keep: usize,
    ) -> Result<(Tensor, Vec<LayerRoutes>)> {
        let input = self.input_after(cache, ids, block, keep)?;
        let routed = self.run(&input, cache, true)?;
        cache.len += keep;
        Ok(routed)
    }

    /// The input of a pass over `ids` after the cache's committed positions, block-causal with
    /// blocks of `block`, that commits `keep` of them.
    fn input_after(
        &self,
        cache: &KvCache,
        ids: &[u32],
        block: usize,
        keep: usize,
    ) -> Result<PassInput> {
        let (start, t) = (cache.len, ids.len());
        if keep > t {
            bail!("a pass over {t} positions cannot store {keep}");
        }
        cache.room_for(t)?;
        let mask = super::layers::attention::block_causal_mask(start, t, block, start + t);
        PassInput::new(ids, start, mask, self.dtype, &self.device)
    }

    /// The forward pass over device-side inputs. Writes the pass's K/V into the cache slots
    /// `input.positions` and leaves `cache.len` alone: the caller commits by advancing it.
    /// Launches the same kernels with the same arguments whatever the tensors hold, so a CUDA
    /// graph captured once can replay it.
    pub fn forward_input(&self, input: &PassInput, cache: &KvCache) -> Result<Tensor> {
        Ok(self.run(input, cache, false)?.0)
    }

    /// [`Model::forward_input`] and its routing (see [`Model::forward_routed`]). A streamed pass
    /// reads its routing tables back from the device, so this one is not for graph capture.
    pub fn forward_input_routed(
        &self,
        input: &PassInput,
        cache: &KvCache,
    ) -> Result<(Tensor, Vec<LayerRoutes>)> {
        self.run(input, cache, true)
    }

    /// The forward pass: embed, then the streamed layer where it takes the pass, else the
    /// standard layers; and (`routes`) the routing of the sparse layers.
    fn run(
        &self,
        input: &PassInput,
        cache: &KvCache,
        routes: bool,
    ) -> Result<(Tensor, Vec<LayerRoutes>)> {
        if input.keys > cache.capacity {
            bail!("attention over {} keys > cache capacity {}", input.keys, cache.capacity);
        }
        let (x, (cos, sin)) = self.net.embed(input, cache, self.dtype)?;
        let pass = LayerPass { input, rope: (&cos, &sin), eps: self.net.eps, fused: self.fused };
        if let Some(s) = &self.streamed {
            if let Some(run) = s.plan(&self.net, x.dim(0)?, input.keys, self.fused)? {
                return run.forward(x, &pass, cache, routes);
            }
        }
        self.net.forward(x, &pass, cache)
    }

    /// Commits `ids` (after the cache's committed positions) in passes of `chunk` rows (a
    /// multiple of `block`), as one committed [`Model::forward`] a chunk would, value for value,
    /// but layer by layer (fast/chunked.rs says why).
    pub fn store_chunks(
        &self,
        ids: &[u32],
        chunk: usize,
        cache: &mut KvCache,
        block: usize,
    ) -> Result<()> {
        let on =
            fast::chunked::Target { device: &self.device, dtype: self.dtype, fused: self.fused };
        fast::chunked::store_chunks(&self.net, on, ids, (chunk, block), cache)
    }

    /// Whether a pass of `t` rows over `keys` keys can be captured as a CUDA graph: the streamed
    /// layer always; the standard layer unless a sparse block routes on the host.
    pub fn capturable(&self, t: usize, keys: usize) -> bool {
        self.streams(t, keys) || !self.net.has_sparse()
    }

    /// Whether a pass of `t` rows over `keys` keys runs the streamed layer.
    pub fn streams(&self, t: usize, keys: usize) -> bool {
        self.streamed
            .as_ref()
            .is_some_and(|s| matches!(s.plan(&self.net, t, keys, self.fused), Ok(Some(_))))
    }

    /// The routes the grouped kernels took in the last streamed pass of `t` rows, read back
    /// from the device tables in one copy: how a pass replayed from a captured graph reports
    /// its routing. None without the streamed layer's tables.
    pub fn streamed_routes(&self, t: usize) -> Result<Vec<LayerRoutes>> {
        match &self.streamed {
            Some(s) => s.routes(&self.net, t),
            None => Ok(Vec::new()),
        }
    }

    /// Distinct experts the grouped MoE kernels touched, summed over passes, and the passes
    /// (each sparse layer of a pass counts once), since the model was loaded: `None` for a
    /// dense model or one that does not run the grouped kernels. Reads the device counters.
    pub fn moe_stats(&self) -> Result<Option<(u64, u64)>> {
        self.streamed.as_ref().map_or(Ok(None), StreamedLayer::moe_stats)
    }

    /// Keeps every layer's projections `[out, in]` with the norms folded in and, unless
    /// `UNMASK_PACKED=0`, packed for the gemv, as the GPU loads them by default in bf16, so
    /// that block passes run the streamed layer (and on the CPU its reference bodies, which is
    /// how tests compare it with the standard layer). bf16 only.
    pub fn use_row_weights(&mut self) -> Result<()> {
        if self.dtype != DType::BF16 {
            bail!(
                "row weights are for the bf16 gemv kernel; this model computes in {:?}",
                self.dtype
            );
        }
        fast::packed::to_rows(&mut self.net)?;
        match &mut self.streamed {
            Some(s) => s.repack(&mut self.net),
            None => {
                self.streamed = Some(StreamedLayer::new(
                    &mut self.net,
                    &self.device,
                    self.dtype,
                    self.paths.packed,
                )?);
                Ok(())
            }
        }
    }

    /// Whether every projection the streamed layer reads through the gemv is packed.
    pub fn packed(&self) -> bool {
        fast::packed::all_packed(&self.net)
    }

    /// Packs the streamed layer's weights (`on`) or lays them back in rows, where that changes
    /// anything: a model without the streamed layer, or run with `UNMASK_PACKED=0`, stays as it
    /// is. Returns whether the weights moved (graphs captured before point at freed memory).
    /// Packed weights serve the passes the gemv takes in one launch; the decode chooses
    /// (`ModelDenoiser`).
    pub fn set_packed(&mut self, on: bool) -> Result<bool> {
        match &mut self.streamed {
            Some(s) => s.set_packed(&mut self.net, on),
            None => Ok(false),
        }
    }

    /// Logits `[T, vocab]` in f32 for hidden states from [`Model::forward`].
    pub fn logits(&self, hidden: &Tensor) -> Result<Tensor> {
        Ok(self.logits_raw(hidden)?.to_dtype(DType::F32)?)
    }

    /// Logits `[T, vocab]` in the compute dtype (what the device sampler reads).
    pub fn logits_raw(&self, hidden: &Tensor) -> Result<Tensor> {
        self.net.lm_head.forward(hidden)
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
}
