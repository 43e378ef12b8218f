//! Unmasking strategies: which masked positions of a block a denoising step commits.
//!
//! Where SDAR's generate.py (`block_diffusion_generate`) and lmdeploy
//! (`pytorch/strategies/dllm/unmasking.py`) disagree, [`Schedule`] picks one:
//! - static: SDAR spreads `block_length % steps` over the first steps; lmdeploy commits
//!   `max(1, block_length / steps)` every step.
//! - dynamic: SDAR takes every position over the threshold only if there are at least the
//!   scheduled count of them, else the top scheduled count; lmdeploy ignores the schedule and
//!   takes the best position plus every one at or over the threshold.
//! - SDAR computes its per-step counts once from `(block_length, steps)` and uses them in
//!   every block, so a first block that holds the prompt's tail may finish in fewer steps; where
//!   a count exceeds the masks left, SDAR picks already-decoded (even prompt) positions and
//!   overwrites them. Here the count is capped at the masks left, and only masked positions are
//!   ever candidates.
//!
//! joint_threshold (LLaDA2.1's `generate()`, SGLang's `JointThreshold`) is the one strategy
//! that also edits: besides committing masks it replaces decoded tokens of the block that the
//! pass would now decode otherwise, with confidence over `edit_threshold`. It ignores the
//! schedule: its blocks end when a pass with no mask left edits nothing, or after
//! `max_post_steps` passes with no mask left ([`StepRule::post_step_allowed`]).

use crate::engine::settings::{Schedule, Strategy};

/// What a position of the block holds when a step begins.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Held {
    /// A mask: a commit may fill it.
    Mask,
    /// A token an earlier step of this block decoded; `differs`: this pass's sample there is
    /// another token. Only an editing strategy ever replaces it.
    Decoded { differs: bool },
    /// A prompt token (the prompt's tail in the first decoded block): never replaced.
    Prompt,
}

/// What a strategy knows about one position of the block at this step.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Cell {
    pub held: Held,
    /// The pass's sample there: its probability and its distribution's entropy.
    pub conf: f32,
    pub entropy: f32,
}

impl Cell {
    pub fn masked(&self) -> bool {
        self.held == Held::Mask
    }
}

/// Everything a strategy needs besides the cells.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct StepRule {
    pub strategy: Strategy,
    pub schedule: Schedule,
    pub threshold: f32,
    pub eb_threshold: f32,
    pub block_length: usize,
    pub steps: usize,
    /// joint_threshold: a decoded token is replaced when the pass's differs from it with a
    /// probability over this.
    pub edit_threshold: f32,
    /// joint_threshold: passes a block may take once no mask is left.
    pub max_post_steps: usize,
}

impl StepRule {
    /// The part of the decode settings a strategy reads.
    pub fn from_settings(s: &crate::engine::settings::DecodeSettings) -> Self {
        StepRule {
            strategy: s.strategy,
            schedule: s.schedule,
            threshold: s.threshold,
            eb_threshold: s.eb_threshold,
            block_length: s.block_length,
            steps: s.steps,
            edit_threshold: s.edit_threshold,
            max_post_steps: s.max_post_steps,
        }
    }

    /// Whether the strategy may replace tokens it committed (and so runs passes after a
    /// block's last mask).
    pub fn edits(&self) -> bool {
        self.strategy == Strategy::JointThreshold
    }

    /// Whether a block with no mask left may take its `post`-th such pass (1-based): LLaDA2.1's
    /// `generate()` counts a pass that starts with no mask and stops once the count passes
    /// `max_post_steps`, before that pass's forward. Never for a strategy that does not edit.
    pub fn post_step_allowed(&self, post: usize) -> bool {
        self.edits() && post <= self.max_post_steps
    }

    /// Whether the strategy follows the per-step counts of the schedule.
    pub fn follows_schedule(&self) -> bool {
        match self.strategy {
            Strategy::Sequential | Strategy::LowConfidenceStatic => true,
            Strategy::LowConfidenceDynamic => self.schedule == Schedule::Sdar,
            Strategy::EntropyBounded | Strategy::JointThreshold => false,
        }
    }

    /// Positions to commit at step `step` of a block, before the cap at the masks left.
    ///
    /// `sdar`: generate.py's `get_num_transfer_tokens(block_length, steps)`: `B / S` per step,
    /// the first `B % S` steps one more. It depends on neither the block nor its masks: a first
    /// block that holds the prompt's tail keeps the counts of a full block and so may finish
    /// in fewer steps (B8 S4 with 2 masks: `[2, 2, 2, 2]` commits both at step 0). The counts
    /// sum to `B`, at least the masks of any block, so a block never runs past step `S - 1`;
    /// with `S > B` the steps past `B` would count 0, but no mask is left by then.
    pub fn scheduled(&self, step: usize) -> usize {
        match self.schedule {
            Schedule::Sdar => {
                let (base, extra) =
                    (self.block_length / self.steps, self.block_length % self.steps);
                base + usize::from(step < extra)
            }
            Schedule::Lmdeploy => (self.block_length / self.steps).max(1),
        }
    }

    /// Indices (into `cells`) to commit, ascending. Empty only when no cell is masked.
    pub fn select(&self, cells: &[Cell], step: usize) -> Vec<usize> {
        let masked: Vec<usize> = (0..cells.len()).filter(|&i| cells[i].masked()).collect();
        if masked.is_empty() {
            return vec![];
        }
        // Capped at the masks left: generate.py would overwrite decoded positions instead.
        let k = self.scheduled(step).clamp(1, masked.len());
        let mut picked = match self.strategy {
            Strategy::Sequential => masked[..k].to_vec(),
            Strategy::LowConfidenceStatic => top_by_confidence(cells, &masked, k),
            Strategy::LowConfidenceDynamic => self.dynamic(cells, &masked, k),
            Strategy::EntropyBounded => self.entropy_bounded(cells, &masked),
            Strategy::JointThreshold => self.over_threshold_or_best(cells, &masked),
        };
        picked.sort_unstable();
        picked
    }

    /// Indices (into `cells`) of decoded tokens to replace with the pass's, ascending: under
    /// joint_threshold, every one the pass would decode otherwise with a probability strictly
    /// over `edit_threshold`; none under any other strategy. Masks and prompt are never edited.
    pub fn edit(&self, cells: &[Cell]) -> Vec<usize> {
        if !self.edits() {
            return vec![];
        }
        (0..cells.len())
            .filter(|&i| {
                cells[i].held == Held::Decoded { differs: true }
                    && cells[i].conf > self.edit_threshold
            })
            .collect()
    }

    /// LLaDA2.1's mask-to-token rule: every mask with probability strictly over the threshold,
    /// else the single best (its `num_to_transfer` of 1).
    fn over_threshold_or_best(&self, cells: &[Cell], masked: &[usize]) -> Vec<usize> {
        let over: Vec<usize> =
            masked.iter().copied().filter(|&i| cells[i].conf > self.threshold).collect();
        if over.is_empty() {
            top_by_confidence(cells, masked, 1)
        } else {
            over
        }
    }

    fn dynamic(&self, cells: &[Cell], masked: &[usize], k: usize) -> Vec<usize> {
        match self.schedule {
            Schedule::Sdar => {
                let over: Vec<usize> =
                    masked.iter().copied().filter(|&i| cells[i].conf > self.threshold).collect();
                if over.len() >= k {
                    over
                } else {
                    top_by_confidence(cells, masked, k)
                }
            }
            Schedule::Lmdeploy => {
                let best = top_by_confidence(cells, masked, 1)[0];
                let mut picked: Vec<usize> = masked
                    .iter()
                    .copied()
                    .filter(|&i| i != best && cells[i].conf >= self.threshold)
                    .collect();
                picked.push(best);
                picked
            }
        }
    }

    fn entropy_bounded(&self, cells: &[Cell], masked: &[usize]) -> Vec<usize> {
        let mut order = masked.to_vec();
        order.sort_by(|&a, &b| cells[a].entropy.total_cmp(&cells[b].entropy).then(a.cmp(&b)));
        // the prefix whose cumulative entropy stays strictly under the bound: generate.py's and
        // JetEngine's `searchsorted(cumsum, eb, right=False)`
        let mut cum = 0.0f32;
        let mut take = 0;
        for &i in &order {
            cum += cells[i].entropy;
            if cum >= self.eb_threshold {
                break;
            }
            take += 1;
        }
        order.truncate(take.max(1));
        order
    }
}

/// The `k` masked positions of highest confidence; a tie goes to the lower position and NaN
/// ranks last.
fn top_by_confidence(cells: &[Cell], masked: &[usize], k: usize) -> Vec<usize> {
    let key = |i: usize| if cells[i].conf.is_nan() { f32::NEG_INFINITY } else { cells[i].conf };
    let mut order = masked.to_vec();
    order.sort_by(|&a, &b| key(b).total_cmp(&key(a)).then(a.cmp(&b)));
    order.truncate(k);
    order
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(strategy: Strategy, schedule: Schedule) -> StepRule {
        StepRule {
            strategy,
            schedule,
            threshold: 0.5,
            eb_threshold: 0.35,
            block_length: 4,
            steps: 4,
            edit_threshold: 0.9,
            max_post_steps: 16,
        }
    }

    fn cells(confs: &[f32], masked: &[bool]) -> Vec<Cell> {
        confs
            .iter()
            .zip(masked)
            .map(|(&conf, &masked)| Cell {
                held: if masked { Held::Mask } else { Held::Decoded { differs: false } },
                conf,
                entropy: 1.0 - conf,
            })
            .collect()
    }

    const ALL_MASKED: [bool; 4] = [true; 4];

    #[test]
    fn sdar_schedule_spreads_the_remainder_over_the_first_steps() {
        let r =
            StepRule { block_length: 8, steps: 3, ..rule(Strategy::Sequential, Schedule::Sdar) };
        let counts: Vec<usize> = (0..3).map(|s| r.scheduled(s)).collect();
        assert_eq!(counts, vec![3, 3, 2]);
        let r = StepRule { block_length: 4, steps: 8, ..r };
        let counts: Vec<usize> = (0..8).map(|s| r.scheduled(s)).collect();
        assert_eq!(counts, vec![1, 1, 1, 1, 0, 0, 0, 0]);
    }

    /// generate.py's `get_num_transfer_tokens(block_length, steps)`, written as the Python
    /// does it (a tensor of `base`, `+1` on the first `remainder`), to check `scheduled` against.
    fn generate_py_counts(block_length: usize, steps: usize) -> Vec<usize> {
        let mut counts = vec![block_length / steps; steps];
        for c in counts.iter_mut().take(block_length % steps) {
            *c += 1;
        }
        counts
    }

    /// Steps (each the committed in-block indices) a block of `masked` takes under `r`,
    /// all confidences equal, so static and sequential both pick the leftmost.
    fn run_block(r: &StepRule, masked: &[bool]) -> Vec<Vec<usize>> {
        let mut c = cells(&vec![0.5; masked.len()], masked);
        let mut steps = vec![];
        while c.iter().any(Cell::masked) {
            let picked = r.select(&c, steps.len());
            for &i in &picked {
                c[i].held = Held::Decoded { differs: false };
            }
            steps.push(picked);
        }
        steps
    }

    #[test]
    fn sdar_schedule_keeps_generate_py_counts_in_a_block_holding_the_prompt_tail() {
        for (b, s) in [(8, 4), (4, 2), (8, 3), (4, 8)] {
            let counts = generate_py_counts(b, s);
            for strategy in [Strategy::Sequential, Strategy::LowConfidenceStatic] {
                let r = StepRule { block_length: b, steps: s, ..rule(strategy, Schedule::Sdar) };
                for tail in 0..b {
                    let masked: Vec<bool> = (0..b).map(|i| i >= tail).collect();
                    // generate.py's counts, each capped at the masks left, until none is left.
                    let mut left = b - tail;
                    let mut want = vec![];
                    for &k in &counts {
                        if left == 0 {
                            break;
                        }
                        want.push(k.min(left));
                        left -= k.min(left);
                    }
                    let got: Vec<usize> = run_block(&r, &masked).iter().map(Vec::len).collect();
                    assert_eq!(got, want, "B{b} S{s} tail {tail} {strategy:?}");
                }
            }
        }
        // The example: B8 S4, prompt tail of 6: both masks at step 0 (not 1 + 1).
        let r =
            StepRule { block_length: 8, steps: 4, ..rule(Strategy::Sequential, Schedule::Sdar) };
        let masked: Vec<bool> = (0..8).map(|i| i >= 6).collect();
        assert_eq!(run_block(&r, &masked), vec![vec![6, 7]]);
        // B4 S2, tail of 1: counts [2, 2] -> 2 then the last 1.
        let r = StepRule { block_length: 4, steps: 2, ..r };
        assert_eq!(run_block(&r, &[false, true, true, true]), vec![vec![1, 2], vec![3]]);
        // B4 S2, tail of 3: the count 2 is capped at the 1 mask left (generate.py would also
        // rewrite the prompt position 2).
        assert_eq!(run_block(&r, &[false, false, false, true]), vec![vec![3]]);
    }

    #[test]
    fn sdar_dynamic_minimum_count_comes_from_block_length_and_steps() {
        // B8 S4: k = 2 even with only 3 masks left, so one position over the threshold is not
        // enough and the top 2 are taken.
        let r = StepRule {
            block_length: 8,
            steps: 4,
            ..rule(Strategy::LowConfidenceDynamic, Schedule::Sdar)
        };
        let masked = [false, false, false, false, false, true, true, true];
        let c = cells(&[0.0, 0.0, 0.0, 0.0, 0.0, 0.9, 0.2, 0.3], &masked);
        assert_eq!(r.select(&c, 0), vec![5, 7]);
    }

    #[test]
    fn lmdeploy_schedule_is_flat_and_at_least_one() {
        let r = StepRule {
            block_length: 8,
            steps: 3,
            ..rule(Strategy::Sequential, Schedule::Lmdeploy)
        };
        assert_eq!(r.scheduled(0), 2);
        assert_eq!(r.scheduled(5), 2);
        let r = StepRule { block_length: 4, steps: 8, ..r };
        assert_eq!(r.scheduled(0), 1);
    }

    #[test]
    fn sequential_goes_left_to_right_over_masks() {
        let r = rule(Strategy::Sequential, Schedule::Sdar);
        let c = cells(&[0.9, 0.1, 0.8, 0.2], &[false, true, true, true]);
        assert_eq!(r.select(&c, 0), vec![1]);
        let c = cells(&[0.9, 0.1, 0.8, 0.2], &[false, false, true, true]);
        assert_eq!(r.select(&c, 1), vec![2]);
    }

    #[test]
    fn static_takes_most_confident_masked_positions() {
        let r = rule(Strategy::LowConfidenceStatic, Schedule::Sdar);
        let c = cells(&[0.2, 0.9, 0.4, 0.7], &ALL_MASKED);
        assert_eq!(r.select(&c, 0), vec![1]);
        // a decoded cell is never picked, however confident.
        let c = cells(&[0.2, 0.99, 0.4, 0.7], &[true, false, true, true]);
        assert_eq!(r.select(&c, 1), vec![3]);
        // B=8, S=3 -> 3 at step 0.
        let r8 = StepRule { block_length: 8, steps: 3, ..r };
        let c8 = cells(&[0.1, 0.5, 0.9, 0.3, 0.8, 0.2, 0.7, 0.0], &[true; 8]);
        assert_eq!(r8.select(&c8, 0), vec![2, 4, 6]);
    }

    #[test]
    fn static_ties_go_to_the_lower_position_and_nan_ranks_last() {
        let r = rule(Strategy::LowConfidenceStatic, Schedule::Sdar);
        let c = cells(&[0.5, 0.5, 0.5, 0.5], &ALL_MASKED);
        assert_eq!(r.select(&c, 0), vec![0]);
        let c = cells(&[f32::NAN, 0.01, f32::NAN, 0.0], &ALL_MASKED);
        assert_eq!(r.select(&c, 0), vec![1]);
    }

    #[test]
    fn count_is_capped_at_the_masks_left() {
        // lmdeploy B=4 S=1 -> k=4, only 2 masks left.
        let r = StepRule { steps: 1, ..rule(Strategy::LowConfidenceStatic, Schedule::Lmdeploy) };
        let c = cells(&[0.9, 0.1, 0.8, 0.2], &[false, true, false, true]);
        assert_eq!(r.select(&c, 0), vec![1, 3]);
    }

    #[test]
    fn sdar_dynamic_takes_all_over_threshold_or_falls_back_to_top_k() {
        let r = rule(Strategy::LowConfidenceDynamic, Schedule::Sdar);
        let c = cells(&[0.6, 0.9, 0.4, 0.7], &ALL_MASKED);
        assert_eq!(r.select(&c, 0), vec![0, 1, 3]);
        // none over: the scheduled single best.
        let c = cells(&[0.1, 0.3, 0.2, 0.05], &ALL_MASKED);
        assert_eq!(r.select(&c, 0), vec![1]);
        // threshold is strict in SDAR mode.
        let c = cells(&[0.5, 0.5, 0.1, 0.1], &ALL_MASKED);
        assert_eq!(r.select(&c, 0), vec![0]);
        // B=8 S=2 -> k=4 but only 2 over: top 4 instead.
        let r8 = StepRule { block_length: 8, steps: 2, ..r };
        let c8 = cells(&[0.9, 0.8, 0.1, 0.4, 0.3, 0.2, 0.0, 0.45], &[true; 8]);
        assert_eq!(r8.select(&c8, 0), vec![0, 1, 3, 7]);
    }

    #[test]
    fn lmdeploy_dynamic_takes_best_plus_all_at_threshold() {
        let r = rule(Strategy::LowConfidenceDynamic, Schedule::Lmdeploy);
        let c = cells(&[0.5, 0.2, 0.49, 0.3], &ALL_MASKED);
        assert_eq!(r.select(&c, 0), vec![0]);
        let c = cells(&[0.1, 0.2, 0.3, 0.25], &ALL_MASKED);
        assert_eq!(r.select(&c, 0), vec![2], "at least one");
        let c = cells(&[0.5, 0.9, 0.5, 0.3], &[true, true, true, false]);
        assert_eq!(r.select(&c, 0), vec![0, 1, 2]);
        assert!(!r.follows_schedule());
    }

    #[test]
    fn entropy_bounded_takes_the_low_entropy_prefix() {
        let r = rule(Strategy::EntropyBounded, Schedule::Sdar);
        let mut c = cells(&[0.0; 4], &ALL_MASKED);
        for (cell, h) in c.iter_mut().zip([0.3, 0.05, 2.0, 0.1]) {
            cell.entropy = h;
        }
        // sorted: 1 (0.05), 3 (0.15 cum), 0 (0.45 cum > 0.35): take 1 and 3.
        assert_eq!(r.select(&c, 0), vec![1, 3]);
        // everything above the bound still commits one.
        for cell in &mut c {
            cell.entropy = 5.0;
        }
        assert_eq!(r.select(&c, 0), vec![0]);
        assert!(!r.follows_schedule());
        // a prefix whose sum reaches the bound exactly stops before it (strictly under: the
        // references' searchsorted(right=False)); 0.125 + 0.25 = 0.375 in f32 exactly
        let r = StepRule { eb_threshold: 0.375, ..rule(Strategy::EntropyBounded, Schedule::Sdar) };
        for (cell, h) in c.iter_mut().zip([0.25, 0.125, 2.0, 3.0]) {
            cell.entropy = h;
        }
        assert_eq!(r.select(&c, 0), vec![1]);
    }

    #[test]
    fn nothing_masked_selects_nothing() {
        for s in Strategy::ALL {
            let r = rule(s, Schedule::Sdar);
            assert!(r.select(&cells(&[0.5; 4], &[false; 4]), 0).is_empty());
        }
    }

    #[test]
    fn joint_threshold_commits_every_mask_over_the_threshold_else_the_best() {
        let r = StepRule { threshold: 0.6, ..rule(Strategy::JointThreshold, Schedule::Sdar) };
        let c = cells(&[0.7, 0.6, 0.9, 0.1], &ALL_MASKED);
        // strict: 0.6 is not over 0.6; the schedule (B4 S4: 1 a step) is not read
        assert_eq!(r.select(&c, 0), vec![0, 2]);
        let c = cells(&[0.2, 0.5, 0.4, 0.1], &ALL_MASKED);
        assert_eq!(r.select(&c, 0), vec![1]);
        assert!(!r.follows_schedule());
    }

    #[test]
    fn joint_threshold_edits_decoded_tokens_it_would_now_decode_otherwise() {
        let r = StepRule { edit_threshold: 0.5, ..rule(Strategy::JointThreshold, Schedule::Sdar) };
        let held = [
            Held::Decoded { differs: true },  // over: replaced
            Held::Decoded { differs: true },  // at the threshold: kept (strict)
            Held::Decoded { differs: false }, // the same token: nothing to replace
            Held::Prompt,                     // never
            Held::Mask,                       // a mask is committed, not edited
        ];
        let c: Vec<Cell> = held
            .iter()
            .zip([0.8, 0.5, 0.99, 0.99, 0.99])
            .map(|(&held, conf)| Cell { held, conf, entropy: 0.0 })
            .collect();
        assert_eq!(r.edit(&c), vec![0]);
        // NaN is never over a threshold
        let nan = [Cell { held: Held::Decoded { differs: true }, conf: f32::NAN, entropy: 0.0 }];
        assert!(r.edit(&nan).is_empty());
    }

    #[test]
    fn only_joint_threshold_edits_or_takes_post_steps() {
        for s in Strategy::ALL {
            let r = StepRule { edit_threshold: 0.0, ..rule(s, Schedule::Sdar) };
            let c = [Cell { held: Held::Decoded { differs: true }, conf: 1.0, entropy: 0.0 }];
            let edits = s == Strategy::JointThreshold;
            assert_eq!(r.edit(&c).len(), usize::from(edits), "{s:?}");
            assert_eq!(r.post_step_allowed(1), edits, "{s:?}");
        }
        let r = StepRule { max_post_steps: 2, ..rule(Strategy::JointThreshold, Schedule::Sdar) };
        assert_eq!(
            (1..=3).map(|p| r.post_step_allowed(p)).collect::<Vec<_>>(),
            [true, true, false]
        );
        let r = StepRule { max_post_steps: 0, ..r };
        assert!(!r.post_step_allowed(1));
    }
}
