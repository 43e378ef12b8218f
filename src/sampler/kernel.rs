//! The device sampler (kernels/sampler.cu) as a candle custom op, and its CPU mirror.
//!
//! One op call samples every row of a `[rows, vocab]` logits tensor (bf16 or f32) given one
//! uniform per row and returns `[rows, 4]` f32: token id, confidence, entropy, flag. Flag 1
//! means the row is outside what the kernel decides on its own (top-k above [`KMAX`], or a
//! temperature draw / top-p cut that falls outside the [`KMAX`] most probable tokens); the
//! caller then samples that row with the reference [`super::sample`].
//!
//! [`mirror_row`] is the kernel's algorithm step for step on the CPU: the same per-thread
//! strided online reduction, the same butterfly combine order, the same radix select, ordered
//! gather and serial tail. It is the op's CPU implementation, and its tests check it against
//! the reference sampler, so the kernel's logic is covered by CI without a GPU.

use candle_core::{CpuStorage, CustomOp2, DType, Layout, Shape, Tensor};

#[cfg(test)]
use crate::engine::settings::Sampling;
use crate::engine::settings::{Confidence, SamplerSpec, TopK};

/// Threads per block (NT in the kernel).
pub const NT: usize = 512;
/// Spans each row's online pass is split into, one block each (SEG in the kernel).
pub const SEG: usize = 32;
const WARPS: usize = NT / 32;
/// Most candidates the kernel sorts (KMAX in the kernel).
pub const KMAX: usize = 256;
const TILE_PER_THREAD: usize = 8;

/// What the kernel needs besides the logits and the uniforms.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct KernelParams {
    pub mask_id: u32,
    pub greedy: bool,
    pub inv_t: f32,
    pub top_k: u32,
    pub top_p: f32,
    /// Confidence and entropy from the scaled softmax of the whole row ([`Confidence::Scaled`]),
    /// the row statistics the kernel's first pass has anyway.
    pub scaled: bool,
    /// Top-k keeps every token equal to the k-th as well ([`TopK::TiesKept`]).
    pub ties_kept: bool,
}

impl KernelParams {
    pub fn new(spec: &SamplerSpec, mask_id: u32) -> Self {
        let (sampling, greedy) = (&spec.sampling, spec.is_greedy());
        KernelParams {
            mask_id,
            greedy,
            // The reference divides exactly so: `1.0 / temperature` in f32.
            inv_t: if greedy { 1.0 } else { 1.0 / sampling.temperature },
            top_k: sampling.top_k.min(u32::MAX as usize) as u32,
            top_p: sampling.top_p,
            scaled: !greedy && spec.confidence == Confidence::Scaled,
            ties_kept: spec.top_k_rule == TopK::TiesKept,
        }
    }
}

/// One row's result as the kernel writes it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct KernelSample {
    pub token: u32,
    pub conf: f32,
    pub entropy: f32,
    /// The host must sample this row itself.
    pub overflow: bool,
}

impl KernelSample {
    pub fn from_row(r: &[f32]) -> Self {
        KernelSample { token: r[0] as u32, conf: r[1], entropy: r[2], overflow: r[3] != 0.0 }
    }
}

/// The custom op: `logits [rows, vocab]` (bf16/f32, contiguous), `uniforms [rows]` f32 ->
/// `[rows, 4]` f32.
pub struct SampleOp(pub KernelParams);

/// Samples every row of `logits` with the device kernel (or its CPU mirror on the CPU).
pub fn sample_op(
    logits: &Tensor,
    uniforms: &Tensor,
    params: KernelParams,
) -> candle_core::Result<Tensor> {
    logits.apply_op2_no_bwd(uniforms, &SampleOp(params))
}

fn check_shapes(l1: &Layout, l2: &Layout) -> candle_core::Result<(usize, usize)> {
    let (rows, vocab) = l1.shape().dims2()?;
    if l2.shape().dims1()? != rows {
        candle_core::bail!("unmask-sample: {rows} rows of logits but {:?} uniforms", l2.shape());
    }
    if l1.contiguous_offsets().is_none() || l2.contiguous_offsets().is_none() {
        candle_core::bail!("unmask-sample: inputs must be contiguous");
    }
    if vocab == 0 || vocab >= (1 << 24) {
        candle_core::bail!("unmask-sample: vocabulary of {vocab} is outside 1..2^24");
    }
    Ok((rows, vocab))
}

impl CustomOp2 for SampleOp {
    fn name(&self) -> &'static str {
        "unmask-sample"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let (rows, vocab) = check_shapes(l1, l2)?;
        let (o1, _) = l1.contiguous_offsets().expect("checked");
        let (o2, _) = l2.contiguous_offsets().expect("checked");
        let logits: Vec<f32> = match s1 {
            CpuStorage::F32(v) => v[o1..o1 + rows * vocab].to_vec(),
            CpuStorage::BF16(v) => v[o1..o1 + rows * vocab].iter().map(|x| x.to_f32()).collect(),
            CpuStorage::F16(v) => v[o1..o1 + rows * vocab].iter().map(|x| x.to_f32()).collect(),
            _ => candle_core::bail!("unmask-sample: logits must be f32, bf16 or f16"),
        };
        let CpuStorage::F32(u) = s2 else {
            candle_core::bail!("unmask-sample: uniforms must be f32")
        };
        let mut out = Vec::with_capacity(rows * 4);
        for r in 0..rows {
            let s = mirror_row(&logits[r * vocab..(r + 1) * vocab], &self.0, u[o2 + r]);
            out.extend_from_slice(&[
                s.token as f32,
                s.conf,
                s.entropy,
                if s.overflow { 1.0 } else { 0.0 },
            ]);
        }
        Ok((CpuStorage::F32(out), Shape::from((rows, 4))))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s1: &candle_core::CudaStorage,
        l1: &Layout,
        s2: &candle_core::CudaStorage,
        l2: &Layout,
    ) -> candle_core::Result<(candle_core::CudaStorage, Shape)> {
        let (rows, vocab) = check_shapes(l1, l2)?;
        super::cuda::launch(s1, l1, s2, l2, rows, vocab, &self.0)
    }
}

/// Dtype the op accepts for logits without a conversion.
pub fn native_dtype(dt: DType) -> bool {
    matches!(dt, DType::F32 | DType::BF16)
}

// ---------------------------------------------------------------------------------------------
// The CPU mirror. Every function below corresponds to the kernel function of the same name.

#[derive(Clone, Copy, Debug)]
struct Acc {
    m: f32,
    s: f32,
    w: f32,
    arg: u32,
    n: u32,
}

const EMPTY: Acc = Acc { m: f32::NEG_INFINITY, s: 0.0, w: 0.0, arg: u32::MAX, n: 0 };

fn acc_push(a: &mut Acc, x: f32, i: u32) {
    a.n += 1;
    if a.s == 0.0 {
        a.m = x;
        a.s = 1.0;
        a.w = 0.0;
        a.arg = i;
    } else if x > a.m {
        let d = a.m - x;
        let e = d.exp();
        a.w = e * (a.w + d * a.s);
        a.s = e * a.s + 1.0;
        a.m = x;
        a.arg = i;
    } else {
        let d = x - a.m;
        let e = d.exp();
        a.s += e;
        a.w += e * d;
    }
}

fn acc_combine(mut a: Acc, mut b: Acc) -> Acc {
    if b.s == 0.0 {
        a.n += b.n;
        return a;
    }
    if a.s == 0.0 {
        b.n += a.n;
        return b;
    }
    let m = a.m.max(b.m);
    let arg = if a.m > b.m {
        a.arg
    } else if b.m > a.m {
        b.arg
    } else {
        a.arg.min(b.arg)
    };
    let (da, db) = (a.m - m, b.m - m);
    let (ea, eb) = (da.exp(), db.exp());
    Acc {
        m,
        s: ea * a.s + eb * b.s,
        w: ea * (a.w + da * a.s) + eb * (b.w + db * b.s),
        arg,
        n: a.n + b.n,
    }
}

/// The butterfly of `__shfl_xor_sync` with offsets 16..1; returns lane 0's value.
fn acc_warp(lanes: &[Acc; 32]) -> Acc {
    let mut v = *lanes;
    for off in [16usize, 8, 4, 2, 1] {
        let prev = v;
        for l in 0..32 {
            v[l] = acc_combine(prev[l], prev[l ^ off]);
        }
    }
    v[0]
}

fn fkey(x: f32) -> u32 {
    let u = x.to_bits();
    if u & 0x8000_0000 != 0 {
        !u
    } else {
        u | 0x8000_0000
    }
}

fn fkey_inv(k: u32) -> f32 {
    f32::from_bits(if k & 0x8000_0000 != 0 { k & 0x7fff_ffff } else { !k })
}

fn value_at(row: &[f32], i: usize, p: &KernelParams) -> Option<f32> {
    if i as u32 == p.mask_id {
        return None;
    }
    let z = row[i];
    let x = if p.greedy { z } else { z * p.inv_t };
    (x > f32::NEG_INFINITY).then_some(x)
}

/// The kernel's `sample_row` for one row.
pub fn mirror_row(row: &[f32], p: &KernelParams, u: f32) -> KernelSample {
    let vocab = row.len();
    // 1. online pass over SEG spans (one block each): thread `tid` of span `seg` takes ids
    //    lo + tid, lo + tid + NT, ... below hi; the spans' partials combine by a butterfly
    let span = vocab.div_ceil(SEG);
    let mut parts = [EMPTY; SEG];
    for (seg, part) in parts.iter_mut().enumerate() {
        let (lo, hi) = (seg * span, ((seg + 1) * span).min(vocab));
        let mut threads = [EMPTY; NT];
        for (tid, a) in threads.iter_mut().enumerate() {
            let mut i = lo + tid;
            while i < hi {
                if let Some(x) = value_at(row, i, p) {
                    acc_push(a, x, i as u32);
                }
                i += NT;
            }
        }
        let mut warp_acc = [EMPTY; 32];
        for w in 0..WARPS {
            let lanes: &[Acc; 32] = threads[w * 32..w * 32 + 32].try_into().expect("32 lanes");
            warp_acc[w] = acc_warp(lanes);
        }
        *part = acc_warp(&warp_acc);
    }
    let t = acc_warp(&parts);

    if p.greedy {
        return KernelSample {
            token: t.arg,
            conf: 1.0 / t.s,
            entropy: t.s.ln() - t.w / t.s,
            overflow: false,
        };
    }

    // 2. mode
    let overflow = KernelSample { token: t.arg, conf: 0.0, entropy: 0.0, overflow: true };
    let truncates = p.top_k > 0 && (p.top_k as usize) < vocab;
    let (k, partial) = if truncates && p.top_k as usize <= KMAX {
        ((p.top_k).min(t.n) as usize, false)
    } else if truncates {
        return overflow;
    } else if t.n as usize <= KMAX {
        (t.n as usize, false)
    } else {
        (KMAX, true)
    };
    if k == 0 {
        return overflow;
    }

    // 3. radix select of the k-th largest key; the last digit's count is every key equal to it
    let (mut prefix, mut kk, mut pmask, mut equal) = (0u32, k as u32, 0u32, 0u32);
    for shift in [24u32, 16, 8, 0] {
        let mut hist = [0u32; 256];
        for i in 0..vocab {
            if let Some(x) = value_at(row, i, p) {
                let key = fkey(x);
                if key & pmask == prefix {
                    hist[((key >> shift) & 255) as usize] += 1;
                }
            }
        }
        let (mut cum, mut d) = (0u32, 255u32);
        for dd in (0..256).rev() {
            if cum + hist[dd] >= kk {
                d = dd as u32;
                break;
            }
            cum += hist[dd];
        }
        prefix |= d << shift;
        kk -= cum;
        pmask |= 255 << shift;
        equal = hist[d as usize];
    }
    let (thr, need) = (prefix, kk as usize);
    let n_above = k - need;
    // TopK::TiesKept: every key equal to the k-th, so k grows (past KMAX: the host's row)
    let (k, need) = match p.ties_kept && truncates {
        true => (n_above + equal as usize, equal as usize),
        false => (k, need),
    };
    if k > KMAX {
        return overflow;
    }

    // 4. gather: keys above thr, then the `need` lowest ids whose key equals thr
    let composite = |key: u32, i: usize| ((key as u64) << 32) | (0xffff_ffff - i as u32) as u64;
    let mut cand = vec![0u64; KMAX];
    let (mut n_gt, mut n_eq) = (0usize, 0usize);
    for i in 0..vocab {
        if let Some(x) = value_at(row, i, p) {
            let key = fkey(x);
            if key > thr {
                if n_gt < n_above {
                    cand[n_gt] = composite(key, i);
                }
                n_gt += 1;
            } else if key == thr && n_eq < need {
                cand[n_above + n_eq] = composite(key, i);
                n_eq += 1;
            }
        }
    }
    debug_assert_eq!(n_gt, n_above, "radix select and gather disagree");
    let _ = TILE_PER_THREAD; // tiles only change which thread finds what, not the result

    // 5. sort, descending: value desc, id asc (the keys are distinct)
    cand.sort_unstable_by(|a, b| b.cmp(a));

    // 6. the reference's tail
    let m = fkey_inv((cand[0] >> 32) as u32);
    let mut pe = Vec::with_capacity(k);
    let mut pid = Vec::with_capacity(k);
    for &c in &cand[..k] {
        let x = fkey_inv((c >> 32) as u32);
        let e = (x - m).exp();
        if e > 0.0 {
            pe.push(e);
            pid.push(0xffff_ffff - (c & 0xffff_ffff) as u32);
        }
    }
    // Confidence::Scaled: the chosen candidate's probability and the entropy under the whole
    // scaled row, from the first pass's statistics
    let scaled = |c: usize, s: KernelSample| match p.scaled {
        true => KernelSample {
            conf: (fkey_inv((cand[c] >> 32) as u32) - t.m).exp() / t.s,
            entropy: t.s.ln() - t.w / t.s,
            ..s
        },
        false => s,
    };
    let n = pe.len();
    let total: f32 = if partial { t.s } else { pe.iter().fold(0.0, |acc, &e| acc + e) };
    let mut keep = n;
    if p.top_p < 1.0 {
        let mut cum = 0.0f32;
        let mut reached = false;
        for (c, &e) in pe.iter().enumerate() {
            cum += e / total;
            // past p, as the references cut (a token goes once the mass before it exceeds p)
            if cum > p.top_p {
                keep = c + 1;
                reached = true;
                break;
            }
        }
        if !reached && partial {
            return overflow;
        }
    }
    if !partial || p.top_p < 1.0 {
        let total2 = pe[..keep].iter().fold(0.0f32, |acc, &e| acc + e);
        let probs: Vec<f32> = pe[..keep].iter().map(|&e| e / total2).collect();
        let entropy =
            probs.iter().filter(|&&q| q > 0.0).fold(0.0f32, |acc, &q| acc + (-q) * q.ln());
        let mut cum = 0.0f32;
        let mut chosen = keep - 1;
        for (c, &q) in probs.iter().enumerate() {
            cum += q;
            if u < cum {
                chosen = c;
                break;
            }
        }
        return scaled(
            chosen,
            KernelSample { token: pid[chosen], conf: probs[chosen], entropy, overflow: false },
        );
    }
    let entropy = t.s.ln() - t.w / t.s;
    let mut cum = 0.0f32;
    for (c, &e) in pe.iter().enumerate() {
        let q = e / total;
        cum += q;
        if u < cum {
            return scaled(c, KernelSample { token: pid[c], conf: q, entropy, overflow: false });
        }
    }
    overflow
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sampler::sample;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    fn params(s: &SamplerSpec, mask: u32) -> KernelParams {
        KernelParams::new(s, mask)
    }

    /// The reference on the row as the engine hands it over (mask set to -inf).
    fn reference(row: &[f32], s: &SamplerSpec, mask: u32, u: f32) -> crate::sampler::PosSample {
        let mut r = row.to_vec();
        if let Some(z) = r.get_mut(mask as usize) {
            *z = f32::NEG_INFINITY;
        }
        sample(&r, s, u)
    }

    /// Logits like a model's, optionally rounded to bf16 (many exact ties).
    fn random_row(rng: &mut ChaCha8Rng, vocab: usize, scale: f32, bf16: bool) -> Vec<f32> {
        (0..vocab)
            .map(|_| {
                // sum of uniforms: roughly normal, heavier top with the cube
                let g: f32 = (0..4).map(|_| rng.random::<f32>() - 0.5).sum::<f32>();
                let z = scale * g * g.abs();
                if bf16 {
                    half::bf16::from_f32(z).to_f32()
                } else {
                    z
                }
            })
            .collect()
    }

    fn close(a: f32, b: f32, tol: f32) -> bool {
        (a - b).abs() <= tol * (1.0 + b.abs())
    }

    /// Checks the mirror against the reference; returns how many rows overflowed.
    fn check(
        rows: usize,
        vocab: usize,
        s: SamplerSpec,
        seed: u64,
        scale: f32,
        bf16: bool,
    ) -> usize {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let mask = (vocab - 1) as u32;
        let mut overflowed = 0;
        for r in 0..rows {
            let row = random_row(&mut rng, vocab, scale, bf16);
            let u = if s.is_greedy() { 0.0 } else { rng.random::<f32>() };
            let got = mirror_row(&row, &params(&s, mask), u);
            if got.overflow {
                overflowed += 1;
                continue;
            }
            let want = reference(&row, &s, mask, u);
            assert_ne!(got.token, mask, "row {r}: the mask is never sampled");
            assert_eq!(got.token, want.token, "row {r} {s:?} u={u}: {got:?} vs {want:?}");
            assert!(close(got.conf, want.conf, 1e-5), "row {r} {s:?}: conf {got:?} vs {want:?}");
            assert!(
                close(got.entropy, want.entropy, 1e-4),
                "row {r} {s:?}: entropy {got:?} vs {want:?}"
            );
        }
        overflowed
    }

    fn temp(t: f32, k: usize, p: f32) -> SamplerSpec {
        Sampling { temperature: t, top_k: k, top_p: p, seed: 0 }.into()
    }

    #[test]
    fn greedy_matches_reference_with_ties_and_mask() {
        assert_eq!(check(40, 3000, SamplerSpec::default(), 1, 8.0, true), 0);
        assert_eq!(check(40, 354, SamplerSpec::default(), 2, 3.0, false), 0);
    }

    #[test]
    fn greedy_tie_goes_to_lowest_id_across_threads() {
        // spans of 2 NT ids: 7 + NT (the thread of 7, pushed after it), 700 (another thread of
        // span 0), 5 * 2 NT + 3 (span 5), the last id (the mask) all share the max with 7
        let vocab = SEG * 2 * NT;
        let mut row = vec![0.0f32; vocab];
        for i in [7 + NT, 700, 5 * 2 * NT + 3, 7, vocab - 1] {
            row[i] = 5.0;
        }
        let p = params(&SamplerSpec::default(), vocab as u32 - 1);
        let got = mirror_row(&row, &p, 0.0);
        assert_eq!(got.token, 7);
        // without 7, the lowest of the rest
        row[7] = 0.0;
        assert_eq!(mirror_row(&row, &p, 0.0).token, 7 + NT as u32);
        row[7 + NT] = 0.0;
        assert_eq!(mirror_row(&row, &p, 0.0).token, 700);
        row[700] = 0.0;
        assert_eq!(
            mirror_row(&row, &p, 0.0).token,
            5 * 2 * NT as u32 + 3,
            "a later span's max wins"
        );
        // the mask holds the max: never chosen
        let mut row = vec![0.0f32; 100];
        row[99] = 9.0;
        row[3] = 1.0;
        assert_eq!(mirror_row(&row, &params(&SamplerSpec::default(), 99), 0.0).token, 3);
    }

    #[test]
    fn top_k_matches_reference_exactly() {
        for (k, seed) in [(1usize, 3u64), (2, 4), (5, 5), (50, 6), (256, 7)] {
            assert_eq!(check(20, 5000, temp(0.8, k, 1.0), seed, 6.0, true), 0, "k={k}");
            assert_eq!(check(10, 5000, temp(1.3, k, 0.9), seed + 100, 6.0, false), 0, "k={k} p");
        }
    }

    #[test]
    fn scaled_confidence_matches_reference() {
        let scaled = |s: SamplerSpec| SamplerSpec { confidence: Confidence::Scaled, ..s };
        assert_eq!(check(20, 5000, scaled(temp(0.8, 20, 0.9)), 31, 6.0, true), 0, "exact mode");
        assert_eq!(
            check(10, 200, scaled(temp(0.7, 0, 1.0)), 32, 2.0, false),
            0,
            "every token a candidate"
        );
        let peaked = check(20, 20000, scaled(temp(1.0, 0, 1.0)), 33, 20.0, true);
        assert!(peaked < 20, "partial mode decides most peaked rows ({peaked} overflowed)");
        assert_eq!(
            check(10, 3000, scaled(SamplerSpec::default()), 34, 8.0, true),
            0,
            "greedy is unchanged"
        );
    }

    #[test]
    fn top_p_keeps_the_token_whose_preceding_mass_equals_p() {
        let row = [1.0f32; 4];
        let got = mirror_row(&row, &params(&temp(1.0, 0, 0.5), 99), 0.999);
        assert_eq!((got.token, got.overflow), (2, false));
        assert!(close(got.conf, 1.0 / 3.0, 1e-6), "{got:?}");
    }

    #[test]
    fn small_vocabulary_needs_no_bound() {
        // every token fits in KMAX: top-k off and top-p on or off are exact
        assert_eq!(check(30, 200, temp(1.0, 0, 1.0), 8, 2.0, true), 0);
        assert_eq!(check(30, 200, temp(0.7, 0, 0.5), 9, 2.0, false), 0);
        assert_eq!(check(30, 200, temp(0.7, 500, 1.0), 10, 2.0, false), 0, "k >= vocab is off");
    }

    #[test]
    fn large_vocabulary_without_top_k_is_exact_or_flagged() {
        // peaked rows: the draw lands inside the 256 best, no overflow
        let peaked = check(20, 20000, temp(1.0, 0, 1.0), 11, 20.0, true);
        assert!(peaked < 20, "peaked rows mostly decided on the device ({peaked} overflowed)");
        // top-p on a peaked row: decided
        assert_eq!(check(20, 20000, temp(0.5, 0, 0.8), 12, 20.0, false), 0);
        // flat rows: the nucleus needs far more than 256 tokens -> flagged, never wrong
        let flat = check(10, 20000, temp(1.0, 0, 0.95), 13, 0.1, false);
        assert_eq!(flat, 10);
    }

    #[test]
    fn top_k_above_the_bound_is_flagged() {
        let row = vec![0.5f32; 1000];
        let got = mirror_row(&row, &params(&temp(1.0, 300, 1.0), 0), 0.3);
        assert!(got.overflow);
    }

    #[test]
    fn ties_at_the_top_k_boundary_take_the_lowest_ids() {
        // values: 3.0 at ids 10, 20; 2.0 at ids 5, 15, 25, 35; rest 0. top_k = 4 keeps 10, 20, 5, 15.
        let mut row = vec![0.0f32; 600];
        row[10] = 3.0;
        row[20] = 3.0;
        for i in [35usize, 5, 25, 15] {
            row[i] = 2.0;
        }
        let s = temp(1.0, 4, 1.0);
        for u in [0.0f32, 0.3, 0.6, 0.99] {
            let got = mirror_row(&row, &params(&s, 599), u);
            let want = reference(&row, &s, 599, u);
            assert_eq!((got.token, got.overflow), (want.token, false), "u={u}");
            assert!(close(got.conf, want.conf, 1e-6) && close(got.entropy, want.entropy, 1e-6));
        }
        // the draw at the end of the CDF lands on the 4th: id 15, not 25 or 35
        assert_eq!(mirror_row(&row, &params(&s, 599), 0.999).token, 15);
        // generate.py's rule keeps every token equal to the 4th: 10, 20, then 5, 15, 25, 35
        let kept = SamplerSpec { top_k_rule: TopK::TiesKept, ..s };
        for u in [0.0f32, 0.3, 0.6, 0.999] {
            let got = mirror_row(&row, &params(&kept, 599), u);
            let want = reference(&row, &kept, 599, u);
            assert_eq!((got.token, got.overflow), (want.token, false), "u={u}");
            assert!(close(got.conf, want.conf, 1e-6) && close(got.entropy, want.entropy, 1e-6));
        }
        assert_eq!(mirror_row(&row, &params(&kept, 599), 0.999).token, 35);
    }

    #[test]
    fn top_k_with_ties_kept_matches_reference() {
        let kept = |s: SamplerSpec| SamplerSpec { top_k_rule: TopK::TiesKept, ..s };
        // bf16 rows: many exact ties at the k-th
        for (k, seed) in [(1usize, 41u64), (5, 42), (20, 43), (200, 44)] {
            assert_eq!(check(20, 3000, kept(temp(0.8, k, 1.0)), seed, 6.0, true), 0, "k={k}");
            assert_eq!(
                check(10, 3000, kept(temp(1.1, k, 0.9)), seed + 10, 6.0, true),
                0,
                "k={k} p"
            );
        }
        // more ties than the kernel holds: the host decides
        let row = vec![0.5f32; 1000];
        assert!(mirror_row(&row, &params(&kept(temp(1.0, 10, 1.0)), 0), 0.3).overflow);
    }

    #[test]
    fn op_runs_on_cpu_tensors() {
        use candle_core::Device;
        let mut rng = ChaCha8Rng::seed_from_u64(21);
        let (rows, vocab) = (4, 1000);
        let data: Vec<f32> =
            (0..rows).flat_map(|_| random_row(&mut rng, vocab, 5.0, true)).collect();
        let logits = Tensor::from_vec(data.clone(), (rows, vocab), &Device::Cpu).unwrap();
        let us = [0.1f32, 0.5, 0.9, 0.99];
        let u = Tensor::new(&us, &Device::Cpu).unwrap();
        for s in [SamplerSpec::default(), temp(0.9, 40, 0.9)] {
            for lg in [logits.clone(), logits.to_dtype(DType::BF16).unwrap()] {
                let out = sample_op(&lg, &u, params(&s, 3)).unwrap().to_vec2::<f32>().unwrap();
                for r in 0..rows {
                    let got = KernelSample::from_row(&out[r]);
                    let want = reference(&data[r * vocab..(r + 1) * vocab], &s, 3, us[r]);
                    assert_eq!(got.token, want.token);
                    assert!(!got.overflow);
                }
            }
        }
    }
}
