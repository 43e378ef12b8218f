//! `y [T, N] = x [T, K] · Wᵀ` for the few rows of a block pass, `W` kept in the checkpoint's own
//! `[N, K]` (out, in) layout, all bf16 with f32 sums: kernels/gemv.cu on the GPU (launched from
//! `cuda/gemv.rs`), the same algorithm in Rust here on the CPU, which is what the tests check.
//!
//! A block pass multiplies 4 or 8 rows by every weight once, so it is bound by streaming the
//! weights. Its paired form folds the MLP's silu(gate) * up into the gate|up product; its norm
//! and residual forms ([`GemvInto`]) fold the layer's RMSNorms and residual adds in, which is
//! what the GPU's streamed layer runs (fast/streamed.rs; the default in bf16,
//! `UNMASK_GEMV=0` for cuBLAS, paths.rs). [`Gemv::fits`] says where the kernel applies;
//! elsewhere callers use candle's matmul.

use candle_core::{CpuStorage, CustomOp1, CustomOp2, DType, Layout, Result, Shape, Tensor};

/// Most rows one launch multiplies: the 8 columns of the m16n8k16 product's B operand.
pub const MAX_ROWS: usize = 8;

/// Output rows of one tile (the 16 rows of the tensor-core product's A operand).
pub const TILE_ROWS: usize = 16;

/// K a warp step covers: 8 values a lane, 4 lanes a row.
pub const K_STEP: usize = 32;

/// Most output rows the kernel takes. Past that (lm_head's 151936) cuBLAS streams the weight
/// faster (check-device times both).
pub const MAX_N: usize = 32768;

/// How a weight's values lie in memory; the tensor's shape says which, so that a packed weight
/// can never be taken for rows by code that only knows rows (candle's matmul refuses its shape).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WeightLayout {
    /// The checkpoint's `[N, K]` (out, in).
    Rows,
    /// `[N / 16, K / 32, 16, 32]`: each 16-row tile's K steps in turn, each step the 16 rows'
    /// 32 values, which is the order of the tensor-core fragments the kernel's warps load
    /// (kernels/gemv.cu, `PACKED`): a warp reads 512 contiguous bytes a step where rows have it
    /// read 8 runs of 64 bytes K apart, and the streamed layer's chain runs faster, the more so
    /// the larger the model.
    Packed,
}

/// `(N, K, layout)` of a weight of this shape: `[N, K]` rows or `[N / 16, K / 32, 16, 32]` packed.
pub fn weight_dims(dims: &[usize]) -> Option<(usize, usize, WeightLayout)> {
    match *dims {
        [n, k] => Some((n, k, WeightLayout::Rows)),
        [tiles, steps, TILE_ROWS, K_STEP] => {
            Some((tiles * TILE_ROWS, steps * K_STEP, WeightLayout::Packed))
        }
        _ => None,
    }
}

/// `(experts, N, K, layout)` of one layer's stacked expert weights: `[E, N, K]` rows, or each
/// expert packed, `[E, N / 16, K / 32, 16, 32]` (the grouped kernels find expert `e` at the
/// same offset, `e N K`, in both).
pub fn experts_dims(dims: &[usize]) -> Option<(usize, usize, usize, WeightLayout)> {
    let (&e, one) = dims.split_first()?;
    let (n, k, layout) = weight_dims(one)?;
    Some((e, n, k, layout))
}

/// Stacked `[E, N, K]` expert rows -> each expert packed ([`experts_dims`]): the experts' rows
/// one after another are whole tiles of one `[E N, K]` weight.
pub fn pack_experts(rows: &Tensor) -> Result<Tensor> {
    let (e, n, k) = rows.dims3()?;
    pack(&rows.reshape((e * n, k))?)?.reshape((e, n / TILE_ROWS, k / K_STEP, TILE_ROWS, K_STEP))
}

/// Each expert packed -> stacked `[E, N, K]` rows (the inverse of [`pack_experts`]).
pub fn unpack_experts(packed: &Tensor) -> Result<Tensor> {
    let Some((e, n, k, WeightLayout::Packed)) = experts_dims(packed.dims()) else {
        candle_core::bail!("gemv: {:?} are not packed experts", packed.shape());
    };
    unpack(&packed.reshape((e * n / TILE_ROWS, k / K_STEP, TILE_ROWS, K_STEP))?)?.reshape((e, n, k))
}

/// A weight's `n x k` values as `[N, K]` rows: borrowed, or unpacked into a new vector (the CPU
/// bodies' view of a packed weight).
pub fn rows_of(
    w: &[half::bf16],
    n: usize,
    k: usize,
    layout: WeightLayout,
) -> std::borrow::Cow<'_, [half::bf16]> {
    match layout {
        WeightLayout::Rows => std::borrow::Cow::Borrowed(w),
        WeightLayout::Packed => std::borrow::Cow::Owned(repack_values(w, n, k, WeightLayout::Rows)),
    }
}

/// Whether a paired (gate|up) weight of `n` rows splits into its gate and up halves: two equal
/// halves, and packed, each whole tiles (so that no tile holds rows of both).
pub fn halves_fit(n: usize, layout: WeightLayout) -> bool {
    n.is_multiple_of(2) && (layout == WeightLayout::Rows || n.is_multiple_of(2 * TILE_ROWS))
}

/// Whether `[n, k]` rows can be packed: whole tiles and whole steps. A gate|up weight also
/// needs each half whole tiles (`halves` 2), so that no tile holds rows of both.
pub fn packable(n: usize, k: usize, halves: usize) -> bool {
    n.is_multiple_of(TILE_ROWS * halves) && k.is_multiple_of(K_STEP)
}

/// `[N, K]` bf16 rows -> the packed layout ([`WeightLayout::Packed`]), on the tensor's device.
pub fn pack(rows: &Tensor) -> Result<Tensor> {
    rows.apply_op1_no_bwd(&Repack { to: WeightLayout::Packed })
}

/// A packed bf16 weight back to `[N, K]` rows (a new tensor): for products of more rows than
/// the kernel takes, which go through cuBLAS. On the GPU one kernel (kernels/gemv.cu,
/// `unmask_repack`) moves 16-byte fragments, where candle's strided copy of the same transpose
/// moves 2-byte values, several times slower.
pub fn unpack(packed: &Tensor) -> Result<Tensor> {
    packed.apply_op1_no_bwd(&Repack { to: WeightLayout::Rows })
}

/// A weight's values moved into `to` from the other layout, each 32-value run of a row (one
/// step of a tile's row) whole: packed run `i` is row `r` of step `s` of tile `t`,
/// `i = (t steps + s) 16 + r`.
fn repack_values(src: &[half::bf16], n: usize, k: usize, to: WeightLayout) -> Vec<half::bf16> {
    let steps = k / K_STEP;
    let mut dst = vec![half::bf16::ZERO; n * k];
    for i in 0..n * steps {
        let (r, s, t) = (i % TILE_ROWS, i / TILE_ROWS % steps, i / TILE_ROWS / steps);
        let (packed, rows) = (i * K_STEP, (t * TILE_ROWS + r) * k + s * K_STEP);
        let (from, into) = match to {
            WeightLayout::Packed => (rows, packed),
            WeightLayout::Rows => (packed, rows),
        };
        dst[into..into + K_STEP].copy_from_slice(&src[from..from + K_STEP]);
    }
    dst
}

/// The op behind [`pack`] and [`unpack`]: a contiguous bf16 weight into layout `to`.
struct Repack {
    to: WeightLayout,
}

impl Repack {
    /// `(N, K)` and the output shape, after checking the input is in the other layout.
    fn dims(&self, l: &Layout) -> Result<(usize, usize, Shape)> {
        let Some((n, k, from)) = weight_dims(l.dims()) else {
            candle_core::bail!("repack: {:?} is not a weight", l.shape())
        };
        if from == self.to || !packable(n, k, 1) || !l.is_contiguous() {
            candle_core::bail!(
                "repack: {:?} ({from:?}, contiguous {}) cannot become {:?}",
                l.shape(),
                l.is_contiguous(),
                self.to
            );
        }
        let shape = match self.to {
            WeightLayout::Packed => Shape::from((n / TILE_ROWS, k / K_STEP, TILE_ROWS, K_STEP)),
            WeightLayout::Rows => Shape::from((n, k)),
        };
        Ok((n, k, shape))
    }
}

impl CustomOp1 for Repack {
    fn name(&self) -> &'static str {
        "unmask-repack"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        let (n, k, shape) = self.dims(l)?;
        let CpuStorage::BF16(v) = s else { candle_core::bail!("repack: the weight must be bf16") };
        let o = l.start_offset();
        Ok((CpuStorage::BF16(repack_values(&v[o..o + n * k], n, k, self.to)), shape))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s: &candle_core::CudaStorage,
        l: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        let (n, k, shape) = self.dims(l)?;
        super::cuda::gemv::repack(self.to, n, k, (s, l)).map(|s| (s, shape))
    }
}

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
    /// afterwards for the K split's sums (4 floats a lane a warp, 8 paired, one more for the
    /// norm forms' sum of squares).
    pub fn smem_bytes(&self, t: usize, k: usize, epilogue: Epilogue, norm: bool) -> usize {
        let staged = t * (k / 8 + 1) * 16;
        let sums = if self.ks > 1 {
            self.ks * self.tb * 32 * 4 * (epilogue.sums() + usize::from(norm))
        } else {
            0
        };
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

/// Splits `(ks, tb, u)` for `(output rows, k, form)` where scripts/gemv_bench.cu's sweep inside
/// the streamed layer's chain (every projection under PDL, a stand-in for attention, one
/// projection's split varied at a time) beat the rule in [`split`]: SDAR-4B and 8B, whose
/// shapes the rule was not tuned on, and whose forward these make faster in the model too.
/// Projections not listed (o at both shapes, down at 8B) measured best at the rule's split.
pub const MEASURED: [Measured; 5] = [
    // SDAR-4B: q|k|v (3815-3841 against 3939 us a forward in the sweep), gate|up (3564 against
    // 3815), down (3477 against 3564)
    Measured { n: 6144, k: 2560, epilogue: Epilogue::Plain, ks: 4, tb: 2, u: 8 },
    Measured { n: 9728, k: 2560, epilogue: Epilogue::SiluMul, ks: 8, tb: 1, u: 4 },
    Measured { n: 2560, k: 9728, epilogue: Epilogue::Plain, ks: 8, tb: 2, u: 8 },
    // SDAR-8B: q|k|v (5878 against 5979), gate|up with 8 steps a batch (5708 against 5862)
    Measured { n: 6144, k: 4096, epilogue: Epilogue::Plain, ks: 8, tb: 1, u: 8 },
    Measured { n: 12288, k: 4096, epilogue: Epilogue::SiluMul, ks: 4, tb: 1, u: 8 },
];

/// Splits for packed weights ([`WeightLayout::Packed`]) where scripts/packed_bench.cu's sweep (the
/// same chain, every projection packed) beat [`MEASURED`] and the rule, on the H200 and the
/// H100. Where the two cards' best differed (4B's o, 8B's q|k|v, o and gate|up), the H200's,
/// the card the performance goals are stated for. A packed shape not listed takes the rows'
/// split.
pub const MEASURED_PACKED: [Measured; 9] = [
    // SDAR-1.7B: q|k|v, 4 steps a batch over 16 warps (both cards)
    Measured { n: 4096, k: 2048, epilogue: Epilogue::Plain, ks: 16, tb: 1, u: 4 },
    // SDAR-30B-A3B: q|k|v, 4 warps a tile and 2 tiles a block (scripts/moe_bench.cu's dense
    // sweep: faster than the rule's), 8 steps a batch (in the model, where a block then asks
    // for half its weights before its wait, not a quarter). Its o and router keep the rule's:
    // no other split was faster in the model.
    Measured { n: 5120, k: 2048, epilogue: Epilogue::Plain, ks: 4, tb: 2, u: 8 },
    // SDAR-4B: q|k|v (both cards), o, gate|up and down (as their rows)
    Measured { n: 6144, k: 2560, epilogue: Epilogue::Plain, ks: 8, tb: 2, u: 4 },
    Measured { n: 2560, k: 4096, epilogue: Epilogue::Plain, ks: 8, tb: 2, u: 4 },
    Measured { n: 9728, k: 2560, epilogue: Epilogue::SiluMul, ks: 8, tb: 1, u: 4 },
    Measured { n: 2560, k: 9728, epilogue: Epilogue::Plain, ks: 8, tb: 2, u: 8 },
    // SDAR-8B: o, gate|up, down (q|k|v as its rows)
    Measured { n: 4096, k: 4096, epilogue: Epilogue::Plain, ks: 8, tb: 2, u: 8 },
    Measured { n: 12288, k: 4096, epilogue: Epilogue::SiluMul, ks: 8, tb: 1, u: 4 },
    Measured { n: 4096, k: 12288, epilogue: Epilogue::Plain, ks: 8, tb: 2, u: 8 },
];

/// One row of [`MEASURED`] or [`MEASURED_PACKED`]: the product (`n` output rows of `k` inputs, its form) and its split.
#[derive(Clone, Copy, Debug)]
pub struct Measured {
    pub n: usize,
    pub k: usize,
    pub epilogue: Epilogue,
    pub ks: usize,
    pub tb: usize,
    pub u: usize,
}

/// The split for `n` output rows of `k` inputs, from scripts/gemv_bench.cu's sweep on the H200
/// (each within 10 % of the best split for its shape): 8 warps on a tile's K (8 steps each, one
/// batch of loads) for the 2048-wide projections; 16 for K = 6144 (down); 4 warps and 2 tiles
/// a block for gate|up, whose 12288 weight rows give blocks enough. Never more warps on a tile
/// than it has steps. Inside the streamed layer's chain (the same harness, every projection
/// under PDL with a stand-in for attention) these were the best splits again, except q|k|v
/// (4096 rows), which is faster with 2 tiles a block.
///
/// SDAR-4B and 8B, which the rule was never tuned on, take the splits [`MEASURED`] lists.
pub fn split(n: usize, k: usize, epilogue: Epilogue) -> Split {
    if let Some(s) = measured(&MEASURED, n, k, epilogue) {
        return s;
    }
    let steps = k / K_STEP;
    let w_rows = match epilogue {
        Epilogue::Plain => n,
        Epilogue::SiluMul => 2 * n,
    };
    let (ks, tb) = if steps >= 128 {
        (16, 1)
    } else if w_rows >= 8192 {
        (4, 2)
    } else if w_rows >= 4096 {
        (8, 2)
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

/// The split of a product whose weight lies in `layout`: [`MEASURED_PACKED`]'s for packed
/// weights, else [`split`].
pub fn split_for(n: usize, k: usize, epilogue: Epilogue, layout: WeightLayout) -> Split {
    match layout {
        WeightLayout::Packed => {
            measured(&MEASURED_PACKED, n, k, epilogue).unwrap_or_else(|| split(n, k, epilogue))
        }
        WeightLayout::Rows => split(n, k, epilogue),
    }
}

/// The split a table lists for `(n, k, epilogue)`.
fn measured(table: &[Measured], n: usize, k: usize, epilogue: Epilogue) -> Option<Split> {
    let m = table.iter().find(|m| (m.n, m.k, m.epilogue) == (n, k, epilogue))?;
    Some(Split { ks: m.ks, tb: m.tb, u: m.u, blocks: n.div_ceil(TILE_ROWS * m.tb) })
}

/// The split of a grouped expert product (kernels/gemv.cu's GRP forms, `n` rows of `k` inputs
/// per expert), from scripts/moe_bench.cu's sweep at the SDAR-30B-A3B shape (9 distinct experts
/// a pass) and the model's bench:
/// - a short K (the down product's 768: 24 steps) takes 2 warps a tile and 4 tiles a block:
///   [`split`]'s 8 warps a tile had 3 steps each, and down ran at 1.35 TB/s against 2.2;
/// - the gate|up product takes 4 warps a tile and 2 tiles a block, not [`split`]'s 8 and 1.
///
/// With both, a sparse layer's route -> gate|up -> down -> combine takes about a quarter less
/// time.
pub fn grouped_split(n: usize, k: usize, epilogue: Epilogue) -> Split {
    let with = |s: Split, ks: usize, tb: usize| Split {
        ks: ks.min(k / K_STEP).max(1),
        tb,
        blocks: n.div_ceil(TILE_ROWS * tb),
        ..s
    };
    match split(n, k, epilogue) {
        s if epilogue == Epilogue::Plain && k / K_STEP <= 32 => with(s, 2, 4),
        s if epilogue == Epilogue::SiluMul => with(s, 4, 2),
        s => s,
    }
}

impl Gemv {
    pub const PLAIN: Gemv = Gemv { epilogue: Epilogue::Plain };
    pub const SILU_MUL: Gemv = Gemv { epilogue: Epilogue::SiluMul };

    /// Whether `x · wᵀ` should run as this op: bf16, `x` of at most [`MAX_ROWS`] rows (leading
    /// dims flattened), `K` a multiple of [`K_STEP`], at most [`MAX_N`] output rows, both
    /// contiguous from an offset that keeps 16-byte alignment.
    pub fn fits(x: &Tensor, w: &Tensor) -> bool {
        let (Some(&k), Some((n, wk, _))) = (x.dims().last(), weight_dims(w.dims())) else {
            return false;
        };
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

    /// `x [.., K]`, `w [N, K]` rows or packed -> `[.., N]` (`[.., N / 2]` for
    /// [`Epilogue::SiluMul`]).
    pub fn forward(self, x: &Tensor, w: &Tensor) -> Result<Tensor> {
        x.apply_op2_no_bwd(w, &self)
    }

    /// Shape checks shared by both backends: the product's sizes and the output shape.
    fn dims(self, lx: &Layout, lw: &Layout) -> Result<(Dims, Shape)> {
        let Some((n, k, layout)) = weight_dims(lw.dims()) else {
            candle_core::bail!(
                "gemv: a weight of shape {:?} is neither [N, K] rows nor packed",
                lw.shape()
            );
        };
        let dims = lx.dims();
        let Some((&xk, lead)) = dims.split_last() else {
            candle_core::bail!("gemv: x has no dimensions")
        };
        if xk != k {
            candle_core::bail!("gemv: x has {xk} features, the weight takes {k}");
        }
        let t: usize = lead.iter().product();
        if !(1..=MAX_ROWS).contains(&t) || k % K_STEP != 0 {
            candle_core::bail!(
                "gemv: {t} rows of {k} (takes 1..={MAX_ROWS} rows, K a multiple of {K_STEP})"
            );
        }
        if self.epilogue == Epilogue::SiluMul && !halves_fit(n, layout) {
            candle_core::bail!("gemv: a gate|up weight of {n} rows ({layout:?}) is not two halves");
        }
        let mut out = lead.to_vec();
        out.push(self.epilogue.out_rows(n));
        Ok((Dims { t, n, k, layout }, Shape::from(out)))
    }
}

/// One product's sizes: `t` rows of `k` inputs times a weight of `n` rows (both halves of a
/// paired weight), and how that weight lies in memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Dims {
    pub t: usize,
    pub n: usize,
    pub k: usize,
    pub layout: WeightLayout,
}

impl Dims {
    /// The weight's values as `[N, K]` rows ([`rows_of`]).
    fn rows<'a>(&self, w: &'a [half::bf16]) -> std::borrow::Cow<'a, [half::bf16]> {
        rows_of(w, self.n, self.k, self.layout)
    }
}

/// The kernel's arithmetic: each output an f32 sum of bf16 products, times its row's `scale`
/// (the norm forms' 1 / rms; else 1), rounded to bf16 once. The GPU sums in a different order
/// (lanes, then warps), so results agree to f32 rounding before the final bf16 rounding.
pub fn gemv_scaled(
    x: &[half::bf16],
    w: &[half::bf16],
    (t, n, k): (usize, usize, usize),
    scale: &[f32],
) -> Vec<half::bf16> {
    let mut y = Vec::with_capacity(t * n);
    for r in 0..t {
        let xr = &x[r * k..(r + 1) * k];
        for o in 0..n {
            let wr = &w[o * k..(o + 1) * k];
            let s = xr.iter().zip(wr).fold(0f32, |a, (xv, wv)| xv.to_f32().mul_add(wv.to_f32(), a));
            y.push(half::bf16::from_f32(s * scale[r]));
        }
    }
    y
}

pub fn gemv_bf16(
    x: &[half::bf16],
    w: &[half::bf16],
    t: usize,
    n: usize,
    k: usize,
) -> Vec<half::bf16> {
    gemv_scaled(x, w, (t, n, k), &vec![1.0; t])
}

/// `1 / sqrt(mean(x²) + eps)` of each of `t` rows of `k` (the sum of squares in f32), the
/// scale the norm forms give each row's outputs.
pub fn rms_inv_rows(x: &[half::bf16], t: usize, k: usize, eps: f32) -> Vec<f32> {
    x.chunks(k)
        .take(t)
        .map(|row| {
            let ss: f32 = row.iter().map(|v| v.to_f32() * v.to_f32()).sum();
            1.0 / (ss / k as f32 + eps).sqrt()
        })
        .collect()
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

/// The product with what surrounds it, written into an existing `[T, N]` tensor (`out`):
/// `out = residual + epilogue(r ⊙ (x · Wᵀ))`, each part optional. With `rms = Some(eps)`, `r`
/// is each row's `1 / sqrt(mean(x²) + eps)`: an RMSNorm of `x` whose weight the caller has
/// folded into `W` (columns scaled, see fast/fold.rs). A block pass of the GPU's
/// streamed layer runs every projection this way, into buffers allocated once for the pass, so
/// a captured graph holds no allocation between its kernels (see fast/streamed.rs, `Workspace`).
#[derive(Clone, Copy, Debug)]
pub struct GemvInto<'a> {
    pub epilogue: Epilogue,
    pub rms: Option<f32>,
    pub residual: Option<&'a Tensor>,
}

/// The kernels/gemv.cu entry point for a form and a batch depth, where that form is compiled.
pub fn kernel_name(epilogue: Epilogue, norm: bool, add: bool, u: usize) -> Option<&'static str> {
    Some(match (epilogue, norm, add, u) {
        (Epilogue::Plain, false, false, 8) => "unmask_gemv_u8",
        (Epilogue::Plain, false, false, 4) => "unmask_gemv_u4",
        (Epilogue::Plain, false, true, 8) => "unmask_gemv_add_u8",
        (Epilogue::Plain, false, true, 4) => "unmask_gemv_add_u4",
        (Epilogue::Plain, true, false, 8) => "unmask_gemv_norm_u8",
        (Epilogue::Plain, true, false, 4) => "unmask_gemv_norm_u4",
        (Epilogue::SiluMul, false, false, 4) => "unmask_gemv_silu_u4",
        (Epilogue::SiluMul, true, false, 4) => "unmask_gemv_norm_silu_u4",
        (Epilogue::SiluMul, false, false, 8) => "unmask_gemv_silu_u8",
        (Epilogue::SiluMul, true, false, 8) => "unmask_gemv_norm_silu_u8",
        _ => return None,
    })
}

/// The entry point of a form for a weight's layout: `kernel_name`'s, or its `_p` twin that
/// reads the packed layout (kernels/gemv.cu's GEMV macro defines both).
pub fn entry_name(name: &str, layout: WeightLayout) -> std::borrow::Cow<'_, str> {
    match layout {
        WeightLayout::Rows => name.into(),
        WeightLayout::Packed => format!("{name}_p").into(),
    }
}

impl GemvInto<'_> {
    /// `out = …` for `x [.., K]`, `w [N, K]` rows or packed.
    pub fn run(&self, out: &Tensor, x: &Tensor, w: &Tensor) -> Result<()> {
        out.inplace_op3(x, w, self)
    }

    /// Whether the GPU has this form and it takes these operands (see [`Gemv::fits`]).
    pub fn fits(&self, x: &Tensor, w: &Tensor) -> bool {
        let Some((n, k, layout)) = weight_dims(w.dims()) else { return false };
        let s = split_for(self.epilogue.out_rows(n), k, self.epilogue, layout);
        let plain = |t: &Tensor| {
            t.dtype() == DType::BF16
                && t.is_contiguous()
                && t.layout().start_offset().is_multiple_of(8)
        };
        Gemv::fits(x, w)
            && (self.epilogue == Epilogue::Plain || halves_fit(n, layout))
            && kernel_name(self.epilogue, self.rms.is_some(), self.residual.is_some(), s.u)
                .is_some()
            && self.residual.is_none_or(plain)
    }

    /// The product's sizes after checking `out` and the residual against it.
    fn dims(&self, lo: &Layout, lx: &Layout, lw: &Layout) -> Result<Dims> {
        let g = Gemv { epilogue: self.epilogue };
        let (d, shape) = g.dims(lx, lw)?;
        if lo.shape() != &shape || !lo.is_contiguous() {
            candle_core::bail!("gemv: output {:?} for a product of shape {shape:?}", lo.shape());
        }
        if let Some(r) = self.residual {
            if r.elem_count() != shape.elem_count() || !r.is_contiguous() {
                candle_core::bail!("gemv: residual {:?} for an output of {shape:?}", r.shape());
            }
        }
        Ok(d)
    }
}

/// bf16 values of a contiguous CPU tensor.
fn cpu_bf16(t: &Tensor) -> Result<Vec<half::bf16>> {
    t.flatten_all()?.to_vec1::<half::bf16>()
}

impl candle_core::InplaceOp3 for GemvInto<'_> {
    fn name(&self) -> &'static str {
        "unmask-gemv-into"
    }

    fn cpu_fwd(
        &self,
        so: &mut CpuStorage,
        lo: &Layout,
        sx: &CpuStorage,
        lx: &Layout,
        sw: &CpuStorage,
        lw: &Layout,
    ) -> Result<()> {
        let d @ Dims { t, n, k, .. } = self.dims(lo, lx, lw)?;
        let (CpuStorage::BF16(out), CpuStorage::BF16(x), CpuStorage::BF16(w)) = (so, sx, sw) else {
            candle_core::bail!("gemv: out, x and w must be bf16");
        };
        let (Some((xa, xb)), Some((wa, wb))) = (lx.contiguous_offsets(), lw.contiguous_offsets())
        else {
            candle_core::bail!("gemv: x and w must be contiguous");
        };
        let x = &x[xa..xb];
        let scale = match self.rms {
            Some(eps) => rms_inv_rows(x, t, k, eps),
            None => vec![1.0; t],
        };
        let y = gemv_scaled(x, &d.rows(&w[wa..wb]), (t, n, k), &scale);
        let mut y = match self.epilogue {
            Epilogue::Plain => y,
            Epilogue::SiluMul => silu_mul_rows(&y, t, n / 2),
        };
        if let Some(r) = self.residual {
            for (v, r) in y.iter_mut().zip(cpu_bf16(r)?) {
                *v = half::bf16::from_f32(v.to_f32() + r.to_f32());
            }
        }
        let o = lo.start_offset();
        out[o..o + y.len()].copy_from_slice(&y);
        Ok(())
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        so: &mut candle_core::CudaStorage,
        lo: &Layout,
        sx: &candle_core::CudaStorage,
        lx: &Layout,
        sw: &candle_core::CudaStorage,
        lw: &Layout,
    ) -> Result<()> {
        let d = self.dims(lo, lx, lw)?;
        super::cuda::gemv::launch_into(self, d, (so, lo), (sx, lx), (sw, lw))
    }
}

impl CustomOp2 for Gemv {
    fn name(&self) -> &'static str {
        "unmask-gemv"
    }

    fn cpu_fwd(
        &self,
        sx: &CpuStorage,
        lx: &Layout,
        sw: &CpuStorage,
        lw: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let (d @ Dims { t, n, k, .. }, shape) = self.dims(lx, lw)?;
        let (CpuStorage::BF16(x), CpuStorage::BF16(w)) = (sx, sw) else {
            candle_core::bail!("gemv: x and w must be bf16");
        };
        let (Some((xa, xb)), Some((wa, wb))) = (lx.contiguous_offsets(), lw.contiguous_offsets())
        else {
            candle_core::bail!("gemv: x and w must be contiguous");
        };
        let y = gemv_bf16(&x[xa..xb], &d.rows(&w[wa..wb]), t, n, k);
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
        let (d, shape) = self.dims(lx, lw)?;
        super::cuda::gemv::launch(self.epilogue, d, (sx, lx), (sw, lw)).map(|s| (s, shape))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    #[test]
    fn grouped_products_split_as_moe_bench_found() {
        // SDAR-30B-A3B: gate|up 4 warps a tile, 2 tiles a block; down (K = 768) 2 warps, 4 tiles
        assert_eq!(
            grouped_split(768, 2048, Epilogue::SiluMul),
            Split { ks: 4, tb: 2, u: 4, blocks: 24 }
        );
        assert_eq!(
            grouped_split(2048, 768, Epilogue::Plain),
            Split { ks: 2, tb: 4, u: 8, blocks: 32 }
        );
        // a long K keeps the dense rule
        assert_eq!(grouped_split(2048, 6144, Epilogue::Plain), split(2048, 6144, Epilogue::Plain));
    }

    /// Every measured split is taken for its shape, has a kernel in the forms the streamed layer
    /// launches (q|k|v and gate|up with the norm, o and down adding), and fits a block.
    #[test]
    fn measured_splits_are_taken_and_have_kernels() {
        let tables =
            [(&MEASURED[..], WeightLayout::Rows), (&MEASURED_PACKED[..], WeightLayout::Packed)];
        for (&Measured { n, k, epilogue: e, ks, tb, u }, layout) in
            tables.iter().flat_map(|&(t, l)| t.iter().map(move |m| (m, l)))
        {
            let s = split_for(n, k, e, layout);
            assert_eq!(
                (s.ks, s.tb, s.u, s.blocks),
                (ks, tb, u, n.div_ceil(16 * tb)),
                "{n} x {k} {e:?}"
            );
            // a plain product may be q|k|v (the norm form) or o / down (the residual form)
            let forms: &[(bool, bool)] = if e == Epilogue::SiluMul {
                &[(true, false)]
            } else {
                &[(true, false), (false, true)]
            };
            for &(norm, add) in forms {
                let name = kernel_name(e, norm, add, u)
                    .unwrap_or_else(|| panic!("{n} x {k} {e:?} u{u}: no kernel"));
                assert!(
                    include_str!("../../kernels/gemv.cu").contains(&format!("GEMV({name}, {u}, ")),
                    "kernels/gemv.cu has no {name}"
                );
            }
            assert!(s.threads() <= 512 && ks <= k / K_STEP);
        }
        // and each has its packed twin
        assert!(include_str!("../../kernels/gemv.cu").contains("void NAME##_p("));
        // the benches' copy of the table (scripts/bench_common.cuh, gemv_split) says the same
        let bench = include_str!("../../scripts/bench_common.cuh");
        for (table, name) in
            [(&MEASURED[..], "measured[]"), (&MEASURED_PACKED[..], "measured_packed[]")]
        {
            let start = bench
                .find(&format!("const M {name} = {{"))
                .unwrap_or_else(|| panic!("scripts/bench_common.cuh has no {name}"));
            let listed = &bench[start..start + bench[start..].find("};").unwrap()];
            for &Measured { n, k, epilogue: e, ks, tb, u } in table {
                let row = format!("{{{n}, {k}, {}, {{{u}, {ks}, {tb}}}}}", e == Epilogue::SiluMul);
                assert!(listed.contains(&row), "scripts/bench_common.cuh's {name} has no `{row}`");
            }
            assert_eq!(listed.matches("}}").count(), table.len(), "{name} lists other shapes");
        }
        // SDAR-4B's gate|up: 8 warps a tile, one tile a block (the rule gave 4 and 2)
        assert_eq!(split(9728, 2560, Epilogue::SiluMul), Split { ks: 8, tb: 1, u: 4, blocks: 608 });
        // a shape not listed keeps the rule
        assert_eq!(split(2560, 4096, Epilogue::Plain), Split { ks: 16, tb: 1, u: 8, blocks: 160 });
    }

    #[test]
    fn the_split_follows_the_h200_sweep_for_each_sdar_projection() {
        // SDAR-1.7B: qkv, o, gate|up (plain and paired), down
        assert_eq!(split(4096, 2048, Epilogue::Plain), Split { ks: 8, tb: 2, u: 8, blocks: 128 });
        assert_eq!(split(2048, 2048, Epilogue::Plain), Split { ks: 8, tb: 1, u: 8, blocks: 128 });
        assert_eq!(split(12288, 2048, Epilogue::Plain), Split { ks: 4, tb: 2, u: 8, blocks: 384 });
        assert_eq!(split(6144, 2048, Epilogue::SiluMul), Split { ks: 4, tb: 2, u: 4, blocks: 192 });
        assert_eq!(split(2048, 6144, Epilogue::Plain), Split { ks: 16, tb: 1, u: 8, blocks: 128 });
        // small K: no more warps than steps; a ragged last tile still gets a block
        assert_eq!(split(10, 64, Epilogue::Plain), Split { ks: 2, tb: 1, u: 8, blocks: 1 });
        let s = split(2048, 6144, Epilogue::Plain);
        assert_eq!(s.threads(), 512);
        // 8 rows of 6144 staged (98 KB) outweigh 16 warps' sums (8 KB)
        assert_eq!(s.smem_bytes(8, 6144, Epilogue::Plain, false), 8 * 769 * 16);
        assert_eq!(s.smem_bytes(8, 6144, Epilogue::Plain, true), 8 * 769 * 16);
        let s8 = split(2048, 2048, Epilogue::Plain);
        assert_eq!(
            s8.smem_bytes(1, 2048, Epilogue::Plain, true),
            8 * 32 * 4 * 5,
            "sums and sums of squares"
        );
        // one row of 2048 (4 KB) is less than 8 warps' paired sums (8 KB)
        assert_eq!(
            split(6144, 2048, Epilogue::SiluMul).smem_bytes(1, 2048, Epilogue::SiluMul, false),
            8 * 32 * 4 * 8
        );
    }

    #[test]
    fn the_cpu_body_equals_an_f32_matmul_rounded_to_bf16() {
        let dev = Device::Cpu;
        let w = Tensor::randn(0f32, 1.0, (37, 256), &dev).unwrap().to_dtype(DType::BF16).unwrap();
        for t in [1, 4, 8] {
            let x =
                Tensor::randn(0f32, 1.0, (t, 256), &dev).unwrap().to_dtype(DType::BF16).unwrap();
            assert!(Gemv::fits(&x, &w));
            let got = Gemv::PLAIN.forward(&x, &w).unwrap();
            assert_eq!(got.dims(), &[t, 37]);
            let f = |t: &Tensor| t.to_dtype(DType::F32).unwrap();
            let want = f(&x).matmul(&f(&w).t().unwrap()).unwrap();
            let got = f(&got);
            // One bf16 rounding of the same f32 sum: within half a bf16 ulp (2^-8 relative).
            let err = ((&got - &want).unwrap().abs().unwrap()
                / (want.abs().unwrap() + 1e-3).unwrap())
            .unwrap();
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
            let want =
                (candle_nn::ops::silu(&gate).unwrap() * gu.narrow(1, i, i).unwrap()).unwrap();
            let f = |t: &Tensor| {
                t.to_dtype(DType::F32).unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap()
            };
            for (g, w) in f(&got).iter().zip(f(&want)) {
                // one rounding of the same f32 value (up to exp's last bit)
                assert!((g - w).abs() <= w.abs() / 256.0 + 1e-6, "t={t}: {g} vs {w}");
            }
        }
        let odd = Tensor::zeros((7, k), DType::BF16, &dev).unwrap();
        let x = Tensor::zeros((1, k), DType::BF16, &dev).unwrap();
        assert!(
            Gemv::SILU_MUL.forward(&x, &odd).is_err(),
            "a gate|up weight has an even row count"
        );
    }

    #[test]
    fn leading_dims_flatten_into_rows() {
        let dev = Device::Cpu;
        let w = Tensor::randn(0f32, 1.0, (16, 256), &dev).unwrap().to_dtype(DType::BF16).unwrap();
        let x = Tensor::randn(0f32, 1.0, (2, 3, 256), &dev).unwrap().to_dtype(DType::BF16).unwrap();
        let got = Gemv::PLAIN.forward(&x, &w).unwrap();
        let flat = Gemv::PLAIN.forward(&x.reshape((6, 256)).unwrap(), &w).unwrap();
        assert_eq!(got.dims(), &[2, 3, 16]);
        let v = |t: Tensor| {
            t.flatten_all().unwrap().to_dtype(DType::F32).unwrap().to_vec1::<f32>().unwrap()
        };
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
        assert!(
            Gemv::PLAIN.forward(&bf((9, 256)), &w).is_err(),
            "the op itself refuses too many rows"
        );
    }

    fn bf(shape: (usize, usize), seed: f32) -> Tensor {
        let n = shape.0 * shape.1;
        // a hash of the index: values in [-1.5, 1.5) with no pattern a sum could cancel
        let v: Vec<f32> = (0..n)
            .map(|i| {
                let h = (i as u32 ^ seed.to_bits())
                    .wrapping_mul(2654435761)
                    .rotate_left(13)
                    .wrapping_mul(0x5bd1e995);
                (h >> 8) as f32 / (1u32 << 24) as f32 * 3.0 - 1.5
            })
            .collect();
        Tensor::from_vec(v, shape, &Device::Cpu).unwrap().to_dtype(DType::BF16).unwrap()
    }

    fn vals(t: &Tensor) -> Vec<f32> {
        t.to_dtype(DType::F32).unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap()
    }

    /// Relative L2 distance within 2^-7: the chain rounds each normed value `x r w` to bf16,
    /// the folded form each weight `W w` instead, so every product carries a different
    /// rounding of relative size up to 2^-9, twice over for silu(gate) * up.
    fn close(a: &[f32], b: &[f32], what: &str) {
        assert_eq!(a.len(), b.len());
        let num: f32 = a.iter().zip(b).map(|(x, y)| (x - y) * (x - y)).sum();
        let den: f32 = b.iter().map(|y| y * y).sum();
        let e = (num / den).sqrt();
        assert!(e < 1.0 / 128.0, "{what}: relative error {e}");
    }

    #[test]
    fn the_norm_form_with_the_weight_folded_in_equals_rms_norm_then_the_product() {
        let (t, k, n) = (4, 256, 48);
        let (x, w) = (bf((t, k), 0.1), bf((n, k), 0.7));
        let nw = (bf((1, k), 2.0).flatten_all().unwrap() * 0.5).unwrap();
        // the norm weight folded into W's columns, as fast/fold.rs does for the streamed layer
        let folded = w.broadcast_mul(&nw.unsqueeze(0).unwrap()).unwrap();
        for (epilogue, rows) in [(Epilogue::Plain, n), (Epilogue::SiluMul, n / 2)] {
            let op = GemvInto { epilogue, rms: Some(1e-6), residual: None };
            assert!(op.fits(&x, &folded));
            let out = Tensor::zeros((t, rows), DType::BF16, &Device::Cpu).unwrap();
            op.run(&out, &x, &folded).unwrap();
            // the unfused chain: RMSNorm in f32 rounded once (candle's CPU rms_norm rounds the
            // rms itself to bf16 first), then the product with the unfolded W
            let f = |t: &Tensor| t.to_dtype(DType::F32).unwrap();
            let normed = candle_nn::ops::rms_norm(&f(&x), &f(&nw), 1e-6)
                .unwrap()
                .to_dtype(DType::BF16)
                .unwrap();
            let want = Gemv { epilogue }.forward(&normed, &w).unwrap();
            close(&vals(&out), &vals(&want), &format!("{epilogue:?}"));
            // and the norm is not a no-op here
            let raw = Gemv { epilogue }.forward(&x, &folded).unwrap();
            assert!(vals(&raw).iter().zip(vals(&want)).any(|(a, b)| (a - b).abs() > 0.1));
        }
    }

    #[test]
    fn the_add_form_rounds_the_product_then_adds_the_residual() {
        let (t, k, n) = (3, 128, 40);
        let (x, w, r) = (bf((t, k), 0.3), bf((n, k), 1.1), bf((t, n), 4.0));
        let op = GemvInto { epilogue: Epilogue::Plain, rms: None, residual: Some(&r) };
        let out = Tensor::zeros((t, n), DType::BF16, &Device::Cpu).unwrap();
        op.run(&out, &x, &w).unwrap();
        // the unfused chain: a bf16 product, then a bf16 add
        let want = (Gemv::PLAIN.forward(&x, &w).unwrap() + &r).unwrap();
        assert_eq!(vals(&out), vals(&want));
        let wrong = Tensor::zeros((t, n + 1), DType::BF16, &Device::Cpu).unwrap();
        assert!(
            GemvInto { residual: Some(&wrong), ..op }.run(&out, &x, &w).is_err(),
            "a residual of another shape"
        );
        let bad_out = Tensor::zeros((t, n - 1), DType::BF16, &Device::Cpu).unwrap();
        assert!(op.run(&bad_out, &x, &w).is_err(), "an output of another shape");
    }

    /// Each value lands where kernels/gemv.cu's PACKED form reads it: lane `4 g + q` of the
    /// warp on tile `t` loads, at step `s`, the uint4 `(t steps + s) 64 + 32 h + 4 g + q`
    /// (`w0`, then `w8` 32 further), values `32 s + 8 q ..+ 8` of row `16 t + g + 8 h`.
    #[test]
    fn packing_puts_each_value_where_the_kernel_reads_it() {
        let (n, k) = (48, 96);
        let steps = k / K_STEP;
        // each value's bits are its index (some are NaNs: compared as bits)
        let rows: Vec<half::bf16> = (0..n * k).map(|i| half::bf16::from_bits(i as u16)).collect();
        let w = Tensor::from_vec(rows, (n, k), &Device::Cpu).unwrap();
        let bits = |t: &Tensor| {
            t.flatten_all()
                .unwrap()
                .to_vec1::<half::bf16>()
                .unwrap()
                .iter()
                .map(|v| v.to_bits() as usize)
                .collect::<Vec<_>>()
        };
        let p = pack(&w).unwrap();
        assert_eq!(p.dims(), &[n / 16, steps, 16, 32]);
        assert_eq!(weight_dims(p.dims()), Some((n, k, WeightLayout::Packed)));
        assert_eq!(weight_dims(w.dims()), Some((n, k, WeightLayout::Rows)));
        for (at, v) in bits(&p).into_iter().enumerate() {
            // value e of uint4 (t steps + s) 64 + 32 h + lane, lane = 4 g + q
            let (e, lane, h, s, t) =
                (at % 8, at / 8 % 32, at / 256 % 2, at / 512 % steps, at / 512 / steps);
            let (g, q) = (lane / 4, lane % 4);
            let (row, col) = (16 * t + g + 8 * h, 32 * s + 8 * q + e);
            assert_eq!(v, row * k + col, "tile {t} step {s} half {h} lane {lane}");
        }
        // candle's transpose of the tiles says the same, and unpacking undoes it
        let moved = w
            .reshape((n / 16, 16, steps, 32))
            .unwrap()
            .transpose(1, 2)
            .unwrap()
            .contiguous()
            .unwrap();
        assert_eq!(bits(&moved), bits(&p));
        assert_eq!(bits(&unpack(&p).unwrap()), bits(&w));
        assert_eq!(unpack(&p).unwrap().dims(), &[n, k]);
        assert!(unpack(&w).is_err() && pack(&p).is_err(), "each way only from the other layout");
        assert!(pack(&w.narrow(0, 0, 40).unwrap()).is_err(), "rows of no whole tiles");
        assert!(
            packable(48, 96, 1)
                && !packable(48, 96, 2)
                && !packable(40, 96, 1)
                && !packable(48, 80, 1)
        );
    }

    /// Every form gives the same bits from a packed weight as from its rows.
    #[test]
    fn every_form_reads_a_packed_weight_as_its_rows() {
        let (k, n) = (128, 64);
        let (w, r) = (bf((n, k), 0.9), bf((8, n), 3.0));
        let p = pack(&w).unwrap();
        for t in [1, 4, 8] {
            let x = bf((t, k), 0.2);
            for g in [Gemv::PLAIN, Gemv::SILU_MUL] {
                assert_eq!(
                    vals(&g.forward(&x, &p).unwrap()),
                    vals(&g.forward(&x, &w).unwrap()),
                    "{g:?} t={t}"
                );
            }
            let res = r.narrow(0, 0, t).unwrap();
            let forms = [
                GemvInto { epilogue: Epilogue::Plain, rms: Some(1e-6), residual: None },
                GemvInto { epilogue: Epilogue::SiluMul, rms: Some(1e-6), residual: None },
                GemvInto { epilogue: Epilogue::Plain, rms: None, residual: Some(&res) },
            ];
            for op in forms {
                assert!(op.fits(&x, &p), "{op:?}");
                let out = |w: &Tensor| {
                    let o = Tensor::zeros((t, op.epilogue.out_rows(n)), DType::BF16, &Device::Cpu)
                        .unwrap();
                    op.run(&o, &x, w).unwrap();
                    vals(&o)
                };
                assert_eq!(out(&p), out(&w), "{op:?} t={t}");
            }
        }
        // a gate|up weight whose halves would share a tile cannot pair packed
        let odd = pack(&bf((48, k), 0.5)).unwrap();
        let x = bf((2, k), 0.1);
        assert!(Gemv::SILU_MUL.forward(&x, &odd).is_err());
        assert!(!GemvInto { epilogue: Epilogue::SiluMul, rms: Some(1e-6), residual: None }
            .fits(&x, &odd));
        assert_eq!(entry_name("unmask_gemv_u8", WeightLayout::Packed), "unmask_gemv_u8_p");
    }

    #[test]
    fn every_form_the_streamed_layer_uses_has_a_kernel() {
        let u = |n, k, e| split(n, k, e).u;
        // qkv (norm), o and down (add), gate|up (norm + silu) of SDAR-1.7B
        assert_eq!(
            kernel_name(Epilogue::Plain, true, false, u(4096, 2048, Epilogue::Plain)),
            Some("unmask_gemv_norm_u8")
        );
        assert_eq!(
            kernel_name(Epilogue::Plain, false, true, u(2048, 2048, Epilogue::Plain)),
            Some("unmask_gemv_add_u8")
        );
        assert_eq!(
            kernel_name(Epilogue::Plain, false, true, u(2048, 6144, Epilogue::Plain)),
            Some("unmask_gemv_add_u8")
        );
        assert_eq!(
            kernel_name(Epilogue::SiluMul, true, false, u(6144, 2048, Epilogue::SiluMul)),
            Some("unmask_gemv_norm_silu_u4")
        );
        assert_eq!(kernel_name(Epilogue::SiluMul, true, true, 4), None, "not compiled");
        let (x, w) = (bf((2, 64), 0.0), bf((16, 64), 1.0));
        let op = GemvInto { epilogue: Epilogue::Plain, rms: Some(1e-6), residual: None };
        assert!(op.fits(&x, &w));
        let add = |residual| GemvInto { epilogue: Epilogue::Plain, rms: None, residual };
        let res = bf((2, 16), 0.0);
        assert!(add(Some(&res)).fits(&x, &w));
        let transposed = bf((16, 2), 0.0).t().unwrap();
        assert!(!add(Some(&transposed)).fits(&x, &w), "a transposed residual");
        assert!(
            !GemvInto { rms: Some(1e-6), ..add(Some(&res)) }.fits(&x, &w),
            "no norm + add form"
        );
    }
}
