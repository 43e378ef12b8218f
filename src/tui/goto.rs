//! Seeking: `g` then a step number (1-based, as the timeline shows it) or `b7` for block 7,
//! and a click on the timeline's bar. Pure: text or a column in, a step index or a one-line
//! reason out.

use crate::trace::store::Run;

/// Where the user asked to go.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Goto {
    /// A step counted from 1 over the decode (the timeline's "overall").
    Step(usize),
    /// The first step of a block, numbered as the trace and the timeline number it.
    Block(usize),
}

/// The prompt's text as a destination; the error says what was typed and what is accepted.
pub fn parse(typed: &str) -> Result<Goto, String> {
    let t = typed.trim();
    if t.is_empty() {
        return Err("nothing typed: type a step number (12) or b and a block (b7)".into());
    }
    let (block, digits) = match t.strip_prefix(['b', 'B']) {
        Some(rest) => (true, rest.trim()),
        None => (false, t),
    };
    let n: usize = digits.parse().map_err(|_| {
        format!(
            "{} is not a step or a block: type a step number (12) or b and a block (b7)",
            quoted(t)
        )
    })?;
    Ok(if block { Goto::Block(n) } else { Goto::Step(n) })
}

/// Most characters of the typed text an error quotes: the footer keeps room for what to
/// type instead (a pasted paragraph would push the help off the line).
const QUOTED_CHARS: usize = 16;

/// `typed` in quotes, its first [`QUOTED_CHARS`] characters and `…` if longer.
fn quoted(typed: &str) -> String {
    match typed.char_indices().nth(QUOTED_CHARS) {
        // Debug's escapes kept (a typed quote or control character), the mark inside.
        Some((cut, _)) => format!("{:?}", &typed[..cut])
            .strip_suffix('"')
            .map_or_else(String::new, |q| format!("{q}…\"")),
        None => format!("{typed:?}"),
    }
}

/// What the prompt's text asks for, then where that is in `run`: a number too large for any
/// decode (more digits than a step index holds) is answered as any step past the end is,
/// quoting all of it (`no step 999999999999999999999: the decode has 26 steps`).
pub fn go(run: &Run, typed: &str) -> Result<usize, String> {
    let t = typed.trim();
    let (block, digits) = match t.strip_prefix(['b', 'B']) {
        Some(rest) => (true, rest.trim()),
        None => (false, t),
    };
    if !digits.is_empty()
        && digits.bytes().all(|b| b.is_ascii_digit())
        && digits.parse::<usize>().is_err()
    {
        let digits = digits.trim_start_matches('0');
        if run.head().is_none() {
            return Err("no step decoded yet".into());
        }
        return Err(if block {
            format!("block {digits} has no steps: {}", block_span(run))
        } else {
            format!("no step {digits}: {}", decoded(run))
        });
    }
    resolve(run, parse(typed)?)
}

/// How far the decode has got, for a step past it.
fn decoded(run: &Run) -> String {
    let head = run.head().map_or(0, |h| h + 1);
    match run.finish {
        Some(_) => format!("the decode has {}", plural(head, "step")),
        None => format!("the decode is at step {head} so far"),
    }
}

/// Which blocks have steps, for a block that has none.
fn block_span(run: &Run) -> String {
    let blocks = run.blocks();
    match (blocks.first(), blocks.last()) {
        (Some(f), Some(l)) => format!("blocks {}–{} have steps", f.block, l.block),
        _ => "no block has steps yet".into(),
    }
}

/// The step index (0-based, as the store counts) of a destination in `run`.
pub fn resolve(run: &Run, g: Goto) -> Result<usize, String> {
    let Some(head) = run.head() else { return Err("no step decoded yet".into()) };
    match g {
        Goto::Step(0) => Err("steps are counted from 1".into()),
        Goto::Step(n) if n - 1 > head => Err(format!("no step {n}: {}", decoded(run))),
        Goto::Step(n) => Ok(n - 1),
        Goto::Block(b) => {
            let steps = run.block_steps(b);
            if !steps.is_empty() {
                return Ok(steps.start);
            }
            Err(format!("block {b} has no steps: {}", block_span(run)))
        }
    }
}

/// The step under column `x` of a timeline bar `width` columns wide, for a run whose head is
/// `head`. The bar draws step k at column `k * (width - 1) / head`: of the steps around `x`,
/// the one drawn nearest to it (the first, where several share a column; the earlier, on a tie).
pub fn step_at_column(x: usize, width: usize, head: usize) -> usize {
    if width < 2 || head == 0 {
        return head;
    }
    let x = x.min(width - 1);
    let col = |k: usize| k * (width - 1) / head;
    let guess = x * head / (width - 1);
    (guess.saturating_sub(1)..=(guess + 2).min(head))
        .min_by_key(|&k| (col(k).abs_diff(x), k))
        .unwrap_or(head)
}

/// `1 step`, `2 steps`.
fn plural(n: usize, noun: &str) -> String {
    crate::format::count(n, noun)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::store::Store;
    use crate::trace::synth::{self, Synth};

    fn store() -> Store {
        Store::from_events(synth::trace(&Synth::small()))
    }

    #[test]
    fn typed_destinations() {
        assert_eq!(parse("12"), Ok(Goto::Step(12)));
        assert_eq!(parse(" b7 "), Ok(Goto::Block(7)));
        assert_eq!(parse("B 3"), Ok(Goto::Block(3)));
        assert_eq!(
            parse("x").unwrap_err(),
            "\"x\" is not a step or a block: type a step number (12) or b and a block (b7)"
        );
        let long = parse("block 99999999999999 step 12345678").unwrap_err();
        assert_eq!(long, "\"block 9999999999…\" is not a step or a block: type a step number (12) or b and a block (b7)");
        assert!(parse("").is_err() && parse("b").is_err() && parse("-3").is_err());
    }

    #[test]
    fn destinations_in_a_run() {
        let s = store();
        let r = s.run().unwrap();
        assert_eq!(resolve(r, Goto::Step(1)), Ok(0));
        assert_eq!(resolve(r, Goto::Step(26)), Ok(25));
        assert_eq!(resolve(r, Goto::Step(27)).unwrap_err(), "no step 27: the decode has 26 steps");
        assert_eq!(resolve(r, Goto::Step(0)).unwrap_err(), "steps are counted from 1");
        let b = r.blocks()[2].clone();
        assert_eq!(resolve(r, Goto::Block(b.block)), Ok(b.first_step));
        let (first, last) = (r.blocks()[0].block, r.blocks().last().unwrap().block);
        assert_eq!(
            resolve(r, Goto::Block(last + 1)).unwrap_err(),
            format!("block {} has no steps: blocks {first}–{last} have steps", last + 1)
        );
    }

    /// A number past what a step index holds is a step past the end, quoted whole (the
    /// prompt used to stop taking digits at 12 characters and say `no step 999999999999`).
    #[test]
    fn numbers_too_large_for_any_decode_are_quoted_whole() {
        let s = store();
        let r = s.run().unwrap();
        let nines = "9".repeat(21);
        assert_eq!(go(r, &nines).unwrap_err(), format!("no step {nines}: the decode has 26 steps"));
        let (first, last) = (r.blocks()[0].block, r.blocks().last().unwrap().block);
        assert_eq!(
            go(r, &format!("b{nines}")).unwrap_err(),
            format!("block {nines} has no steps: blocks {first}–{last} have steps")
        );
        assert_eq!(go(r, "12"), Ok(11));
        assert_eq!(
            go(r, "b-1").unwrap_err(),
            "\"b-1\" is not a step or a block: type a step number (12) or b and a block (b7)"
        );
        assert_eq!(go(r, "99").unwrap_err(), "no step 99: the decode has 26 steps");
    }

    #[test]
    fn columns_map_back_to_the_steps_drawn_there() {
        // The bar draws step k at column k * (w - 1) / head.
        for (w, head) in [(50, 25), (98, 25), (20, 214), (2, 1)] {
            for k in 0..=head {
                let col = k * (w - 1) / head;
                let back = step_at_column(col, w, head);
                assert_eq!(
                    back * (w - 1) / head,
                    col,
                    "w {w} head {head}: step {k} at column {col} came back as {back}"
                );
            }
        }
        assert_eq!(step_at_column(0, 50, 25), 0);
        assert_eq!(step_at_column(49, 50, 25), 25);
        assert_eq!(step_at_column(500, 50, 25), 25, "past the end: the head");
    }
}
