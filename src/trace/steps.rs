//! The per-step list: one line per denoising step, in decode order, with the texts it committed
//! and the tokens it edited (`unmask steps`, the TUI's Steps panel). Pure: events in, lines out.
//!
//! Numbering, as people (and SDAR, SGLang, JetEngine) count: the step over the decode and the
//! step within its block are 1-based; the block is the trace's block index (0-based, prompt
//! blocks included), the same number the TUI's grid labels rows with; positions are the trace's
//! absolute positions.

use serde::Serialize;

use crate::engine::settings::DecodeSettings;
use crate::trace::detok::{self, End, Piece};
use crate::trace::events::{Committed, Event, StepEvent};
use crate::trace::store::{BlockSteps, CellState, Run, Store};

/// One denoising step as a person reads it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct StepLine {
    /// 1-based step over the whole decode.
    pub step: usize,
    /// Block index as in the trace (0-based, prompt blocks included).
    pub block: usize,
    /// 1-based step within the block.
    pub block_step: usize,
    /// The steps the block took, once it is finished when the line is made (JSON `null`
    /// before: a live decode's line, printed as its step happens).
    pub block_steps: Option<usize>,
    /// The most steps the block may take (`--steps`, at most the block length, for strategies
    /// that follow the schedule; one a position for those that loop until no mask is left; with
    /// token editing its passes after the last mask too); a dynamic strategy may take fewer.
    pub block_budget: usize,
    /// Running count of forward passes, this one included.
    pub forward: usize,
    /// Absolute positions committed, ascending.
    pub pos: Vec<usize>,
    /// Their texts at this step, in the same (position) order: what each adds given the bytes
    /// known after the step ([`crate::trace::detok`]'s rule, the TUI's cells), `None` (JSON `null`)
    /// while its bytes wait on a masked neighbour. Invalid UTF-8 is one `U+FFFD` per sequence.
    #[serde(serialize_with = "texts_json")]
    pub texts: Vec<Piece>,
    /// Each token's raw bytes where they are not whole characters (it splits one, or is
    /// invalid UTF-8), as the trace's `bytes`; `None` else. Absent in JSON when all are `None`.
    #[serde(skip_serializing_if = "all_none")]
    pub bytes: Vec<Option<Vec<u8>>>,
    /// Their confidences, in the same order.
    pub conf: Vec<f32>,
    /// Positions whose token this step replaced (token editing), ascending. Absent in JSON
    /// when none.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub edits: Vec<EditLine>,
    /// Those of `pos` the output does not take, as known after this step: past
    /// `--max-new-tokens`, or after an EOS decoded by then (an EOS a later step decodes drops
    /// more: the [`FinishLine`] lists every dropped position). Absent in JSON when none.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub dropped: Vec<usize>,
}

/// The end of a run: why it stopped, how many tokens it output, and every position it decoded
/// that the output does not take (past `--max-new-tokens`, after the EOS, an unfinished block).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct FinishLine {
    pub reason: crate::trace::events::FinishReason,
    pub output_tokens: usize,
    /// Absolute positions, ascending.
    pub dropped: Vec<usize>,
}

impl FinishLine {
    /// `finished: eos · 8 tokens out · 3 decoded and dropped: pos 18-19, 23`.
    pub fn text(&self) -> String {
        let reason = serde_json::to_value(self.reason)
            .ok()
            .and_then(|v| v.as_str().map(str::to_string))
            .unwrap_or_default();
        let mut s = format!("finished: {reason} · {} tokens out", self.output_tokens);
        if !self.dropped.is_empty() {
            s += &format!(
                " · {} decoded and dropped: pos {}",
                self.dropped.len(),
                ranges(&self.dropped)
            );
        }
        s
    }

    /// `{"finish":{"reason":"eos","output_tokens":8,"dropped":[18,19,23]}}`.
    pub fn json(&self) -> String {
        serde_json::json!({ "finish": self }).to_string()
    }
}

/// Ascending positions as ranges: `3-5, 9`.
fn ranges(pos: &[usize]) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut i = 0;
    while i < pos.len() {
        let mut j = i;
        while j + 1 < pos.len() && pos[j + 1] == pos[j] + 1 {
            j += 1;
        }
        out.push(if i == j { pos[i].to_string() } else { format!("{}-{}", pos[i], pos[j]) });
        i = j + 1;
    }
    out.join(", ")
}

/// One edit of a step: the token a decoded position held and the one it holds now.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct EditLine {
    pub pos: usize,
    pub from: u32,
    pub token: u32,
    /// The two tokens each on its own (not read with their neighbours, as committed texts are:
    /// an edit names tokens), `U+FFFD` per invalid sequence.
    #[serde(serialize_with = "piece_json")]
    pub from_text: Piece,
    #[serde(serialize_with = "piece_json")]
    pub text: Piece,
    /// Their raw bytes where they are not whole characters; absent in JSON otherwise.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub from_bytes: Option<Vec<u8>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bytes: Option<Vec<u8>>,
    /// The new token's confidence.
    pub conf: f32,
}

fn piece_json<S: serde::Serializer>(p: &Piece, s: S) -> Result<S::Ok, S::Error> {
    match p {
        Piece::Text(t) => s.serialize_some(&t.lossy()),
        Piece::Pending(_) => s.serialize_none(),
    }
}

/// A token on its own, every byte known: its characters, invalid bytes as such.
fn own_piece(bytes: &[u8]) -> Piece {
    detok::pieces(&[], &[Some(bytes)], End::Final).0.swap_remove(0).expect("not masked")
}

fn texts_json<S: serde::Serializer>(texts: &[Piece], s: S) -> Result<S::Ok, S::Error> {
    s.collect_seq(texts.iter().map(|p| match p {
        Piece::Text(t) => Some(t.lossy()),
        Piece::Pending(_) => None,
    }))
}

fn all_none(b: &[Option<Vec<u8>>]) -> bool {
    b.iter().all(Option::is_none)
}

/// A position's text as the line shows it: characters as a JSON string, bytes (pending, or
/// invalid UTF-8) as bare hex, so that `<B5>` (a byte) never reads as `"<B5>"` (a token's text).
fn shown(p: &Piece) -> String {
    let quote = |s: &str| serde_json::to_string(s).expect("a string serialises");
    match p {
        Piece::Pending(b) => crate::trace::detok::hex(b),
        Piece::Text(t) if t.is_empty() => quote(""),
        Piece::Text(t) => t.render(quote),
    }
}

impl StepLine {
    /// `step 13 · block 3 · step 1/4 · fwd 13  [17 "To", 18 " find"]`: each position and its
    /// text as a JSON string, bytes that are no characters (yet) as bare hex (`<E2>`), a
    /// dropped one marked `✗` (`19 ✗" the"`: it never starts a text, as the TUI strikes the
    /// cell through); then each edit as `~21 " cat"→" dog"` (`~` as in a diff's changed line).
    pub fn text(&self) -> String {
        let texts: Vec<String> = self
            .texts
            .iter()
            .zip(&self.pos)
            .map(|(t, p)| match self.dropped.contains(p) {
                true => format!("{p} ✗{}", shown(t)),
                false => format!("{p} {}", shown(t)),
            })
            .collect();
        let s = format!(
            "step {} · block {} · step {}/{} · fwd {}  [{}]",
            self.step,
            self.block,
            self.block_step,
            self.count(),
            self.forward,
            texts.join(", ")
        );
        s + &self.edits_text()
    }

    /// The end of [`StepLine::text`] that lists the edits: ` ~21 " cat"→" dog"` for each, or
    /// nothing.
    pub fn edits_text(&self) -> String {
        self.edits
            .iter()
            .map(|e| format!(" ~{} {}→{}", e.pos, shown(&e.from_text), shown(&e.text)))
            .collect()
    }

    pub fn json(&self) -> String {
        serde_json::to_string(self).expect("a step line serialises")
    }

    /// The `N` of "step k/N": the steps the block took, or `≤` its budget while unknown.
    pub fn count(&self) -> BlockSteps {
        self.block_steps.map_or(BlockSteps::AtMost(self.block_budget), BlockSteps::Took)
    }
}

/// A block's end in the list of a decode as it runs (`unmask steps`): the steps it took, and
/// its budget where the two differ.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct BlockDone {
    pub block: usize,
    pub steps: usize,
    pub budget: usize,
    pub forward: usize,
}

impl BlockDone {
    /// `block 3 done · 3 steps (at most 4)`.
    pub fn text(&self) -> String {
        let budget = match self.budget == self.steps {
            true => String::new(),
            false => format!(" (at most {})", self.budget),
        };
        format!("block {} done · {}{budget}", self.block, crate::format::count(self.steps, "step"))
    }

    /// `{"block_done":{"block":3,"steps":3,"budget":4,"forward":16}}`.
    pub fn json(&self) -> String {
        serde_json::json!({ "block_done": self }).to_string()
    }
}

/// Turns events into step lines as they come, so a live decode prints each step at once. The
/// events go through a [`Store`], so a line is what the TUI's Steps panel shows for the step.
#[derive(Debug, Default)]
pub struct StepLines {
    store: Store,
    /// Settings in force for the current block (a step event carries them when they change).
    settings: Option<DecodeSettings>,
    /// Steps seen since the last header.
    count: usize,
}

impl StepLines {
    pub fn new() -> Self {
        StepLines::default()
    }

    /// The end of the run whose finish event was just pushed: every position the run decoded
    /// that its output does not take.
    pub fn finish(&self, f: &crate::trace::events::FinishEvent) -> FinishLine {
        let dropped = self.store.run().map_or(Vec::new(), |run| {
            let end = run.prompt_len() + f.output_ids.len();
            let last = run.steps().len().checked_sub(1);
            let decoded = |p: &usize| matches!(run.cell(*p, last), CellState::Decoded(_));
            (end..run.max_blocks() * run.block_length()).filter(decoded).collect()
        });
        FinishLine { reason: f.reason, output_tokens: f.output_ids.len(), dropped }
    }

    /// The end of the block whose event was just pushed, as the run recorded it.
    pub fn block_done(&self, b: &crate::trace::events::BlockEvent) -> BlockDone {
        let budget = self.store.run().map_or(b.steps, |r| r.block_step_budget(b.block));
        BlockDone {
            block: b.block,
            steps: b.steps,
            budget: budget.max(b.steps),
            forward: b.forward,
        }
    }

    /// The line for `ev` if it is a step; a header (a new run) restarts the count.
    pub fn push(&mut self, ev: &Event) -> Option<StepLine> {
        let before = self.store.run().map_or(0, |r| r.steps().len());
        let generation = self.store.generation();
        self.store.push(ev.clone());
        match ev {
            Event::Header(h) => {
                self.settings = Some(h.settings.clone());
                self.count = 0;
                None
            }
            Event::Step(s) => {
                let mut line = self.line(s);
                // The store's line (texts given every byte known at the step), unless the
                // store refused the step as contradicting the recording.
                let run = self.store.run().filter(|r| {
                    self.store.generation() == generation && r.steps().len() == before + 1
                });
                if let Some(l) = run.and_then(|r| from_run(r, before)) {
                    line = StepLine { step: line.step, ..l };
                }
                Some(line)
            }
            _ => None,
        }
    }

    /// The line from the event alone: each token's own text.
    fn line(&mut self, s: &StepEvent) -> StepLine {
        if let Some(new) = &s.settings {
            self.settings = Some(new.clone());
        }
        self.count += 1;
        let budget = self.settings.as_ref().map_or(0, DecodeSettings::step_budget);
        let mut committed: Vec<_> = s.committed.iter().collect();
        committed.sort_by_key(|c| c.pos);
        let own = |c: &Committed| {
            let bytes = c.bytes.as_deref().unwrap_or(c.text.as_bytes());
            detok::pieces(&[], &[Some(bytes)], End::Final).0.swap_remove(0).expect("not masked")
        };
        StepLine {
            step: self.count,
            block: s.block,
            block_step: s.step + 1,
            block_steps: None,
            block_budget: budget.max(s.step + 1),
            forward: s.forward,
            pos: committed.iter().map(|c| c.pos).collect(),
            texts: committed.iter().map(|c| own(c)).collect(),
            bytes: committed.iter().map(|c| c.bytes.clone()).collect(),
            conf: committed.iter().map(|c| c.conf).collect(),
            edits: {
                let mut e: Vec<EditLine> = s.edited.iter().map(|e| self.edit_line(e)).collect();
                e.sort_by_key(|e| e.pos);
                e
            },
            // (a step the store refused: nothing is known of the output)
            dropped: Vec::new(),
        }
    }

    /// An edit from its event; the replaced token's bytes from the run, which has seen it.
    fn edit_line(&self, e: &crate::trace::events::Edited) -> EditLine {
        let bytes = e.bytes.as_deref().unwrap_or(e.text.as_bytes());
        let run = self.store.run();
        let from = run.map_or(&[][..], |r| r.token_bytes(e.from));
        EditLine {
            pos: e.pos,
            from: e.from,
            token: e.token,
            from_text: own_piece(from),
            text: own_piece(bytes),
            from_bytes: run.filter(|r| r.is_raw(e.from)).map(|_| from.to_vec()),
            bytes: e.bytes.clone(),
            conf: e.conf,
        }
    }
}

/// The line of step index `k` (0-based over the decode) from the store: what the TUI's Steps
/// panel shows, equal to what `lines` makes of the same events.
pub fn from_run(run: &Run, k: usize) -> Option<StepLine> {
    let s = run.step(k)?;
    let b = run.block_length();
    let raw = |token| run.is_raw(token).then(|| run.token_bytes(token).to_vec());
    let committed: Vec<_> = (s.block * b..(s.block + 1) * b)
        .filter_map(|pos| match run.cell(pos, Some(k)) {
            CellState::Decoded(d) if d.committed_at == k => {
                // An edit of the same step can not follow its commit, but a trace may say so.
                Some((pos, run.history(pos, k)[0]))
            }
            _ => None,
        })
        .collect();
    let edits = run
        .edits_at(k)
        .map(|e| EditLine {
            pos: e.pos,
            from: e.from,
            token: e.token,
            from_text: own_piece(run.token_bytes(e.from)),
            text: own_piece(run.token_bytes(e.token)),
            from_bytes: raw(e.from),
            bytes: raw(e.token),
            conf: e.conf,
        })
        .collect();
    Some(StepLine {
        step: k + 1,
        block: s.block,
        block_step: s.step + 1,
        block_steps: run.block_step_count(s.block).took(),
        block_budget: run.block_step_budget(s.block).max(s.step + 1),
        forward: s.forward,
        pos: committed.iter().map(|(p, _)| *p).collect(),
        texts: committed
            .iter()
            .map(|(p, _)| run.cell_piece(*p, Some(k)).expect("decoded"))
            .collect(),
        bytes: committed.iter().map(|(_, d)| raw(d.token)).collect(),
        conf: committed.iter().map(|(_, d)| d.conf).collect(),
        edits,
        dropped: committed
            .iter()
            .map(|(p, _)| *p)
            .filter(|&p| p >= run.output_end(Some(k)))
            .collect(),
    })
}

/// Every step line of the events (restarts included, each run counted from 1), each with the
/// steps its block took where the events hold its block's end.
pub fn lines(events: &[Event]) -> Vec<StepLine> {
    let mut s = StepLines::new();
    let mut out: Vec<StepLine> = Vec::new();
    let mut run_start = 0;
    for e in events {
        match e {
            Event::Header(_) => run_start = out.len(),
            Event::Block(b) => out[run_start..]
                .iter_mut()
                .filter(|l| l.block == b.block)
                .for_each(|l| l.block_steps = Some(b.steps)),
            _ => {}
        }
        out.extend(s.push(e));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::synth::{self, Synth};

    fn commit(pos: usize, text: &str) -> Committed {
        Committed {
            pos,
            token: pos as u32,
            text: text.into(),
            bytes: None,
            conf: 0.5,
            entropy: 0.1,
            top: vec![],
            routes: vec![],
        }
    }

    #[test]
    fn a_step_reads_as_the_seed_wrote_it() {
        let l = StepLine {
            step: 13,
            block: 3,
            block_step: 1,
            block_steps: Some(4),
            block_budget: 4,
            forward: 13,
            pos: vec![12, 13],
            texts: vec![
                Piece::Text(detok::Text::plain("To")),
                Piece::Text(detok::Text::plain(" find")),
            ],
            bytes: vec![None, None],
            conf: vec![0.9, 0.8],
            edits: vec![],
            dropped: vec![],
        };
        assert_eq!(l.text(), r#"step 13 · block 3 · step 1/4 · fwd 13  [12 "To", 13 " find"]"#);
        assert_eq!(
            l.json(),
            r#"{"step":13,"block":3,"block_step":1,"block_steps":4,"block_budget":4,"forward":13,"pos":[12,13],"texts":["To"," find"],"conf":[0.9,0.8]}"#
        );
        // live, before the block's end: at most its budget
        let live = StepLine { block_steps: None, ..l };
        assert_eq!(live.text(), r#"step 13 · block 3 · step 1/≤4 · fwd 13  [12 "To", 13 " find"]"#);
        assert!(live.json().contains(r#""block_steps":null,"block_budget":4"#));
    }

    #[test]
    fn texts_are_in_position_order_and_escaped_as_json() {
        let mut events = synth::trace(&Synth::small());
        // The first step of block 2 (positions 8 to 11, none committed yet).
        let k = events
            .iter()
            .filter(|e| matches!(e, Event::Step(_)))
            .position(|e| matches!(e, Event::Step(s) if s.block == 2))
            .unwrap();
        let Some(Event::Step(s)) = events.iter_mut().filter(|e| matches!(e, Event::Step(_))).nth(k)
        else {
            panic!()
        };
        // Token ids the trace has not spelled otherwise (a token's text never changes in a run).
        let c = |pos, text| Committed { token: 1000 + pos as u32, ..commit(pos, text) };
        s.committed = vec![c(10, "."), c(8, "\n"), c(9, "say \"hi\"")];
        let l = &lines(&events)[k];
        assert_eq!(l.pos, vec![8, 9, 10]);
        assert!(l.text().ends_with(r#"  [8 "\n", 9 "say \"hi\"", 10 "."]"#), "{}", l.text());
    }

    /// Block 2 of a small synthetic trace, its four cells committed as `tokens` (id, text,
    /// bytes) at the steps given (0-based within the block); the lines of that block.
    fn block_lines(tokens: [(u32, &str, Option<&[u8]>, usize); 4]) -> Vec<StepLine> {
        let mut events = synth::trace(&Synth::small());
        let mut steps =
            events.iter_mut().filter_map(|e| if let Event::Step(s) = e { Some(s) } else { None });
        let mut block: Vec<&mut StepEvent> = steps.by_ref().filter(|s| s.block == 2).collect();
        assert_eq!(block.len(), 4);
        for (i, s) in block.iter_mut().enumerate() {
            s.committed = tokens
                .iter()
                .enumerate()
                .filter(|(_, t)| t.3 == i)
                .map(|(j, &(token, text, bytes, _))| Committed {
                    token,
                    text: text.into(),
                    bytes: bytes.map(<[u8]>::to_vec),
                    ..commit(8 + j, "")
                })
                .collect();
            s.masked.clear();
        }
        lines(&events).into_iter().filter(|l| l.block == 2).collect()
    }

    #[test]
    fn a_step_shows_what_its_positions_add_given_the_bytes_known_then() {
        // E0 B5 8C (ൌ) over positions 8, 9, 10, committed at steps 2, 3, 1; "<B5>" literal at 11.
        let ls = block_lines([
            (900, "\u{FFFD}", Some(b"\xE0"), 1),
            (901, "\u{FFFD}", Some(b"\xB5"), 2),
            (902, "\u{FFFD}", Some(b"\x8C"), 0),
            (903, "<B5>", None, 3),
        ]);
        let texts: Vec<String> =
            ls.iter().map(|l| l.text().split("  ").nth(1).unwrap().to_string()).collect();
        assert_eq!(texts, [r#"[10 <8C>]"#, r#"[8 <E0>]"#, r#"[9 ""]"#, r#"[11 "<B5>"]"#]);
        // JSON: null while pending, the raw bytes beside; a literal "<B5>" is a plain text.
        assert!(ls[0].json().contains(r#""texts":[null],"bytes":[[140]]"#), "{}", ls[0].json());
        assert!(ls[2].json().contains(r#""texts":[""],"bytes":[[181]]"#), "{}", ls[2].json());
        assert!(ls[3].json().contains(r#""texts":["<B5>"],"conf""#), "{}", ls[3].json());
    }

    #[test]
    fn invalid_bytes_read_as_hex_and_a_literal_replacement_character_as_text() {
        // DB (never completed: 'h' follows), FC (never UTF-8), a vocabulary token "\u{FFFD}".
        let ls = block_lines([
            (900, "\u{FFFD}", Some(b"\xDB"), 0),
            (901, "hat", None, 1),
            (902, "\u{FFFD}", Some(b"\xFC"), 2),
            (903, "\u{FFFD}", None, 3),
        ]);
        let texts: Vec<String> =
            ls.iter().map(|l| l.text().split("  ").nth(1).unwrap().to_string()).collect();
        assert_eq!(texts, ["[8 <DB>]", r#"[9 "hat"]"#, "[10 <FC>]", "[11 \"\u{FFFD}\"]"]);
        assert!(ls[1].json().contains(r#""texts":["hat"],"conf""#), "{}", ls[1].json());
        // Both spell U+FFFD as JSON text; the invalid byte carries its bytes, the literal none.
        assert!(
            ls[2].json().contains("\"texts\":[\"\u{FFFD}\"],\"bytes\":[[252]]"),
            "{}",
            ls[2].json()
        );
        assert!(ls[3].json().contains("\"texts\":[\"\u{FFFD}\"],\"conf\""), "{}", ls[3].json());
    }

    #[test]
    fn steps_count_from_one_over_the_decode_and_restart_with_a_new_run() {
        let events = synth::trace(&Synth::small());
        let ls = lines(&events);
        let n = events.iter().filter(|e| matches!(e, Event::Step(_))).count();
        assert_eq!(ls.iter().map(|l| l.step).collect::<Vec<_>>(), (1..=n).collect::<Vec<_>>());
        assert!(ls.iter().all(|l| (1..=l.block_steps.unwrap()).contains(&l.block_step)
            && l.block_steps <= Some(l.block_budget)));
        let twice: Vec<Event> = events.iter().chain(&events).cloned().collect();
        let ls2 = lines(&twice);
        assert_eq!(ls2.len(), 2 * n);
        assert_eq!(ls2[n].step, 1);
    }

    #[test]
    fn the_store_gives_the_same_lines_as_the_events() {
        let mut cfg = Synth::small();
        cfg.change_at = Some((cfg.prompt.len() / cfg.block_length + 2, 2));
        let events = synth::trace(&cfg);
        let store = crate::trace::store::Store::from_events(events.clone());
        let run = store.run().unwrap();
        let from_store: Vec<StepLine> =
            (0..run.steps().len()).map(|k| from_run(run, k).unwrap()).collect();
        assert_eq!(from_store, lines(&events));
        assert_eq!(from_run(run, run.steps().len()), None);
    }

    /// A step lists its edits after its commits, `~"old"→"new"`; a post-step has only edits;
    /// JSON gives each with both tokens; the store's lines are the events' lines.
    #[test]
    fn edits_are_listed_on_their_step_line() {
        let events = synth::trace(&Synth::small_edits());
        let ls = lines(&events);
        let texts: Vec<String> = ls.iter().map(StepLine::text).collect();
        assert_eq!(texts[1], r#"step 2 · block 1 · step 2/3 · fwd 2  [6 "."] ~7 " purr"→" It""#);
        assert_eq!(
            texts[2], "step 3 · block 1 · step 3/3 · fwd 3  []",
            "the pass that ends the block"
        );
        let post = ls.iter().position(|l| l.pos.is_empty() && !l.edits.is_empty()).unwrap();
        assert_eq!(
            texts[post],
            r#"step 8 · block 2 · step 5/6 · fwd 8  [] ~10 "\t"→"," ~11 " fish"→" and""#
        );
        assert_eq!(
            ls[1].json(),
            r#"{"step":2,"block":1,"block_step":2,"block_steps":3,"block_budget":6,"forward":2,"pos":[6],"texts":["."],"conf":[0.4813137],"edits":[{"pos":7,"from":15,"token":10,"from_text":" purr","text":" It","conf":0.9038231}]}"#
        );
        assert!(!ls[0].json().contains("edits"), "absent when none");
        let store = crate::trace::store::Store::from_events(events.clone());
        let run = store.run().unwrap();
        let from_store: Vec<StepLine> =
            (0..run.steps().len()).map(|k| from_run(run, k).unwrap()).collect();
        assert_eq!(from_store, ls);
        // From the events alone (the store refused the step): the same edits.
        let mut sl = StepLines::new();
        let Event::Step(s) = &events[2] else { panic!() };
        sl.push(&events[0]);
        sl.push(&events[1]);
        assert_eq!(sl.line(s).edits, ls[1].edits);
    }

    #[test]
    fn a_settings_change_changes_the_step_budget_from_its_block_on() {
        let mut cfg = Synth::small();
        let change = cfg.prompt.len() / cfg.block_length + 2;
        cfg.change_at = Some((change, 2));
        let ls = lines(&synth::trace(&cfg));
        assert!(ls.iter().filter(|l| l.block < change).all(|l| l.block_budget == cfg.steps));
        assert!(ls.iter().filter(|l| l.block >= change).all(|l| l.block_budget == 2));
    }

    /// Strategies that loop until no mask is left may take one step a position, whatever
    /// `--steps` says (entropy_bounded showed "step 2/1").
    #[test]
    fn the_budget_of_a_strategy_that_ignores_the_schedule_is_one_step_a_position() {
        use crate::engine::settings::Strategy;
        let s = |strategy, steps| DecodeSettings {
            strategy,
            steps,
            block_length: 4,
            ..DecodeSettings::default()
        };
        assert_eq!(s(Strategy::EntropyBounded, 1).step_budget(), 4);
        // `--steps` over the block's positions is capped, for the rules that read it
        assert_eq!(s(Strategy::LowConfidenceStatic, 8).capped_steps(), Some(4));
        assert_eq!(s(Strategy::LowConfidenceStatic, 4).capped_steps(), None);
        assert_eq!(s(Strategy::EntropyBounded, 8).capped_steps(), None);
        assert_eq!(s(Strategy::LowConfidenceStatic, 2).step_budget(), 2);
        assert_eq!(s(Strategy::LowConfidenceDynamic, 8).step_budget(), 4);
        assert_eq!(s(Strategy::Sequential, 3).step_budget(), 3);
    }

    #[test]
    fn positions_read_as_ranges() {
        assert_eq!(ranges(&[3, 4, 5, 9]), "3-5, 9");
        assert_eq!(ranges(&[7]), "7");
        assert_eq!(ranges(&[]), "");
    }

    /// The synthetic trace's last block runs past the length: its commits there are marked
    /// `✗` on their step's line, and the finish line lists every dropped position.
    #[test]
    fn commits_past_the_output_are_marked_dropped() {
        let events = synth::trace(&Synth::small_edits());
        let mut s = StepLines::new();
        let mut out = Vec::new();
        for e in &events {
            if let Some(l) = s.push(e) {
                out.push(l.text());
            }
            if let Event::Block(b) = e {
                out.push(s.block_done(b).text());
            }
            if let Event::Finish(f) = e {
                let end = s.finish(f);
                assert_eq!(end.dropped, [30, 31]);
                out.push(end.text());
                assert_eq!(
                    end.json(),
                    r#"{"finish":{"reason":"length","output_tokens":24,"dropped":[30,31]}}"#
                );
            }
        }
        assert!(out.iter().any(|l| l.ends_with("[31 ✗\"ROMEO\"]")), "{out:?}");
        // as it runs, a step knows its block's budget; the block's end says what it took
        assert_eq!(out[0], "step 1 · block 1 · step 1/≤6 · fwd 1  [7 \" purr\"]");
        assert_eq!(out[3], "block 1 done · 3 steps (at most 6)");
        let done = s.block_done(&crate::trace::events::BlockEvent {
            block: 2,
            start: 8,
            tokens: vec![],
            texts: None,
            steps: 6,
            forward: 9,
            t_ms: 0.0,
        });
        assert_eq!(done.text(), "block 2 done · 6 steps");
        assert_eq!(done.json(), r#"{"block_done":{"block":2,"steps":6,"budget":6,"forward":9}}"#);
        assert_eq!(
            out.last().unwrap(),
            "finished: length · 24 tokens out · 2 decoded and dropped: pos 30-31"
        );
    }
}
