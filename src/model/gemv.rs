//! `y [T, N] = x [T, K] · Wᵀ` for the few rows of a block pass, `W` kept in the checkpoint's own
//! `[N, K]` (out, in) layout, all bf16 with f32 sums: kernels/gemv.cu on the GPU (launched from
//! `gemv_cuda.rs`), the same algorithm in Rust here on the CPU, which is what the tests check.
//!
//! A block pass multiplies 4 or 8 rows by every weight once, so it is bound by streaming the
//! weights. Its paired form folds the MLP's silu(gate) * up into the gate|up product. It is
//! opt-in (`UNMASK_GEMV=1`): on the H200, inside a CUDA graph, cuBLAS still streams the
//! SDAR-1.7B projections faster (docs/perf.md, "The gemv kernel"). [`Gemv::fits`] says where
//! the kernel applies; elsewhere callers use candle's matmul.

use candle_core::{CpuStorage, CustomOp2, DType, Layout, Result, Shape, Tensor};

/// Most rows one launch multiplies: the 8 columns of the m16n8k16 product's B operand.
pub const MAX_ROWS: usize = 8;

/// Output rows of one tile (the 16 rows of the tensor-core product's A operand).
pub const TILE_ROWS: usize = 16;

/// K a warp step covers: 8 values a lane, 4 lanes a row.
pub const K_STEP: usize = 32;

/// Most output rows the kernel takes. Past that (lm_head's 151936) cuBLAS streams the weight
/// faster: on the H200, 166.8 against 146.9 us at T = 4 (check-device, run 6 in docs/perf.md).
pub const MAX_N: usize = 32768;

/// What the kernel computes from the two halves of its product.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Epilogue {
    /// `y = x · Wᵀ`.
    #[default]
    Plain,
    /// `W` is gate|up stacked (`[2 I, K]`): `y = silu(x · gateᵀ) * (x · upᵀ)`, `[T, I]`, each
    /// product rounded to bf16 first as the unfused chain does.
    SiluMul,
}

#[derive(Clone, Copy, Debug, Default)]
pub struct Gemv {
    pub epilogue: Epilogue,
}

/// How a launch cuts the work: `ks` warps split the K steps of each 16-row tile between them,
/// a block holds `tb` tiles (`32 ks tb` threads), each warp keeps `u` steps of loads in flight.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Split {
    pub ks: usize,
    pub tb: usize,
    pub u: usize,
    pub blocks: usize,
}

impl Split {
    pub fn threads(&self) -> usize {
        32 * self.ks * self.tb
    }

    /// Dynamic shared memory: x staged (`t` rows of `k` bf16, one 16-byte pad a row), reused
    /// afterwards for the K split's sums (4 floats a lane a warp, 8 paired).
    pub fn smem_bytes(&self, t: usize, k: usize, epilogue: Epilogue) -> usize {
        let staged = t * (k / 8 + 1) * 16;
        let sums = if self.ks > 1 { self.ks * self.tb * 32 * 4 * epilogue.sums() } else { 0 };
        staged.max(sums)
    }
}

impl Epilogue {
    /// f32 accumulators of one lane: one m16n8 tile of C, or two when paired.
    fn sums(self) -> usize {
        match self {
            Epilogue::Plain => 4,
            Epilogue::SiluMul => 8,
        }
    }

    /// Output rows of a product whose weight has `w_rows` rows.
    pub fn out_rows(self, w_rows: usize) -> usize {
        match self {
            Epilogue::Plain => w_rows,
            Epilogue::SiluMul => w_rows / 2,
        }
    }
}

/// The split for `n` output rows of `k` inputs, from scripts/gemv_bench.cu's sweep on the H200
/// (docs/gpu-runs/2026-12-03-gemv-sweep; each within 10 % of the best split for its shape): 8
/// warps on a tile's K (8 steps each, one batch of loads) for the 2048-wide projections; 16 for
/// K = 6144 (down); 4 warps and 2 tiles a block for gate|up, whose 12288 weight rows give
/// blocks enough. Never more warps on a tile than it has steps.
pub fn split(n: usize, k: usize, epilogue: Epilogue) -> Split {
    let steps = k / K_STEP;
    let w_rows = match epilogue {
        Epilogue::Plain => n,
        Epilogue::SiluMul => 2 * n,
    };
    let (ks, tb) = if steps >= 128 {
        (16, 1)
    } else if w_rows >= 8192 {
        (4, 2)
    } else {
        (8, 1)
    };
    let ks = ks.min(steps).max(1);
    // the paired form holds two streams of loads, so a batch of 4 steps for the same bytes
    let u = match epilogue {
        Epilogue::Plain => 8,
        Epilogue::SiluMul => 4,
    };
    Split { ks, tb, u, blocks: n.div_ceil(TILE_ROWS * tb) }
}

impl Gemv {
    pub const PLAIN: Gemv = Gemv { epilogue: Epilogue::Plain };
    pub const SILU_MUL: Gemv = Gemv { epilogue: Epilogue::SiluMul };

    /// Whether `x · wᵀ` should run as this op: bf16, `x` of at most [`MAX_ROWS`] rows (leading
    /// dims flattened), `K` a multiple of [`K_STEP`], at most [`MAX_N`] output rows, both
    /// contiguous from an offset that keeps 16-byte alignment.
    pub fn fits(x: &Tensor, w: &Tensor) -> bool {
        let (Some(&k), Ok((n, wk))) = (x.dims().last(), w.dims2()) else { return false };
        let rows = x.elem_count() / k.max(1);
        let aligned = |t: &Tensor| t.is_contiguous() && t.layout().start_offset().is_multiple_of(8);
        x.dtype() == DType::BF16
            && w.dtype() == DType::BF16
            && k == wk
            && k % K_STEP == 0
            && n <= MAX_N
            && (1..=MAX_ROWS).contains(&rows)
            && aligned(x)
            && aligned(w)
    }

    /// `x [.., K]`, `w [N, K]` -> `[.., N]` (`[.., N / 2]` for [`Epilogue::SiluMul`]).
    pub fn forward(self, x: &Tensor, w: &Tensor) -> Result<Tensor> {
        x.apply_op2_no_bwd(w, &self)
    }

    /// Shape checks shared by both backends: `(T, N, K)` of the product and the output shape.
    fn dims(self, lx: &Layout, lw: &Layout) -> Result<(usize, usize, usize, Shape)> {
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
        if self.epilogue == Epilogue::SiluMul && n % 2 != 0 {
            candle_core::bail!("gemv: a gate|up weight of {n} rows is not two halves");
        }
        let mut out = lead.to_vec();
        out.push(self.epilogue.out_rows(n));
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

/// Where `W[row][8 k8 .. 8 k8 + 8]` (one 16-byte chunk) goes in the kernel's packed order
/// (kernels/gemv.cu, `PACKED`), in 16-byte units: tile `row / 16`, K step `k8 / 4`, then the
/// half (`row % 16 >= 8`), then the lane `(row % 8) * 4 + k8 % 4`. A warp's load for one step
/// and half is then 32 consecutive chunks (512 bytes).
pub fn packed_chunk(row: usize, k8: usize, steps: usize) -> usize {
    let (tile, r) = (row / TILE_ROWS, row % TILE_ROWS);
    let (s, q) = (k8 / 4, k8 % 4);
    let lane = (r % 8) * 4 + q;
    ((tile * steps + s) * 2 + r / 8) * 32 + lane
}

/// `W [n, k]` (bf16 bits, row-major) in the packed order, rows past `n` up to a whole tile as
/// zeros: what the GPU's `unmask_gemv_pack` writes, for the kernel's `PACKED` form (measured
/// in scripts/gemv_bench.cu; not used by the model yet).
pub fn pack_rows(w: &[u16], n: usize, k: usize) -> Vec<u16> {
    assert_eq!(w.len(), n * k, "weight of {n}x{k} holds {} values", w.len());
    assert!(k.is_multiple_of(K_STEP), "K = {k} is not a multiple of {K_STEP}");
    let (k8s, steps) = (k / 8, k / K_STEP);
    let mut out = vec![0u16; n.div_ceil(TILE_ROWS) * TILE_ROWS * k];
    for row in 0..n {
        for k8 in 0..k8s {
            let dst = packed_chunk(row, k8, steps) * 8;
            out[dst..dst + 8].copy_from_slice(&w[row * k + 8 * k8..row * k + 8 * k8 + 8]);
        }
    }
    out
}

/// `[t, 2 i]` gate|up (already rounded to bf16) -> `[t, i]` silu(gate) * up, in f32, rounded once.
pub fn silu_mul_rows(gu: &[half::bf16], t: usize, i: usize) -> Vec<half::bf16> {
    let mut y = Vec::with_capacity(t * i);
    for r in 0..t {
        let (gate, up) = gu[r * 2 * i..(r + 1) * 2 * i].split_at(i);
        y.extend(gate.iter().zip(up).map(|(g, u)| {
            let g = g.to_f32();
            half::bf16::from_f32(g / (1.0 + (-g).exp()) * u.to_f32())
        }));
    }
    y
}

impl CustomOp2 for Gemv {
    fn name(&self) -> &'static str {
        "unmask-gemv"
    }

    fn cpu_fwd(&self, sx: &CpuStorage, lx: &Layout, sw: &CpuStorage, lw: &Layout) -> Result<(CpuStorage, Shape)> {
        let (t, n, k, shape) = self.dims(lx, lw)?;
        let (CpuStorage::BF16(x), CpuStorage::BF16(w)) = (sx, sw) else {
            candle_core::bail!("gemv: x and w must be bf16");
        };
        let (Some((xa, xb)), Some((wa, wb))) = (lx.contiguous_offsets(), lw.contiguous_offsets()) else {
            candle_core::bail!("gemv: x and w must be contiguous");
        };
        let y = gemv_bf16(&x[xa..xb], &w[wa..wb], t, n, k);
        let y = match self.epilogue {
            Epilogue::Plain => y,
            Epilogue::SiluMul => silu_mul_rows(&y, t, n / 2),
        };
        Ok((CpuStorage::BF16(y), shape))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        sx: &candle_core::CudaStorage,
        lx: &Layout,
        sw: &candle_core::CudaStorage,
        lw: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        let (t, n, k, shape) = self.dims(lx, lw)?;
        super::gemv_cuda::launch(self.epilogue, t, n, k, (sx, lx), (sw, lw)).map(|s| (s, shape))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    #[test]
    fn the_split_follows_the_h200_sweep_for_each_sdar_projection() {
        // SDAR-1.7B: qkv, o, gate|up (plain and paired), down
        assert_eq!(split(4096, 2048, Epilogue::Plain), Split { ks: 8, tb: 1, u: 8, blocks: 256 });
        assert_eq!(split(2048, 2048, Epilogue::Plain), Split { ks: 8, tb: 1, u: 8, blocks: 128 });
        assert_eq!(split(12288, 2048, Epilogue::Plain), Split { ks: 4, tb: 2, u: 8, blocks: 384 });
        assert_eq!(split(6144, 2048, Epilogue::SiluMul), Split { ks: 4, tb: 2, u: 4, blocks: 192 });
        assert_eq!(split(2048, 6144, Epilogue::Plain), Split { ks: 16, tb: 1, u: 8, blocks: 128 });
        // small K: no more warps than steps; a ragged last tile still gets a block
        assert_eq!(split(10, 64, Epilogue::Plain), Split { ks: 2, tb: 1, u: 8, blocks: 1 });
        let s = split(2048, 6144, Epilogue::Plain);
        assert_eq!(s.threads(), 512);
        // 8 rows of 6144 staged (98 KB) outweigh 16 warps' sums (8 KB)
        assert_eq!(s.smem_bytes(8, 6144, Epilogue::Plain), 8 * 769 * 16);
        // one row of 2048 (4 KB) is less than 8 warps' paired sums (8 KB)
        assert_eq!(split(6144, 2048, Epilogue::SiluMul).smem_bytes(1, 2048, Epilogue::SiluMul), 8 * 32 * 4 * 8);
    }

    #[test]
    fn the_cpu_body_equals_an_f32_matmul_rounded_to_bf16() {
        let dev = Device::Cpu;
        let w = Tensor::randn(0f32, 1.0, (37, 256), &dev).unwrap().to_dtype(DType::BF16).unwrap();
        for t in [1, 4, 8] {
            let x = Tensor::randn(0f32, 1.0, (t, 256), &dev).unwrap().to_dtype(DType::BF16).unwrap();
            assert!(Gemv::fits(&x, &w));
            let got = Gemv::PLAIN.forward(&x, &w).unwrap();
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
    fn the_paired_form_is_silu_of_the_gate_product_times_the_up_product() {
        let dev = Device::Cpu;
        let (i, k) = (24, 64);
        let w = Tensor::randn(0f32, 0.3, (2 * i, k), &dev).unwrap().to_dtype(DType::BF16).unwrap();
        for t in [1, 4, 8] {
            let x = Tensor::randn(0f32, 1.0, (t, k), &dev).unwrap().to_dtype(DType::BF16).unwrap();
            let got = Gemv::SILU_MUL.forward(&x, &w).unwrap();
            assert_eq!(got.dims(), &[t, i]);
            // the unfused chain in f32 from the bf16 products
            let gu = Gemv::PLAIN.forward(&x, &w).unwrap().to_dtype(DType::F32).unwrap();
            let gate = gu.narrow(1, 0, i).unwrap();
            let want = (candle_nn::ops::silu(&gate).unwrap() * gu.narrow(1, i, i).unwrap()).unwrap();
            let f = |t: &Tensor| t.to_dtype(DType::F32).unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap();
            for (g, w) in f(&got).iter().zip(f(&want)) {
                // one rounding of the same f32 value (up to exp's last bit)
                assert!((g - w).abs() <= w.abs() / 256.0 + 1e-6, "t={t}: {g} vs {w}");
            }
        }
        let odd = Tensor::zeros((7, k), DType::BF16, &dev).unwrap();
        let x = Tensor::zeros((1, k), DType::BF16, &dev).unwrap();
        assert!(Gemv::SILU_MUL.forward(&x, &odd).is_err(), "a gate|up weight has an even row count");
    }

    #[test]
    fn the_packed_order_is_a_bijection_with_512_contiguous_bytes_a_warp_load() {
        let (n, k) = (40usize, 96usize); // 3 tiles (the last ragged), 3 K steps
        let (k8s, steps) = (k / 8, k / K_STEP);
        let tiles = n.div_ceil(TILE_ROWS);
        let mut seen = vec![false; tiles * TILE_ROWS * k8s];
        for row in 0..tiles * TILE_ROWS {
            for k8 in 0..k8s {
                let c = packed_chunk(row, k8, steps);
                assert!(!seen[c], "chunk {c} taken twice");
                seen[c] = true;
            }
        }
        assert!(seen.iter().all(|&b| b), "every chunk of the packed buffer is some row's");
        // what one warp loads for tile 1, step 2, the lower half: lanes (g, q) -> rows 16 + g,
        // k8 = 8 + q, 32 consecutive chunks in lane order
        let base = packed_chunk(16, 8, steps);
        for lane in 0..32 {
            assert_eq!(packed_chunk(16 + lane / 4, 8 + lane % 4, steps), base + lane);
        }
        // the upper half (rows g + 8) follows right after
        assert_eq!(packed_chunk(24, 8, steps), base + 32);
        // and the next step after that
        assert_eq!(packed_chunk(16, 12, steps), base + 64);
    }

    #[test]
    fn packing_moves_every_value_once_and_pads_the_last_tile_with_zeros() {
        let (n, k) = (20, 64);
        let w: Vec<u16> = (0..n * k).map(|i| i as u16 + 1).collect();
        let p = pack_rows(&w, n, k);
        assert_eq!(p.len(), 32 * k, "two whole tiles");
        for row in 0..n {
            for kk in 0..k {
                let at = packed_chunk(row, kk / 8, k / K_STEP) * 8 + kk % 8;
                assert_eq!(p[at], w[row * k + kk], "row {row} k {kk}");
            }
        }
        assert_eq!(p.iter().filter(|&&v| v == 0).count(), (32 - n) * k, "padding rows are zeros");
    }

    #[test]
    fn leading_dims_flatten_into_rows() {
        let dev = Device::Cpu;
        let w = Tensor::randn(0f32, 1.0, (16, 256), &dev).unwrap().to_dtype(DType::BF16).unwrap();
        let x = Tensor::randn(0f32, 1.0, (2, 3, 256), &dev).unwrap().to_dtype(DType::BF16).unwrap();
        let got = Gemv::PLAIN.forward(&x, &w).unwrap();
        let flat = Gemv::PLAIN.forward(&x.reshape((6, 256)).unwrap(), &w).unwrap();
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
        assert!(Gemv::fits(&bf((2, 32)), &bf((16, 32))), "K of one step");
        assert!(!Gemv::fits(&bf((2, 48)), &bf((16, 48))), "K not a multiple of 32");
        assert!(!Gemv::fits(&bf((2, 512)), &w), "K mismatch");
        assert!(!Gemv::fits(&bf((2, 32)), &bf((MAX_N + 1, 32))), "lm_head-sized: cuBLAS");
        assert!(!Gemv::fits(&Tensor::zeros((2, 256), DType::F32, &dev).unwrap(), &w), "not bf16");
        assert!(!Gemv::fits(&bf((256, 2)).t().unwrap(), &w), "not contiguous");
        let flat = Tensor::zeros(272, DType::BF16, &dev).unwrap();
        let at = |off: usize| flat.narrow(0, off, 256).unwrap().reshape((1, 256)).unwrap();
        assert!(Gemv::fits(&at(8), &w), "an offset of 8 values keeps 16-byte alignment");
        assert!(!Gemv::fits(&at(4), &w), "an offset of 4 values breaks it");
        assert!(Gemv::PLAIN.forward(&bf((9, 256)), &w).is_err(), "the op itself refuses too many rows");
    }
}
