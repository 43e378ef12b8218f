//! The device fast paths, apart from the architecture: the streamed layer (streamed.rs) and
//! what it needs of the weights, the norms folded into the projections (fold.rs) and the
//! projections packed in the gemv kernel's order (packed.rs); the grouped MoE ops it runs a
//! sparse layer with (moe_grouped.rs); and the chunked prefill over unpacked copies of packed
//! layers (chunked.rs). [`StreamedLayer`] is the one thing a [`Model`](super::Model) holds of
//! them: present where the weights were laid out for it, and asked, pass by pass, whether it
//! takes the pass ([`StreamedLayer::plan`]).

pub mod chunked;
pub mod fold;
pub mod moe_grouped;
pub mod packed;
pub mod streamed;

use anyhow::{bail, Result};
use candle_core::{DType, Device, Tensor};

use super::decoder::Decoder;
use super::gemv::WeightLayout;
use super::layers::moe::LayerRoutes;
pub use streamed::StreamedPass;

/// The streamed layer of a bf16 model whose norms are folded into its `[out, in]` projections.
pub struct StreamedLayer {
    device: Device,
    /// How the projections lie: rows, or packed for the gemv.
    layout: WeightLayout,
    /// The routing tables of the grouped MoE kernels, one per layer, and their counters
    /// (moe_grouped.rs): where the model has sparse layers.
    moe_tables: Option<Tensor>,
    /// Whether packing is allowed at all (`UNMASK_PACKED`, paths.rs).
    packed: bool,
}

impl StreamedLayer {
    /// Folds `net`'s norms into its projections (which must be `[out, in]`) and packs them for
    /// the gemv unless `packed` is off (`UNMASK_PACKED=0`). Packing comes after the fold, which
    /// scales rows.
    pub fn new(net: &mut Decoder, device: &Device, dtype: DType, packed: bool) -> Result<Self> {
        if dtype != DType::BF16 {
            bail!("the streamed layer is the bf16 gemv kernel's; this model computes in {dtype:?}");
        }
        fold::fold_norms(net)?;
        let moe_tables = match net.has_sparse() {
            true => Some(moe_grouped::new_tables(net.layers.len(), device)?),
            false => None,
        };
        let mut s = StreamedLayer {
            device: device.clone(),
            layout: WeightLayout::Rows,
            moe_tables,
            packed,
        };
        s.repack(net)?;
        Ok(s)
    }

    /// Packs the projections for the gemv, unless `UNMASK_PACKED=0`.
    pub fn repack(&mut self, net: &mut Decoder) -> Result<()> {
        if self.packed {
            packed::relayout(net, WeightLayout::Packed)?;
            self.layout = WeightLayout::Packed;
        }
        Ok(())
    }

    /// Packs the projections (`on`, unless `UNMASK_PACKED=0`) or lays them back in rows:
    /// whether they moved.
    pub fn set_packed(&mut self, net: &mut Decoder, on: bool) -> Result<bool> {
        let want = if on && self.packed { WeightLayout::Packed } else { WeightLayout::Rows };
        if want == self.layout {
            return Ok(false);
        }
        packed::relayout(net, want)?;
        self.layout = want;
        Ok(true)
    }

    /// The streamed pass of `t` rows over `keys` keys, its workspace allocated, or `None`
    /// where the pass runs the standard layer (streamed.rs says when).
    pub fn plan<'a>(
        &'a self,
        net: &'a Decoder,
        t: usize,
        keys: usize,
        fused: bool,
    ) -> Result<Option<StreamedPass<'a>>> {
        streamed::plan(self, net, (t, keys), fused)
    }

    /// The routes of the last streamed pass of `t` rows (streamed.rs).
    pub fn routes(&self, net: &Decoder, t: usize) -> Result<Vec<LayerRoutes>> {
        streamed::routes(self.moe_tables.as_ref(), net, t)
    }

    /// (distinct experts touched summed over passes, passes) of the grouped MoE kernels;
    /// `None` for a dense model.
    pub fn moe_stats(&self) -> Result<Option<(u64, u64)>> {
        let Some(t) = &self.moe_tables else { return Ok(None) };
        Ok(Some(moe_grouped::read_stats(t)?))
    }
}
