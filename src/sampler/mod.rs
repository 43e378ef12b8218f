//! Per-position sampling (token, confidence, entropy) and the unmasking strategies.
//! Pure functions of numbers: no model, no I/O. docs/decoding.md is the specification.

#[cfg(feature = "cuda")]
pub mod cuda;
pub mod kernel;
mod softmax;
pub mod strategy;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::engine::settings::{Confidence, SamplerSpec, Sampling, TopK};

/// What the sampler made of one position's logits.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PosSample {
    pub token: u32,
    /// Probability of `token` under the distribution `SamplerSpec::confidence` names: the one it
    /// was drawn from, or the temperature-scaled one before top-k and top-p.
    pub conf: f32,
    /// Entropy (nats) of that distribution.
    pub entropy: f32,
}

/// One of the most probable tokens of a position, with its probability under the distribution
/// the position's confidence is read from (as [`PosSample::conf`]): `--candidates K` keeps K of them.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Ranked {
    pub token: u32,
    pub p: f32,
}

/// The most candidates `--candidates` keeps per position: enough to read a margin and the
/// runners-up, few enough that a trace stays readable (every masked position of every step
/// carries them).
pub const MAX_CANDIDATES: usize = 16;

/// The seeded stream of uniforms, one per sampled position. Greedy decoding draws none, so a
/// greedy trace does not depend on the seed.
pub struct Uniforms(ChaCha8Rng);

impl Uniforms {
    pub fn new(seed: u64) -> Self {
        Uniforms(ChaCha8Rng::seed_from_u64(seed))
    }

    /// One uniform in [0, 1) per position, or none when greedy.
    pub fn draw(&mut self, n: usize, sampling: &Sampling) -> Vec<f32> {
        if sampling.is_greedy() {
            return vec![0.0; n];
        }
        (0..n).map(|_| self.0.random::<f32>()).collect()
    }
}

/// Samples one position. `u` is this position's uniform (ignored when greedy).
///
/// A row holding NaN or +inf (NaN/Inf weights, an overflowing activation) has no distribution:
/// its sample says so with a NaN `conf` and `entropy`, which [`PosSample::is_valid`] reports and
/// the decode loop turns into an error naming the position, rather than a made-up token.
pub fn sample(logits: &[f32], sampling: &SamplerSpec, u: f32) -> PosSample {
    sample_ranked(logits, sampling, u, 0).0
}

/// [`sample`], and the `k` most probable tokens of the distribution it draws from, most
/// probable first (ties: the lower id first), tokens of probability 0 left out (so fewer than
/// `k` when top-k or top-p keep fewer). `k == 0` allocates nothing.
pub fn sample_ranked(
    logits: &[f32],
    sampling: &SamplerSpec,
    u: f32,
    k: usize,
) -> (PosSample, Vec<Ranked>) {
    // NaN and +inf have no place in a distribution; -inf (a suppressed token) is fine.
    let Some(max) = softmax::max_finite(logits).filter(|_| !logits.is_empty()) else {
        return (PosSample::INVALID, Vec::new());
    };
    if sampling.is_greedy() {
        let g = Greedy::of(logits, max);
        let top = if k == 0 { Vec::new() } else { g.ranked(logits, k) };
        return (g.sample(), top);
    }
    let inv_t = 1.0 / sampling.sampling.temperature;
    match filtered(
        logits,
        inv_t,
        (sampling.sampling.top_k, sampling.top_k_rule),
        sampling.sampling.top_p,
    ) {
        Some(kept) => {
            let top = kept.iter().take(k).map(|&(token, p)| Ranked { token, p }).collect();
            let drawn = draw(&kept, u);
            match sampling.confidence {
                Confidence::Drawn => (drawn, top),
                Confidence::Scaled => rescored(logits, inv_t, drawn, top),
            }
        }
        // So cold that the scaled logits overflow: the distribution is its zero-temperature
        // limit, all mass on the argmax (what greedy picks, with certainty).
        None => {
            let s = PosSample { conf: 1.0, entropy: 0.0, ..Greedy::of(logits, max).sample() };
            let top = if k == 0 { Vec::new() } else { vec![Ranked { token: s.token, p: 1.0 }] };
            (s, top)
        }
    }
}

/// `drawn` and `top` with their probabilities, and the entropy, taken from the softmax of the
/// whole row scaled by `inv_t` ([`Confidence::Scaled`]) rather than from the filtered one.
fn rescored(
    logits: &[f32],
    inv_t: f32,
    drawn: PosSample,
    top: Vec<Ranked>,
) -> (PosSample, Vec<Ranked>) {
    // x = z * inv_t, as `filtered` scales (and as the device kernel does)
    let scaled: Vec<f32> = logits.iter().map(|&z| z * inv_t).collect();
    // `filtered` found a finite largest scaled logit, so this row has one
    let max = softmax::max_finite(&scaled).unwrap_or(0.0);
    let (log_z, mean_shifted) = softmax::log_partition(&scaled, max);
    let p = |t: u32| ((scaled[t as usize] - max) - log_z).exp();
    let top = top.into_iter().map(|r| Ranked { p: p(r.token), ..r }).collect();
    let entropy = log_z - mean_shifted + 0.0;
    (PosSample { token: drawn.token, conf: p(drawn.token), entropy }, top)
}

impl PosSample {
    /// What [`sample`] returns for a row without a distribution.
    pub const INVALID: PosSample = PosSample { token: 0, conf: f32::NAN, entropy: f32::NAN };

    /// Whether this sample came from a real distribution (finite confidence and entropy).
    pub fn is_valid(&self) -> bool {
        self.conf.is_finite() && self.entropy.is_finite()
    }
}

/// The softmax of a row, as much of it as greedy decoding needs.
struct Greedy {
    best: u32,
    max: f32,
    /// ln Σ e^(z - max).
    log_z: f32,
    /// Σ p (z - max).
    mean_shifted: f32,
}

impl Greedy {
    /// `max`: the row's largest logit ([`softmax::max_finite`]).
    fn of(logits: &[f32], max: f32) -> Self {
        // The lowest id of the largest logit (a tie goes to it); an all -inf row has id 0.
        let best = logits.iter().position(|&z| z == max).unwrap_or(0);
        let (log_z, mean_shifted) = softmax::log_partition(logits, max);
        Greedy { best: best as u32, max, log_z, mean_shifted }
    }

    fn sample(&self) -> PosSample {
        // (+ 0.0: a certain row's 0 - 0 is -0, which traces and tables would spell "-0")
        PosSample {
            token: self.best,
            conf: (-self.log_z).exp(),
            entropy: self.log_z - self.mean_shifted + 0.0,
        }
    }

    /// The `k` largest logits as probabilities, most probable first, the lower id first on a
    /// tie: one pass keeping a sorted list of at most `k` (k is at most [`MAX_CANDIDATES`]:
    /// a full sort of a 151,936-token row per position would cost more than the pass).
    fn ranked(&self, logits: &[f32], k: usize) -> Vec<Ranked> {
        let top = top_scaled(logits, 1.0, k);
        // The argmax's probability is e^-(log_z), exactly `conf`: the same expression.
        top.into_iter()
            .map(|(token, z)| Ranked { token, p: ((z - self.max) - self.log_z).exp() })
            .filter(|r| r.p > 0.0)
            .collect()
    }
}

/// Most tokens [`top_scaled`] selects; a larger top-k takes a selection over the whole row.
const SCAN_K: usize = 256;

/// The `k` largest of `z[i] * scale` with their ids, largest first in f32's total order
/// (`total_cmp`: +0 above -0), equal values by id: the first `k` of the order `filtered` sorts
/// the whole row in, -inf left out. One pass keeping a sorted list of at most `k`: a selection
/// and sort over 151,936 tokens per position cost 0.4 ms a row, this 0.05.
fn top_scaled(z: &[f32], scale: f32, k: usize) -> Vec<(u32, f32)> {
    const W: usize = 16;
    // (key, id, value), keys in `total_cmp`'s order
    let mut top: Vec<(i32, u32, f32)> = Vec::with_capacity(k + 1);
    for (c, chunk) in z.chunks(W).enumerate() {
        // Once the list is full, most chunks hold nothing above its last: one vectorized
        // comparison skips them (the scan below would skip each of their values).
        if top.len() == k
            && chunk.iter().fold(true, |all, &v| all & (total_key(v * scale) <= top[k - 1].0))
        {
            continue;
        }
        for (j, &v) in chunk.iter().enumerate() {
            let v = v * scale;
            let key = total_key(v);
            if v == f32::NEG_INFINITY || (top.len() == k && key <= top[k - 1].0) {
                continue;
            }
            // After every equal value: ids are visited in increasing order.
            let at = top.partition_point(|&(t, ..)| t >= key);
            top.insert(at, (key, (c * W + j) as u32, v));
            top.truncate(k);
        }
    }
    top.into_iter().map(|(_, id, v)| (id, v)).collect()
}

/// An i32 that orders as [`f32::total_cmp`] orders its float.
fn total_key(v: f32) -> i32 {
    let b = v.to_bits() as i32;
    b ^ ((((b >> 31) as u32) >> 1) as i32)
}

/// Token ids with their filtered, renormalised probabilities, most probable first (ties by id);
/// `None` when the temperature is so low that the largest scaled logit is not finite.
fn filtered(
    logits: &[f32],
    inv_t: f32,
    (top_k, rule): (usize, TopK),
    top_p: f32,
) -> Option<Vec<(u32, f32)>> {
    let by_logit = |a: &(u32, f32), b: &(u32, f32)| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0));
    let whole = || -> Vec<(u32, f32)> {
        logits.iter().enumerate().map(|(i, &z)| (i as u32, z * inv_t)).collect()
    };
    let mut order = match top_k {
        k if k == 0 || k >= logits.len() => {
            // The whole vocabulary, still in id order: a stable radix sort on the negated logit
            // is `by_logit`'s order (negation reverses f32's total order; equal logits keep
            // their id order), 4 passes over the row where a comparison sort took 4 ms of 5.5.
            let mut order = whole();
            radsort::sort_by_key(&mut order, |&(_, z)| -z);
            order
        }
        // (-inf left out, where the sort keeps them for `probs` to drop: the same result)
        k if k <= SCAN_K => top_scaled(logits, inv_t, k),
        k => {
            let mut order = whole();
            order.select_nth_unstable_by(k - 1, by_logit);
            order.truncate(k);
            order.sort_unstable_by(by_logit);
            order
        }
    };
    if rule == TopK::TiesKept && top_k > 0 && top_k < logits.len() {
        keep_ties(logits, inv_t, &mut order);
    }
    let m = order.first()?.1;
    if !m.is_finite() {
        return None;
    }
    // Zero-probability tokens (suppressed, or underflowed) can never be drawn.
    let mut probs: Vec<(u32, f32)> =
        order.iter().map(|&(i, z)| (i, (z - m).exp())).filter(|p| p.1 > 0.0).collect();
    let total: f32 = probs.iter().map(|p| p.1).sum();
    if top_p < 1.0 {
        let mut cum = 0.0;
        let mut keep = probs.len();
        for (n, p) in probs.iter().enumerate() {
            cum += p.1 / total;
            // generate.py and lmdeploy drop a token once the mass before it exceeds p
            if cum > top_p {
                keep = n + 1;
                break;
            }
        }
        probs.truncate(keep);
    }
    let total: f32 = probs.iter().map(|p| p.1).sum();
    for p in &mut probs {
        p.1 /= total;
    }
    Some(probs)
}

/// Appends to a top-k `order` every other token whose scaled logit equals its last (in f32's
/// total order, as the device kernel's keys compare), as generate.py keeps them. Those left out
/// have higher ids than the equal ones kept, so id order keeps `order` sorted.
fn keep_ties(logits: &[f32], inv_t: f32, order: &mut Vec<(u32, f32)>) {
    let Some(&(last, kth)) = order.last() else { return };
    if kth == f32::NEG_INFINITY {
        return;
    }
    let key = total_key(kth);
    order.extend(
        logits
            .iter()
            .enumerate()
            .skip(last as usize + 1)
            .filter(|&(_, &z)| total_key(z * inv_t) == key)
            .map(|(i, &z)| (i as u32, z * inv_t)),
    );
}

/// Inverse-CDF draw over `kept` (most probable first), so the same uniform gives the same token
/// on every backend.
fn draw(kept: &[(u32, f32)], u: f32) -> PosSample {
    // (+ 0.0: a token of probability 1 adds -1 ln 1 = -0)
    let entropy: f32 =
        kept.iter().filter(|p| p.1 > 0.0).map(|p| -p.1 * p.1.ln()).sum::<f32>() + 0.0;
    let mut cum = 0.0;
    let mut chosen = kept[kept.len() - 1];
    for &p in kept {
        cum += p.1;
        if u < cum {
            chosen = p;
            break;
        }
    }
    PosSample { token: chosen.0, conf: chosen.1, entropy }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn softmax(z: &[f32]) -> Vec<f32> {
        let m = z.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
        let e: Vec<f32> = z.iter().map(|x| (x - m).exp()).collect();
        let s: f32 = e.iter().sum();
        e.iter().map(|x| x / s).collect()
    }

    fn entropy(p: &[f32]) -> f32 {
        p.iter().filter(|&&x| x > 0.0).map(|x| -x * x.ln()).sum()
    }

    #[test]
    fn greedy_takes_argmax_with_unfiltered_probability() {
        let z = [0.5, 2.0, -1.0, 1.0];
        let s = sample(&z, &SamplerSpec::default(), 0.0);
        let p = softmax(&z);
        assert_eq!(s.token, 1);
        assert!((s.conf - p[1]).abs() < 1e-6);
        assert!((s.entropy - entropy(&p)).abs() < 1e-5);
    }

    #[test]
    fn suppressed_tokens_do_not_poison_confidence_or_entropy() {
        let z = [0.5, f32::NEG_INFINITY, 2.0];
        let s = sample(&z, &SamplerSpec::default(), 0.0);
        let p = softmax(&[0.5, 2.0]);
        assert_eq!(s.token, 2);
        assert!((s.conf - p[1]).abs() < 1e-6 && (s.entropy - entropy(&p)).abs() < 1e-5, "{s:?}");
        let t = sample(
            &z,
            &SamplerSpec::from(Sampling { temperature: 1.0, ..Sampling::default() }),
            0.999,
        );
        assert_eq!(t.token, 0, "a suppressed token is never drawn");
        assert!(t.entropy.is_finite());
    }

    #[test]
    fn scaled_confidence_reads_the_whole_row_before_top_k_and_top_p() {
        // lmdeploy's and JetEngine's confidence: softmax(z / T) over every token, where the
        // token is still drawn from the filtered distribution
        let z = [2.0, 1.0, 0.5, -1.0, 0.0];
        let drawn = SamplerSpec::from(Sampling {
            temperature: 0.5,
            top_k: 2,
            top_p: 0.9,
            ..Sampling::default()
        });
        let scaled = SamplerSpec { confidence: Confidence::Scaled, ..drawn };
        let p = softmax(&z.map(|v| v * 2.0));
        for u in [0.0, 0.5, 0.99] {
            let (a, ta) = sample_ranked(&z, &drawn, u, 3);
            let (b, tb) = sample_ranked(&z, &scaled, u, 3);
            assert_eq!(a.token, b.token, "the same draw");
            assert!((b.conf - p[b.token as usize]).abs() < 1e-6, "{b:?} vs {p:?}");
            assert!((b.entropy - entropy(&p)).abs() < 1e-5);
            assert!(a.conf > b.conf, "the filtered probability is the larger");
            assert_eq!(
                ta.iter().map(|r| r.token).collect::<Vec<_>>(),
                tb.iter().map(|r| r.token).collect::<Vec<_>>()
            );
            for r in &tb {
                assert!((r.p - p[r.token as usize]).abs() < 1e-6);
            }
        }
        // greedy has one distribution: the same numbers either way
        let g = SamplerSpec { confidence: Confidence::Scaled, ..SamplerSpec::default() };
        assert_eq!(sample(&z, &g, 0.0), sample(&z, &SamplerSpec::default(), 0.0));
    }

    #[test]
    fn top_p_keeps_the_token_whose_preceding_mass_equals_p() {
        // four equal tokens: 0.25 each, exactly. The mass before the third is 0.5, not more
        // than p = 0.5, so generate.py and lmdeploy keep it (and drop the fourth).
        let z = [1.0f32; 4];
        let s = SamplerSpec::from(Sampling { temperature: 1.0, top_p: 0.5, ..Sampling::default() });
        let last = sample(&z, &s, 0.999);
        assert_eq!(last.token, 2);
        assert!((last.conf - 1.0 / 3.0).abs() < 1e-6, "{last:?}");
    }

    #[test]
    fn a_temperature_too_cold_to_scale_is_the_greedy_limit() {
        // 1/1e-38 = 1e38: every scaled logit but zero overflows. This indexed an empty list.
        let z = [0.5, 2.0, -1.0, 1.0];
        for t in [1e-38, f32::MIN_POSITIVE, 1e-45] {
            let s = sample(
                &z,
                &SamplerSpec::from(Sampling { temperature: t, top_k: 2, top_p: 0.9, seed: 0 }),
                0.7,
            );
            assert_eq!((s.token, s.conf, s.entropy), (1, 1.0, 0.0), "temperature {t}");
        }
        let negative = [-3.0, -2.0, -5.0];
        let s = sample(
            &negative,
            &SamplerSpec::from(Sampling { temperature: 1e-38, ..Sampling::default() }),
            0.2,
        );
        assert_eq!((s.token, s.conf, s.entropy), (1, 1.0, 0.0));
    }

    #[test]
    fn nan_or_infinite_logits_give_an_invalid_sample() {
        for bad in [f32::NAN, f32::INFINITY] {
            let z = [0.5, bad, 1.0];
            for sm in [
                SamplerSpec::default(),
                SamplerSpec::from(Sampling { temperature: 0.7, ..Sampling::default() }),
            ] {
                let s = sample(&z, &sm, 0.3);
                assert!(!s.is_valid(), "{bad} {sm:?}: {s:?}");
            }
        }
        assert!(sample(&[0.5, f32::NEG_INFINITY], &SamplerSpec::default(), 0.0).is_valid());
    }

    /// A certain row's entropy is 0, not -0 (traces and tables spelled it "-0").
    #[test]
    fn a_certain_rows_entropy_is_plus_zero() {
        let z = [0.0, f32::NEG_INFINITY, f32::NEG_INFINITY];
        for s in [
            SamplerSpec::default(),
            SamplerSpec::from(Sampling { temperature: 1.0, ..Sampling::default() }),
        ] {
            let e = sample(&z, &s, 0.5).entropy;
            assert_eq!(e.to_bits(), 0f32.to_bits(), "{s:?}: {e}");
        }
    }

    #[test]
    fn greedy_tie_goes_to_lowest_id() {
        let s = sample(&[1.0, 3.0, 3.0], &SamplerSpec::default(), 0.0);
        assert_eq!(s.token, 1);
    }

    #[test]
    fn temperature_draw_follows_inverse_cdf() {
        // probabilities after softmax: ln(1), ln(2), ln(3), ln(4) -> 0.1 0.2 0.3 0.4
        let z: Vec<f32> = [1f32, 2., 3., 4.].iter().map(|x| x.ln()).collect();
        let sm = SamplerSpec::from(Sampling { temperature: 1.0, ..Sampling::default() });
        // sorted: id3 0.4, id2 0.3, id1 0.2, id0 0.1
        assert_eq!(sample(&z, &sm, 0.0).token, 3);
        assert_eq!(sample(&z, &sm, 0.39).token, 3);
        assert_eq!(sample(&z, &sm, 0.41).token, 2);
        assert_eq!(sample(&z, &sm, 0.71).token, 1);
        let last = sample(&z, &sm, 0.95);
        assert_eq!(last.token, 0);
        assert!((last.conf - 0.1).abs() < 1e-6);
        assert!((last.entropy - entropy(&[0.1, 0.2, 0.3, 0.4])).abs() < 1e-5);
    }

    #[test]
    fn top_k_renormalises_over_the_k_best() {
        let z: Vec<f32> = [1f32, 2., 3., 4.].iter().map(|x| x.ln()).collect();
        let sm = SamplerSpec::from(Sampling { temperature: 1.0, top_k: 2, ..Sampling::default() });
        let s = sample(&z, &sm, 0.99);
        assert_eq!(s.token, 2);
        assert!((s.conf - 3.0 / 7.0).abs() < 1e-6);
        assert!((s.entropy - entropy(&[4. / 7., 3. / 7.])).abs() < 1e-5);
    }

    #[test]
    fn top_p_keeps_smallest_prefix_reaching_mass() {
        let z: Vec<f32> = [1f32, 2., 3., 4.].iter().map(|x| x.ln()).collect();
        // 0.4 < 0.6 <= 0.7: keeps ids 3 and 2.
        let sm =
            SamplerSpec::from(Sampling { temperature: 1.0, top_p: 0.6, ..Sampling::default() });
        assert_eq!(sample(&z, &sm, 0.999).token, 2);
        // a tiny p still keeps one token, with probability 1.
        let one =
            SamplerSpec::from(Sampling { temperature: 1.0, top_p: 1e-6, ..Sampling::default() });
        let s = sample(&z, &one, 0.999);
        assert_eq!((s.token, s.conf, s.entropy), (3, 1.0, 0.0));
    }

    #[test]
    fn low_temperature_sharpens() {
        let z = [0.0, 1.0];
        let hot = sample(
            &z,
            &SamplerSpec::from(Sampling { temperature: 2.0, ..Sampling::default() }),
            0.0,
        );
        let cold = sample(
            &z,
            &SamplerSpec::from(Sampling { temperature: 0.25, ..Sampling::default() }),
            0.0,
        );
        assert_eq!((hot.token, cold.token), (1, 1));
        assert!(cold.conf > hot.conf);
    }

    /// The reference top-k: every token's probability under the distribution drawn from
    /// (softmax of logits / T, top-k and top-p applied, renormalised), fully sorted.
    fn reference_top(z: &[f32], spec: &SamplerSpec, k: usize) -> Vec<(u32, f32)> {
        let s = &spec.sampling;
        let t = if s.is_greedy() { 1.0 } else { s.temperature };
        let scaled: Vec<f32> = z.iter().map(|x| x / t).collect();
        let p = softmax(&scaled);
        let mut all: Vec<(u32, f32)> = p.iter().enumerate().map(|(i, &p)| (i as u32, p)).collect();
        all.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        if !s.is_greedy() {
            if s.top_k > 0 {
                all.truncate(s.top_k);
            }
            let mut cum = 0.0;
            let total: f32 = all.iter().map(|x| x.1).sum();
            let keep = all.iter().position(|x| {
                cum += x.1 / total;
                cum >= s.top_p
            });
            if s.top_p < 1.0 {
                all.truncate(keep.map_or(all.len(), |n| n + 1));
            }
            let total: f32 = all.iter().map(|x| x.1).sum();
            all.iter_mut().for_each(|x| x.1 /= total);
        }
        all.into_iter().filter(|x| x.1 > 0.0).take(k).collect()
    }

    #[test]
    fn ranked_candidates_are_the_reference_top_k_of_the_logits() {
        let mut rng = ChaCha8Rng::seed_from_u64(5);
        // Ties (quantised logits) and a suppressed token, over a vocabulary of 500.
        let z: Vec<f32> = (0..500)
            .map(|i| {
                if i == 7 {
                    f32::NEG_INFINITY
                } else {
                    (rng.random::<f32>() * 40.0).round() / 4.0
                }
            })
            .collect();
        let settings = [
            SamplerSpec::default(),
            SamplerSpec::from(Sampling { temperature: 0.7, top_k: 40, top_p: 0.95, seed: 0 }),
            SamplerSpec::from(Sampling { temperature: 1.3, top_k: 0, top_p: 1.0, seed: 0 }),
            SamplerSpec::from(Sampling { temperature: 0.5, top_k: 2, top_p: 1.0, seed: 0 }),
        ];
        for s in settings {
            for k in [1, 3, 16] {
                let (pick, top) = sample_ranked(&z, &s, 0.4, k);
                let want = reference_top(&z, &s, k);
                let got: Vec<u32> = top.iter().map(|r| r.token).collect();
                let ids: Vec<u32> = want.iter().map(|r| r.0).collect();
                assert_eq!(got, ids, "{s:?} k {k}");
                for (r, w) in top.iter().zip(&want) {
                    assert!((r.p - w.1).abs() < 1e-5, "{s:?} k {k}: {r:?} vs {w:?}");
                }
                assert_eq!(pick, sample(&z, &s, 0.4), "ranking does not change the draw");
                if s.is_greedy() {
                    assert_eq!(
                        (top[0].token, top[0].p),
                        (pick.token, pick.conf),
                        "greedy: the first is the pick, same p"
                    );
                }
            }
        }
        assert_eq!(sample_ranked(&z, &SamplerSpec::default(), 0.0, 0).1, vec![]);
    }

    #[test]
    fn ranked_candidates_leave_out_what_cannot_be_drawn() {
        let z = [1.0, f32::NEG_INFINITY, 0.5, -200.0];
        let (_, top) = sample_ranked(&z, &SamplerSpec::default(), 0.0, 16);
        assert_eq!(
            top.iter().map(|r| r.token).collect::<Vec<_>>(),
            vec![0, 2],
            "-inf and an underflowed token are out"
        );
        let cold = SamplerSpec::from(Sampling { temperature: 1e-38, ..Sampling::default() });
        assert_eq!(sample_ranked(&z, &cold, 0.3, 3).1, vec![Ranked { token: 0, p: 1.0 }]);
        assert_eq!(sample_ranked(&[f32::NAN, 1.0], &SamplerSpec::default(), 0.0, 3).1, vec![]);
    }

    /// Every way `filtered` orders the kept tokens (a radix sort of the whole vocabulary, the
    /// one-pass top-k, a selection for a large top-k) is the comparison sort's: scaled logits
    /// descending in f32's total order (+0 before -0, -inf last), equal ones by id.
    #[test]
    fn every_top_k_path_orders_as_by_logit() {
        let mut rng = ChaCha8Rng::seed_from_u64(11);
        let specials = [0.0, -0.0, f32::NEG_INFINITY, 1e-40, -1e-40];
        let z: Vec<f32> = (0..5000)
            .map(|i| {
                if i % 13 == 0 {
                    specials[i / 13 % specials.len()]
                } else {
                    (rng.random::<f32>() * 64.0).round() / 8.0 - 4.0
                }
            })
            .collect();
        // logits near 0, so that ±0 and the tiny ones rank among the first
        let near: Vec<f32> =
            z.iter().map(|&v| if v.is_finite() && v.abs() > 0.5 { v - 8.0 } else { v }).collect();
        for z in [&z, &near] {
            for (inv_t, top_k, top_p) in [
                (1.0, 0, 1.0),
                (0.5, 0, 0.9),
                (2.0, 5000, 1.0),
                (1.0, 1, 1.0),
                (0.7, 20, 0.95),
                (1.3, 256, 1.0),
                (1.0, 300, 1.0),
                (1.0, 4999, 1.0),
            ] {
                let got = filtered(z, inv_t, (top_k, TopK::Exact), top_p).unwrap();
                let mut order: Vec<(u32, f32)> =
                    z.iter().enumerate().map(|(i, &v)| (i as u32, v * inv_t)).collect();
                order.sort_unstable_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
                let ids: Vec<u32> = order.iter().map(|p| p.0).take(got.len()).collect();
                assert_eq!(
                    got.iter().map(|p| p.0).collect::<Vec<_>>(),
                    ids,
                    "1/T {inv_t}, top-k {top_k}, top-p {top_p}"
                );
                if top_k > 0 && top_p == 1.0 {
                    let finite = z.iter().filter(|v| **v > f32::NEG_INFINITY).count();
                    assert_eq!(
                        got.len(),
                        top_k.min(finite),
                        "top-k {top_k} keeps k (none underflows here)"
                    );
                }
            }
        }
        let all_suppressed = [f32::NEG_INFINITY; 40];
        assert_eq!(
            filtered(&all_suppressed, 1.0, (5, TopK::Exact), 1.0),
            None,
            "no finite logit: the greedy limit"
        );
    }

    /// The sampler without its shortcuts, as docs/decoding.md states it: every token's scaled
    /// logit sorted by comparison (total order, then id), libm's exp summed in order in f64.
    fn plain(z: &[f32], spec: &SamplerSpec, u: f32, k: usize) -> (PosSample, Vec<Ranked>) {
        if z.is_empty() || z.iter().any(|v| v.is_nan() || *v == f32::INFINITY) {
            return (PosSample::INVALID, vec![]);
        }
        let s = &spec.sampling;
        let by = |a: &(u32, f32), b: &(u32, f32)| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0));
        let sorted = |inv_t: f32| {
            let mut all: Vec<(u32, f32)> =
                z.iter().enumerate().map(|(i, &v)| (i as u32, v * inv_t)).collect();
            all.sort_by(by);
            all
        };
        let greedy_of = |z: &[f32]| {
            let (mut best, mut max) = (0usize, f32::NEG_INFINITY);
            for (i, &v) in z.iter().enumerate() {
                if v > max {
                    (best, max) = (i, v);
                }
            }
            let (mut sum, mut w) = (0f64, 0f64);
            for &v in z.iter().filter(|v| **v > f32::NEG_INFINITY) {
                let d = (v - max) as f64;
                (sum, w) = (sum + d.exp(), w + d.exp() * d);
            }
            let (log_z, mean) = (sum.ln() as f32, (w / sum) as f32);
            (
                PosSample { token: best as u32, conf: (-log_z).exp(), entropy: log_z - mean },
                max,
                log_z,
            )
        };
        let greedy = || greedy_of(z);
        if s.is_greedy() {
            let (pick, max, log_z) = greedy();
            let top = sorted(1.0).into_iter().filter(|p| p.1 > f32::NEG_INFINITY).take(k);
            return (
                pick,
                top.map(|(token, v)| Ranked { token, p: ((v - max) - log_z).exp() })
                    .filter(|r| r.p > 0.0)
                    .collect(),
            );
        }
        let mut order = sorted(1.0 / s.temperature);
        if s.top_k > 0 && s.top_k < order.len() {
            // generate.py keeps every token equal to the k-th (same bits of the scaled logit)
            let kth = order[s.top_k - 1].1;
            let keep = match spec.top_k_rule {
                TopK::TiesKept if kth > f32::NEG_INFINITY => {
                    order.iter().take_while(|p| p.1.to_bits() != kth.to_bits()).count()
                        + order.iter().filter(|p| p.1.to_bits() == kth.to_bits()).count()
                }
                _ => s.top_k,
            };
            order.truncate(keep);
        }
        let m = order[0].1;
        if !m.is_finite() {
            let g = PosSample { conf: 1.0, entropy: 0.0, ..greedy().0 };
            return (g, if k == 0 { vec![] } else { vec![Ranked { token: g.token, p: 1.0 }] });
        }
        let mut probs: Vec<(u32, f32)> =
            order.iter().map(|&(i, v)| (i, (v - m).exp())).filter(|p| p.1 > 0.0).collect();
        let total: f32 = probs.iter().map(|p| p.1).sum();
        if s.top_p < 1.0 {
            let mut cum = 0.0;
            let keep = probs.iter().position(|p| {
                cum += p.1 / total;
                cum > s.top_p
            });
            probs.truncate(keep.map_or(probs.len(), |n| n + 1));
        }
        let total: f32 = probs.iter().map(|p| p.1).sum();
        probs.iter_mut().for_each(|p| p.1 /= total);
        let (pick, top): (PosSample, Vec<Ranked>) = (
            draw(&probs, u),
            probs.iter().take(k).map(|&(token, p)| Ranked { token, p }).collect(),
        );
        if spec.confidence == Confidence::Drawn {
            return (pick, top);
        }
        // the whole row's softmax at this temperature
        let scaled: Vec<f32> = z.iter().map(|v| v * (1.0 / s.temperature)).collect();
        let (whole, max, log_z) = greedy_of(&scaled);
        let p = |t: u32| ((scaled[t as usize] - max) - log_z).exp();
        (
            PosSample { conf: p(pick.token), entropy: whole.entropy, ..pick },
            top.into_iter().map(|r| Ranked { p: p(r.token), ..r }).collect(),
        )
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig { cases: 2000, failure_persistence: None, ..Default::default() })]

        /// Every shortcut (the vectorized max and partition, the one-pass top-k, the radix sort)
        /// gives what the plain sampler gives: the same token, the same candidates in the same
        /// order, the same numbers (greedy's f64 sums to an ulp of f32).
        #[test]
        fn the_sampler_equals_the_plain_one(
            len in 1usize..600,
            seed in proptest::prelude::any::<u64>(),
            t in proptest::sample::select(vec![0.0f32, 0.5, 1.0, 1.7]),
            top_k in proptest::sample::select(vec![0usize, 1, 3, 20, 256, 257, 599, 700]),
            top_p in proptest::sample::select(vec![1.0f32, 0.9, 0.5, 1e-6]),
            u in 0.0f32..1.0,
            k in proptest::sample::select(vec![0usize, 1, 5, 16]),
            ties in proptest::prelude::any::<bool>(),
            scaled in proptest::prelude::any::<bool>(),
        ) {
            let mut rng = ChaCha8Rng::seed_from_u64(seed);
            let specials = [0.0, -0.0, f32::NEG_INFINITY, 1e-40, -1e-40, 3.0, -3.0];
            let z: Vec<f32> = (0..len)
                .map(|_| if rng.random::<f32>() < 0.2 { specials[rng.random_range(0..specials.len())] } else { (rng.random::<f32>() * 48.0).round() / 8.0 - 3.0 })
                .collect();
            let s = SamplerSpec {
                sampling: Sampling { temperature: t, top_k, top_p, ..Sampling::default() },
                top_k_rule: if ties { TopK::TiesKept } else { TopK::Exact },
                confidence: if scaled { Confidence::Scaled } else { Confidence::Drawn },
            };
            let (got, want) = (sample_ranked(&z, &s, u, k), plain(&z, &s, u, k));
            proptest::prop_assert_eq!(got.0.token, want.0.token);
            let ids = |r: &[Ranked]| r.iter().map(|r| r.token).collect::<Vec<_>>();
            proptest::prop_assert_eq!(ids(&got.1), ids(&want.1));
            let near = |a: f32, b: f32| a == b || (a - b).abs() <= f32::EPSILON * b.abs().max(1e-30) || (a.is_nan() && b.is_nan());
            if s.is_greedy() || scaled {
                proptest::prop_assert!(near(got.0.conf, want.0.conf) && near(got.0.entropy, want.0.entropy), "{:?} vs {:?}", got.0, want.0);
                for (a, b) in got.1.iter().zip(&want.1) {
                    proptest::prop_assert!(near(a.p, b.p), "{:?} vs {:?}", a, b);
                }
            } else {
                proptest::prop_assert_eq!(got, want);
            }
        }
    }

    #[test]
    fn uniforms_are_reproducible_and_skipped_when_greedy() {
        let sm = Sampling { temperature: 1.0, seed: 7, ..Sampling::default() };
        let a = Uniforms::new(7).draw(5, &sm);
        let b = Uniforms::new(7).draw(5, &sm);
        let c = Uniforms::new(8).draw(5, &sm);
        assert_eq!(a, b);
        assert_ne!(a, c);
        assert!(a.iter().all(|u| (0.0..1.0).contains(u)));
        assert_eq!(Uniforms::new(7).draw(3, &Sampling::default()), vec![0.0; 3]);
    }
}
