//! A layer's feed-forward block: a dense SwiGLU (mlp.rs) or a sparse mixture of experts
//! (moe.rs). A family's file says which each layer has; the decoder runs either.

use anyhow::Result;
use candle_core::Tensor;

use super::mlp::SwiGlu;
use super::moe::{MoeBlock, Route};

/// A layer's feed-forward block.
pub enum Mlp {
    Dense(SwiGlu),
    Sparse(MoeBlock),
}

impl Mlp {
    /// The block's output, and each row's route where it is sparse.
    pub(super) fn forward(&self, x: &Tensor, fused: bool) -> Result<(Tensor, Option<Vec<Route>>)> {
        match self {
            Mlp::Dense(m) => Ok((m.forward(x, fused)?, None)),
            Mlp::Sparse(m) => m.forward(x, fused).map(|(y, r)| (y, Some(r))),
        }
    }

    pub(super) fn dense(&self) -> Option<&SwiGlu> {
        match self {
            Mlp::Dense(m) => Some(m),
            Mlp::Sparse(_) => None,
        }
    }

    pub(super) fn sparse(&self) -> Option<&MoeBlock> {
        match self {
            Mlp::Sparse(m) => Some(m),
            Mlp::Dense(_) => None,
        }
    }

    /// Whether the streamed layer can run this block: dense with `[out, in]` projections, or
    /// sparse with its experts stacked for the grouped kernels.
    pub(super) fn streamable(&self) -> bool {
        match self {
            Mlp::Dense(m) => m.gate_up_proj.gemv_weight().is_some() && m.down_proj.gemv_weight().is_some(),
            Mlp::Sparse(m) => m.grouped().is_some(),
        }
    }

    pub(super) fn bytes(&self) -> usize {
        match self {
            Mlp::Dense(m) => m.bytes(),
            Mlp::Sparse(m) => m.bytes(),
        }
    }
}

