//! The CPU attention kernel (what [`super::ops::Attention`] runs on the host).
//!
//! Work is split into tasks of (KV head, tile of query rows); a task takes every query head of
//! its KV head, so each key and value row is read once for `group x rows` queries. Within a
//! task the keys go by in blocks of [`KEY_BLOCK`], flash-attention style: the block's scores
//! (a small GEMM, queries x keys), an online softmax update (running max and sum per query,
//! the output rescaled when the max grows), then the block's values added in (a second small
//! GEMM). Nothing grows with the cache length but the loop, and both products are register
//! tiles of fused multiply-adds (8 queries x 1 key or 4 x 2; 8 queries x 8 dimensions or 4 x
//! 16), which the
//! one-dot-product-at-a-time loop this replaces was not: it reached about 18 % of the FMA peak
//! and a 4096-token prefill spent a third of its time here.
//!
//! Hand-written because no crate on crates.io offers a CPU attention over this cache layout
//! (`[2, kv_heads, capacity, head_dim]`, block-causal additive mask) with grouped queries. An
//! AVX2+FMA body is chosen at run time; a portable body does the same operations in the same
//! order (per-lane fused multiply-adds, the same reduction tree, the same exponential), so the
//! two agree bit for bit and the tests hold on any CPU.

use super::fastmath::exp;
use super::ops::Attention;

/// Keys per block: the block's values (64 x 128 f32 = 32 kB) stay in L1 while each query tile
/// adds them in.
const KEY_BLOCK: usize = 64;
/// Query rows a task takes when the call has few (a block pass's 4 or 8: one task per KV
/// head keeps both cores busy) or many (a prefill chunk: more queries share each key read).
const TILE_FEW: usize = 4;
const TILE_MANY: usize = 16;

/// One attention call's inputs: `q [heads, t_len, d]`, the cache `kv [2, kv_heads, cap, d]`,
/// and an optional additive mask `[t_len, keys]` (0 or -inf).
pub struct Job<'a> {
    pub op: &'a Attention,
    pub q: &'a [f32],
    pub kv: &'a [f32],
    pub mask: Option<&'a [f32]>,
    pub t_len: usize,
    pub cap: usize,
}

impl Job<'_> {
    fn tile(&self) -> usize {
        if self.t_len > 2 * TILE_MANY {
            TILE_MANY
        } else {
            TILE_FEW
        }
    }

    pub fn tasks(&self) -> usize {
        self.op.kv_heads * self.t_len.div_ceil(self.tile())
    }

    /// The query rows of task `i`.
    pub fn rows(&self, i: usize) -> std::ops::Range<usize> {
        let (tile, tile_no) = (self.tile(), i / self.op.kv_heads);
        tile * tile_no..(tile * (tile_no + 1)).min(self.t_len)
    }

    /// The number of keys row `t` sees: all of them without a mask, else up to the last one
    /// its mask row leaves visible (a prefill chunk's later blocks: half its causal square).
    fn seen(&self, t: usize) -> usize {
        let keys = self.op.keys;
        self.mask.map_or(keys, |m| {
            m[t * keys..(t + 1) * keys]
                .iter()
                .rposition(|&v| v != f32::NEG_INFINITY)
                .map_or(0, |j| j + 1)
        })
    }

    /// Task `i`'s output, `[group][rows][d]` (query heads of KV head `i % kv_heads`, each over
    /// the rows of tile `i / kv_heads`).
    pub fn task(&self, i: usize) -> Vec<f32> {
        #[cfg(target_arch = "x86_64")]
        if self.op.head_dim.is_multiple_of(8)
            && std::arch::is_x86_feature_detected!("avx2")
            && std::arch::is_x86_feature_detected!("fma")
        {
            // SAFETY: the features were just detected, and the head dimension is whole lanes.
            return unsafe { self.task_with::<avx2::Avx2>(i) };
        }
        // SAFETY: the portable body needs no feature.
        unsafe { self.task_with::<Portable>(i) }
    }

    /// # Safety
    /// `K`'s CPU features are present.
    unsafe fn task_with<K: Kernels>(&self, i: usize) -> Vec<f32> {
        let op = self.op;
        let (kvh, d) = (op.kv_heads, op.head_dim);
        let (g, rows) = (i % kvh, self.rows(i));
        let group = op.heads / kvh;
        let span = rows.clone().map(|t| self.seen(t)).max().unwrap_or(0);
        // Queries n = j * rows + r: head g*group + j, row rows.start + r; contiguous per head.
        let qn = group * rows.len();
        let mut q = Vec::with_capacity(qn * d);
        for hh in g * group..(g + 1) * group {
            q.extend_from_slice(
                &self.q[(hh * self.t_len + rows.start) * d..(hh * self.t_len + rows.end) * d],
            );
        }
        let row_of = |n: usize| rows.start + n % rows.len();
        let (kc, vc) = (&self.kv[g * self.cap * d..], &self.kv[(kvh + g) * self.cap * d..]);
        let mut out = vec![0f32; qn * d];
        let mut state = vec![Softmax::EMPTY; qn];
        let mut s = vec![0f32; qn * KEY_BLOCK];
        for k0 in (0..span).step_by(KEY_BLOCK) {
            let nk = KEY_BLOCK.min(span - k0);
            let next = (k0 + KEY_BLOCK).min(span)..(k0 + 2 * KEY_BLOCK).min(span);
            let ahead = [&kc[next.start * d..next.end * d], &vc[next.start * d..next.end * d]];
            // SAFETY (all three): `K`'s features are the caller's promise; the slices are sized
            // as each kernel asserts.
            unsafe { K::scores(&q, &kc[k0 * d..(k0 + nk) * d], d, nk, &mut s, ahead) };
            for (n, (st, o)) in state.iter_mut().zip(out.chunks_exact_mut(d)).enumerate() {
                let row = &mut s[n * KEY_BLOCK..][..nk];
                let mask = self.mask.map(|m| &m[row_of(n) * op.keys + k0..][..nk]);
                // SAFETY: as above.
                let alpha = unsafe { st.update::<K>(row, op.scale, mask) };
                if alpha != 1.0 {
                    o.iter_mut().for_each(|x| *x *= alpha);
                }
            }
            unsafe { K::values(&s, &vc[k0 * d..(k0 + nk) * d], d, nk, &mut out) };
        }
        for (o, st) in out.chunks_exact_mut(d).zip(&state) {
            // A row that saw no key (none does: every row sees its own position) stays zero.
            if st.sum > 0.0 {
                let inv = 1.0 / st.sum;
                o.iter_mut().for_each(|x| *x *= inv);
            }
        }
        out
    }
}

/// Asks for key `j`'s K and V rows of the next block (`ahead`, either may be short or empty)
/// while this block's key `j` is scored: the next block streams from DRAM as this one
/// computes. Without it a decode-shaped task (8 queries) read and computed in turn, 6.7 GB/s
/// and 27 GFLOP/s on one thread against 47 GFLOP/s on a cache in L3; issuing a whole block's
/// prefetches at once did nothing (the core drops what its miss queue cannot hold).
#[inline(always)]
fn prefetch_row(ahead: [&[f32]; 2], j: usize, d: usize) {
    #[cfg(target_arch = "x86_64")]
    for part in ahead {
        if let Some(row) = part.get(j * d..(j + 1) * d) {
            for line in row.chunks(16) {
                // SAFETY: a prefetch of a valid address; it never faults and changes no memory.
                unsafe {
                    std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T1 }>(
                        line.as_ptr().cast(),
                    )
                };
            }
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (ahead, j, d);
}

/// One query's online softmax: the largest score so far and the sum of `exp(score - max)`.
#[derive(Clone, Copy)]
struct Softmax {
    max: f32,
    sum: f32,
}

impl Softmax {
    const EMPTY: Softmax = Softmax { max: f32::NEG_INFINITY, sum: 0.0 };

    /// Takes a block's raw dot products, turns them into weights `exp(score - max)` in place
    /// (score = dot x scale + mask), and returns the factor the output so far must be
    /// multiplied by (the old max's weights rescaled to the new one; 1 when the max did not
    /// move).
    ///
    /// # Safety
    /// `K`'s CPU features are present.
    #[inline(always)]
    unsafe fn update<K: Kernels>(
        &mut self,
        row: &mut [f32],
        scale: f32,
        mask: Option<&[f32]>,
    ) -> f32 {
        // SAFETY (both): the caller's promise.
        let max = unsafe { K::scores_max(row, scale, mask) }.max(self.max);
        if max == f32::NEG_INFINITY {
            // Nothing visible yet: every weight is zero, the output untouched.
            row.fill(0.0);
            return 1.0;
        }
        let alpha = if max == self.max { 1.0 } else { exp(self.max - max) };
        self.sum = self.sum * alpha + unsafe { K::exp_sum(row, max) };
        self.max = max;
        alpha
    }
}

/// The two products and the exponential, in a body per instruction set; every body computes
/// the same values in the same order.
trait Kernels {
    /// `s[n * KEY_BLOCK + j] = q_n . k_j` for every query `n` of `q [qn, d]` and key `j` of
    /// `k [nk, d]`, prefetching the next block's rows (`ahead`: K, V) as it goes.
    unsafe fn scores(q: &[f32], k: &[f32], d: usize, nk: usize, s: &mut [f32], ahead: [&[f32]; 2]);
    /// `out_n += sum_j p[n * KEY_BLOCK + j] v_j` over the keys `j` of `v [nk, d]`.
    unsafe fn values(p: &[f32], v: &[f32], d: usize, nk: usize, out: &mut [f32]);
    /// `x = x * scale + mask` for every element; returns the largest.
    unsafe fn scores_max(x: &mut [f32], scale: f32, mask: Option<&[f32]>) -> f32;
    /// `x = exp(x - max)` for every element; returns their sum, added in 8 lanes then
    /// [`tree`], then the elements past the last whole 8 in order.
    unsafe fn exp_sum(x: &mut [f32], max: f32) -> f32;
}

/// Sums of 8 lanes as the AVX2 body's reduction tree adds them (two horizontal adds, then the
/// two 128-bit halves).
#[inline(always)]
fn tree(a: &[f32; 8]) -> f32 {
    ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]))
}

/// Any CPU, any head dimension: per-lane fused multiply-adds over 8-wide chunks (lanes past
/// `d` add nothing).
struct Portable;

impl Kernels for Portable {
    unsafe fn scores(
        q: &[f32],
        k: &[f32],
        d: usize,
        nk: usize,
        s: &mut [f32],
        _ahead: [&[f32]; 2],
    ) {
        let qn = q.len() / d;
        for n in 0..qn {
            for j in 0..nk {
                let mut lanes = [0f32; 8];
                for c in (0..d).step_by(8) {
                    for (l, a) in lanes.iter_mut().enumerate().filter(|(l, _)| c + l < d) {
                        *a = q[n * d + c + l].mul_add(k[j * d + c + l], *a);
                    }
                }
                s[n * KEY_BLOCK + j] = tree(&lanes);
            }
        }
    }

    unsafe fn values(p: &[f32], v: &[f32], d: usize, nk: usize, out: &mut [f32]) {
        for (n, o) in out.chunks_exact_mut(d).enumerate() {
            for j in 0..nk {
                let w = p[n * KEY_BLOCK + j];
                for (x, &vv) in o.iter_mut().zip(&v[j * d..(j + 1) * d]) {
                    *x = w.mul_add(vv, *x);
                }
            }
        }
    }

    unsafe fn scores_max(x: &mut [f32], scale: f32, mask: Option<&[f32]>) -> f32 {
        for (j, v) in x.iter_mut().enumerate() {
            *v = *v * scale + mask.map_or(0.0, |m| m[j]);
        }
        x.iter().copied().fold(f32::NEG_INFINITY, f32::max)
    }

    unsafe fn exp_sum(x: &mut [f32], max: f32) -> f32 {
        let mut lanes = [0f32; 8];
        let mut chunks = x.chunks_exact_mut(8);
        for c in &mut chunks {
            for (l, v) in lanes.iter_mut().zip(c) {
                *v = exp(*v - max);
                *l += *v;
            }
        }
        let rest = chunks.into_remainder();
        rest.iter_mut().fold(tree(&lanes), |s, v| {
            *v = exp(*v - max);
            s + *v
        })
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::{exp, Kernels, KEY_BLOCK};
    use crate::model::fastmath::avx2::exp8;
    use std::arch::x86_64::*;

    /// AVX2 and FMA, head dimensions a multiple of 8.
    pub struct Avx2;

    impl Kernels for Avx2 {
        #[target_feature(enable = "avx2,fma")]
        unsafe fn scores(
            q: &[f32],
            k: &[f32],
            d: usize,
            nk: usize,
            s: &mut [f32],
            ahead: [&[f32]; 2],
        ) {
            let qn = q.len() / d;
            assert!(d.is_multiple_of(8) && k.len() >= nk * d && s.len() >= qn * KEY_BLOCK);
            // Tiles of 8 queries x 1 key while 8 are left (each key row read once for all of
            // them: a block pass's 8 queries a KV head), then 4 x 2.
            let eights = qn / 8 * 8;
            for n0 in (0..eights).step_by(8) {
                for j in 0..nk {
                    if n0 == 0 {
                        super::prefetch_row(ahead, j, d);
                    }
                    // SAFETY: n0 + 8 <= qn, j < nk.
                    unsafe { dots::<8, 1>(q, k, d, n0, j, s) };
                }
            }
            for n0 in (eights..qn).step_by(4) {
                for j0 in (0..nk).step_by(2) {
                    if n0 == 0 {
                        super::prefetch_row(ahead, j0, d);
                        super::prefetch_row(ahead, j0 + 1, d);
                    }
                    // SAFETY: n0 < qn and j0 < nk; the tiles clip at the ends.
                    unsafe {
                        match (qn - n0, nk - j0) {
                            (1, 1) => dots::<1, 1>(q, k, d, n0, j0, s),
                            (1, _) => dots::<1, 2>(q, k, d, n0, j0, s),
                            (2, 1) => dots::<2, 1>(q, k, d, n0, j0, s),
                            (2, _) => dots::<2, 2>(q, k, d, n0, j0, s),
                            (3, 1) => dots::<3, 1>(q, k, d, n0, j0, s),
                            (3, _) => dots::<3, 2>(q, k, d, n0, j0, s),
                            (_, 1) => dots::<4, 1>(q, k, d, n0, j0, s),
                            _ => dots::<4, 2>(q, k, d, n0, j0, s),
                        }
                    }
                }
            }
        }

        #[target_feature(enable = "avx2,fma")]
        unsafe fn values(p: &[f32], v: &[f32], d: usize, nk: usize, out: &mut [f32]) {
            let qn = out.len() / d;
            assert!(d.is_multiple_of(8) && v.len() >= nk * d && p.len() >= qn * KEY_BLOCK);
            // As the scores: 8 queries x 8 dimensions while 8 queries are left, then 4 x 16.
            let eights = qn / 8 * 8;
            for n0 in (0..eights).step_by(8) {
                for c in (0..d).step_by(8) {
                    // SAFETY: n0 + 8 <= qn, c + 8 <= d.
                    unsafe { sums::<8, 1>(p, v, d, nk, n0, c, out) };
                }
            }
            for n0 in (eights..qn).step_by(4) {
                for c in (0..d).step_by(16) {
                    // SAFETY: n0 < qn, c < d; the tiles clip at the ends.
                    unsafe {
                        match (qn - n0, d - c) {
                            (1, 8) => sums::<1, 1>(p, v, d, nk, n0, c, out),
                            (1, _) => sums::<1, 2>(p, v, d, nk, n0, c, out),
                            (2, 8) => sums::<2, 1>(p, v, d, nk, n0, c, out),
                            (2, _) => sums::<2, 2>(p, v, d, nk, n0, c, out),
                            (3, 8) => sums::<3, 1>(p, v, d, nk, n0, c, out),
                            (3, _) => sums::<3, 2>(p, v, d, nk, n0, c, out),
                            (_, 8) => sums::<4, 1>(p, v, d, nk, n0, c, out),
                            _ => sums::<4, 2>(p, v, d, nk, n0, c, out),
                        }
                    }
                }
            }
        }

        #[target_feature(enable = "avx2,fma")]
        unsafe fn scores_max(x: &mut [f32], scale: f32, mask: Option<&[f32]>) -> f32 {
            let (sc, n) = (_mm256_set1_ps(scale), x.len() / 8 * 8);
            let mut mx = _mm256_set1_ps(f32::NEG_INFINITY);
            for c in (0..n).step_by(8) {
                // SAFETY: c + 8 <= n <= x.len(), and the mask is as long as the row.
                unsafe {
                    let m =
                        mask.map_or(_mm256_setzero_ps(), |m| _mm256_loadu_ps(m[c..c + 8].as_ptr()));
                    let v = _mm256_add_ps(_mm256_mul_ps(_mm256_loadu_ps(x.as_ptr().add(c)), sc), m);
                    _mm256_storeu_ps(x.as_mut_ptr().add(c), v);
                    // a NaN score is passed over, as f32::max does (maxps returns its second
                    // operand when either is NaN)
                    mx = _mm256_max_ps(v, mx);
                }
            }
            let mut lanes = [0f32; 8];
            // SAFETY: lanes holds 8 floats.
            unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), mx) };
            let mut best = lanes.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            for (j, v) in x.iter_mut().enumerate().skip(n) {
                *v = *v * scale + mask.map_or(0.0, |m| m[j]);
                best = best.max(*v);
            }
            best
        }

        #[target_feature(enable = "avx2,fma")]
        unsafe fn exp_sum(x: &mut [f32], max: f32) -> f32 {
            let mut chunks = x.chunks_exact_mut(8);
            let (m, mut acc) = (_mm256_set1_ps(max), _mm256_setzero_ps());
            for c in &mut chunks {
                // SAFETY: c holds 8 floats.
                unsafe {
                    let e = exp8(_mm256_sub_ps(_mm256_loadu_ps(c.as_ptr()), m));
                    _mm256_storeu_ps(c.as_mut_ptr(), e);
                    acc = _mm256_add_ps(acc, e);
                }
            }
            let mut lanes = [0f32; 8];
            // SAFETY: lanes holds 8 floats.
            unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), acc) };
            chunks.into_remainder().iter_mut().fold(super::tree(&lanes), |s, v| {
                *v = exp(*v - max);
                s + *v
            })
        }
    }

    /// Queries n0..n0+R against keys j0..j0+J (R x J <= 8): R x J accumulators of 8 lanes over
    /// the head dimension, then one reduction tree for all of them.
    #[target_feature(enable = "avx2,fma")]
    unsafe fn dots<const R: usize, const J: usize>(
        q: &[f32],
        k: &[f32],
        d: usize,
        n0: usize,
        j0: usize,
        s: &mut [f32],
    ) {
        let mut acc = [[_mm256_setzero_ps(); J]; R];
        let (qp, kp) = (q.as_ptr().add(n0 * d), k.as_ptr().add(j0 * d));
        for c in (0..d).step_by(8) {
            let kv: [__m256; J] = std::array::from_fn(|j| _mm256_loadu_ps(kp.add(j * d + c)));
            for (r, a) in acc.iter_mut().enumerate() {
                let qv = _mm256_loadu_ps(qp.add(r * d + c));
                for (x, &kk) in a.iter_mut().zip(&kv) {
                    *x = _mm256_fmadd_ps(qv, kk, *x);
                }
            }
        }
        let mut v = [_mm256_setzero_ps(); 8];
        for (r, a) in acc.iter().enumerate() {
            for (j, &x) in a.iter().enumerate() {
                v[r * J + j] = x;
            }
        }
        let mut lanes = [0f32; 8];
        _mm256_storeu_ps(lanes.as_mut_ptr(), tree8(v));
        for r in 0..R {
            for j in 0..J {
                s[(n0 + r) * KEY_BLOCK + j0 + j] = lanes[r * J + j];
            }
        }
    }

    /// Lane i of the result is the sum of v[i]'s lanes, added as [`super::tree`] adds them.
    #[target_feature(enable = "avx2,fma")]
    unsafe fn tree8(v: [__m256; 8]) -> __m256 {
        let t0 = _mm256_hadd_ps(v[0], v[1]);
        let t1 = _mm256_hadd_ps(v[2], v[3]);
        let t2 = _mm256_hadd_ps(v[4], v[5]);
        let t3 = _mm256_hadd_ps(v[6], v[7]);
        let (u0, u1) = (_mm256_hadd_ps(t0, t1), _mm256_hadd_ps(t2, t3));
        _mm256_add_ps(
            _mm256_permute2f128_ps::<0x20>(u0, u1),
            _mm256_permute2f128_ps::<0x31>(u0, u1),
        )
    }

    /// `out` rows n0..n0+R at dimensions c..c+8C, plus the block's weighted values: R x C
    /// accumulators, a weight broadcast per (query, key).
    #[target_feature(enable = "avx2,fma")]
    #[allow(clippy::too_many_arguments)]
    unsafe fn sums<const R: usize, const C: usize>(
        p: &[f32],
        v: &[f32],
        d: usize,
        nk: usize,
        n0: usize,
        c: usize,
        out: &mut [f32],
    ) {
        let op = out.as_mut_ptr().add(n0 * d + c);
        let mut acc: [[__m256; C]; R] = std::array::from_fn(|r| {
            std::array::from_fn(|cc| _mm256_loadu_ps(op.add(r * d + cc * 8)))
        });
        let (pp, vp) = (p.as_ptr().add(n0 * KEY_BLOCK), v.as_ptr().add(c));
        for j in 0..nk {
            let vv: [__m256; C] = std::array::from_fn(|cc| _mm256_loadu_ps(vp.add(j * d + cc * 8)));
            for (r, a) in acc.iter_mut().enumerate() {
                let w = _mm256_broadcast_ss(&*pp.add(r * KEY_BLOCK + j));
                for (x, &y) in a.iter_mut().zip(&vv) {
                    *x = _mm256_fmadd_ps(w, y, *x);
                }
            }
        }
        for (r, a) in acc.iter().enumerate() {
            for (cc, &x) in a.iter().enumerate() {
                _mm256_storeu_ps(op.add(r * d + cc * 8), x);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A deterministic spread of values in [-1, 1).
    fn values(n: usize, seed: usize) -> Vec<f32> {
        (0..n).map(|i| (((i * 2654435761 + seed * 40503) % 65521) as f32 / 32760.5) - 1.0).collect()
    }

    /// Attention in f64, one query at a time, the plain softmax.
    fn reference(job: &Job, hh: usize, t: usize) -> Vec<f64> {
        let op = job.op;
        let (d, g) = (op.head_dim, hh / (op.heads / op.kv_heads));
        let q = &job.q[(hh * job.t_len + t) * d..][..d];
        let key = |j: usize| &job.kv[(g * job.cap + j) * d..][..d];
        let val = |j: usize| &job.kv[((op.kv_heads + g) * job.cap + j) * d..][..d];
        let sc: Vec<f64> = (0..op.keys)
            .map(|j| {
                let dot: f64 = q.iter().zip(key(j)).map(|(&a, &b)| a as f64 * b as f64).sum();
                dot * op.scale as f64 + job.mask.map_or(0.0, |m| m[t * op.keys + j] as f64)
            })
            .collect();
        let mx = sc.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let w: Vec<f64> = sc.iter().map(|s| (s - mx).exp()).collect();
        let total: f64 = w.iter().sum();
        (0..d).map(|i| (0..op.keys).map(|j| w[j] * val(j)[i] as f64).sum::<f64>() / total).collect()
    }

    fn run(job: &Job, body: impl Fn(&Job, usize) -> Vec<f32>) -> Vec<f32> {
        let (h, d) = (job.op.heads, job.op.head_dim);
        let group = h / job.op.kv_heads;
        let mut out = vec![0f32; job.t_len * h * d];
        for i in 0..job.tasks() {
            let (g, rows) = (i % job.op.kv_heads, job.rows(i));
            for (n, o) in body(job, i).chunks_exact(d).enumerate() {
                let (hh, t) = (g * group + n / rows.len(), rows.start + n % rows.len());
                out[(t * h + hh) * d..][..d].copy_from_slice(o);
            }
        }
        out
    }

    /// Shapes that cross every edge: GQA groups of 1, 3 and 8; key counts below, at and past
    /// several blocks (with a ragged last one); head dimensions of 8, 24 (a last chunk of 8)
    /// and 128; few rows and a prefill's many (both tile sizes); with and without a
    /// block-causal mask, whose first rows see no key of the last blocks.
    fn cases() -> Vec<(usize, usize, usize, usize, usize, bool)> {
        // (heads, kv_heads, d, t, keys, masked)
        vec![
            (3, 3, 8, 1, 5, false),
            (6, 2, 24, 9, 200, true),
            (8, 1, 128, 4, 130, true),
            (4, 2, 16, 40, 64, true),
            (16, 2, 128, 8, 300, false),
            (2, 1, 128, 70, 333, true),
        ]
    }

    fn with_job(case: (usize, usize, usize, usize, usize, bool), f: impl Fn(&Job)) {
        let (h, kvh, d, t, keys, masked) = case;
        let cap = keys + 3;
        let op = Attention {
            heads: h,
            kv_heads: kvh,
            head_dim: d,
            keys,
            scale: 1.0 / (d as f32).sqrt(),
        };
        let q: Vec<f32> = values(h * t * d, 1).iter().map(|v| v * 3.0).collect();
        let kv = values(2 * kvh * cap * d, 2);
        let mask = masked.then(|| {
            crate::model::layers::attention::block_causal_mask(keys - t, t, 4, keys).unwrap()
        });
        f(&Job { op: &op, q: &q, kv: &kv, mask: mask.as_deref(), t_len: t, cap });
    }

    #[test]
    fn attention_equals_the_plain_softmax_in_f64() {
        for case in cases() {
            with_job(case, |job| {
                let got = run(job, |j, i| j.task(i));
                let (h, d) = (job.op.heads, job.op.head_dim);
                for t in 0..job.t_len {
                    for hh in 0..h {
                        let want = reference(job, hh, t);
                        for (i, (&g, w)) in
                            got[(t * h + hh) * d..][..d].iter().zip(want).enumerate()
                        {
                            assert!(
                                (g as f64 - w).abs() < 2e-6 * (1.0 + w.abs()),
                                "{case:?} row {t} head {hh} dim {i}: {g} vs {w}"
                            );
                        }
                    }
                }
            });
        }
    }

    #[test]
    fn both_bodies_agree_bit_for_bit() {
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
        {
            for case in cases().into_iter().filter(|c| c.2.is_multiple_of(8)) {
                with_job(case, |job| {
                    // SAFETY: detected just above.
                    let simd = run(job, |j, i| unsafe { j.task_with::<avx2::Avx2>(i) });
                    // SAFETY: the portable body needs no feature.
                    assert_eq!(
                        simd,
                        run(job, |j, i| unsafe { j.task_with::<Portable>(i) }),
                        "{case:?}"
                    );
                });
            }
            let mut a: Vec<f32> =
                (0..37).map(|i| -0.7 * i as f32).chain([f32::NEG_INFINITY, -90.0, 0.0]).collect();
            let mask: Vec<f32> =
                (0..a.len()).map(|j| if j % 5 == 3 { f32::NEG_INFINITY } else { 0.0 }).collect();
            let mut b = a.clone();
            // SAFETY: detected above.
            let (ma, mb) = unsafe {
                (
                    avx2::Avx2::scores_max(&mut a, 0.3, Some(&mask)),
                    Portable::scores_max(&mut b, 0.3, Some(&mask)),
                )
            };
            assert_eq!((ma, &a), (mb, &b));
            let (sa, sb) =
                unsafe { (avx2::Avx2::exp_sum(&mut a, ma), Portable::exp_sum(&mut b, mb)) };
            assert_eq!((sa, &a), (sb, &b));
            // a NaN score (an inf or a NaN in q or k) is passed over by both maxima
            let mut a = vec![-10f32; 24];
            (a[0], a[8], a[16]) = (5.0, f32::NAN, 1.0);
            let mut b = a.clone();
            // SAFETY: detected above.
            let (ma, mb) = unsafe {
                (avx2::Avx2::scores_max(&mut a, 1.0, None), Portable::scores_max(&mut b, 1.0, None))
            };
            assert_eq!((ma, mb), (5.0, 5.0));
        }
    }
}
