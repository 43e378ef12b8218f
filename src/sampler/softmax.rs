//! The two passes greedy sampling makes over a row of logits (151,936 of them for Qwen3's
//! vocabulary, every row of every pass): its largest value, and the log-partition `ln Σ e^(z-m)`
//! with the mean shifted logit `Σ p (z-m)` that the confidence and the entropy come from.
//!
//! The partition is summed in f64, as the reference always was, but with an exponential of its
//! own instead of libm's `exp` (one call an element: a millisecond a row, 2 ms of a 46 ms
//! qwen3-0.6b pass on this box). [`exp`] is within an ulp or two of f64's exact value, so the
//! f32 results equal libm's except when an f64 sum lies within 1e-16 of an f32 rounding
//! boundary. Hand-written for the same reason as src/model/fastmath.rs: no crate offers a
//! vector f64 exp with a scalar twin that rounds alike, and the AVX2 body and the portable one
//! must agree bit for bit (the same operations, fused where the other fuses, summed in the
//! same lanes and the same order).

/// Below this shifted logit a term is left out of the partition: e^-708 is 3e-308, and the
/// row's largest logit contributes e^0 = 1, so no f64 sum can tell. (-inf, a suppressed token,
/// falls here too, and so does a row that is all -inf: its partition is 0.)
const FLOOR: f64 = -708.0;
const LOG2E: f64 = std::f64::consts::LOG2_E;
/// ln 2 in two parts (fdlibm's): `n * LN2_HI` is exact for the |n| <= 1022 used here.
const LN2_HI: f64 = f64::from_bits(0x3fe6_2e42_fee0_0000);
const LN2_LO: f64 = f64::from_bits(0x3dea_39ef_3579_3c76);
/// 1/0!, 1/1!, ... 1/13!: Taylor's series of e^r to degree 13, whose truncation at |r| <= ln2 / 2
/// is 4e-18, under half an ulp.
const C: [f64; 14] = {
    let mut c = [1.0; 14];
    let mut i = 1;
    while i < 14 {
        c[i] = c[i - 1] / i as f64;
        i += 1;
    }
    c
};
/// Elements a step of the partition sums: 2 AVX2 registers of 4 f64.
const LANES: usize = 8;

/// The largest logit of a row, or `None` when it holds a NaN or +inf (no distribution). An empty
/// row, or one all -inf, has -inf.
pub fn max_finite(z: &[f32]) -> Option<f32> {
    // Exact comparisons only, so any order gives the same answer: written as 16 independent
    // lanes for the compiler to vectorize.
    const W: usize = 16;
    let mut mx = [f32::NEG_INFINITY; W];
    let mut bad = [0u32; W];
    let chunks = z.chunks_exact(W);
    let tail = chunks.remainder();
    for c in chunks {
        for j in 0..W {
            bad[j] |= u32::from(!finite_or_minus_inf(c[j]));
            mx[j] = if c[j] > mx[j] { c[j] } else { mx[j] };
        }
    }
    let mut m = f32::NEG_INFINITY;
    for &v in mx.iter().chain(tail) {
        m = if v > m { v } else { m };
    }
    let bad = bad.iter().any(|&b| b != 0) || tail.iter().any(|&v| !finite_or_minus_inf(v));
    (!bad).then_some(m)
}

/// Neither NaN nor +inf, from the bits (a comparison would vectorize less well).
fn finite_or_minus_inf(v: f32) -> bool {
    let b = v.to_bits();
    (b & 0x7fff_ffff) <= 0x7f80_0000 && b != 0x7f80_0000
}

/// For logits `z` with maximum `m`: `(ln Σ e^(z-m), Σ p (z-m))`, summed in f64. The entropy is
/// their difference and the maximum's probability `e^-(first)`.
pub fn log_partition(z: &[f32], m: f32) -> (f32, f32) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
        // SAFETY: the features were just detected.
        return unsafe { avx2::log_partition(z, m) };
    }
    portable_log_partition(z, m)
}

/// [`log_partition`] one element at a time, in the AVX2 body's lanes.
fn portable_log_partition(z: &[f32], m: f32) -> (f32, f32) {
    let mut lanes = Sums::default();
    let chunks = z.chunks_exact(LANES);
    let tail = chunks.remainder();
    for c in chunks {
        for (j, &v) in c.iter().enumerate() {
            let (e, d) = term((v - m) as f64);
            lanes.sum[j] += e;
            lanes.weighted[j] += e * d;
        }
    }
    lanes.finish(tail, m)
}

/// Per-lane partial sums of the partition and of `e^d · d`.
#[derive(Default)]
struct Sums {
    sum: [f64; LANES],
    weighted: [f64; LANES],
}

impl Sums {
    /// Lanes j and j + 4 (the two registers) added, then the four in a fixed tree, then the tail
    /// one element at a time.
    fn finish(&self, tail: &[f32], m: f32) -> (f32, f32) {
        let fold = |l: &[f64; LANES]| {
            let t: [f64; 4] = std::array::from_fn(|j| l[j] + l[j + 4]);
            (t[0] + t[1]) + (t[2] + t[3])
        };
        let (mut sum, mut weighted) = (fold(&self.sum), fold(&self.weighted));
        for &v in tail {
            let (e, d) = term((v - m) as f64);
            sum += e;
            weighted += e * d;
        }
        (sum.ln() as f32, (weighted / sum) as f32)
    }
}

/// `(e^d, d)` for a term of the partition, `(0, 0)` for one left out (below [`FLOOR`], -inf, or
/// the NaN of an all -inf row).
fn term(d: f64) -> (f64, f64) {
    if d >= FLOOR {
        (exp(d), d)
    } else {
        (0.0, 0.0)
    }
}

/// `e^x` for `x` in [[`FLOOR`], 0] (anything in [-708, 709] works), the operations of
/// [`avx2::exp4`] one lane at a time: `x = n ln2 + r` with |r| <= ln2 / 2, e^r by its series,
/// then times 2^n through the exponent bits.
pub fn exp(x: f64) -> f64 {
    let n = (x * LOG2E).round_ties_even();
    let r = n.mul_add(-LN2_HI, x);
    let r = n.mul_add(-LN2_LO, r);
    // Estrin's scheme: 4 dependent steps where Horner's takes 13 (a Horner exp was latency-bound,
    // 1.7 ns an element in 8 lanes)
    let (r2, q) = (r * r, |i: usize| C[i + 1].mul_add(r, C[i]));
    let r4 = r2 * r2;
    let (s0, s1, s2) = (q(2).mul_add(r2, q(0)), q(6).mul_add(r2, q(4)), q(10).mul_add(r2, q(8)));
    let (o0, o1) = (s1.mul_add(r4, s0), q(12).mul_add(r4, s2));
    let p = o1.mul_add(r4 * r4, o0);
    p * f64::from_bits(((n as i64 + 1023) as u64) << 52)
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::{Sums, C, FLOOR, LANES, LN2_HI, LN2_LO, LOG2E};
    use std::arch::x86_64::*;

    /// [`super::exp`] on 4 lanes.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn exp4(x: __m256d) -> __m256d {
        let n = _mm256_round_pd::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
            _mm256_mul_pd(x, _mm256_set1_pd(LOG2E)),
        );
        let r = _mm256_fmadd_pd(n, _mm256_set1_pd(-LN2_HI), x);
        let r = _mm256_fmadd_pd(n, _mm256_set1_pd(-LN2_LO), r);
        let r2 = _mm256_mul_pd(r, r);
        let r4 = _mm256_mul_pd(r2, r2);
        // (a macro, not a closure: a closure would not inherit the function's target features)
        macro_rules! q {
            ($i:expr) => {
                _mm256_fmadd_pd(_mm256_set1_pd(C[$i + 1]), r, _mm256_set1_pd(C[$i]))
            };
        }
        let (s0, s1, s2) = (
            _mm256_fmadd_pd(q!(2), r2, q!(0)),
            _mm256_fmadd_pd(q!(6), r2, q!(4)),
            _mm256_fmadd_pd(q!(10), r2, q!(8)),
        );
        let (o0, o1) = (_mm256_fmadd_pd(s1, r4, s0), _mm256_fmadd_pd(q!(12), r4, s2));
        let p = _mm256_fmadd_pd(o1, _mm256_mul_pd(r4, r4), o0);
        // n is an integer in [-1022, 1023]: to i32, widened to i64, biased, into the exponent
        let e = _mm256_slli_epi64::<52>(_mm256_add_epi64(
            _mm256_cvtepi32_epi64(_mm256_cvtpd_epi32(n)),
            _mm256_set1_epi64x(1023),
        ));
        _mm256_mul_pd(p, _mm256_castsi256_pd(e))
    }

    /// `(e^d, d)` on 4 lanes, `(0, 0)` where `d` is below the floor or NaN ([`super::term`]).
    #[target_feature(enable = "avx2,fma")]
    unsafe fn term4(d: __m256d) -> (__m256d, __m256d) {
        let keep = _mm256_cmp_pd::<_CMP_GE_OQ>(d, _mm256_set1_pd(FLOOR));
        let d = _mm256_and_pd(d, keep);
        (_mm256_and_pd(exp4(d), keep), d)
    }

    /// [`super::log_partition`], 8 elements a step.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn log_partition(z: &[f32], m: f32) -> (f32, f32) {
        let whole = z.len() / LANES * LANES;
        let mv = _mm256_set1_ps(m);
        let (mut s0, mut s1, mut w0, mut w1) =
            (_mm256_setzero_pd(), _mm256_setzero_pd(), _mm256_setzero_pd(), _mm256_setzero_pd());
        for i in (0..whole).step_by(LANES) {
            // SAFETY: i + 8 <= whole <= z.len().
            let d = _mm256_sub_ps(unsafe { _mm256_loadu_ps(z.as_ptr().add(i)) }, mv);
            let (e0, d0) = term4(_mm256_cvtps_pd(_mm256_castps256_ps128(d)));
            let (e1, d1) = term4(_mm256_cvtps_pd(_mm256_extractf128_ps::<1>(d)));
            s0 = _mm256_add_pd(s0, e0);
            s1 = _mm256_add_pd(s1, e1);
            // a product then a sum, not fused: the portable body's `weighted += e * d`
            w0 = _mm256_add_pd(w0, _mm256_mul_pd(e0, d0));
            w1 = _mm256_add_pd(w1, _mm256_mul_pd(e1, d1));
        }
        let mut lanes = Sums::default();
        // SAFETY: each array holds 8 f64, two stores of 4.
        unsafe {
            _mm256_storeu_pd(lanes.sum.as_mut_ptr(), s0);
            _mm256_storeu_pd(lanes.sum.as_mut_ptr().add(4), s1);
            _mm256_storeu_pd(lanes.weighted.as_mut_ptr(), w0);
            _mm256_storeu_pd(lanes.weighted.as_mut_ptr().add(4), w1);
        }
        lanes.finish(&z[whole..], m)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The reference this replaced: libm's exp, one element at a time, summed in order.
    fn libm_partition(z: &[f32], m: f32) -> (f32, f32) {
        let (mut sum, mut weighted) = (0f64, 0f64);
        for &v in z.iter().filter(|v| **v > f32::NEG_INFINITY) {
            let d = (v - m) as f64;
            let e = d.exp();
            sum += e;
            weighted += e * d;
        }
        (sum.ln() as f32, (weighted / sum) as f32)
    }

    fn rows() -> Vec<Vec<f32>> {
        let mut h = 0x2545_f491_4f6c_dd1du64;
        let mut u = move || {
            h ^= h << 13;
            h ^= h >> 7;
            h ^= h << 17;
            (h >> 40) as f32 / (1u64 << 24) as f32
        };
        let mut out: Vec<Vec<f32>> = [(151_936, 30.0), (4096, 8.0), (13, 3.0), (1000, 900.0)]
            .iter()
            .map(|&(n, spread)| (0..n).map(|_| (u() - 0.5) * spread).collect())
            .collect();
        // suppressed tokens, and terms below the floor beside the maximum
        out[2][3] = f32::NEG_INFINITY;
        out.push(vec![0.0, -800.0, f32::NEG_INFINITY, -707.9, 1e-30]);
        out
    }

    #[test]
    fn exp_is_within_two_ulp_of_libm_over_the_range() {
        let mut worst = 0f64;
        for i in 0..=200_000 {
            let x = FLOOR * i as f64 / 200_000.0 + (i % 7) as f64 * 1e-9;
            let x = x.min(0.0);
            let (got, want) = (exp(x), x.exp());
            worst = worst.max(((got - want) / want).abs() / f64::EPSILON);
        }
        assert!(worst <= 2.0, "worst {worst} ulp");
        assert_eq!(exp(0.0), 1.0);
    }

    #[test]
    fn the_partition_equals_libms_in_f32() {
        for z in rows() {
            let m = max_finite(&z).unwrap();
            let (got, want) = (log_partition(&z, m), libm_partition(&z, m));
            assert_eq!(got, want, "{} logits", z.len());
        }
    }

    #[test]
    fn both_bodies_agree_bit_for_bit() {
        for z in rows() {
            for cut in [0, 1, 7, 8, 9] {
                let z = &z[..z.len().saturating_sub(cut)];
                let m = max_finite(z).unwrap_or(f32::NEG_INFINITY);
                let (a, b) = (log_partition(z, m), portable_log_partition(z, m));
                assert_eq!(
                    (a.0.to_bits(), a.1.to_bits()),
                    (b.0.to_bits(), b.1.to_bits()),
                    "{} logits",
                    z.len()
                );
            }
        }
    }

    #[test]
    fn a_row_all_suppressed_has_no_mass() {
        let z = [f32::NEG_INFINITY; 20];
        assert_eq!(max_finite(&z), Some(f32::NEG_INFINITY));
        let (log_z, _) = log_partition(&z, f32::NEG_INFINITY);
        assert_eq!(log_z, f32::NEG_INFINITY);
        assert_eq!(max_finite(&[]), Some(f32::NEG_INFINITY));
    }

    #[test]
    fn nan_and_plus_infinity_anywhere_have_no_maximum() {
        for bad in [f32::NAN, -f32::NAN, f32::INFINITY] {
            for at in [0, 5, 16, 31, 33] {
                let mut z = vec![0.5f32; 34];
                z[at] = bad;
                assert_eq!(max_finite(&z), None, "{bad} at {at}");
            }
        }
        let z: Vec<f32> = (0..40).map(|i| if i == 20 { 9.0 } else { -(i as f32) }).collect();
        assert_eq!(max_finite(&z), Some(9.0));
        assert_eq!(max_finite(&[f32::MAX, f32::NEG_INFINITY]), Some(f32::MAX));
    }
}
