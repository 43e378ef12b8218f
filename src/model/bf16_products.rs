//! bf16 products, what `--dtype bf16` means on the CPU: each projection's input rounded to bf16
//! (as PyTorch's bf16 models and llama.cpp's bf16 weights round the activations a matmul
//! takes) and multiplied by the stored bf16 weights two products at a time, with AVX512-BF16's
//! `vdpbf16ps`: one instruction is 32 multiply-adds where an f32 FMA is 16, at the same rate
//! on Zen 4. The residual stream, norms, attention and sampling stay f32. A storing pass and a
//! prefill, which f32 products leave bound by the FMA units, become bound by memory again.
//!
//! Layout: panels of [`PANEL`] output columns whose rows are *pairs* of inputs,
//! `[out / 16][in / 2][16][2]` (an odd `in` padded with a zero), so one 64-byte row of a panel
//! is one register: 16 columns x 2 inputs, the lanes the instruction pairs up.
//!
//! The arithmetic, which the portable body reproduces bit for bit (tested against the
//! instruction where the CPU has it, so that a decode gives the same tokens on every machine):
//! each output keeps two f32 sums, A over the even pairs of inputs and B over the odd ones (two
//! sums so that even a 4-row sweep has 8 independent chains to hide the instruction's latency);
//! a pair adds its second product and then its first, each a fused multiply-add rounded to
//! nearest even, with denormal inputs read as zero and tiny results flushed to zero (the
//! instruction's own rules, whatever MXCSR says, with x86's meaning of tiny: see `fma_ftz`;
//! inputs are flushed when they are rounded or packed, so only results need it); the output
//! is A + B.
//!
//! Hand-written because no crate multiplies bf16 by bf16 this way on the CPU: candle's bf16
//! matmul (the `gemm` crate) widens both operands to f32 and runs f32 FMA.

use super::linear::PANEL;

/// Input rows a sweep over a panel: 8 rows x 2 sums = 16 of AVX-512's 32 registers.
pub const ROWS: usize = 8;

/// f32 -> bf16 bits, rounded to nearest even (NaN stays NaN), a denormal flushed to a zero of
/// its sign as the instruction would read it.
pub fn round(v: f32) -> u16 {
    daz(half::bf16::from_f32(v).to_bits())
}

/// A bf16 denormal (exponent bits zero, mantissa not) as the zero of its sign.
pub fn daz(b: u16) -> u16 {
    if b & 0x7f80 == 0 {
        b & 0x8000
    } else {
        b
    }
}

fn widen(b: u16) -> f32 {
    f32::from_bits((b as u32) << 16)
}

/// `a · b + c` as `vdpbf16ps` computes each of its products: one rounding, then a tiny result
/// flushed to the zero of its sign. x86 calls a result tiny by rounding it to 24 bits with an
/// unbounded exponent, not onto the denormal grid, so the line is half a 24-bit step below the
/// smallest normal, `T` = 2^-126 - 2^-151: an exact sum below it is flushed (although the
/// denormal grid rounds some of them up to 2^-126), one at or above it gives 2^-126 or more (a
/// tie rounds to the even 2^-126). f64 decides against `T` exactly: rounding to f64 keeps the
/// order to `T`, which it holds, and only a sum within half an f64 step below `T` could round
/// onto it; that needs bits below 2^-179, but `c` is 0 or a normal f32 (every sum is flushed)
/// and `a · b` has 16 significant bits, so a sum that close to `T` is a multiple of 2^-167.
fn fma_ftz(a: f32, b: f32, c: f32) -> f32 {
    const T: f64 = 1.0 / (1u128 << 126) as f64 - 1.0 / (1u128 << 126) as f64 / (1u64 << 25) as f64;
    let r = a.mul_add(b, c);
    if r == 0.0 || r.abs() > f32::MIN_POSITIVE || !r.is_finite() {
        return r;
    }
    if ((a as f64).mul_add(b as f64, c as f64)).abs() < T {
        0f32.copysign(r)
    } else {
        r
    }
}

/// `x [t, k]` as rounded bf16 pairs, the first input of a pair in the low half (where the
/// panels keep it), an odd `k`'s last pair padded with zero, in groups of [`ROWS`] rows
/// interleaved: `[t / ROWS][k / 2][ROWS]`, so that a sweep's broadcasts for one pair of
/// inputs read one 32-byte run rather than eight rows apart (which for `in` of 3072 or more
/// left the L1 cache). A last group's missing rows are zero.
pub fn pairs(x: &[f32], t: usize, k: usize) -> Vec<u32> {
    let k2 = k.div_ceil(2);
    let mut out = vec![0u32; t.div_ceil(ROWS) * k2 * ROWS];
    for (r, row) in x.chunks_exact(k).take(t).enumerate() {
        let group = &mut out[r / ROWS * k2 * ROWS..][..k2 * ROWS];
        for (i, p) in row.chunks(2).enumerate() {
            let hi = p.get(1).map_or(0, |&v| round(v));
            group[i * ROWS + r % ROWS] = round(p[0]) as u32 | (hi as u32) << 16;
        }
    }
    out
}

/// Where input `i` of column `c` sits in a pair-layout panel.
pub const fn slot(c: usize, i: usize) -> usize {
    (i / 2) * 2 * PANEL + 2 * c + i % 2
}

/// `rows` rows of the group `xs` (`k2` pairs of [`ROWS`], see [`pairs`]) times the panel `pw`,
/// into `acc`: the arithmetic of the module's doc, one scalar at a time.
pub fn portable(pw: &[u16], xs: &[u32], rows: usize, k2: usize, acc: &mut [[f32; PANEL]]) {
    for (r, out) in acc.iter_mut().enumerate().take(rows) {
        let mut sums = [[0f32; PANEL]; 2];
        for (i, wrow) in pw.chunks_exact(2 * PANEL).take(k2).enumerate() {
            let x = xs[i * ROWS + r];
            let (lo, hi) = (widen(x as u16), widen((x >> 16) as u16));
            for (c, s) in sums[i % 2].iter_mut().enumerate() {
                *s = fma_ftz(hi, widen(wrow[2 * c + 1]), *s);
                *s = fma_ftz(lo, widen(wrow[2 * c]), *s);
            }
        }
        for (c, o) in out.iter_mut().enumerate() {
            *o = sums[0][c] + sums[1][c];
        }
    }
}

/// Whether this CPU runs the instruction (checked once; the portable body computes the same
/// numbers more slowly elsewhere).
pub fn native() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        static NATIVE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        // avx512bf16 implies avx512bw to the compiler, which may use it in the enabled bodies
        *NATIVE.get_or_init(|| {
            std::arch::is_x86_feature_detected!("avx512f")
                && std::arch::is_x86_feature_detected!("avx512bw")
                && std::arch::is_x86_feature_detected!("avx512bf16")
        })
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

#[cfg(target_arch = "x86_64")]
pub mod avx512 {
    use super::{PANEL, ROWS};
    use std::arch::x86_64::*;

    /// [`super::portable`] with the instruction, prefetching the panel `ahead` at the same
    /// offsets as it goes (the thread's next panel on its last sweep over this one).
    ///
    /// # Safety
    /// The CPU has AVX512F and AVX512-BF16 ([`super::native`]).
    #[target_feature(enable = "avx512f,avx512bf16")]
    pub unsafe fn sweep(
        pw: &[u16],
        ahead: &[u16],
        xs: &[u32],
        rows: usize,
        k2: usize,
        acc: &mut [[f32; PANEL]],
    ) {
        assert!(rows <= ROWS && acc.len() >= rows);
        // One body per row count, so the sums are registers.
        match rows {
            1 => rows_n::<1>(pw, ahead, xs, k2, acc),
            2 => rows_n::<2>(pw, ahead, xs, k2, acc),
            3 => rows_n::<3>(pw, ahead, xs, k2, acc),
            4 => rows_n::<4>(pw, ahead, xs, k2, acc),
            5 => rows_n::<5>(pw, ahead, xs, k2, acc),
            6 => rows_n::<6>(pw, ahead, xs, k2, acc),
            7 => rows_n::<7>(pw, ahead, xs, k2, acc),
            _ => rows_n::<8>(pw, ahead, xs, k2, acc),
        }
    }

    #[target_feature(enable = "avx512f,avx512bf16")]
    unsafe fn rows_n<const R: usize>(
        pw: &[u16],
        ahead: &[u16],
        xs: &[u32],
        k2: usize,
        acc: &mut [[f32; PANEL]],
    ) {
        const LINE: usize = 2 * PANEL; // u16 a pair row: 64 bytes, one cache line
        assert!(pw.len() >= k2 * LINE && ahead.len() >= k2 * LINE && xs.len() >= ROWS * k2);
        let mut a = [_mm512_setzero_ps(); R];
        let mut b = [_mm512_setzero_ps(); R];
        let (w, x, pre) = (pw.as_ptr(), xs.as_ptr(), ahead.as_ptr());
        // a 512-bit integer register read as 32 bf16 (same bits)
        let bh = |v: __m512i| -> __m512bh { unsafe { std::mem::transmute(v) } };
        let mut i = 0;
        while i + 2 <= k2 {
            // SAFETY: i + 1 < k2, within the lengths asserted above.
            unsafe {
                _mm_prefetch::<_MM_HINT_T1>(pre.add(i * LINE).cast());
                _mm_prefetch::<_MM_HINT_T1>(pre.add((i + 1) * LINE).cast());
                let w0 = bh(_mm512_loadu_si512(w.add(i * LINE).cast()));
                let w1 = bh(_mm512_loadu_si512(w.add((i + 1) * LINE).cast()));
                for r in 0..R {
                    a[r] = _mm512_dpbf16_ps(
                        a[r],
                        w0,
                        bh(_mm512_set1_epi32(*x.add(i * ROWS + r) as i32)),
                    );
                    b[r] = _mm512_dpbf16_ps(
                        b[r],
                        w1,
                        bh(_mm512_set1_epi32(*x.add((i + 1) * ROWS + r) as i32)),
                    );
                }
            }
            i += 2;
        }
        if i < k2 {
            // SAFETY: i < k2, as above.
            unsafe {
                let w0 = bh(_mm512_loadu_si512(w.add(i * LINE).cast()));
                for (r, s) in a.iter_mut().enumerate() {
                    *s = _mm512_dpbf16_ps(
                        *s,
                        w0,
                        bh(_mm512_set1_epi32(*x.add(i * ROWS + r) as i32)),
                    );
                }
            }
        }
        for ((out, s), t) in acc.iter_mut().zip(a).zip(b) {
            // SAFETY: each row of `acc` holds 16 floats.
            unsafe { _mm512_storeu_ps(out.as_mut_ptr(), _mm512_add_ps(s, t)) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stream of bf16 values over many binades, with zeros, denormals, and both signs.
    fn values(n: usize, seed: u64) -> Vec<u16> {
        let mut s = seed | 1;
        (0..n)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                let exp = match s % 16 {
                    0 => 0,                          // zero or a denormal
                    1 => 1 + (s >> 8) as u16 % 40,   // tiny: products underflow
                    _ => 120 + (s >> 8) as u16 % 14, // ordinary activations and weights
                };
                ((s >> 20) as u16 & 0x8000) | exp << 7 | (s >> 32) as u16 & 0x7f
            })
            .collect()
    }

    #[test]
    fn rounding_is_to_nearest_even_and_flushes_denormals() {
        assert_eq!(round(1.0), 0x3f80);
        // 1 + 2^-8 lies halfway between 1 and 1 + 2^-7: to the even one, 1
        assert_eq!(round(1.0 + 1.0 / 256.0), 0x3f80);
        assert_eq!(round(1.0 + 3.0 / 256.0), 0x3f82);
        assert_eq!(round(-2.5), 0xc020);
        assert_eq!(round(1e-39), 0x0000, "a denormal");
        assert_eq!(round(-1e-39), 0x8000);
        assert!(widen(round(f32::NAN)).is_nan());
        let got = pairs(&[1.0, -2.5, 3.0, 3.0, 1.0, -2.5], 2, 3);
        let mut want = [0u32; 2 * ROWS];
        [want[0], want[1], want[ROWS], want[ROWS + 1]] = [0xc020_3f80, 0x3f80_4040, 0x4040, 0xc020];
        assert_eq!(
            got, want,
            "two rows of 3 inputs: pairs interleaved by row, a zero-padded last pair"
        );
    }

    /// A sum that lands in the window below the smallest normal that the denormal grid rounds
    /// up to it but x86 calls tiny: 2^-63 · 2^-63 = 2^-126, then 1.5·2^-75 · -2^-76 more gives
    /// 2^-126 - 0.75·2^-150, which the instruction flushes to zero (found by a review's fuzz;
    /// random values never land there). Just outside the window, 2^-126 - 2^-152 is kept as
    /// 2^-126.
    #[test]
    fn a_sum_just_below_the_smallest_normal_is_flushed_as_the_instruction_does() {
        let run = |lo_x: u16, lo_w: u16| {
            let xs = vec![0x2000u32 << 16 | lo_x as u32; ROWS];
            let pw: Vec<u16> =
                (0..2 * PANEL).map(|i| if i % 2 == 0 { lo_w } else { 0x2000 }).collect();
            let mut a = [[0f32; PANEL]; ROWS];
            portable(&pw, &xs, ROWS, 1, &mut a);
            #[cfg(target_arch = "x86_64")]
            if native() {
                let mut b = [[0f32; PANEL]; ROWS];
                // SAFETY: detected just above.
                unsafe { avx512::sweep(&pw, &pw, &xs, ROWS, 1, &mut b) };
                assert_eq!(
                    a.map(|r| r.map(f32::to_bits)),
                    b.map(|r| r.map(f32::to_bits)),
                    "portable against the instruction"
                );
            }
            a[0][0]
        };
        // 1.5·2^-75 (0x1a40) times -2^-76 (0x9980): in the window, flushed
        assert_eq!(run(0x1a40, 0x9980).to_bits(), 0);
        // 2^-75 (0x1a00) times -2^-77 (0x9900): 2^-126 - 2^-152, above the line: 2^-126
        assert_eq!(run(0x1a00, 0x9900), f32::MIN_POSITIVE);
    }

    /// The portable body against the instruction on values that exercise its rounding, its
    /// flushes and the order of its sums (skipped where the CPU lacks the instruction; the
    /// next test checks the portable body alone).
    #[test]
    fn the_portable_body_equals_the_instruction_bit_for_bit() {
        if !native() {
            eprintln!("no AVX512-BF16 here: nothing to compare the portable body with");
            return;
        }
        for k2 in [1, 2, 3, 64, 67] {
            let pw: Vec<u16> = values(k2 * 2 * PANEL, 7 + k2 as u64).into_iter().map(daz).collect();
            // a group of ROWS rows, interleaved as `pairs` lays them out
            let xs: Vec<u32> = values(2 * ROWS * k2, 3)
                .chunks(2)
                .map(|p| daz(p[0]) as u32 | (daz(p[1]) as u32) << 16)
                .collect();
            for rows in 1..=ROWS {
                let (mut a, mut b) = ([[0f32; PANEL]; ROWS], [[0f32; PANEL]; ROWS]);
                portable(&pw, &xs, rows, k2, &mut a);
                // SAFETY: detected above.
                #[cfg(target_arch = "x86_64")]
                unsafe {
                    avx512::sweep(&pw, &pw, &xs, rows, k2, &mut b)
                };
                for r in 0..rows {
                    let (pa, pb) = (a[r].map(f32::to_bits), b[r].map(f32::to_bits));
                    assert_eq!(pa, pb, "k2 {k2}, {rows} rows, row {r}");
                }
            }
        }
    }

    /// The portable body is the doc's arithmetic: checked on sums small enough to be exact
    /// (then any order gives the plain dot product of the rounded values).
    #[test]
    fn on_exact_values_it_is_the_dot_product_of_the_rounded_inputs() {
        let k = 9;
        let w: Vec<f32> = (0..PANEL * k).map(|i| ((i * 7 % 23) as f32 - 11.0) / 8.0).collect();
        let mut pw = vec![0u16; k.div_ceil(2) * 2 * PANEL];
        for c in 0..PANEL {
            for i in 0..k {
                pw[slot(c, i)] = round(w[c * k + i]);
            }
        }
        let x: Vec<f32> =
            (0..2 * k).map(|i| ((i * 5 % 13) as f32 - 6.0) / 4.0 + 1.0 / 1024.0).collect();
        let mut acc = [[0f32; PANEL]; ROWS];
        portable(&pw, &pairs(&x, 2, k), 2, k.div_ceil(2), &mut acc);
        for r in 0..2 {
            for c in 0..PANEL {
                // rounded inputs are multiples of 2^-10 and weights of 1/8: every sum is exact
                let want: f32 = (0..k).map(|i| widen(round(x[r * k + i])) * w[c * k + i]).sum();
                assert_eq!(acc[r][c], want, "row {r} col {c}");
            }
        }
    }
}
