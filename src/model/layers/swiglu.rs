//! The dense feed-forward block every SDAR family has somewhere: SwiGLU,
//! `down(silu(gate(x)) * up(x))`, with gate and up stacked into one product; also each expert
//! of a [`MoeBlock`](super::moe::MoeBlock).

use anyhow::Result;
use candle_core::Tensor;

use crate::model::linear::Linear;
use crate::model::loader::Loader;
use crate::model::ops;

pub struct SwiGlu {
    /// gate and up projections stacked: one matmul, `[hidden, 2*intermediate]`.
    pub gate_up_proj: Linear,
    pub down_proj: Linear,
    pub intermediate: usize,
}

impl SwiGlu {
    /// `{prefix}.{gate,up,down}_proj.weight` (`prefix` e.g. `model.layers.N.mlp`).
    pub fn load(b: &Loader, prefix: &str, hidden: usize, intermediate: usize) -> Result<Self> {
        let gate_up = [
            (format!("{prefix}.gate_proj.weight"), intermediate),
            (format!("{prefix}.up_proj.weight"), intermediate),
        ];
        Ok(SwiGlu {
            gate_up_proj: b.proj(&gate_up, hidden)?,
            down_proj: b.proj(&[(format!("{prefix}.down_proj.weight"), hidden)], intermediate)?,
            intermediate,
        })
    }

    /// `[T, hidden]` -> `[T, hidden]`. `fused`: the fused SiLU-multiply op, else candle's chain.
    pub fn forward(&self, x: &Tensor, fused: bool) -> candle_core::Result<Tensor> {
        if let Some(h) = self.gate_up_proj.forward_silu_mul(x)? {
            return self.down_proj.forward(&h);
        }
        let gate_up = self.gate_up_proj.forward(x)?;
        let i = self.intermediate;
        let h = if fused {
            ops::silu_mul(&gate_up, &ops::SiluMul { intermediate: i })?
        } else {
            let gate = candle_nn::ops::silu(&gate_up.narrow(1, 0, i)?)?;
            (gate * gate_up.narrow(1, i, i)?)?
        };
        self.down_proj.forward(&h)
    }

    /// This block with packed projections unpacked into rows ([`Linear::unpacked_pair`]);
    /// `None` where neither is packed.
    pub fn unpacked(&self) -> Result<Option<SwiGlu>> {
        let Some((gate_up_proj, down_proj)) =
            Linear::unpacked_pair(&self.gate_up_proj, &self.down_proj)?
        else {
            return Ok(None);
        };
        Ok(Some(SwiGlu { gate_up_proj, down_proj, intermediate: self.intermediate }))
    }

    pub fn bytes(&self) -> usize {
        self.gate_up_proj.bytes() + self.down_proj.bytes()
    }
}
