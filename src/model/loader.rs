//! Reads a checkpoint's tensors into the layout the device path wants: what a family's file
//! and every block (attention, SwiGLU, MoE) call to load themselves.

use anyhow::Result;
use candle_core::{DType, Device, Tensor};

use super::linear::{Bf16Panels, Linear, Products};
use super::paths::{bf16_weights_here, gemv_here};
use super::weights::WeightSource;
use super::Compute;

/// Reads a checkpoint's tensors into the layout this device's path wants: what a family's
/// file calls to load its blocks.
pub struct Loader<'a> {
    w: &'a dyn WeightSource,
    dtype: DType,
    /// How bf16 panels multiply ([`Products`]); with bf16 products every projection is one.
    products: Products,
    device: &'a Device,
    /// bf16 panels for projections stored in bf16 ([`Linear::Bf16`]).
    bf16_panels: bool,
    /// Projections kept `[out, in]` for the gemv kernel ([`Linear::Rows`]).
    pub(super) rows: bool,
}

impl<'a> Loader<'a> {
    /// A loader for `device` and `compute` (its dtype and device paths), which picks the
    /// projections' layout (paths.rs).
    /// On a GPU it also hands the kernels' launch choices over (`PathChoices::launch_on`).
    pub fn new(w: &'a dyn WeightSource, compute: impl Into<Compute>, device: &'a Device) -> Self {
        let Compute { dtype, products, paths } = compute.into();
        paths.launch_on(device);
        let (bf16_panels, rows) =
            (bf16_weights_here(device, dtype, &paths), gemv_here(device, dtype, &paths));
        Loader { w, dtype, products, device, bf16_panels, rows }
    }

    /// A tensor that is not a projection (a norm weight, the embedding), in the compute dtype.
    pub fn get(&self, name: &str, shape: &[usize]) -> Result<Tensor> {
        self.w.get(name, shape, self.dtype, self.device)
    }

    pub fn contains(&self, name: &str) -> bool {
        self.w.contains(name)
    }

    /// How errors name where `name` is (the checkpoint's file that holds it).
    pub fn origin(&self, name: &str) -> String {
        self.w.origin(name)
    }

    /// The device the tensors are loaded on.
    pub fn device(&self) -> &Device {
        self.device
    }

    /// A small tensor read to the host in f32 whatever the compute dtype (a router's bias, which
    /// ranks experts and must not round to bf16 on a bf16 device).
    pub fn host_f32(&self, name: &str, shape: &[usize]) -> Result<Vec<f32>> {
        Ok(self.w.get(name, shape, DType::F32, &Device::Cpu)?.flatten_all()?.to_vec1::<f32>()?)
    }

    /// Whether the projection or embedding `name` is kept in bf16: stored so, or rounded to it
    /// for bf16 products.
    pub(super) fn bf16(&self, name: &str) -> bool {
        self.bf16_panels
            && (self.products == Products::Bf16 || self.w.stored(name) == Some(DType::BF16))
    }

    /// bf16 panels packed straight from a mapped checkpoint's bytes, where every part is there
    /// in bf16 with its shape (else `None`: the caller goes through tensors).
    pub(super) fn mapped_panels(
        &self,
        parts: &[(String, usize)],
        inp: usize,
    ) -> Option<Bf16Panels> {
        let bytes = parts
            .iter()
            .map(|(n, out)| self.w.bf16_bytes(n, &[*out, inp]))
            .collect::<Option<Vec<_>>>()?;
        Some(Bf16Panels::from_le_parts(&bytes, inp, self.products))
    }

    /// The embedding `[vocab, hidden]`: as stored where the projections keep bf16 (the CPU's
    /// bf16 path widens the rows a pass looks up, not the whole table at load), else in the
    /// compute dtype.
    pub(super) fn embedding(&self, name: &str, shape: &[usize]) -> Result<Tensor> {
        let dtype = if self.bf16(name) { DType::BF16 } else { self.dtype };
        self.w.get(name, shape, dtype, self.device)
    }

    /// A projection from `[out, in]` checkpoint tensors stacked along `out`: bf16 panels (see
    /// linear.rs) where the CPU computes in f32 from bf16 weights; kept `[out, in]` for the
    /// GPU's gemv kernel; else stored transposed, `[in, out]` and contiguous, so that it is a
    /// plain matmul and the CPU's gemm does not re-pack the weight on every pass.
    pub(super) fn linear(&self, stacked: Tensor, bf16: bool) -> Result<Linear> {
        if bf16 {
            return Ok(Linear::Bf16(Bf16Panels::from_tensor(&stacked, self.products)?));
        }
        if self.rows {
            return Ok(Linear::Rows(stacked.contiguous()?));
        }
        Ok(Linear::Dense(stacked.t()?.contiguous()?))
    }

    /// The projection of the tensors `parts` (name, rows) stacked, each `[rows, inp]`.
    pub fn proj(&self, parts: &[(String, usize)], inp: usize) -> Result<Linear> {
        let keep = parts.iter().all(|(n, _)| self.bf16(n));
        if let Some(p) = keep.then(|| self.mapped_panels(parts, inp)).flatten() {
            return Ok(Linear::Bf16(p));
        }
        // Panels are made from the stored bf16 values directly, not through f32.
        let dt = if keep { DType::BF16 } else { self.dtype };
        let ts = parts
            .iter()
            .map(|(n, out)| self.w.get(n, &[*out, inp], dt, self.device))
            .collect::<Result<Vec<_>>>()?;
        self.linear(Tensor::cat(&ts, 0)?, keep)
    }
}
