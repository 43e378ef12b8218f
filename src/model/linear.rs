//! A projection `y = x W`, in one of three forms:
//!
//! - [`Linear::Dense`]: a contiguous `[in, out]` tensor in the compute dtype, multiplied by
//!   candle's matmul (the GPU in f32/f16 or with `UNMASK_GEMV=0`, and the lm_head; the CPU
//!   when the checkpoint is not bf16).
//! - [`Linear::Rows`]: the checkpoint's own `[out, in]` tensor in bf16, the GPU's default in
//!   bf16: a block pass's few rows go through the kernel of gemv.rs, a prefill's many rows
//!   through cuBLAS with the weight read transposed (no second copy).
//! - [`Linear::Packed`]: a [`Linear::Rows`] weight re-laid out in the order the gemv kernel's
//!   warps read it (gemv.rs, `WeightLayout::Packed`): the streamed layer's projections on
//!   the GPU. Passes of more rows than the kernel takes run it once per 8 rows up to
//!   [`PACKED_CHUNKS_UP_TO`], past that unpack the weight for cuBLAS (a long prompt's chunks
//!   share one unpacked copy a layer: `Model::store_chunks`).
//! - [`Linear::Bf16`]: on the CPU with f32 compute and a bf16 checkpoint, the stored bf16 values
//!   kept as they are and widened to f32 inside a hand-written kernel. A block pass multiplies
//!   only a few rows, so it is bound by reading the weights; bf16 halves those bytes and the
//!   values are exactly the f32 ones (bf16 -> f32 is lossless).
//!
//! The bf16 kernel walks `W` in panels of [`PANEL`] output columns, laid out panel by panel
//! (`[out / PANEL][in][PANEL]`) so that each panel is one sequential stream. The panels are
//! shared out between the threads ([`threads`]); each thread sweeps its panels with up to
//! [`ROWS`] input rows at a time (8 with AVX-512 when a product has more than 4), their `PANEL`
//! sums in registers. More rows (hundreds in a prefill) sweep the same panel again, which is
//! then in the core's L2 cache: DRAM streams every weight byte once a product whatever the row
//! count, and a prefill is bound by the FMA units, not by memory. The next panel is prefetched
//! into L2 (not L1: there it evicted the rows being swept). `--dtype bf16` on the CPU lays the
//! panels out for bf16_products.rs instead ([`Products`]).

use candle_core::{CpuStorage, CustomOp1, DType, Layout, Result, Shape, Tensor};
use rayon::prelude::*;

use super::bf16_products;
use super::gemv::{Gemv, MAX_ROWS};

/// Output columns per panel: two 8-lane f32 registers per row on AVX2.
pub const PANEL: usize = 16;
/// Input rows per sweep over a panel: 4 rows x 2 registers = 8 accumulators, which with the
/// widened weights and the broadcast input fit AVX2's 16 registers without spilling.
pub const ROWS: usize = 4;
/// Below this many multiply-adds a product (or an attention) runs on the calling thread:
/// handing work to the pool costs more than it saves (the embedded model's projections).
pub const PARALLEL_FROM: usize = 1 << 20;

/// Rows up to which a packed weight's product runs the gemv kernel 8 rows at a time (each
/// launch reads the weight once); past it, unpacking the weight (a read and a write) for one
/// cuBLAS product reads fewer bytes. A 16-row pass is a storing pass of 8-token blocks.
pub const PACKED_CHUNKS_UP_TO: usize = 2 * MAX_ROWS;

pub enum Linear {
    Dense(Tensor),
    Rows(Tensor),
    Packed(Tensor),
    Bf16(Bf16Panels),
}

impl Linear {
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        match self {
            Linear::Dense(w) => x.matmul(w),
            Linear::Rows(w) if Gemv::fits(x, w) => Gemv::PLAIN.forward(x, w),
            Linear::Rows(w) => x.matmul(&w.t()?),
            Linear::Packed(w) => match packed_kernel(Gemv::PLAIN, x, w)? {
                Some(y) => Ok(y),
                None => x.matmul(&super::gemv::unpack(w)?.t()?),
            },
            Linear::Bf16(p) => x.apply_op1_no_bwd(p),
        }
    }

    /// Packs a [`Linear::Rows`] projection for the gemv kernel ([`Linear::Packed`]) where its
    /// shape allows (`halves`: 2 for a stacked gate|up weight); anything else stays as it is.
    pub fn pack(self, halves: usize) -> Result<Self> {
        Ok(match self {
            Linear::Rows(w)
                if w.dims2().is_ok_and(|(n, k)| super::gemv::packable(n, k, halves)) =>
            {
                Linear::Packed(super::gemv::pack(&w)?)
            }
            other => other,
        })
    }

    /// `silu(x Wg) * (x Wu)` for a stacked gate|up weight in one kernel, where the gemv kernel
    /// takes `x` ([`Linear::Rows`] and a block pass's few rows; [`Linear::Packed`] and up to
    /// [`PACKED_CHUNKS_UP_TO`] rows); `None` elsewhere (the caller runs the product and the
    /// activation apart).
    pub fn forward_silu_mul(&self, x: &Tensor) -> Result<Option<Tensor>> {
        match self {
            Linear::Rows(w) if Gemv::fits(x, w) => Gemv::SILU_MUL.forward(x, w).map(Some),
            Linear::Packed(w) => packed_kernel(Gemv::SILU_MUL, x, w),
            _ => Ok(None),
        }
    }

    /// A packed projection as rows (its weight unpacked into a new tensor), for a run of
    /// products over many rows that would each unpack it; `None` for any other form.
    pub fn unpacked(&self) -> Result<Option<Linear>> {
        match self {
            Linear::Packed(w) => Ok(Some(Linear::Rows(super::gemv::unpack(w)?))),
            _ => Ok(None),
        }
    }

    /// The projection as rows: a packed one unpacked, a rows one shared (its tensor, not a
    /// copy); `None` for the dense and CPU forms.
    pub fn as_rows(&self) -> Result<Option<Linear>> {
        match self {
            Linear::Rows(w) => Ok(Some(Linear::Rows(w.clone()))),
            packed => packed.unpacked(),
        }
    }

    /// Both projections as rows ([`Linear::as_rows`]) where either is packed; `None` where
    /// neither is (nothing to unpack) or one has no rows form. A block's pair (q|k|v and o;
    /// gate|up and down), unpacked together for products over many rows.
    pub fn unpacked_pair(a: &Linear, b: &Linear) -> Result<Option<(Linear, Linear)>> {
        if !a.is_packed() && !b.is_packed() {
            return Ok(None);
        }
        Ok(a.as_rows()?.zip(b.as_rows()?))
    }

    /// Whether this is a packed projection.
    pub fn is_packed(&self) -> bool {
        matches!(self, Linear::Packed(_))
    }

    /// The `[out, in]` weight of a [`Linear::Rows`] projection.
    pub fn rows(&self) -> Option<&Tensor> {
        match self {
            Linear::Rows(w) => Some(w),
            _ => None,
        }
    }

    /// The weight the gemv kernel reads, rows or packed (see gemv.rs, [`WeightLayout`]).
    pub fn gemv_weight(&self) -> Option<&Tensor> {
        match self {
            Linear::Rows(w) | Linear::Packed(w) => Some(w),
            _ => None,
        }
    }

    /// Bytes the weights occupy.
    pub fn bytes(&self) -> usize {
        match self {
            Linear::Dense(w) | Linear::Rows(w) | Linear::Packed(w) => {
                w.elem_count() * w.dtype().size_in_bytes()
            }
            Linear::Bf16(p) => p.bytes(),
        }
    }
}

/// `op` of `x [.., K]` and a packed weight through the kernel: once for at most [`MAX_ROWS`]
/// rows, once per 8 rows up to [`PACKED_CHUNKS_UP_TO`]; `None` past that (see [`Linear::Packed`]).
fn packed_kernel(op: Gemv, x: &Tensor, w: &Tensor) -> Result<Option<Tensor>> {
    if Gemv::fits(x, w) {
        return op.forward(x, w).map(Some);
    }
    let Some((&k, lead)) = x.dims().split_last() else {
        candle_core::bail!("a projection's input has no dimensions")
    };
    let t: usize = lead.iter().product();
    if t <= MAX_ROWS || t > PACKED_CHUNKS_UP_TO {
        return Ok(None);
    }
    let flat = x.reshape((t, k))?;
    let parts = (0..t)
        .step_by(MAX_ROWS)
        .map(|r| op.forward(&flat.narrow(0, r, MAX_ROWS.min(t - r))?.contiguous()?, w))
        .collect::<Result<Vec<_>>>()?;
    let y = Tensor::cat(&parts, 0)?;
    let mut out = lead.to_vec();
    out.push(y.dim(1)?);
    y.reshape(out).map(Some)
}

/// How a bf16 projection meets its input.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Products {
    /// The input in f32 times each weight widened exactly, summed by f32 FMA: the f32 result
    /// (the default; what the goldens hold).
    #[default]
    F32,
    /// The input rounded to bf16 and two products an instruction (bf16_products.rs): `--dtype
    /// bf16` on the CPU.
    Bf16,
}

/// bf16 bits of `W [in, out]`, repacked into zero-padded column panels, laid out for the
/// kernel of their [`Products`].
pub struct Bf16Panels {
    k: usize,
    n: usize,
    products: Products,
    data: Vec<u16>,
}

impl std::fmt::Debug for Bf16Panels {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Bf16Panels({}x{}, {:?} products)", self.k, self.n, self.products)
    }
}

/// Where column `c` (0..16) of a panel row is stored. The AVX2 kernel widens a row of 16 bf16
/// with two unpacks against zero, which work within 128-bit halves: the low one yields stored
/// positions 0-3 and 8-11, the high one 4-7 and 12-15. Storing columns 4-7 at 8-11 and 8-11
/// at 4-7 makes the two registers columns 0-7 and 8-15 in order. (Its own inverse.)
const fn slot(c: usize) -> usize {
    match c / 4 {
        1 => c + 4,
        2 => c - 4,
        _ => c,
    }
}

/// Asks Linux to back `v` with 2 MB pages (transparent huge pages, where they are enabled or
/// `madvise`d) before it is first written: passes stream gigabytes of panels, and with 4 kB
/// pages a TLB miss every 4 kB. qwen3-0.6b on the 2-core dev box, two runs each: a denoising
/// pass 65.9 / 72.0 ms against 72.8 / 80.9, a storing pass 86.6 / 95.5 against 93.1 / 114.4;
/// the load takes about a second longer (the kernel compacts memory for the 2 MB pages).
/// Best effort: a refusal changes nothing but the time. (The bench's bandwidth buffer asks the
/// same, so that the floor is read through the same pages.)
pub fn huge_pages<T>(v: &mut [T]) {
    #[cfg(target_os = "linux")]
    {
        const PAGE: usize = 4096;
        let (start, end) =
            (v.as_mut_ptr() as usize, v.as_mut_ptr() as usize + std::mem::size_of_val(v));
        let (a, b) = (start.next_multiple_of(PAGE), end / PAGE * PAGE);
        if b > a {
            // SAFETY: [a, b) lies within `v`'s allocation; the advice changes no contents.
            unsafe { libc::madvise(a as *mut libc::c_void, b - a, libc::MADV_HUGEPAGE) };
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = v;
}

/// One row of a weight being packed: bf16 bits in memory, or the little-endian bytes of a
/// checkpoint file (read in place from its memory map, which need not be 2-byte aligned).
#[derive(Clone, Copy)]
enum RowBits<'a> {
    Bits(&'a [u16]),
    Le(&'a [u8]),
}

impl Bf16Panels {
    /// From a row-major `[out, in]` weight (the checkpoint's own layout), as bf16 bits.
    pub fn from_out_in(w: &[u16], out: usize, inp: usize, products: Products) -> Self {
        assert_eq!(w.len(), out * inp, "weight of {out}x{inp} holds {} values", w.len());
        Self::pack(out, inp, products, |o| RowBits::Bits(&w[o * inp..][..inp]))
    }

    /// From `[out_i, in]` row-major weights stacked along `out`, each the little-endian bf16
    /// bytes a safetensors file stores: packed straight from the file's map, so that loading
    /// reads the checkpoint once and writes the panels once (no tensor, no concatenation).
    pub fn from_le_parts(parts: &[&[u8]], inp: usize, products: Products) -> Self {
        assert!(
            parts.iter().all(|p| p.len() % (2 * inp) == 0),
            "parts of whole rows of {inp} bf16 values"
        );
        let rows: Vec<&[u8]> = parts.iter().flat_map(|p| p.chunks_exact(2 * inp)).collect();
        Self::pack(rows.len(), inp, products, |o| RowBits::Le(rows[o]))
    }

    /// u16 a panel holds: `in` rows of [`PANEL`], or `in / 2` rows of pairs.
    fn panel_len(k: usize, products: Products) -> usize {
        match products {
            Products::F32 => k * PANEL,
            Products::Bf16 => k.div_ceil(2) * 2 * PANEL,
        }
    }

    fn pack<'a>(
        out: usize,
        inp: usize,
        products: Products,
        row: impl Fn(usize) -> RowBits<'a> + Sync,
    ) -> Self {
        // Where input i of column j goes, and what the kernel reads there: bf16 products read
        // denormal weights as zero, so they are stored as zero (the portable body then need
        // not check them).
        match products {
            Products::F32 => {
                Self::pack_as(out, inp, products, row, |j, i| i * PANEL + slot(j), |v| v)
            }
            Products::Bf16 => {
                Self::pack_as(out, inp, products, row, bf16_products::slot, bf16_products::daz)
            }
        }
    }

    fn pack_as<'a>(
        out: usize,
        inp: usize,
        products: Products,
        row: impl Fn(usize) -> RowBits<'a> + Sync,
        at: impl Fn(usize, usize) -> usize + Sync,
        keep: impl Fn(u16) -> u16 + Sync,
    ) -> Self {
        let len = Self::panel_len(inp, products);
        let mut data = vec![0u16; out.div_ceil(PANEL) * len];
        huge_pages(&mut data);
        // Panel by panel, writing in order and reading PANEL rows of the weight side by side,
        // each sequentially: a load streams the checkpoint once.
        data.par_chunks_mut(len).enumerate().for_each(|(p, panel)| {
            for j in 0..PANEL.min(out - p * PANEL) {
                let mut put = |i: usize, v: u16| panel[at(j, i)] = keep(v);
                match row(p * PANEL + j) {
                    RowBits::Bits(r) => r.iter().enumerate().for_each(|(i, &v)| put(i, v)),
                    RowBits::Le(r) => r
                        .chunks_exact(2)
                        .enumerate()
                        .for_each(|(i, b)| put(i, u16::from_le_bytes([b[0], b[1]]))),
                }
            }
        });
        Bf16Panels { k: inp, n: out, products, data }
    }

    /// From a `[out, in]` tensor of any dtype that holds bf16 values (converted exactly); a
    /// contiguous bf16 one is read in place. (An f32 tensor for bf16 products is rounded.)
    pub fn from_tensor(w: &Tensor, products: Products) -> Result<Self> {
        let (out, inp) = w.dims2()?;
        let w = w.to_dtype(DType::BF16)?.contiguous()?;
        let (storage, layout) = w.storage_and_layout();
        let (candle_core::Storage::Cpu(CpuStorage::BF16(v)), Some((a, b))) =
            (&*storage, layout.contiguous_offsets())
        else {
            let bits: Vec<u16> =
                w.flatten_all()?.to_vec1::<half::bf16>()?.iter().map(|b| b.to_bits()).collect();
            return Ok(Self::from_out_in(&bits, out, inp, products));
        };
        // SAFETY: bf16 is a transparent u16 (half's `#[repr(transparent)]`).
        let bits = unsafe { std::slice::from_raw_parts(v[a..b].as_ptr().cast::<u16>(), b - a) };
        Ok(Self::from_out_in(bits, out, inp, products))
    }

    /// Input features (`in`).
    pub fn inputs(&self) -> usize {
        self.k
    }

    /// Bytes of the panels.
    pub fn bytes(&self) -> usize {
        self.data.len() * 2
    }

    /// `y [t, n] = x [t, k] W`, x row-major.
    pub fn matmul(&self, x: &[f32], t: usize) -> Vec<f32> {
        assert_eq!(x.len(), t * self.k, "{t} rows of {} features", self.k);
        let mut y = vec![0f32; t * self.n];
        let panels = self.n.div_ceil(PANEL);
        let threads =
            if t * self.n * self.k < PARALLEL_FROM { 1 } else { threads().clamp(1, panels) };
        let out = Out(y.as_mut_ptr());
        let pairs = (self.products == Products::Bf16).then(|| bf16_products::pairs(x, t, self.k));
        let per = panels.div_ceil(threads);
        let work = |c: usize| {
            let chunk = c * per..((c + 1) * per).min(panels);
            for p in chunk.clone() {
                let next = chunk.contains(&(p + 1));
                // SAFETY: panel `p` writes only columns p*PANEL.. of each row, and each panel
                // belongs to one chunk; `y` outlives the scope of every chunk.
                match &pairs {
                    None => unsafe { kernel::panel(self, p, next, x, t, &out) },
                    Some(xs) => unsafe { kernel::panel_bf16(self, p, next, xs, t, &out) },
                }
            }
        };
        if threads == 1 {
            work(0);
        } else {
            (0..threads).into_par_iter().for_each(work);
        }
        y
    }
}

/// Threads a product is shared out between: `RAYON_NUM_THREADS` where set (the embedded
/// model's one thread is set that way after loading), else the pool's. Not candle's
/// `get_num_threads`, which reads /proc/cpuinfo on every call (65 us, 113 times a pass).
pub fn threads() -> usize {
    match std::env::var("RAYON_NUM_THREADS").ok().and_then(|v| v.parse().ok()) {
        Some(n) if n > 0 => n,
        _ => rayon::current_num_threads(),
    }
}

/// The output of [`Bf16Panels::matmul`], written by several threads at disjoint columns.
struct Out(*mut f32);
// SAFETY: see the one use; the threads write disjoint elements.
unsafe impl Sync for Out {}

impl CustomOp1 for Bf16Panels {
    fn name(&self) -> &'static str {
        "linear-bf16"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        let CpuStorage::F32(v) = s else { candle_core::bail!("linear-bf16: input must be f32") };
        let Some((a, b)) = l.contiguous_offsets() else {
            candle_core::bail!("linear-bf16: input must be contiguous")
        };
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

/// One panel times every row, [`ROWS`] rows a sweep: AVX2+FMA intrinsics where the CPU has
/// them (checked at run time), else portable Rust the compiler vectorises as it can. Both sum
/// each output in the same order (k ascending, one f32 fused multiply-add a step), so they
/// agree exactly.
///
/// The AVX2 body's last sweep over a panel prefetches the thread's next panel at the same
/// offset, so that DRAM streams it while the FMA units work: the hardware prefetcher alone
/// left a 4-row sweep at about 80 % of a core's read bandwidth, and an 8-row pass (whose
/// second sweep reads the panel from cache) with DRAM idle half the time. One core, 311 MB of
/// panels (a scratch timing program, best of 15): 4 rows 22.5 -> 18.7 ms, 8 rows 36.4 -> 31.1.
mod kernel {
    use super::{bf16_products, slot, Bf16Panels, Out, PANEL, ROWS};

    /// Most rows a sweep of any body takes.
    const MOST_ROWS: usize = 8;
    const _: () =
        assert!(avx512::ROWS <= MOST_ROWS && ROWS <= MOST_ROWS && bf16_products::ROWS <= MOST_ROWS);

    /// Panel `p` times every row, `group` rows a sweep: `sweep(pw, ahead, r0, rows, acc)` sums
    /// rows `r0..r0 + rows` against the panel `pw` into `acc`, prefetching `ahead` (the
    /// thread's next panel on the last sweep, where `prefetch_next` says there is one; else
    /// this panel, in cache: harmless); each sweep's sums go to `out` at the panel's columns.
    ///
    /// # Safety
    /// `out` points at `t * w.n` floats that nothing else reads or writes at the columns of
    /// panel `p` while this runs.
    unsafe fn each_sweep(
        w: &Bf16Panels,
        p: usize,
        prefetch_next: bool,
        t: usize,
        group: usize,
        out: &Out,
        mut sweep: impl FnMut(&[u16], &[u16], usize, usize, &mut [[f32; PANEL]]),
    ) {
        let (len, n) = (Bf16Panels::panel_len(w.k, w.products), w.n);
        let pw = &w.data[p * len..][..len];
        let next = if prefetch_next { &w.data[(p + 1) * len..][..len] } else { pw };
        let cols = PANEL.min(n - p * PANEL);
        for r0 in (0..t).step_by(group) {
            let rows = group.min(t - r0);
            let mut acc = [[0f32; PANEL]; MOST_ROWS];
            sweep(pw, if r0 + rows == t { next } else { pw }, r0, rows, &mut acc[..group]);
            for (r, a) in acc.iter().enumerate().take(rows) {
                // SAFETY: row r0 + r < t, columns inside this panel (the caller's promise).
                let dst = unsafe {
                    std::slice::from_raw_parts_mut(out.0.add((r0 + r) * n + p * PANEL), cols)
                };
                dst.copy_from_slice(&a[..cols]);
            }
        }
    }

    /// The f32 products of panel `p`; `prefetch_next`: panel `p + 1` is this thread's next.
    ///
    /// # Safety
    /// As [`each_sweep`]'s.
    pub unsafe fn panel(
        w: &Bf16Panels,
        p: usize,
        prefetch_next: bool,
        x: &[f32],
        t: usize,
        out: &Out,
    ) {
        let k = w.k;
        #[cfg(target_arch = "x86_64")]
        let simd = std::arch::is_x86_feature_detected!("avx2")
            && std::arch::is_x86_feature_detected!("fma");
        #[cfg(not(target_arch = "x86_64"))]
        let simd = false;
        // AVX-512 sweeps 8 rows at once (32 registers), AVX2 and the portable body 4: the sums
        // are the same whatever the grouping. A block pass's 4 rows stay with AVX2, bound by
        // memory either way (SDAR-1.7B, alternating runs: 116.8 / 118.9 ms a denoising pass
        // with AVX2, 120.8 / 125.3 with AVX-512; a storing pass 158.1 / 158.1 against 136.8 /
        // 139.8, a 68-row prefill 1,052 / 1,056 against 966 / 971).
        let wide = t > ROWS && avx512::available();
        let group = if wide { avx512::ROWS } else { ROWS };
        let sweep =
            |pw: &[u16], ahead: &[u16], r0: usize, rows: usize, acc: &mut [[f32; PANEL]]| {
                let xs = &x[r0 * k..(r0 + rows) * k];
                #[cfg(target_arch = "x86_64")]
                if wide {
                    // SAFETY: the feature was detected.
                    return unsafe { avx512::sweep(pw, ahead, xs, rows, k, acc) };
                } else if simd {
                    // SAFETY: the features were just detected.
                    return unsafe { avx2::sweep(pw, ahead, xs, rows, k, acc) };
                }
                portable(pw, xs, rows, k, acc);
            };
        // SAFETY: the caller's promise, passed on.
        unsafe { each_sweep(w, p, prefetch_next, t, group, out, sweep) }
    }

    /// The bf16 products of panel `p`: `xs` the input as bf16 pairs
    /// ([`bf16_products::pairs`]), [`bf16_products::ROWS`] rows a sweep.
    ///
    /// # Safety
    /// As [`each_sweep`]'s.
    pub unsafe fn panel_bf16(
        w: &Bf16Panels,
        p: usize,
        prefetch_next: bool,
        xs: &[u32],
        t: usize,
        out: &Out,
    ) {
        const R: usize = bf16_products::ROWS;
        let k2 = w.k.div_ceil(2);
        let sweep =
            |pw: &[u16], ahead: &[u16], r0: usize, rows: usize, acc: &mut [[f32; PANEL]]| {
                let x = &xs[r0 * k2..][..R * k2]; // the group of rows r0.. (r0 is a multiple of R)
                #[cfg(target_arch = "x86_64")]
                if bf16_products::native() {
                    // SAFETY: the features were detected.
                    return unsafe { bf16_products::avx512::sweep(pw, ahead, x, rows, k2, acc) };
                }
                bf16_products::portable(pw, x, rows, k2, acc);
            };
        // SAFETY: the caller's promise, passed on.
        unsafe { each_sweep(w, p, prefetch_next, t, R, out, sweep) }
    }

    fn widen(b: u16) -> f32 {
        f32::from_bits((b as u32) << 16)
    }

    pub fn portable(pw: &[u16], xs: &[f32], rows: usize, k: usize, acc: &mut [[f32; PANEL]]) {
        for (i, wrow) in pw.chunks_exact(PANEL).enumerate() {
            let wf: [f32; PANEL] = std::array::from_fn(|c| widen(wrow[slot(c)]));
            for (r, a) in acc.iter_mut().enumerate().take(rows) {
                let xv = xs[r * k + i];
                for (s, &w) in a.iter_mut().zip(&wf) {
                    *s = xv.mul_add(w, *s);
                }
            }
        }
    }

    #[cfg(target_arch = "x86_64")]
    pub mod avx2 {
        use super::{PANEL, ROWS};
        use std::arch::x86_64::*;

        /// `rows` rows of `xs` times the panel `pw`, prefetching the panel `ahead` as it goes.
        ///
        /// # Safety
        /// The CPU has AVX2 and FMA.
        #[target_feature(enable = "avx2,fma")]
        pub unsafe fn sweep(
            pw: &[u16],
            ahead: &[u16],
            xs: &[f32],
            rows: usize,
            k: usize,
            acc: &mut [[f32; PANEL]],
        ) {
            assert!(rows <= ROWS && acc.len() >= rows);
            // One body per row count, so the accumulators are registers.
            match rows {
                1 => rows_n::<1>(pw, ahead, xs, k, acc),
                2 => rows_n::<2>(pw, ahead, xs, k, acc),
                3 => rows_n::<3>(pw, ahead, xs, k, acc),
                _ => rows_n::<4>(pw, ahead, xs, k, acc),
            }
        }

        #[target_feature(enable = "avx2,fma")]
        unsafe fn rows_n<const R: usize>(
            pw: &[u16],
            ahead: &[u16],
            xs: &[f32],
            k: usize,
            acc: &mut [[f32; PANEL]],
        ) {
            assert!(pw.len() >= k * PANEL && ahead.len() >= k * PANEL && xs.len() >= R * k);
            let zero = _mm256_setzero_si256();
            let mut lo = [_mm256_setzero_ps(); R];
            let mut hi = [_mm256_setzero_ps(); R];
            let (w, x, pre) = (pw.as_ptr(), xs.as_ptr(), ahead.as_ptr());
            for i in 0..k {
                // SAFETY: i < k, within the lengths asserted above.
                unsafe {
                    // a panel row is 32 bytes: every other one starts the next 64-byte line
                    if i % 2 == 0 {
                        _mm_prefetch::<_MM_HINT_T1>(pre.add(i * PANEL).cast());
                    }
                    let b = _mm256_loadu_si256(w.add(i * PANEL).cast());
                    // bf16 -> f32 is the 16 bits moved to the top half
                    let wl = _mm256_castsi256_ps(_mm256_unpacklo_epi16(zero, b));
                    let wh = _mm256_castsi256_ps(_mm256_unpackhi_epi16(zero, b));
                    for (r, (l, h)) in lo.iter_mut().zip(hi.iter_mut()).enumerate() {
                        let xv = _mm256_broadcast_ss(&*x.add(r * k + i));
                        *l = _mm256_fmadd_ps(xv, wl, *l);
                        *h = _mm256_fmadd_ps(xv, wh, *h);
                    }
                }
            }
            for ((a, l), h) in acc.iter_mut().zip(lo).zip(hi) {
                // SAFETY: each row of `acc` holds 16 floats.
                unsafe {
                    _mm256_storeu_ps(a.as_mut_ptr(), l);
                    _mm256_storeu_ps(a.as_mut_ptr().add(8), h);
                }
            }
        }
    }

    /// The f32 products with AVX-512: a panel row's 16 bf16 widened into one 16-lane register
    /// (zero-extended, shifted into the top half), 8 rows a sweep in 8 of the 32 registers, so
    /// a storing pass sweeps each panel once, not twice, and widens each row once for 8 rows
    /// rather than for 4. The lanes hold the panel's stored order ([`slot`]), put back in
    /// column order once a sweep. Each output is the same chain of fused multiply-adds, k
    /// ascending, as the AVX2 and portable bodies: equal bit for bit.
    pub mod avx512 {
        use super::PANEL;

        /// Rows a sweep.
        pub const ROWS: usize = 8;

        /// Whether this CPU has AVX-512F (checked once).
        pub fn available() -> bool {
            #[cfg(target_arch = "x86_64")]
            {
                static YES: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
                // avx512f implies avx2 and fma to the compiler, which may use them in the body
                *YES.get_or_init(|| {
                    std::arch::is_x86_feature_detected!("avx512f")
                        && std::arch::is_x86_feature_detected!("avx2")
                        && std::arch::is_x86_feature_detected!("fma")
                })
            }
            #[cfg(not(target_arch = "x86_64"))]
            false
        }

        #[cfg(target_arch = "x86_64")]
        pub use body::sweep;

        #[cfg(target_arch = "x86_64")]
        mod body {
            use super::super::slot;
            use super::{PANEL, ROWS};
            use std::arch::x86_64::*;

            /// `rows` (at most [`ROWS`]) rows of `xs` times the panel `pw`, prefetching the
            /// panel `ahead` into L2 as it goes.
            ///
            /// # Safety
            /// The CPU has AVX-512F ([`super::available`]).
            #[target_feature(enable = "avx512f")]
            pub unsafe fn sweep(
                pw: &[u16],
                ahead: &[u16],
                xs: &[f32],
                rows: usize,
                k: usize,
                acc: &mut [[f32; PANEL]],
            ) {
                assert!(rows <= ROWS && acc.len() >= rows);
                match rows {
                    1 => rows_n::<1>(pw, ahead, xs, k, acc),
                    2 => rows_n::<2>(pw, ahead, xs, k, acc),
                    3 => rows_n::<3>(pw, ahead, xs, k, acc),
                    4 => rows_n::<4>(pw, ahead, xs, k, acc),
                    5 => rows_n::<5>(pw, ahead, xs, k, acc),
                    6 => rows_n::<6>(pw, ahead, xs, k, acc),
                    7 => rows_n::<7>(pw, ahead, xs, k, acc),
                    _ => rows_n::<8>(pw, ahead, xs, k, acc),
                }
            }

            #[target_feature(enable = "avx512f")]
            unsafe fn rows_n<const R: usize>(
                pw: &[u16],
                ahead: &[u16],
                xs: &[f32],
                k: usize,
                acc: &mut [[f32; PANEL]],
            ) {
                assert!(pw.len() >= k * PANEL && ahead.len() >= k * PANEL && xs.len() >= R * k);
                let mut sums = [_mm512_setzero_ps(); R];
                let (w, x, pre) = (pw.as_ptr(), xs.as_ptr(), ahead.as_ptr());
                for i in 0..k {
                    // SAFETY: i < k, within the lengths asserted above.
                    unsafe {
                        // a panel row is 32 bytes: every other one starts the next 64-byte line
                        if i % 2 == 0 {
                            _mm_prefetch::<_MM_HINT_T1>(pre.add(i * PANEL).cast());
                        }
                        let b = _mm256_loadu_si256(w.add(i * PANEL).cast());
                        let wf =
                            _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(b)));
                        for (r, s) in sums.iter_mut().enumerate() {
                            *s = _mm512_fmadd_ps(_mm512_set1_ps(*x.add(r * k + i)), wf, *s);
                        }
                    }
                }
                for (out, s) in acc.iter_mut().zip(sums) {
                    let mut lanes = [0f32; PANEL];
                    // SAFETY: 16 floats.
                    unsafe { _mm512_storeu_ps(lanes.as_mut_ptr(), s) };
                    for (c, o) in out.iter_mut().enumerate() {
                        *o = lanes[slot(c)];
                    }
                }
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

    /// Every row count from 1 to 10, 17 and a prefill-like 37 over shapes with ragged panels, a
    /// single input feature and odd widths, on one thread and on the pool (where each thread's
    /// last sweep prefetches its next panel), against the naive sums (exact: the values are
    /// small multiples of 1/8 and 1/4).
    #[test]
    fn many_shapes_and_row_counts_match_the_naive_sums() {
        const _: () =
            assert!(8 * (PANEL * 40 + 3) * 257 >= PARALLEL_FROM, "the last shape takes the pool");
        for (out, inp) in [
            (1, 1),
            (15, 7),
            (16, 64),
            (17, 300),
            (PANEL * 2 + 5, 19),
            (100, 33),
            (PANEL * 40 + 3, 257),
        ] {
            let w: Vec<f32> = (0..out * inp).map(|i| ((i * 7 % 23) as f32 - 11.0) / 8.0).collect();
            let p = Bf16Panels::from_out_in(
                &w.iter().map(|&v| bits(v)).collect::<Vec<_>>(),
                out,
                inp,
                Products::F32,
            );
            for t in (1..=10).chain([17, 37]) {
                let x: Vec<f32> = (0..t * inp).map(|i| ((i * 5 % 13) as f32 - 6.0) / 4.0).collect();
                let y = p.matmul(&x, t);
                for r in 0..t {
                    for o in 0..out {
                        let want: f32 = (0..inp).map(|i| x[r * inp + i] * w[o * inp + i]).sum();
                        assert_eq!(y[r * out + o], want, "{out}x{inp} t={t} row {r} col {o}");
                    }
                }
            }
        }
    }

    /// Bf16 products over the same shapes and row counts (sweeps of 8 rows, odd widths padded
    /// to a pair), against the dot products of the rounded inputs: exact, as the inputs round
    /// to quarters plus a few 2^-10 and the weights are eighths.
    #[test]
    fn bf16_products_match_the_dot_products_of_the_rounded_inputs() {
        for (out, inp) in
            [(1, 1), (15, 7), (16, 64), (17, 300), (PANEL * 2 + 5, 19), (PANEL * 40 + 3, 257)]
        {
            let w: Vec<f32> = (0..out * inp).map(|i| ((i * 7 % 23) as f32 - 11.0) / 8.0).collect();
            let p = Bf16Panels::from_out_in(
                &w.iter().map(|&v| bits(v)).collect::<Vec<_>>(),
                out,
                inp,
                Products::Bf16,
            );
            for t in (1..=10).chain([17, 37]) {
                let x: Vec<f32> = (0..t * inp)
                    .map(|i| ((i * 5 % 13) as f32 - 6.0) / 4.0 + 1.0 / 1024.0)
                    .collect();
                let y = p.matmul(&x, t);
                for r in 0..t {
                    for o in 0..out {
                        let rounded = |v: f32| half::bf16::from_f32(v).to_f32();
                        let want: f32 =
                            (0..inp).map(|i| rounded(x[r * inp + i]) * w[o * inp + i]).sum();
                        assert_eq!(y[r * out + o], want, "{out}x{inp} t={t} row {r} col {o}");
                    }
                }
            }
        }
    }

    /// A row's bf16 products do not depend on the rows beside it (sweeps of 8, the pool's
    /// threads): a block pass and a storing pass give a position the same logits.
    #[test]
    fn a_rows_bf16_products_are_the_same_alone_and_among_others() {
        let (out, inp) = (PANEL * 40 + 3, 258);
        let w: Vec<u16> = (0..out * inp).map(|i| bits(((i as f32) * 0.61).sin() / 8.0)).collect();
        let p = Bf16Panels::from_out_in(&w, out, inp, Products::Bf16);
        let x: Vec<f32> = (0..11 * inp).map(|i| (i as f32 * 0.37).sin()).collect();
        let all = p.matmul(&x, 11);
        for r in [0, 7, 8, 10] {
            let alone = p.matmul(&x[r * inp..][..inp], 1);
            assert_eq!(alone, all[r * out..][..out], "row {r}");
        }
        // and they are close to the f32 products (inputs rounded to 8 bits)
        let exact = Bf16Panels::from_out_in(&w, out, inp, Products::F32).matmul(&x, 11);
        let scale = exact.iter().fold(0f32, |m, v| m.max(v.abs()));
        assert!(
            all.iter().zip(&exact).all(|(a, b)| (a - b).abs() <= scale / 64.0),
            "bf16 products far from f32"
        );
    }

    /// The portable body against the AVX2 one, which must agree bit for bit, on inexact values
    /// (the naive sums above check both, the pool's included, on exact ones).
    #[test]
    fn both_bodies_round_alike() {
        let (out, inp) = (PANEL * 40 + 3, 256);
        let w: Vec<f32> = (0..out * inp).map(|i| ((i * 7 % 23) as f32 - 11.0) / 8.0).collect();
        let p = Bf16Panels::from_out_in(
            &w.iter().map(|&v| bits(v)).collect::<Vec<_>>(),
            out,
            inp,
            Products::F32,
        );
        // inexact values: the two bodies still round alike
        let x: Vec<f32> = (0..4 * inp).map(|i| (i as f32 * 0.37).sin()).collect();
        let pw = &p.data[..inp * PANEL];
        let mut a = [[0f32; PANEL]; ROWS];
        kernel::portable(pw, &x, 3, inp, &mut a);
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
        {
            let mut b = [[0f32; PANEL]; ROWS];
            // SAFETY: detected just above.
            unsafe { kernel::avx2::sweep(pw, pw, &x, 3, inp, &mut b) };
            assert_eq!(a, b);
        }
        for c in 0..PANEL {
            let want = (0..inp).fold(0f32, |s, i| x[inp + i].mul_add(w[c * inp + i], s));
            assert_eq!(a[1][c], want, "column {c}");
        }
    }

    /// The AVX-512 body against the portable one, bit for bit, for every row count it takes
    /// (8 rows in one sweep against two of 4), on inexact values.
    #[test]
    fn the_avx512_body_rounds_as_the_portable_one() {
        if !kernel::avx512::available() {
            eprintln!("no AVX-512F here: nothing to compare");
            return;
        }
        let (out, inp) = (PANEL, 301);
        let w: Vec<u16> = (0..out * inp).map(|i| bits(((i as f32) * 0.71).sin() / 4.0)).collect();
        let p = Bf16Panels::from_out_in(&w, out, inp, Products::F32);
        let x: Vec<f32> = (0..8 * inp).map(|i| (i as f32 * 0.37).cos()).collect();
        let pw = &p.data[..inp * PANEL];
        for rows in 1..=8 {
            let mut want = [[0f32; PANEL]; 8];
            for r0 in (0..rows).step_by(ROWS) {
                let n = ROWS.min(rows - r0);
                kernel::portable(pw, &x[r0 * inp..], n, inp, &mut want[r0..]);
            }
            let mut got = [[0f32; PANEL]; 8];
            #[cfg(target_arch = "x86_64")]
            // SAFETY: detected above.
            unsafe {
                kernel::avx512::sweep(pw, pw, &x, rows, inp, &mut got)
            };
            assert_eq!(got[..rows], want[..rows], "{rows} rows");
        }
    }

    /// Parts of a file's bytes, stacked and at an odd address, pack as the same bits in memory.
    #[test]
    fn panels_from_little_endian_parts_equal_those_from_bits() {
        let (inp, a, b) = (19, 7, PANEL + 4);
        let w: Vec<u16> = (0..(a + b) * inp).map(|i| (i * 2654435761 % 65521) as u16).collect();
        let mut file = vec![0u8];
        file.extend(w.iter().flat_map(|v| v.to_le_bytes()));
        let (pa, pb) = file[1..].split_at(2 * a * inp);
        let got = Bf16Panels::from_le_parts(&[pa, pb], inp, Products::F32);
        let want = Bf16Panels::from_out_in(&w, a + b, inp, Products::F32);
        assert_eq!((got.k, got.n, &got.data), (want.k, want.n, &want.data));
    }

    #[test]
    fn the_slots_put_each_column_where_the_unpacks_find_it() {
        let stored: Vec<usize> = (0..PANEL).map(slot).collect();
        assert_eq!(stored, [0, 1, 2, 3, 8, 9, 10, 11, 4, 5, 6, 7, 12, 13, 14, 15]);
        assert!((0..PANEL).all(|c| slot(slot(c)) == c));
    }

    #[test]
    fn as_a_candle_op_it_equals_the_f32_matmul_of_the_widened_weights() {
        let dev = candle_core::Device::Cpu;
        let w = Tensor::randn(0f32, 1.0, (40, 24), &dev).unwrap().to_dtype(DType::BF16).unwrap();
        let x = Tensor::randn(0f32, 1.0, (2, 3, 24), &dev).unwrap();
        let lin = Linear::Bf16(Bf16Panels::from_tensor(&w, Products::F32).unwrap());
        let got = lin.forward(&x).unwrap();
        assert_eq!(got.dims(), &[2, 3, 40]);
        let want = x.broadcast_matmul(&w.to_dtype(DType::F32).unwrap().t().unwrap()).unwrap();
        let diff = (got - want)
            .unwrap()
            .abs()
            .unwrap()
            .flatten_all()
            .unwrap()
            .max(0)
            .unwrap()
            .to_scalar::<f32>()
            .unwrap();
        assert!(diff < 1e-4, "max diff {diff}");
        assert_eq!(lin.bytes(), 2 * 24 * 48, "three zero-padded panels of 16 columns");
    }

    #[test]
    fn rows_form_equals_the_dense_form_through_the_kernel_and_through_matmul() {
        let dev = candle_core::Device::Cpu;
        let w = Tensor::randn(0f32, 1.0, (48, 256), &dev).unwrap().to_dtype(DType::BF16).unwrap();
        let rows = Linear::Rows(w.clone());
        let dense = Linear::Dense(w.t().unwrap().contiguous().unwrap());
        for t in [4, 8, 9, 64] {
            let x =
                Tensor::randn(0f32, 1.0, (t, 256), &dev).unwrap().to_dtype(DType::BF16).unwrap();
            assert_eq!(Gemv::fits(&x, &w), t <= 8);
            let f = |t: Tensor| t.to_dtype(DType::F32).unwrap();
            let (a, b) = (f(rows.forward(&x).unwrap()), f(dense.forward(&x).unwrap()));
            assert_eq!(a.dims(), &[t, 48]);
            let rel =
                ((&a - &b).unwrap().abs().unwrap() / (b.abs().unwrap() + 1e-2).unwrap()).unwrap();
            let max = rel.flatten_all().unwrap().max(0).unwrap().to_scalar::<f32>().unwrap();
            // Both round one f32 sum to bf16; sums in another order may round to the next value.
            assert!(max <= 2.0 / 256.0, "t={t}: relative difference {max}");
        }
        assert_eq!(rows.bytes(), 48 * 256 * 2);
    }

    /// A packed projection gives its rows' results at every row count: the kernel for a block
    /// pass, the kernel 8 rows at a time for up to 16, cuBLAS (here candle's CPU matmul) on the
    /// unpacked weight past that.
    #[test]
    fn a_packed_projection_equals_its_rows_at_every_row_count() {
        let dev = candle_core::Device::Cpu;
        let w = Tensor::randn(0f32, 0.3, (64, 96), &dev).unwrap().to_dtype(DType::BF16).unwrap();
        let (rows, packed) = (Linear::Rows(w.clone()), Linear::Rows(w.clone()).pack(2).unwrap());
        assert!(matches!(packed, Linear::Packed(_)) && packed.bytes() == rows.bytes());
        assert!(
            matches!(Linear::Rows(w.narrow(0, 0, 48).unwrap()).pack(2).unwrap(), Linear::Rows(_)),
            "halves of 24 rows"
        );
        let v = |t: Tensor| {
            t.to_dtype(DType::F32).unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap()
        };
        for t in [1, 4, 8, 9, 12, 16, 17, 40] {
            let x = Tensor::randn(0f32, 1.0, (t, 96), &dev).unwrap().to_dtype(DType::BF16).unwrap();
            let got = packed.forward(&x).unwrap();
            assert_eq!(got.dims(), &[t, 64]);
            let want = match t {
                // the kernel on the rows, 8 rows at a time
                9..=PACKED_CHUNKS_UP_TO => {
                    let parts: Vec<Tensor> = (0..t)
                        .step_by(8)
                        .map(|r| rows.forward(&x.narrow(0, r, 8.min(t - r)).unwrap()).unwrap())
                        .collect();
                    Tensor::cat(&parts, 0).unwrap()
                }
                _ => rows.forward(&x).unwrap(),
            };
            assert_eq!(v(got), v(want), "t={t}");
            let paired = packed.forward_silu_mul(&x).unwrap();
            assert_eq!(
                paired.is_some(),
                t <= PACKED_CHUNKS_UP_TO,
                "t={t}: past 16 rows the caller runs the activation"
            );
            if t <= 8 {
                assert_eq!(
                    v(paired.unwrap()),
                    v(rows.forward_silu_mul(&x).unwrap().unwrap()),
                    "t={t}"
                );
            }
        }
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
        let want = (candle_nn::ops::silu(&gu.narrow(1, 0, 32).unwrap()).unwrap()
            * gu.narrow(1, 32, 32).unwrap())
        .unwrap();
        let f = |t: &Tensor| {
            t.to_dtype(DType::F32).unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap()
        };
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
