//! Asking the GPU's L2 for weights before the kernel that reads them (kernels/gemv.cu,
//! `unmask_prefetch_l2`). A block pass of the streamed layer reads every weight once from HBM,
//! but HBM idles while the small kernels run (q/k norm and RoPE, attention: about 10 us a
//! layer at SDAR-1.7B, whose layer streams in about 24 us) and at every kernel boundary, where
//! one projection's last loads drain before the next one's first ones are asked for. Asked for
//! in those gaps, the next projections' first bytes are in the L2 when their kernel starts.
//!
//! What is asked where is a pure function of the layer's weight sizes and the budgets
//! ([`plan`], unit-tested); the launch is the CUDA side's (`cuda/gemv.rs`). On the CPU and
//! before sm_90 (no bulk prefetch) asking does nothing.

use anyhow::Result;
use candle_core::Tensor;

/// Ranges start and end on this many bytes: the bulk prefetch takes multiples of 16, and a
/// weight's rows are multiples of 256 bytes at every SDAR shape.
pub const ALIGN: usize = 256;

/// The bytes asked ahead, in MB (10^6 bytes): `attention` while a layer's attention runs (the
/// o projection, then the heads of the feed-forward block's first product), `boundary` at the
/// two projections after it that start a new weight stream (the down product's head during
/// gate|up, the next layer's q/k/v head during down). `UNMASK_L2_PREFETCH=A/B` sets both
/// (`0` turns it off).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Budget {
    pub attention: usize,
    pub boundary: usize,
}

impl Budget {
    pub const OFF: Budget = Budget { attention: 0, boundary: 0 };
    /// Chosen on the H200 (docs/perf.md, session 12).
    pub const DEFAULT: Budget = Budget { attention: 0, boundary: 0 };

    /// `A/B` or `A` (then B = 0), in MB.
    pub fn parse(s: &str) -> Result<Budget> {
        let mb = |v: &str| -> Result<usize> {
            let v = v.trim();
            let n: usize = v.parse().map_err(|_| anyhow::anyhow!("UNMASK_L2_PREFETCH: {v:?} is not a whole number of MB"))?;
            Ok(n * 1_000_000)
        };
        let (a, b) = s.split_once('/').unwrap_or((s, "0"));
        Ok(Budget { attention: mb(a)?, boundary: mb(b)? })
    }

    /// `UNMASK_L2_PREFETCH`, else [`Budget::DEFAULT`]; read once. A value that does not parse
    /// is reported once and the default kept (it is a tuning switch, not an option).
    pub fn get() -> Budget {
        static B: std::sync::OnceLock<Budget> = std::sync::OnceLock::new();
        *B.get_or_init(|| match std::env::var("UNMASK_L2_PREFETCH") {
            Ok(v) => Budget::parse(&v).unwrap_or_else(|e| {
                eprintln!("unmask: {e}; keeping {:?}", Budget::DEFAULT);
                Budget::DEFAULT
            }),
            Err(_) => Budget::DEFAULT,
        })
    }
}

/// A weight to ask for: `Whole` from its start; `Halves` a stacked `[2 N, K]` product
/// (gate|up), whose kernel reads row n of both halves together, so its two heads are asked
/// for side by side.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Part {
    Whole(usize),
    Halves(usize),
}

/// The byte ranges `(part, start, len)` that `budget` bytes buy over `parts`, in order: each
/// part from its start while the budget lasts, a `Halves` part's two heads growing together.
/// Lengths are multiples of [`ALIGN`]; empty ranges are left out.
pub fn plan(budget: usize, parts: &[Part]) -> Vec<(usize, usize, usize)> {
    let down = |v: usize| v / ALIGN * ALIGN;
    let mut left = budget;
    let mut out = Vec::new();
    for (i, p) in parts.iter().enumerate() {
        match *p {
            Part::Whole(size) => {
                let len = down(size.min(left));
                if len > 0 {
                    out.push((i, 0, len));
                }
                left -= len;
            }
            Part::Halves(size) => {
                let half = size / 2;
                let len = down(half.min(left / 2));
                if len > 0 {
                    out.push((i, 0, len));
                    out.push((i, half, len));
                }
                left -= 2 * len;
            }
        }
        if left < ALIGN {
            break;
        }
    }
    out
}

/// Asks for `budget` bytes of `parts` (weights and how to read them, [`plan`]); nothing on
/// the CPU or with a zero budget.
/// `parts` is asked for only with a budget, so a pass without one builds nothing.
pub fn ask<'a>(budget: usize, parts: impl FnOnce() -> Vec<(&'a Tensor, Part)>) -> Result<()> {
    if budget == 0 {
        return Ok(());
    }
    let parts = parts();
    let sizes: Vec<Part> = parts.iter().map(|(_, p)| *p).collect();
    let ranges: Vec<(&Tensor, usize, usize)> = plan(budget, &sizes).into_iter().map(|(i, s, l)| (parts[i].0, s, l)).collect();
    prefetch(&ranges)
}

/// The bytes of a weight, for [`Part`].
pub fn bytes(w: &Tensor) -> usize {
    w.elem_count() * w.dtype().size_in_bytes()
}

/// Launches the prefetch of `ranges` (weight, start byte, length), four a launch.
fn prefetch(ranges: &[(&Tensor, usize, usize)]) -> Result<()> {
    #[cfg(feature = "cuda")]
    if ranges.first().is_some_and(|(w, _, _)| w.device().is_cuda()) {
        for four in ranges.chunks(4) {
            super::cuda::gemv::prefetch_l2(four)?;
        }
    }
    let _ = ranges;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const MB: usize = 1_000_000;

    #[test]
    fn the_budget_reads_as_megabytes_and_rejects_what_is_not_a_number() {
        assert_eq!(Budget::parse("24/4").unwrap(), Budget { attention: 24 * MB, boundary: 4 * MB });
        assert_eq!(Budget::parse("16").unwrap(), Budget { attention: 16 * MB, boundary: 0 });
        assert_eq!(Budget::parse("0").unwrap(), Budget::OFF);
        let e = Budget::parse("lots").unwrap_err().to_string();
        assert!(e.contains("\"lots\"") && e.contains("UNMASK_L2_PREFETCH"), "{e}");
    }

    #[test]
    fn a_whole_part_comes_first_then_both_heads_of_a_stacked_one_grow_together() {
        // SDAR-1.7B: o 8,388,608 bytes; gate|up 50,331,648 (two halves of 25,165,824)
        let (o, gu) = (2048 * 2048 * 2, 2 * 6144 * 2048 * 2);
        assert_eq!(plan(4 * MB + 100, &[Part::Whole(o), Part::Halves(gu)]), vec![(0, 0, 4 * MB)]);
        let p = plan(24 * MB, &[Part::Whole(o), Part::Halves(gu)]);
        let rest = (24 * MB - o) / 2 / ALIGN * ALIGN;
        assert_eq!(p, vec![(0, 0, o), (1, 0, rest), (1, gu / 2, rest)]);
        assert!(p.iter().map(|r| r.2).sum::<usize>() <= 24 * MB);
        // more than everything: every byte once, no range past its part
        assert_eq!(plan(1000 * MB, &[Part::Whole(o), Part::Halves(gu)]), vec![(0, 0, o), (1, 0, gu / 2), (1, gu / 2, gu / 2)]);
    }

    #[test]
    fn ranges_are_aligned_and_nothing_is_asked_of_an_empty_budget() {
        assert!(plan(0, &[Part::Whole(1 << 20)]).is_empty());
        assert!(plan(ALIGN - 1, &[Part::Whole(1 << 20)]).is_empty());
        for (start, len) in plan(5_000_001, &[Part::Whole(1_000_000), Part::Halves(9_000_000)]).iter().map(|r| (r.1, r.2)) {
            assert_eq!((start % 16, len % ALIGN), (0, 0));
        }
        // a part smaller than the alignment is skipped, the budget goes on to the next
        assert_eq!(plan(MB, &[Part::Whole(100), Part::Whole(512)]), vec![(1, 0, 512)]);
    }
}
