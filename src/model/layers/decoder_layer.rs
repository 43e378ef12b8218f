//! One decoder layer as every SDAR family has it: the input norm, attention and its residual,
//! the post-attention norm, the feed-forward block and its residual. Each residual's add and
//! the norm after it are one op when fused, so a layer hands the next its normed input too.

use anyhow::Result;
use candle_core::Tensor;
use candle_nn::ops::rms_norm;

use super::attention::SelfAttention;
use super::feed_forward::FeedForward;
use super::kv_cache::PassInput;
use super::moe::Route;
use crate::model::ops;

pub struct DecoderLayer {
    /// RMSNorm weight `[hidden]` before attention.
    pub input_norm: Tensor,
    pub attn: SelfAttention,
    /// RMSNorm weight `[hidden]` before the feed-forward block.
    pub post_norm: Tensor,
    pub ffn: FeedForward,
}

/// What every layer of one pass reads besides its weights and its cache.
pub struct LayerPass<'a> {
    pub input: &'a PassInput,
    /// The pass's rotary rows `(cos, sin)`.
    pub rope: (&'a Tensor, &'a Tensor),
    /// The layer norms' epsilon.
    pub eps: f32,
    /// The fused ops of ops.rs, else the generic candle chains they are checked against.
    pub fused: bool,
}

impl DecoderLayer {
    /// The layer over the residual stream `x` and its normed `h`, writing the pass's K/V into
    /// `kv`: the next `(x, h)`, `h` normed by `next_norm` (the next layer's input norm, or the
    /// final norm), and each row's route where the feed-forward block is sparse.
    pub fn forward(
        &self,
        xh: (&Tensor, &Tensor),
        next_norm: &Tensor,
        kv: &Tensor,
        pass: &LayerPass,
    ) -> Result<(Tensor, Tensor, Option<Vec<Route>>)> {
        self.forward_with((&self.attn, &self.ffn), xh, next_norm, kv, pass)
    }

    /// [`DecoderLayer::forward`] with other copies of the layer's attention and feed-forward
    /// block (its weights laid out otherwise, fast/chunked.rs).
    #[allow(clippy::type_complexity)]
    pub fn forward_with(
        &self,
        (attn, ffn): (&SelfAttention, &FeedForward),
        (x, h): (&Tensor, &Tensor),
        next_norm: &Tensor,
        kv: &Tensor,
        pass: &LayerPass,
    ) -> Result<(Tensor, Tensor, Option<Vec<Route>>)> {
        let a = attn.forward(h, pass.rope, kv, pass.input, pass.fused)?;
        let (x, h) = add_norm(x, &a, &self.post_norm, pass)?;
        let (m, routes) = ffn.forward(&h, pass.fused)?;
        let (x, h) = add_norm(&x, &m, next_norm, pass)?;
        Ok((x, h, routes))
    }

    /// Bytes of the layer's weights.
    pub fn bytes(&self) -> usize {
        let size = |t: &Tensor| t.elem_count() * t.dtype().size_in_bytes();
        let norms = [&self.input_norm, &self.attn.q_norm, &self.attn.k_norm, &self.post_norm]
            .into_iter()
            .map(size)
            .sum::<usize>();
        norms + self.attn.qkv_proj.bytes() + self.attn.o_proj.bytes() + self.ffn.bytes()
    }
}

/// `(x + delta, rms_norm(x + delta) * w)`.
fn add_norm(x: &Tensor, delta: &Tensor, w: &Tensor, pass: &LayerPass) -> Result<(Tensor, Tensor)> {
    if pass.fused && x.dim(1)? <= 12 * 1024 {
        return Ok(ops::add_rms_norm(x, delta, w, &ops::AddRmsNorm { eps: pass.eps })?);
    }
    let x = (x + delta)?;
    let h = rms_norm(&x, w, pass.eps)?;
    Ok((x, h))
}
