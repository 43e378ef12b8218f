//! `y [T, N] = x [T, K] · Wᵀ` for the few rows of a block pass, `W` kept in the checkpoint's own
//! `[N, K]` (out, in) layout, all bf16 with f32 sums: kernels/gemv.cu on the GPU (launched from
//! `gemv_cuda.rs`), the same algorithm in Rust here on the CPU, which is what the tests check.
//!
//! A block pass multiplies 4 or 8 rows by every weight once, so it is bound by streaming the
//! weights. This kernel is opt-in (`UNMASK_GEMV=1`): on the H200, inside a CUDA graph, cuBLAS
//! is faster on every SDAR-1.7B projection (docs/perf.md, "The gemv kernel").
//! [`Gemv::fits`] says where the kernel applies; elsewhere callers use candle's matmul.

use candle_core::{CpuStorage, CustomOp2, DType, Layout, Result, Shape, Tensor};

/// Most rows one launch multiplies: the 8 columns of the m16n8k16 product's B operand.
pub const MAX_ROWS: usize = 8;

/// Output rows one warp group owns (one 16-row tile of the tensor-core product).
pub const ROWS_PER_GROUP: usize = 16;

/// Warps per block (256 threads).
pub const WARPS: usize = 8;

/// Blocks wanted in a launch before the K dimension is split further: about one per SM of an
/// H200 (132 SMs; a block's staging buffers fill most of an SM's shared memory), so that every
/// SM streams weights the whole time.
pub const MIN_BLOCKS: usize = 128;

/// K is staged through shared memory 256 values (512 bytes of a row) at a time.
pub const K_STEP: usize = 256;

/// Dynamic shared memory of a launch: 8 warps x 2 stages x 16 rows x 544 bytes
/// (kernels/gemv.cu's SMEM_BYTES).
pub const SMEM_BYTES: usize = WARPS * 2 * ROWS_PER_GROUP * 544;

#[derive(Clone, Copy, Debug, Default)]
pub struct Gemv;

/// How a launch splits the work: `ks` warps share the K dimension of each row group, so a
/// block covers `WARPS * ROWS_PER_GROUP / ks` output rows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Split {
    pub ks: usize,
    pub blocks: usize,
}

/// The smallest K split that gives at least [`MIN_BLOCKS`] blocks (the most, 8, otherwise):
/// splitting K costs a shared-memory reduction, too few blocks leave SMs idle.
pub fn split(n: usize) -> Split {
    let blocks = |ks: usize| n.div_ceil(WARPS * ROWS_PER_GROUP / ks);
    let ks = [1, 2, 4, 8].into_iter().find(|&ks| blocks(ks) >= MIN_BLOCKS).unwrap_or(8);
    Split { ks, blocks: blocks(ks) }
}

impl Gemv {
    /// Whether `x · wᵀ` can run as this op: bf16, `x` of at most [`MAX_ROWS`] rows (leading
    /// dims flattened), `K` a multiple of [`K_STEP`], both contiguous from an offset that keeps
    /// 16-byte alignment.
    pub fn fits(x: &Tensor, w: &Tensor) -> bool {
        let (Some(&k), Ok((_, wk))) = (x.dims().last(), w.dims2()) else { return false };
        let rows = x.elem_count() / k.max(1);
        let aligned = |t: &Tensor| t.is_contiguous() && t.layout().start_offset().is_multiple_of(8);
        x.dtype() == DType::BF16
            && w.dtype() == DType::BF16
            && k == wk
            && k % K_STEP == 0
            && (1..=MAX_ROWS).contains(&rows)
            && aligned(x)
            && aligned(w)
    }

    /// `x [.., K]`, `w [N, K]` -> `[.., N]`.
    pub fn forward(x: &Tensor, w: &Tensor) -> Result<Tensor> {
        x.apply_op2_no_bwd(w, &Gemv)
    }

    /// Shape checks shared by both backends: `(T, N, K)` and the output shape.
    fn dims(lx: &Layout, lw: &Layout) -> Result<(usize, usize, usize, Shape)> {
        let (n, k) = lw.shape().dims2()?;
        let dims = lx.dims();
        let Some((&xk, lead)) = dims.split_last() else { candle_core::bail!("gemv: x has no dimensions") };
        if xk != k {
            candle_core::bail!("gemv: x has {xk} features, the weight takes {k}");
        }
        let t: usize = lead.iter().product();
        if !(1..=MAX_ROWS).contains(&t) || k % K_STEP != 0 {
            candle_core::bail!("gemv: {t} rows of {k} (takes 1..={MAX_ROWS} rows, K a multiple of {K_STEP})");
        }
        let mut out = lead.to_vec();
        out.push(n);
        Ok((t, n, k, Shape::from(out)))
    }
}

/// The kernel's arithmetic: each output is an f32 sum of bf16 products, rounded to bf16 once.
/// The GPU sums in a different order (lanes, then warps), so results agree to f32 rounding
/// before the final bf16 rounding.
pub fn gemv_bf16(x: &[half::bf16], w: &[half::bf16], t: usize, n: usize, k: usize) -> Vec<half::bf16> {
    let mut y = Vec::with_capacity(t * n);
    for r in 0..t {
        let xr = &x[r * k..(r + 1) * k];
        for o in 0..n {
            let wr = &w[o * k..(o + 1) * k];
            let s = xr.iter().zip(wr).fold(0f32, |a, (xv, wv)| xv.to_f32().mul_add(wv.to_f32(), a));
            y.push(half::bf16::from_f32(s));
        }
    }
    y
}

impl CustomOp2 for Gemv {
    fn name(&self) -> &'static str {
        "unmask-gemv"
    }

    fn cpu_fwd(&self, sx: &CpuStorage, lx: &Layout, sw: &CpuStorage, lw: &Layout) -> Result<(CpuStorage, Shape)> {
        let (t, n, k, shape) = Self::dims(lx, lw)?;
        let (CpuStorage::BF16(x), CpuStorage::BF16(w)) = (sx, sw) else {
            candle_core::bail!("gemv: x and w must be bf16");
        };
        let (Some((xa, xb)), Some((wa, wb))) = (lx.contiguous_offsets(), lw.contiguous_offsets()) else {
            candle_core::bail!("gemv: x and w must be contiguous");
        };
        Ok((CpuStorage::BF16(gemv_bf16(&x[xa..xb], &w[wa..wb], t, n, k)), shape))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        sx: &candle_core::CudaStorage,
        lx: &Layout,
        sw: &candle_core::CudaStorage,
        lw: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        let (t, n, k, shape) = Self::dims(lx, lw)?;
        super::gemv_cuda::launch(t, n, k, (sx, lx), (sw, lw)).map(|s| (s, shape))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    #[test]
    fn the_split_fills_the_card_with_the_least_k_splitting() {
        // SDAR-1.7B: lm_head, gate|up, qkv, o/down.
        assert_eq!(split(151936), Split { ks: 1, blocks: 1187 });
        assert_eq!(split(12288), Split { ks: 2, blocks: 192 });
        assert_eq!(split(4096), Split { ks: 4, blocks: 128 });
        assert_eq!(split(2048), Split { ks: 8, blocks: 128 });
        // Too small to fill the card even split 8 ways: the most split, every row covered.
        assert_eq!(split(10), Split { ks: 8, blocks: 1 });
        assert_eq!(SMEM_BYTES, 139264);
    }

    #[test]
    fn the_cpu_body_equals_an_f32_matmul_rounded_to_bf16() {
        let dev = Device::Cpu;
        let w = Tensor::randn(0f32, 1.0, (37, 256), &dev).unwrap().to_dtype(DType::BF16).unwrap();
        for t in [1, 4, 8] {
            let x = Tensor::randn(0f32, 1.0, (t, 256), &dev).unwrap().to_dtype(DType::BF16).unwrap();
            assert!(Gemv::fits(&x, &w));
            let got = Gemv::forward(&x, &w).unwrap();
            assert_eq!(got.dims(), &[t, 37]);
            let f = |t: &Tensor| t.to_dtype(DType::F32).unwrap();
            let want = f(&x).matmul(&f(&w).t().unwrap()).unwrap();
            let got = f(&got);
            // One bf16 rounding of the same f32 sum: within half a bf16 ulp (2^-8 relative).
            let err = ((&got - &want).unwrap().abs().unwrap() / (want.abs().unwrap() + 1e-3).unwrap()).unwrap();
            let max = err.flatten_all().unwrap().max(0).unwrap().to_scalar::<f32>().unwrap();
            assert!(max <= 1.0 / 256.0 + 1e-4, "t={t}: relative error {max}");
        }
    }

    #[test]
    fn leading_dims_flatten_into_rows() {
        let dev = Device::Cpu;
        let w = Tensor::randn(0f32, 1.0, (16, 256), &dev).unwrap().to_dtype(DType::BF16).unwrap();
        let x = Tensor::randn(0f32, 1.0, (2, 3, 256), &dev).unwrap().to_dtype(DType::BF16).unwrap();
        let got = Gemv::forward(&x, &w).unwrap();
        let flat = Gemv::forward(&x.reshape((6, 256)).unwrap(), &w).unwrap();
        assert_eq!(got.dims(), &[2, 3, 16]);
        let v = |t: Tensor| t.flatten_all().unwrap().to_dtype(DType::F32).unwrap().to_vec1::<f32>().unwrap();
        assert_eq!(v(got), v(flat));
    }

    #[test]
    fn it_declines_what_the_kernel_cannot_take() {
        let dev = Device::Cpu;
        let bf = |s: (usize, usize)| Tensor::zeros(s, DType::BF16, &dev).unwrap();
        let w = bf((16, 256));
        assert!(Gemv::fits(&bf((8, 256)), &w));
        assert!(!Gemv::fits(&bf((9, 256)), &w), "more than MAX_ROWS rows");
        assert!(!Gemv::fits(&bf((2, 32)), &bf((16, 32))), "K not a multiple of 256");
        assert!(!Gemv::fits(&bf((2, 512)), &w), "K mismatch");
        assert!(!Gemv::fits(&Tensor::zeros((2, 256), DType::F32, &dev).unwrap(), &w), "not bf16");
        assert!(!Gemv::fits(&bf((256, 2)).t().unwrap(), &w), "not contiguous");
        let flat = Tensor::zeros(272, DType::BF16, &dev).unwrap();
        let at = |off: usize| flat.narrow(0, off, 256).unwrap().reshape((1, 256)).unwrap();
        assert!(Gemv::fits(&at(8), &w), "an offset of 8 values keeps 16-byte alignment");
        assert!(!Gemv::fits(&at(4), &w), "an offset of 4 values breaks it");
        assert!(Gemv::forward(&bf((9, 256)), &w).is_err(), "the op itself refuses too many rows");
    }
}
