//! The streamed layer's projections laid out for the gemv kernel: `[out, in]` rows, then
//! packed in the order the kernel reads them (gemv.rs, `WeightLayout::Packed`).

use anyhow::{bail, Result};

use crate::model::decoder::Decoder;
use crate::model::gemv::WeightLayout;
use crate::model::layers::feed_forward::FeedForward;
use crate::model::linear::Linear;

/// Every layer's projections as `[out, in]` rows ([`Linear::Rows`]; packed ones stay packed)
/// and a MoE block's experts stacked for the grouped kernels. Not for bf16 panels.
pub fn to_rows(net: &mut Decoder) -> Result<()> {
    let norm = net.norm.clone();
    let to_rows = |p: &mut Linear| -> Result<()> {
        *p = match std::mem::replace(p, Linear::Rows(norm.clone())) {
            Linear::Dense(w) => Linear::Rows(w.t()?.contiguous()?),
            p @ (Linear::Rows(_) | Linear::Packed(_)) => p,
            Linear::Bf16(_) => bail!("bf16 panels are the f32 CPU path's"),
        };
        Ok(())
    };
    for l in &mut net.layers {
        to_rows(&mut l.attn.qkv_proj)?;
        to_rows(&mut l.attn.o_proj)?;
        match &mut l.ffn {
            FeedForward::Dense(mlp) => {
                to_rows(&mut mlp.gate_up_proj)?;
                to_rows(&mut mlp.down_proj)?;
            }
            FeedForward::Sparse(moe) => {
                moe.for_each_proj(&mut |p| to_rows(p))?;
                moe.group()?;
            }
        }
    }
    Ok(())
}

/// Whether every projection the streamed layer reads through the gemv is packed.
pub fn all_packed(net: &Decoder) -> bool {
    let packed = Linear::is_packed;
    !net.layers.is_empty()
        && net.layers.iter().all(|l| {
            let ffn = match &l.ffn {
                FeedForward::Dense(m) => packed(&m.gate_up_proj) && packed(&m.down_proj),
                FeedForward::Sparse(moe) => {
                    moe.packed()
                        && moe
                            .shared
                            .as_ref()
                            .is_none_or(|s| packed(&s.gate_up_proj) && packed(&s.down_proj))
                }
            };
            packed(&l.attn.qkv_proj) && packed(&l.attn.o_proj) && ffn
        })
}

/// Re-lays the streamed layer's projections (q|k|v, o, a dense block's gate|up and down, a
/// sparse block's grouped experts and shared expert) out in layout `to`: the gemv kernel's
/// packed order (each projection where its shape allows) or back in rows. MoE routers keep
/// their rows (the host router reads them).
pub fn relayout(net: &mut Decoder, to: WeightLayout) -> Result<()> {
    let norm = net.norm.clone();
    let each = |p: &mut Linear, halves: usize| -> Result<()> {
        let old = std::mem::replace(p, Linear::Rows(norm.clone()));
        *p = match to {
            WeightLayout::Packed => old.pack(halves)?,
            WeightLayout::Rows => old.unpacked()?.unwrap_or(old),
        };
        Ok(())
    };
    for l in &mut net.layers {
        each(&mut l.attn.qkv_proj, 1)?;
        each(&mut l.attn.o_proj, 1)?;
        match (&mut l.ffn, to) {
            (FeedForward::Dense(mlp), _) => {
                each(&mut mlp.gate_up_proj, 2)?;
                each(&mut mlp.down_proj, 1)?;
            }
            (FeedForward::Sparse(moe), to) => {
                match to {
                    WeightLayout::Packed => moe.pack()?,
                    WeightLayout::Rows => moe.unpack()?,
                }
                if let Some(s) = &mut moe.shared {
                    each(&mut s.gate_up_proj, 2)?;
                    each(&mut s.down_proj, 1)?;
                }
            }
        }
    }
    Ok(())
}
