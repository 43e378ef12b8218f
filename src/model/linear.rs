//! A projection `y = x W`, in one of three forms:
//!
//! - [`Linear::Dense`]: a contiguous `[in, out]` tensor in the compute dtype, multiplied by
//!   candle's matmul (the GPU in f32/f16 or with `UNMASK_GEMV=0`, and the lm_head; the CPU
//!   when the checkpoint is not bf16).
//! - [`Linear::Rows`]: the checkpoint's own `[out, in]` tensor in bf16, the GPU's default in
//!   bf16: a block pass's few rows go through the kernel of gemv.rs, a prefill's many rows
//!   through cuBLAS with the weight read transposed (no second copy).
//! - [`Linear::Bf16`]: on the CPU with f32 compute and a bf16 checkpoint, the stored bf16 values
//!   kept as they are and widened to f32 inside a hand-written kernel. A block pass multiplies
//!   only a few rows, so it is bound by reading the weights; bf16 halves those bytes and the
//!   values are exactly the f32 ones (bf16 -> f32 is lossless).
//!
//! The bf16 kernel walks `W` in panels of [`PANEL`] output columns, laid out panel by panel
//! (`[out / PANEL][in][PANEL]`) so that each panel is one sequential stream, and keeps the
//! `PANEL` sums of up to [`ROWS`] input rows in registers while it streams.

use candle_core::{CpuStorage, CustomOp1, DType, Layout, Result, Shape, Tensor};

use super::gemv::Gemv;

/// Output columns per panel: two 16-lane f32 registers per row.
pub const PANEL: usize = 32;
/// Input rows per sweep over the weights (accumulators: `ROWS * PANEL / 16` registers).
pub const ROWS: usize = 8;

pub enum Linear {
    Dense(Tensor),
    Rows(Tensor),
    Bf16(Bf16Panels),
}

impl Linear {
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        match self {
            Linear::Dense(w) => x.matmul(w),
            Linear::Rows(w) if Gemv::fits(x, w) => Gemv::PLAIN.forward(x, w),
            Linear::Rows(w) => x.matmul(&w.t()?),
            Linear::Bf16(p) => x.apply_op1_no_bwd(p),
        }
    }

    /// `silu(x Wg) * (x Wu)` for a stacked gate|up weight in one kernel, where the gemv kernel
    /// takes `x` ([`Linear::Rows`] and a block pass's few rows); `None` elsewhere (the caller
    /// runs the product and the activation apart).
    pub fn forward_silu_mul(&self, x: &Tensor) -> Result<Option<Tensor>> {
        match self {
            Linear::Rows(w) if Gemv::fits(x, w) => Gemv::SILU_MUL.forward(x, w).map(Some),
            _ => Ok(None),
        }
    }

    /// The `[out, in]` weight of a [`Linear::Rows`] projection.
    pub fn rows(&self) -> Option<&Tensor> {
        match self {
            Linear::Rows(w) => Some(w),
            _ => None,
        }
    }

    /// Bytes the weights occupy.
    pub fn bytes(&self) -> usize {
        match self {
            Linear::Dense(w) | Linear::Rows(w) => w.elem_count() * w.dtype().size_in_bytes(),
            Linear::Bf16(p) => p.data.len() * 2,
        }
    }
}

/// bf16 bits of `W [in, out]`, repacked into zero-padded column panels.
pub struct Bf16Panels {
    k: usize,
    n: usize,
    data: Vec<u16>,
}

impl std::fmt::Debug for Bf16Panels {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Bf16Panels({}x{})", self.k, self.n)
    }
}

impl Bf16Panels {
    /// From a row-major `[out, in]` weight (the checkpoint's own layout), as bf16 bits.
    pub fn from_out_in(w: &[u16], out: usize, inp: usize) -> Self {
        assert_eq!(w.len(), out * inp, "weight of {out}x{inp} holds {} values", w.len());
        let panels = out.div_ceil(PANEL);
        let mut data = vec![0u16; panels * inp * PANEL];
        for o in 0..out {
            let (p, j) = (o / PANEL, o % PANEL);
            let row = &w[o * inp..(o + 1) * inp];
            for (i, &v) in row.iter().enumerate() {
                data[(p * inp + i) * PANEL + j] = v;
            }
        }
        Bf16Panels { k: inp, n: out, data }
    }

    /// From a `[out, in]` tensor of any dtype that holds bf16 values (converted exactly).
    pub fn from_tensor(w: &Tensor) -> Result<Self> {
        let (out, inp) = w.dims2()?;
        let bits: Vec<u16> = w.to_dtype(DType::BF16)?.flatten_all()?.to_vec1::<half::bf16>()?.iter().map(|b| b.to_bits()).collect();
        Ok(Self::from_out_in(&bits, out, inp))
    }

    /// `y [t, n] = x [t, k] W`, x row-major.
    pub fn matmul(&self, x: &[f32], t: usize) -> Vec<f32> {
        let mut y = vec![0f32; t * self.n];
        for r0 in (0..t).step_by(ROWS) {
            let rows = ROWS.min(t - r0);
            let xs = &x[r0 * self.k..(r0 + rows) * self.k];
            let ys = &mut y[r0 * self.n..(r0 + rows) * self.n];
            kernel::run(self, xs, rows, ys);
        }
        y
    }
}

impl CustomOp1 for Bf16Panels {
    fn name(&self) -> &'static str {
        "linear-bf16"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        let CpuStorage::F32(v) = s else { candle_core::bail!("linear-bf16: input must be f32") };
        let Some((a, b)) = l.contiguous_offsets() else { candle_core::bail!("linear-bf16: input must be contiguous") };
        let dims = l.dims();
        let (&k, lead) = dims.split_last().expect("a tensor has a shape");
        if k != self.k {
            candle_core::bail!("linear-bf16: input of {k} features, weight takes {}", self.k);
        }
        let t: usize = lead.iter().product();
        let mut shape = lead.to_vec();
        shape.push(self.n);
        Ok((CpuStorage::F32(self.matmul(&v[a..b], t)), Shape::from(shape)))
    }
}

/// The kernel, compiled for the best instruction set the CPU has (picked at run time): the same
/// Rust, vectorised by the compiler for AVX-512, AVX2+FMA, or the baseline.
mod kernel {
    use super::{Bf16Panels, PANEL};

    pub fn run(w: &Bf16Panels, x: &[f32], rows: usize, y: &mut [f32]) {
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx512f") {
                // SAFETY: the feature was just detected.
                return unsafe { avx512(w, x, rows, y) };
            }
            if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
                // SAFETY: as above.
                return unsafe { avx2(w, x, rows, y) };
            }
        }
        generic(w, x, rows, y)
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f,fma")]
    unsafe fn avx512(w: &Bf16Panels, x: &[f32], rows: usize, y: &mut [f32]) {
        generic(w, x, rows, y)
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn avx2(w: &Bf16Panels, x: &[f32], rows: usize, y: &mut [f32]) {
        generic(w, x, rows, y)
    }

    #[inline(always)]
    fn generic(w: &Bf16Panels, x: &[f32], rows: usize, y: &mut [f32]) {
        // One monomorphised body per row count, so the accumulators are a fixed-size array the
        // compiler keeps in registers.
        match rows {
            1 => panels::<1>(w, x, y),
            2 => panels::<2>(w, x, y),
            3 => panels::<3>(w, x, y),
            4 => panels::<4>(w, x, y),
            5 => panels::<5>(w, x, y),
            6 => panels::<6>(w, x, y),
            7 => panels::<7>(w, x, y),
            8 => panels::<8>(w, x, y),
            _ => unreachable!("at most ROWS rows per sweep"),
        }
    }

    #[inline(always)]
    fn panels<const R: usize>(w: &Bf16Panels, x: &[f32], y: &mut [f32]) {
        let (k, n) = (w.k, w.n);
        for (p, panel) in w.data.chunks_exact(k * PANEL).enumerate() {
            let mut acc = [[0f32; PANEL]; R];
            for (i, wrow) in panel.chunks_exact(PANEL).enumerate() {
                let mut wf = [0f32; PANEL];
                for j in 0..PANEL {
                    wf[j] = f32::from_bits((wrow[j] as u32) << 16);
                }
                for r in 0..R {
                    let xv = x[r * k + i];
                    for j in 0..PANEL {
                        acc[r][j] = xv.mul_add(wf[j], acc[r][j]);
                    }
                }
            }
            let c0 = p * PANEL;
            let cols = PANEL.min(n - c0);
            for r in 0..R {
                y[r * n + c0..r * n + c0 + cols].copy_from_slice(&acc[r][..cols]);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// bf16 bits of small integers / 8: exact in bf16, and their products sum exactly in f32.
    fn bits(v: f32) -> u16 {
        half::bf16::from_f32(v).to_bits()
    }

    #[test]
    fn matches_a_naive_product_for_every_row_count_and_a_ragged_panel() {
        let (out, inp) = (PANEL * 2 + 5, 19);
        let w: Vec<f32> = (0..out * inp).map(|i| ((i * 7 % 23) as f32 - 11.0) / 8.0).collect();
        let p = Bf16Panels::from_out_in(&w.iter().map(|&v| bits(v)).collect::<Vec<_>>(), out, inp);
        for t in [1, 3, 8, 9, 17] {
            let x: Vec<f32> = (0..t * inp).map(|i| ((i * 5 % 13) as f32 - 6.0) / 4.0).collect();
            let y = p.matmul(&x, t);
            for r in 0..t {
                for o in 0..out {
                    let want: f32 = (0..inp).map(|i| x[r * inp + i] * w[o * inp + i]).sum();
                    assert_eq!(y[r * out + o], want, "t={t} row {r} col {o}");
                }
            }
        }
    }

    #[test]
    fn as_a_candle_op_it_equals_the_f32_matmul_of_the_widened_weights() {
        let dev = candle_core::Device::Cpu;
        let w = Tensor::randn(0f32, 1.0, (40, 24), &dev).unwrap().to_dtype(DType::BF16).unwrap();
        let x = Tensor::randn(0f32, 1.0, (2, 3, 24), &dev).unwrap();
        let lin = Linear::Bf16(Bf16Panels::from_tensor(&w).unwrap());
        let got = lin.forward(&x).unwrap();
        assert_eq!(got.dims(), &[2, 3, 40]);
        let want = x.broadcast_matmul(&w.to_dtype(DType::F32).unwrap().t().unwrap()).unwrap();
        let diff = (got - want).unwrap().abs().unwrap().flatten_all().unwrap().max(0).unwrap().to_scalar::<f32>().unwrap();
        assert!(diff < 1e-4, "max diff {diff}");
        assert_eq!(lin.bytes(), 2 * 24 * 64, "two zero-padded panels of 32 columns");
    }

    #[test]
    fn rows_form_equals_the_dense_form_through_the_kernel_and_through_matmul() {
        let dev = candle_core::Device::Cpu;
        let w = Tensor::randn(0f32, 1.0, (48, 256), &dev).unwrap().to_dtype(DType::BF16).unwrap();
        let rows = Linear::Rows(w.clone());
        let dense = Linear::Dense(w.t().unwrap().contiguous().unwrap());
        for t in [4, 8, 9, 64] {
            let x = Tensor::randn(0f32, 1.0, (t, 256), &dev).unwrap().to_dtype(DType::BF16).unwrap();
            assert_eq!(Gemv::fits(&x, &w), t <= 8);
            let f = |t: Tensor| t.to_dtype(DType::F32).unwrap();
            let (a, b) = (f(rows.forward(&x).unwrap()), f(dense.forward(&x).unwrap()));
            assert_eq!(a.dims(), &[t, 48]);
            let rel = ((&a - &b).unwrap().abs().unwrap() / (b.abs().unwrap() + 1e-2).unwrap()).unwrap();
            let max = rel.flatten_all().unwrap().max(0).unwrap().to_scalar::<f32>().unwrap();
            // Both round one f32 sum to bf16; sums in another order may round to the next value.
            assert!(max <= 2.0 / 256.0, "t={t}: relative difference {max}");
        }
        assert_eq!(rows.bytes(), 48 * 256 * 2);
    }

    #[test]
    fn only_the_rows_form_folds_silu_into_the_product() {
        let dev = candle_core::Device::Cpu;
        let w = Tensor::randn(0f32, 0.3, (64, 32), &dev).unwrap().to_dtype(DType::BF16).unwrap();
        let x = Tensor::randn(0f32, 1.0, (4, 32), &dev).unwrap().to_dtype(DType::BF16).unwrap();
        let rows = Linear::Rows(w.clone());
        let got = rows.forward_silu_mul(&x).unwrap().expect("a block pass's rows take the kernel");
        assert_eq!(got.dims(), &[4, 32]);
        let gu = rows.forward(&x).unwrap().to_dtype(DType::F32).unwrap();
        let want = (candle_nn::ops::silu(&gu.narrow(1, 0, 32).unwrap()).unwrap() * gu.narrow(1, 32, 32).unwrap()).unwrap();
        let f = |t: &Tensor| t.to_dtype(DType::F32).unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap();
        for (g, w) in f(&got).iter().zip(f(&want)) {
            // silu(gate) * up of the same products, rounded once to bf16
            assert!((g - w).abs() <= w.abs() / 128.0 + 1e-3, "{g} vs {w}");
        }
        // a prefill's many rows, and the dense form, leave the activation to the caller
        let many = Tensor::zeros((9, 32), DType::BF16, &dev).unwrap();
        assert!(rows.forward_silu_mul(&many).unwrap().is_none());
        let dense = Linear::Dense(w.t().unwrap().contiguous().unwrap());
        assert!(dense.forward_silu_mul(&x).unwrap().is_none());
    }
}
