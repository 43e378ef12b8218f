//! The streamed layer: a block pass's layers as six kernels each (five where q/k prep folds
//! into attention, on the GPU up to 512 keys: ops.rs, `prep_attention_into`), every one
//! writing into a preallocated [`Workspace`] (or the cache), so that a captured graph holds no
//! allocation between them and, under programmatic dependent launch (sm_90's default,
//! `UNMASK_PDL=0` off), each launch overlaps the tail of the one before: the q/k/v product
//! with the input RMSNorm folded in; q/k norm, RoPE and the K/V to their cache slots;
//! attention; the o product plus the residual; the gate|up product with the post-attention
//! norm folded in and silu(gate) * up; the down product plus the residual. A sparse layer's
//! feed-forward block is the grouped MoE ops instead (moe_grouped.rs), after its shared
//! expert's two products where it has one (LLaDA2). The norms' weights are
//! in the projections (fold.rs); each norm is the scale of its product's rows, so the values
//! round at other points than in the standard layer (tests check the two against each other
//! within bf16 error).

use anyhow::{bail, Result};
use candle_core::{DType, Tensor};
use candle_nn::ops::rms_norm;

use super::moe_grouped::{self, ExpertsDownInto, ExpertsUpInto, RouteRule};
use super::StreamedLayer;
use crate::model::decoder::Decoder;
use crate::model::gemv::{self, Epilogue, GemvInto};
use crate::model::layers::decoder_layer::LayerPass;
use crate::model::layers::feed_forward::FeedForward;
use crate::model::layers::kv_cache::KvCache;
use crate::model::layers::moe::{LayerRoutes, MoeBlock, Route};
use crate::model::layers::router::Routing;
use crate::model::linear::Linear;
use crate::model::ops;

/// A pass the streamed layer takes, with its workspace.
pub struct StreamedPass<'a> {
    layer: &'a StreamedLayer,
    net: &'a Decoder,
    ws: Workspace,
}

/// Buffers a streamed pass writes, allocated before its first layer (so in a captured graph
/// their allocations come first, not between kernels): the q/k/v product, the prepared q heads
/// `[H, T, d]`, attention's output, the residual stream after attention (`mid`) and after the
/// feed-forward block (`out`, the next layer's input), and the SwiGLU's activation.
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
/// activations per (row, choice) slot `[T k, I]`, their weighted down products `[T k, H]` f32;
/// where the block has a shared expert, its activation `[T, I shared]` and the residual stream
/// with its output added `[T, H]` (the residual the routed experts' sum is added to).
struct MoeWorkspace {
    router: Tensor,
    act: Tensor,
    part: Tensor,
    shared: Option<(Tensor, Tensor)>,
}

/// The streamed pass of `t` rows over `keys` keys, or `None` where the pass runs the standard
/// layer: the streamed one needs every projection kept for the gemv kernel ([`Linear::Rows`]
/// or [`Linear::Packed`]), the fused ops, and the kernels to take these shapes.
pub(super) fn plan<'a>(
    layer: &'a StreamedLayer,
    net: &'a Decoder,
    (t, keys): (usize, usize),
    fused: bool,
) -> Result<Option<StreamedPass<'a>>> {
    if !fused || t > gemv::MAX_ROWS {
        return Ok(None);
    }
    let heads = net.heads();
    if !ops::cuda_attention_takes(keys, heads.head_dim) && !long_attention(layer, net, keys)
        || !net.streamable()
    {
        return Ok(None);
    }
    let Some(ws) = Workspace::new(layer, net, t)? else { return Ok(None) };
    Ok(ws.fits(net).then_some(StreamedPass { layer, net, ws }))
}

/// Whether the streamed layer's attention takes `keys` keys past the fused kernel's limit:
/// the GPU's split-K kernels do (cuda/ops.rs, `split_applies`).
fn long_attention(layer: &StreamedLayer, net: &Decoder, keys: usize) -> bool {
    #[cfg(feature = "cuda")]
    if layer.device.is_cuda() {
        return crate::model::cuda::ops::split_applies(&net.heads().attention_op(keys));
    }
    let _ = (layer, net, keys);
    false
}

impl Workspace {
    /// The buffers of a pass of `t` rows; `None` where a sparse block lacks its grouped form.
    fn new(layer: &StreamedLayer, net: &Decoder, t: usize) -> Result<Option<Self>> {
        let heads = net.heads();
        let (d, h, kvh) = (heads.head_dim, heads.heads, heads.kv_heads);
        let hidden = net.embed.table.dim(1)?;
        let bf16 = DType::BF16;
        // SAFETY: uninitialised, but every kernel of the pass writes its whole buffer before
        // the next reads it (zeroing them was one memset node each in the graph)
        let buf = |shape: &[usize], dt: DType| unsafe { Tensor::empty(shape, dt, &layer.device) };
        let dense = net.layers.iter().find_map(|l| l.ffn.dense());
        let moe = match net.layers.iter().find_map(|l| l.ffn.sparse()) {
            Some(m) => {
                let Some((_, router)) = m.grouped() else { return Ok(None) };
                let (e, k, i) = (router.dim(0)?, m.top_k(), m.intermediate());
                let shared = match &m.shared {
                    Some(s) => Some((buf(&[t, s.intermediate], bf16)?, buf(&[t, hidden], bf16)?)),
                    None => None,
                };
                Some(MoeWorkspace {
                    router: buf(&[t, e], bf16)?,
                    act: buf(&[t * k, i], bf16)?,
                    part: buf(&[t * k, hidden], DType::F32)?,
                    shared,
                })
            }
            None => None,
        };
        Ok(Some(Workspace {
            qkv: buf(&[t, (h + 2 * kvh) * d], bf16)?,
            q: buf(&[h, t, d], bf16)?,
            attn: buf(&[t, h * d], bf16)?,
            mid: buf(&[t, hidden], bf16)?,
            out: buf(&[t, hidden], bf16)?,
            act: buf(&[t, dense.map_or(0, |m| m.intermediate)], bf16)?,
            moe,
        }))
    }

    /// Whether the kernels take every product of the pass. `mid` stands in for the layer
    /// input: the same shape, dtype and layout. The attention products of any layer; the
    /// SwiGLU products of a dense layer if there is one; a sparse layer's grouped form.
    fn fits(&self, net: &Decoder) -> bool {
        let l0 = &net.layers[0];
        let [qkv_p, o_p, gate_up_p, down_p] = self.products(&self.mid, net.eps);
        let fits = |(op, input, _): &(GemvInto, &Tensor, &Tensor), w: Option<&Tensor>| {
            w.is_some_and(|w| op.fits(input, w))
        };
        let mut ok = fits(&qkv_p, l0.attn.qkv_proj.gemv_weight())
            && fits(&o_p, l0.attn.o_proj.gemv_weight());
        if let Some(m) = net.layers.iter().find_map(|l| l.ffn.dense()) {
            ok &= fits(&gate_up_p, m.gate_up_proj.gemv_weight())
                && fits(&down_p, m.down_proj.gemv_weight());
        }
        if let (Some(m), Some(mw)) = (net.layers.iter().find_map(|l| l.ffn.sparse()), &self.moe) {
            ok &= moe_fits(m, &self.mid, mw, net.eps);
        }
        ok
    }

    /// A layer's four products as the streamed layer runs them, each `(op, input, output)`, for
    /// the layer input `x`: q|k|v (the input norm folded in), o (plus the residual `x`),
    /// gate|up (the post-attention norm folded in, then SiLU) and down (plus `mid`). One list
    /// for both the run and the check that the kernel takes every product.
    fn products<'a>(
        &'a self,
        x: &'a Tensor,
        eps: f32,
    ) -> [(GemvInto<'a>, &'a Tensor, &'a Tensor); 4] {
        let (rms, plain) = (Some(eps), Epilogue::Plain);
        [
            (GemvInto { epilogue: plain, rms, residual: None }, x, &self.qkv),
            (GemvInto { epilogue: plain, rms: None, residual: Some(x) }, &self.attn, &self.mid),
            (GemvInto { epilogue: Epilogue::SiluMul, rms, residual: None }, &self.mid, &self.act),
            (
                GemvInto { epilogue: plain, rms: None, residual: Some(&self.mid) },
                &self.act,
                &self.out,
            ),
        ]
    }
}

/// Whether the grouped kernels take a sparse layer of this shape: the router through the
/// norm-folded gemv, hidden and I multiples of the gemv's K step, the pass's slots within
/// the routing table, a grouped router of at most [`moe_grouped::MAX_GROUPS`] groups; and the
/// shared expert's two products through the gemv, where the block has one.
fn moe_fits(m: &MoeBlock, mid: &Tensor, mw: &MoeWorkspace, eps: f32) -> bool {
    use moe_grouped::{MAX_CHOICES, MAX_EXPERTS, MAX_GROUPS, MAX_SLOTS};
    let Some((g, router)) = m.grouped() else { return false };
    let (Ok(t), Some((e, i2, h, _))) = (mid.dim(0), gemv::experts_dims(g.gate_up.dims())) else {
        return false;
    };
    let router_op = GemvInto { epilogue: Epilogue::Plain, rms: Some(eps), residual: None };
    let groups_fit = match m.routing() {
        Routing::Softmax { .. } => true,
        Routing::GroupedSigmoid(r) => r.groups <= MAX_GROUPS && m.bias().is_some(),
    };
    let shared_fits = match (&m.shared, &mw.shared) {
        (None, None) => true,
        (Some(s), Some((act, out))) => {
            let [gate_up, down] = shared_products(mid, act, out, eps);
            let fits = |(op, input, _): &(GemvInto, &Tensor, &Tensor), w: Option<&Tensor>| {
                w.is_some_and(|w| op.fits(input, w))
            };
            fits(&gate_up, s.gate_up_proj.gemv_weight()) && fits(&down, s.down_proj.gemv_weight())
        }
        _ => false,
    };
    router_op.fits(mid, router)
        && mw.act.dim(1).is_ok_and(|i| 2 * i == i2)
        && h % gemv::K_STEP == 0
        && (i2 / 2) % gemv::K_STEP == 0
        && e <= MAX_EXPERTS
        && m.top_k() <= MAX_CHOICES
        && t * m.top_k() <= MAX_SLOTS
        && groups_fit
        && shared_fits
}

/// A shared expert's two products as a dense layer's gate|up and down run, each `(op, input,
/// output)`: gate|up of the layer's `mid` (the post-attention norm folded in, then SiLU) into
/// `act`, down plus the residual `mid` into `out`.
fn shared_products<'a>(
    mid: &'a Tensor,
    act: &'a Tensor,
    out: &'a Tensor,
    eps: f32,
) -> [(GemvInto<'a>, &'a Tensor, &'a Tensor); 2] {
    [
        (GemvInto { epilogue: Epilogue::SiluMul, rms: Some(eps), residual: None }, mid, act),
        (GemvInto { epilogue: Epilogue::Plain, rms: None, residual: Some(mid) }, act, out),
    ]
}

impl StreamedPass<'_> {
    /// The pass from the embedded rows `x`: every layer's kernels, then the final norm; and
    /// (`routes`) the routes read back from the device tables.
    pub fn forward(
        self,
        mut x: Tensor,
        pass: &LayerPass,
        cache: &KvCache,
        routes: bool,
    ) -> Result<(Tensor, Vec<LayerRoutes>)> {
        let (net, ws) = (self.net, &self.ws);
        let t = x.dim(0)?;
        let (cos, sin) = pass.rope;
        let input = pass.input;
        let attn = net.heads().attention_op(input.keys);
        for (l, layer) in net.layers.iter().enumerate() {
            let run = |(op, input, out): (GemvInto, &Tensor, &Tensor), p: &Linear| -> Result<()> {
                let w = p.gemv_weight().ok_or_else(|| {
                    anyhow::anyhow!("layer {l}: a projection is not the gemv kernel's")
                })?;
                Ok(op.run(out, input, w)?)
            };
            let [qkv, o, gate_up, down] = ws.products(&x, net.eps);
            run(qkv, &layer.attn.qkv_proj)?;
            let prep = layer.attn.qkv_op();
            ops::prep_attention_into(
                &ws.attn,
                &ws.q,
                &cache.kv[l],
                (&ws.qkv, cos, sin),
                input.mask.as_ref(),
                &input.positions,
                &prep,
                &attn,
            )?;
            run(o, &layer.attn.o_proj)?;
            match &layer.ffn {
                FeedForward::Dense(mlp) => {
                    run(gate_up, &mlp.gate_up_proj)?;
                    run(down, &mlp.down_proj)?;
                }
                FeedForward::Sparse(moe) => self.moe(l, moe)?,
            }
            x = ws.out.clone();
        }
        let h = rms_norm(&x, &net.norm, net.eps)?;
        Ok((h, if routes { self.layer.routes(net, t)? } else { Vec::new() }))
    }

    /// A sparse layer's feed-forward block, `ws.out = ws.mid + moe(ws.mid)`, as three ops
    /// (moe_grouped.rs): the router product with the post-attention norm folded in; the
    /// routing into this layer's table and the grouped gate|up of every (row, choice) slot;
    /// the grouped down products times their weights, summed, plus the residual (on the GPU
    /// five kernels with the router's: cuda/moe.rs; the down kernel reads the table before it
    /// waits for gate|up, so nothing may rewrite it between the two). A shared expert goes
    /// first, as a dense layer's SwiGLU (two gemvs): its output plus `ws.mid` is the residual
    /// the routed sum is added to, so the route, gate|up and down stay back to back. Nothing
    /// comes back to the host.
    fn moe(&self, l: usize, moe: &MoeBlock) -> Result<()> {
        let (ws, eps) = (&self.ws, self.net.eps);
        let (Some((g, router)), Some(mw), Some(tables)) =
            (moe.grouped(), &ws.moe, &self.layer.moe_tables)
        else {
            bail!("layer {l}: the streamed layer needs the MoE block's grouped form");
        };
        let res = match (&moe.shared, &mw.shared) {
            (Some(s), Some((act, out))) => {
                let [gate_up, down] = shared_products(&ws.mid, act, out, eps);
                for ((op, input, output), p) in [(gate_up, &s.gate_up_proj), (down, &s.down_proj)] {
                    let w = p.gemv_weight().ok_or_else(|| {
                        anyhow::anyhow!("layer {l}: the shared expert is not the gemv kernel's")
                    })?;
                    op.run(output, input, w)?;
                }
                out
            }
            (None, _) => &ws.mid,
            (Some(_), None) => bail!("layer {l}: no workspace for the shared expert"),
        };
        let k = moe.top_k();
        let rule = match moe.routing() {
            Routing::Softmax { norm } => RouteRule::Softmax { norm: *norm },
            Routing::GroupedSigmoid(router) => {
                let Some(bias) = moe.bias() else {
                    bail!("layer {l}: the grouped router's bias is not on the device")
                };
                RouteRule::GroupedSigmoid { router, bias }
            }
        };
        GemvInto { epilogue: Epilogue::Plain, rms: Some(eps), residual: None }
            .run(&mw.router, &ws.mid, router)?;
        let up = ExpertsUpInto { tables, logits: &mw.router, layer: l, k, rule, eps };
        up.run(&mw.act, &ws.mid, &g.gate_up)?;
        ExpertsDownInto { tables, part: &mw.part, res, layer: l, k }
            .run(&ws.out, &mw.act, &g.down)?;
        Ok(())
    }
}

/// The routes the grouped kernels took in the last streamed pass of `t` rows, read back from
/// the device `tables` in one copy: how a pass replayed from a captured graph reports its
/// routing.
pub(super) fn routes(tables: Option<&Tensor>, net: &Decoder, t: usize) -> Result<Vec<LayerRoutes>> {
    let Some(tables) = tables else { return Ok(Vec::new()) };
    let all = moe_grouped::read_tables(tables, net.layers.len(), t)?;
    let sparse = net
        .layers
        .iter()
        .zip(all)
        .enumerate()
        .filter(|(_, (layer, _))| layer.ffn.sparse().is_some());
    Ok(sparse
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
