//! A layer's feed-forward block: a dense SwiGLU (swiglu.rs) or a sparse mixture of experts
//! (moe.rs: softmax or grouped sigmoid routing, router.rs; with or without a shared expert). A
//! family's file says which each layer has; the decoder runs either. A new kind of block is a
//! file beside them and a variant here.

use anyhow::Result;
use candle_core::Tensor;

use super::moe::{MoeBlock, Route};
use super::swiglu::SwiGlu;

/// A layer's feed-forward block.
pub enum FeedForward {
    Dense(SwiGlu),
    Sparse(MoeBlock),
}

impl FeedForward {
    /// The block's output, and each row's route where it is sparse.
    pub fn forward(&self, x: &Tensor, fused: bool) -> Result<(Tensor, Option<Vec<Route>>)> {
        match self {
            FeedForward::Dense(m) => Ok((m.forward(x, fused)?, None)),
            FeedForward::Sparse(m) => m.forward(x, fused).map(|(y, r)| (y, Some(r))),
        }
    }

    pub fn dense(&self) -> Option<&SwiGlu> {
        match self {
            FeedForward::Dense(m) => Some(m),
            FeedForward::Sparse(_) => None,
        }
    }

    pub fn sparse(&self) -> Option<&MoeBlock> {
        match self {
            FeedForward::Sparse(m) => Some(m),
            FeedForward::Dense(_) => None,
        }
    }

    /// Whether the streamed layer can run this block: dense with `[out, in]` projections, or
    /// sparse with its experts stacked for the grouped kernels (and its shared expert, if any,
    /// `[out, in]` for the gemv).
    pub fn streamable(&self) -> bool {
        match self {
            FeedForward::Dense(m) => {
                m.gate_up_proj.gemv_weight().is_some() && m.down_proj.gemv_weight().is_some()
            }
            FeedForward::Sparse(m) => {
                m.grouped().is_some()
                    && m.shared.as_ref().is_none_or(|s| {
                        s.gate_up_proj.gemv_weight().is_some()
                            && s.down_proj.gemv_weight().is_some()
                    })
            }
        }
    }

    pub fn bytes(&self) -> usize {
        match self {
            FeedForward::Dense(m) => m.bytes(),
            FeedForward::Sparse(m) => m.bytes(),
        }
    }
}
