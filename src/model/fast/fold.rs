//! Folding each layer's RMSNorm weights into the projections that read their output, so that
//! the streamed layer's products only scale their rows by 1 / rms.

use anyhow::{bail, Result};
use candle_core::Tensor;

use crate::model::decoder::Decoder;
use crate::model::layers::feed_forward::FeedForward;
use crate::model::linear::Linear;

/// Folds each layer's input and post-attention RMSNorm weights into the projections that read
/// their output (q/k/v and gate|up, or a MoE block's router and experts: `W[n, k] w[k]`,
/// rounded to bf16) and leaves weights of ones in their place, so the standard layer computes
/// the same function. The projections must be `[out, in]`.
pub fn fold_norms(net: &mut Decoder) -> Result<()> {
    let fold = |p: &mut Linear, w: &mut Tensor| -> Result<()> {
        let Linear::Rows(rows) = p else { bail!("norms fold only into [out, in] projections") };
        *rows = rows.broadcast_mul(&w.unsqueeze(0)?)?.contiguous()?;
        *w = w.ones_like()?;
        Ok(())
    };
    for l in &mut net.layers {
        fold(&mut l.attn.qkv_proj, &mut l.input_norm)?;
        match &mut l.ffn {
            FeedForward::Dense(mlp) => fold(&mut mlp.gate_up_proj, &mut l.post_norm)?,
            FeedForward::Sparse(moe) => {
                moe.fold_norm(&l.post_norm)?;
                l.post_norm = l.post_norm.ones_like()?;
            }
        }
    }
    Ok(())
}
