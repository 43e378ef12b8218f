//! The exponential the CPU kernels use (attention's softmax, SiLU), in 8 AVX2 lanes and one
//! lane at a time with the same operations, so that a kernel's two bodies agree bit for bit.
//!
//! Cephes' single-precision method: range reduction by ln 2 in two parts, a degree-5
//! polynomial, the power of two put in the exponent bits; within 2.5e-7 (about 2 ulp) of the
//! exact value. Hand-written because libm's `expf` is one call an element (4-5 ns: a 16k-key
//! prefill made 2e10 of them) and no crate offers a vector exp with a scalar twin that rounds
//! alike. Arguments are clamped to [-88, 88]: below, the result is 0 (-inf included); above,
//! e^88 (f32's largest power of e is e^88.7).

const LO: f32 = -88.0;
const HI: f32 = 88.0;
const LOG2E: f32 = std::f32::consts::LOG2_E;
const LN2_HI: f32 = 0.693_359_4;
const LN2_LO: f32 = -2.121_944_4e-4;
const POLY: [f32; 6] =
    [1.987_569_1e-4, 1.398_199_9e-3, 8.333_452e-3, 4.166_579_6e-2, 0.166_666_65, 0.5];

/// `e^x`, the operations of [`avx2::exp8`] one lane at a time.
#[allow(clippy::manual_clamp)] // not clamp: a NaN must become LO, as `_mm256_max_ps` makes it
pub fn exp(x: f32) -> f32 {
    let x = x.max(LO).min(HI);
    let n = (x * LOG2E).round_ties_even();
    let r = n.mul_add(-LN2_HI, x);
    let r = n.mul_add(-LN2_LO, r);
    let p = POLY[1..].iter().fold(POLY[0], |p, &c| p.mul_add(r, c));
    let y = p.mul_add(r * r, r) + 1.0;
    // n is in [-127, 127]: a biased exponent of 0 (the value 0) to 254.
    y * f32::from_bits(((n as i32 + 127) as u32) << 23)
}

/// `silu(g) * u = g / (1 + e^-g) * u` for each pair, into `out`.
pub fn silu_mul(g: &[f32], u: &[f32], out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
        // SAFETY: the features were just detected.
        return unsafe { avx2::silu_mul(g, u, out) };
    }
    silu_mul_lanes(g, u, out);
}

fn silu_mul_lanes(g: &[f32], u: &[f32], out: &mut [f32]) {
    for ((o, &g), &u) in out.iter_mut().zip(g).zip(u) {
        *o = g / (1.0 + exp(-g)) * u;
    }
}

#[cfg(target_arch = "x86_64")]
pub mod avx2 {
    use super::{LN2_HI, LN2_LO, LOG2E, POLY};
    use std::arch::x86_64::*;

    /// [`super::exp`] on 8 lanes.
    ///
    /// # Safety
    /// The CPU has AVX2 and FMA.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn exp8(x: __m256) -> __m256 {
        let x =
            _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(super::LO)), _mm256_set1_ps(super::HI));
        let n = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
            _mm256_mul_ps(x, _mm256_set1_ps(LOG2E)),
        );
        let r = _mm256_fmadd_ps(n, _mm256_set1_ps(-LN2_HI), x);
        let r = _mm256_fmadd_ps(n, _mm256_set1_ps(-LN2_LO), r);
        let mut p = _mm256_set1_ps(POLY[0]);
        for &c in &POLY[1..] {
            p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(c));
        }
        let y = _mm256_add_ps(_mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r), _mm256_set1_ps(1.0));
        let e = _mm256_slli_epi32::<23>(_mm256_add_epi32(
            _mm256_cvtps_epi32(n),
            _mm256_set1_epi32(127),
        ));
        _mm256_mul_ps(y, _mm256_castsi256_ps(e))
    }

    /// [`super::silu_mul`], 8 at a time.
    ///
    /// # Safety
    /// The CPU has AVX2 and FMA.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn silu_mul(g: &[f32], u: &[f32], out: &mut [f32]) {
        let n = out.len().min(g.len()).min(u.len());
        let whole = n / 8 * 8;
        let one = _mm256_set1_ps(1.0);
        for i in (0..whole).step_by(8) {
            // SAFETY: i + 8 <= n, within all three slices.
            unsafe {
                let gv = _mm256_loadu_ps(g.as_ptr().add(i));
                let den = _mm256_add_ps(one, exp8(_mm256_sub_ps(_mm256_setzero_ps(), gv)));
                let y = _mm256_mul_ps(_mm256_div_ps(gv, den), _mm256_loadu_ps(u.as_ptr().add(i)));
                _mm256_storeu_ps(out.as_mut_ptr().add(i), y);
            }
        }
        super::silu_mul_lanes(&g[whole..n], &u[whole..n], &mut out[whole..n]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_exponential_is_within_about_two_ulp_of_the_exact_one_and_clamped_outside_its_range() {
        let mut worst = 0f64;
        for i in 0..=400_000 {
            let x = -87.0 + 174.0 * i as f32 / 400_000.0;
            let (got, want) = (exp(x) as f64, (x as f64).exp());
            worst = worst.max(((got - want) / want).abs());
        }
        assert!(worst < 2.5e-7, "worst relative error {worst}");
        assert_eq!(exp(0.0), 1.0);
        assert_eq!((exp(f32::NEG_INFINITY), exp(-100.0)), (0.0, 0.0));
        assert_eq!(exp(f32::INFINITY), exp(88.0));
        assert!(exp(88.0).is_finite() && exp(88.0) > 1e38);
    }

    /// The AVX2 body equals the lanes one bit for bit, ragged tails included, and both are
    /// SiLU to within the exponential's error.
    #[test]
    fn silu_mul_bodies_agree_and_are_silu() {
        let g: Vec<f32> = (0..203)
            .map(|i| (i as f32 - 101.0) * 0.37)
            .chain([f32::NEG_INFINITY, 1e30, -1e30])
            .collect();
        let u: Vec<f32> = (0..g.len()).map(|i| 1.0 + (i % 7) as f32 * 0.5).collect();
        let mut a = vec![0f32; g.len()];
        silu_mul_lanes(&g, &u, &mut a);
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
        {
            let mut b = vec![0f32; g.len()];
            // SAFETY: detected just above.
            unsafe { avx2::silu_mul(&g, &u, &mut b) };
            assert_eq!(
                a.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                b.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
            );
        }
        for ((&y, &g), &u) in a.iter().zip(&g).zip(&u).take(203) {
            let want = g as f64 / (1.0 + (-g as f64).exp()) * u as f64;
            assert!(
                (y as f64 - want).abs() <= 1e-6 * want.abs() + 1e-30,
                "silu({g}) * {u}: {y} vs {want}"
            );
        }
    }
}
