//! A long prompt committed in chunks, layer by layer: every chunk through layer 0, then every
//! chunk through layer 1, ... (a chunk's attention at layer `l` sees the K/V the chunks before
//! it wrote there). So a packed layer is unpacked into rows once for the whole prompt (its
//! products take many rows: cuBLAS), not once a chunk. Meanwhile it holds every chunk's
//! residual stream and normed input (`2 x ids x hidden` values: 0.5 GB for 32k positions of
//! SDAR-8B in bf16) and the in-chunk part of each chunk's mask; a chunk's whole
//! `[chunk, keys]` mask is made when it is used.

use anyhow::{bail, Result};
use candle_core::{DType, Device, Tensor};
use candle_nn::ops::rms_norm;

use crate::model::decoder::Decoder;
use crate::model::layers::attention::block_causal_inner;
use crate::model::layers::decoder_layer::LayerPass;
use crate::model::layers::feed_forward::FeedForward;
use crate::model::layers::kv_cache::{mask_tensor, KvCache, PassInput};

/// Where and how the model computes.
#[derive(Clone, Copy)]
pub struct Target<'a> {
    pub device: &'a Device,
    pub dtype: DType,
    pub fused: bool,
}

/// Commits `ids` (after the cache's committed positions) in passes of `chunk` rows (a multiple
/// of `block`), as one committed forward a chunk would, value for value, but layer by layer.
pub fn store_chunks(
    net: &Decoder,
    on: Target,
    ids: &[u32],
    (chunk, block): (usize, usize),
    cache: &mut KvCache,
) -> Result<()> {
    let start = cache.len;
    if chunk == 0 || block == 0 {
        bail!("storing in chunks of {chunk} rows, blocks of {block}: both must be at least 1");
    }
    cache.room_for(ids.len())?;
    let mut parts = Vec::new();
    for (c, piece) in ids.chunks(chunk).enumerate() {
        let (from, t) = (start + c * chunk, piece.len());
        let input = PassInput::new(piece, from, None, on.dtype, on.device)?;
        let (x, rope) = net.embed(&input, cache, on.dtype)?;
        let h = rms_norm(&x, &net.layers[0].input_norm, net.eps)?;
        let inner = mask_tensor(block_causal_inner(from, t, block), (t, t), on.dtype, on.device)?;
        parts.push((input, inner, rope, x, h));
    }
    // the committed columns of every mask: all visible
    let visible = Tensor::zeros((chunk, start + ids.len()), on.dtype, on.device)?;
    for (l, layer) in net.layers.iter().enumerate() {
        let attn = layer.attn.unpacked()?;
        let ffn = match &layer.ffn {
            FeedForward::Dense(m) => m.unpacked()?.map(FeedForward::Dense),
            FeedForward::Sparse(m) => m.unpacked()?.map(FeedForward::Sparse),
        };
        let blocks = (attn.as_ref().unwrap_or(&layer.attn), ffn.as_ref().unwrap_or(&layer.ffn));
        for (input, inner, (cos, sin), x, h) in parts.iter_mut() {
            let (t, from) = (input.ids.dim(0)?, input.keys - input.ids.dim(0)?);
            let mask = match inner {
                Some(m) if from > 0 => {
                    Some(Tensor::cat(&[&visible.narrow(0, 0, t)?.narrow(1, 0, from)?, &*m], 1)?)
                }
                other => other.clone(),
            };
            let input = PassInput {
                ids: input.ids.clone(),
                positions: input.positions.clone(),
                keys: input.keys,
                mask,
            };
            let pass = LayerPass { input: &input, rope: (cos, sin), eps: net.eps, fused: on.fused };
            let (nx, nh, _) =
                layer.forward_with(blocks, (x, h), net.next_norm(l), &cache.kv[l], &pass)?;
            (*x, *h) = (nx, nh);
        }
    }
    cache.len += ids.len();
    Ok(())
}
