//! How a mixture of experts picks each row's experts from its router logits, on the host in
//! f32, as the reference implementations compute it:
//!
//! - [`Routing::Softmax`] (Qwen3-MoE, SDAR-MoE): softmax over every expert, the top k
//!   probabilities, renormalised to sum 1 where `norm_topk_prob`.
//! - [`Routing::GroupedSigmoid`] (LLaDA2): each expert's score is the sigmoid of its logit;
//!   selection ranks the scores plus a per-expert bias (`expert_bias`, selection only); the
//!   experts fall in `groups` equal groups, a group's rank is the sum of its two best biased
//!   scores, and only the `keep` best groups' experts may be chosen; the top k of those by
//!   biased score, weighted by their unbiased scores over their sum (plus 1e-20), times `scale`.
//!
//! Equal values are ordered as PyTorch's CPU `torch.topk` leaves them (topk.rs), so the experts
//! are the reference's even on ties. The grouped MoE ops of the device path (fast/moe_grouped.rs)
//! rank exact ties by the lower id instead, a rule a kernel applies cheaply.

use super::moe::Route;
use super::topk::topk;

/// A sparse layer's routing rule.
#[derive(Clone, Debug, PartialEq)]
pub enum Routing {
    /// Softmax top-k; `norm`: renormalise the k probabilities to sum 1.
    Softmax {
        norm: bool,
    },
    GroupedSigmoid(GroupedSigmoid),
}

/// LLaDA2's group-limited sigmoid router (see the module's notes).
#[derive(Clone, Debug, PartialEq)]
pub struct GroupedSigmoid {
    /// `[experts]`, added to the scores for selection only.
    pub bias: Vec<f32>,
    /// Groups of `experts / groups` consecutive experts (each at least 2: a group's rank sums
    /// its best two).
    pub groups: usize,
    /// Groups whose experts may be chosen.
    pub keep: usize,
    /// Multiplies the renormalised weights (`routed_scaling_factor`).
    pub scale: f32,
}

impl Routing {
    /// One row's `k` experts from its router logits, best first, and their weights.
    pub fn route(&self, logits: &[f32], k: usize) -> Route {
        match self {
            Routing::Softmax { norm } => softmax_top_k(logits, k, *norm),
            Routing::GroupedSigmoid(g) => g.route(logits, k),
        }
    }
}

/// One row's route from its router logits: softmax in f32, top-k as `torch.topk` picks and
/// orders them, renormalised if `norm`.
pub fn softmax_top_k(logits: &[f32], k: usize, norm: bool) -> Route {
    let probs = softmax(logits);
    let order = topk(&probs, k);
    let mut weights: Vec<f32> = order.iter().map(|&e| probs[e]).collect();
    if norm {
        let sum: f32 = weights.iter().sum();
        weights.iter_mut().for_each(|w| *w /= sum);
    }
    Route { experts: order.into_iter().map(|e| e as u32).collect(), weights }
}

/// Softmax in f32 the way torch's CPU kernel computes it: `exp(x - max) * (1 / sum)`.
fn softmax(x: &[f32]) -> Vec<f32> {
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let e: Vec<f32> = x.iter().map(|v| (v - max).exp()).collect();
    let inv = 1.0 / e.iter().sum::<f32>();
    e.into_iter().map(|v| v * inv).collect()
}

/// `1 / (1 + e^-x)` in f32.
pub fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

/// The sum of the two largest of `v` (at least two values), as `topk(2).values.sum()` adds them.
pub fn best_two_sum(v: &[f32]) -> f32 {
    let (mut a, mut b) = (f32::NEG_INFINITY, f32::NEG_INFINITY);
    for &x in v {
        if x > a {
            (a, b) = (x, a);
        } else if x > b {
            b = x;
        }
    }
    a + b
}

impl GroupedSigmoid {
    /// One row's `k` experts from its router logits (see the module's notes).
    pub fn route(&self, logits: &[f32], k: usize) -> Route {
        let scores: Vec<f32> = logits.iter().map(|&z| sigmoid(z)).collect();
        let biased: Vec<f32> = scores.iter().zip(&self.bias).map(|(s, b)| s + b).collect();
        let size = biased.len() / self.groups;
        let group_scores: Vec<f32> = biased.chunks(size).map(best_two_sum).collect();
        // the kept groups as a set: torch.topk(sorted=False) keeps the same elements as the
        // sorted form (its nth_element, without the sort of the first k - 1)
        let mut kept = vec![false; self.groups];
        for g in topk(&group_scores, self.keep) {
            kept[g] = true;
        }
        let masked: Vec<f32> = biased
            .iter()
            .enumerate()
            .map(|(e, &b)| if kept[e / size] { b } else { f32::NEG_INFINITY })
            .collect();
        let experts = topk(&masked, k);
        let mut weights: Vec<f32> = experts.iter().map(|&e| scores[e]).collect();
        if k > 1 {
            let sum = weights.iter().sum::<f32>() + 1e-20;
            weights.iter_mut().for_each(|w| *w /= sum);
        }
        weights.iter_mut().for_each(|w| *w *= self.scale);
        Route { experts: experts.into_iter().map(|e| e as u32).collect(), weights }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn router(bias: Vec<f32>, groups: usize, keep: usize) -> GroupedSigmoid {
        GroupedSigmoid { bias, groups, keep, scale: 2.5 }
    }

    fn logit(p: f32) -> f32 {
        (p / (1.0 - p)).ln()
    }

    #[test]
    fn the_bias_picks_the_experts_and_the_weights_ignore_it() {
        // scores 0.9, 0.8, 0.7, 0.6 in one group; a bias lifts expert 3 over expert 0
        let logits: Vec<f32> = [0.9, 0.8, 0.7, 0.6].map(logit).to_vec();
        let r = router(vec![0.0, 0.0, 0.0, 0.35], 1, 1).route(&logits, 2);
        assert_eq!(r.experts, vec![3, 0]);
        let (s3, s0) = (sigmoid(logits[3]), sigmoid(logits[0]));
        let want = [s3 / (s3 + s0) * 2.5, s0 / (s3 + s0) * 2.5];
        for (g, w) in r.weights.iter().zip(want) {
            assert!((g - w).abs() < 1e-6, "{:?} vs {want:?}", r.weights);
        }
        assert!((r.weights.iter().sum::<f32>() - 2.5).abs() < 1e-6, "scaled to 2.5");
    }

    #[test]
    fn one_expert_a_row_keeps_its_score_times_the_scale() {
        let logits: Vec<f32> = [0.2, 0.9, 0.4, 0.1].map(logit).to_vec();
        let r = router(vec![0.0; 4], 2, 1).route(&logits, 1);
        assert_eq!(r.experts, vec![1]);
        assert!((r.weights[0] - sigmoid(logits[1]) * 2.5).abs() < 1e-6, "{:?}", r.weights);
    }

    #[test]
    fn experts_come_only_from_the_kept_groups() {
        // groups {0,1} {2,3} {4,5}: group 1 has the single best expert (0.99) but the worst
        // pair; group 0 and group 2 are kept, so expert 2 is never chosen
        let logits: Vec<f32> = [0.8, 0.85, 0.99, 0.01, 0.7, 0.75].map(logit).to_vec();
        let r = router(vec![0.0; 6], 3, 2).route(&logits, 3);
        assert_eq!(r.experts, vec![1, 0, 5]);
        assert!(!r.experts.contains(&2));
    }

    #[test]
    fn equal_scores_are_ordered_deterministically_as_torch_topk_orders_them() {
        let logits = vec![0.0f32; 8];
        let g = router(vec![0.0; 8], 4, 4);
        let (a, b) = (g.route(&logits, 3), g.route(&logits, 3));
        assert_eq!(a, b, "the same row routes the same way");
        // torch.topk([0.5] * 8, 3) on the CPU: indices 6, 5, 4 (topk.rs)
        assert_eq!(a.experts, vec![6, 5, 4]);
        assert!(a.weights.iter().all(|&w| (w - 2.5 / 3.0).abs() < 1e-6), "{:?}", a.weights);
    }

    #[test]
    fn best_two_sum_adds_the_two_largest() {
        assert_eq!(best_two_sum(&[0.5, 0.25]), 0.75);
        assert_eq!(best_two_sum(&[0.1, 0.7, 0.3, 0.7]), 1.4);
        assert_eq!(best_two_sum(&[-1.0, -3.0, -2.0]), -3.0);
    }
}
