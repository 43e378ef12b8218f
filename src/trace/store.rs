//! The append-only event store behind every view. It knows nothing of terminals.
//!
//! Events go in once; any past step can then be looked at again. A *step index* `k` numbers
//! every denoising step of a run, over all blocks (0 is the first step of the first decode
//! block). "The state at `k`" is the state right after step `k` was applied. Each cell keeps the
//! step index that decoded it, so the state of a cell at `k` is one comparison, and drawing a
//! window of a 10,000-token decode never replays events.
//!
//! Token editing replaces a decoded cell's token at a later step of its block: a cell keeps the
//! token it was committed with, and an edited one also the list of its replacements (step
//! index, the token it held, the new token, its confidence), so the state at `k` is the newest
//! replacement at or before `k`: going back undoes edits and going forward redoes them, with
//! nothing to replay. A cell that was never edited costs what it did before.
//!
//! A new header starts a new run (a restart); the old run is dropped.

use std::collections::HashMap;
use std::ops::Range;

use crate::engine::settings::DecodeSettings;
use crate::sampler::Ranked;
use crate::trace::detok::{self, End, Piece};
use crate::trace::events::{
    BlockEvent, Event, FinishEvent, FinishReason, Header, StepEvent, TopCandidate,
};

/// `CellRec::at` of a position nothing has decoded yet.
const NOT_DECODED: u32 = u32::MAX;
/// `CellRec::at` of a prompt position (decoded before any step).
const PROMPT: u32 = u32::MAX - 1;

/// The cell's first token: the one its commit set (an edit's are in `Run::edits`).
#[derive(Clone, Copy, Debug)]
struct CellRec {
    token: u32,
    /// Step index that decoded it, or `NOT_DECODED` / `PROMPT`.
    at: u32,
    conf: f32,
    entropy: f32,
}

/// One recorded denoising step.
#[derive(Clone, Debug, PartialEq)]
pub struct StepRec {
    pub block: usize,
    /// 0-based within its block.
    pub step: usize,
    /// Running count of forward passes, this one included.
    pub forward: usize,
    pub t_ms: f64,
    /// Positions this step committed.
    pub committed: usize,
    /// Positions this step edited (replaced the token of: token editing).
    pub edited: usize,
    /// No mask of its block was left before it: a post-step, which can only edit.
    pub post: bool,
    /// Edits by all steps up to and including this one.
    pub edits_total: usize,
    /// This step's edits, ascending by position, in `Run::edits`.
    edits: Range<u32>,
    /// Positions committed by all steps up to and including this one.
    pub tokens_total: usize,
    /// Of those, the ones inside `max_new_tokens` (cells past it are decoded but dropped).
    kept_total: usize,
    /// Lowest position this step committed, else edited (the inspector's default cell).
    pub first_commit: Option<usize>,
    /// This step's candidates for still-masked cells, sorted by position, in `Run::cands`.
    cands: Range<u32>,
    /// `--routing`: distinct experts the step's pass read, over its sparse layers.
    pub experts: Option<ExpertCounts>,
    /// The sum of `experts`' means over the routed steps up to and including this one, and
    /// their count (as `tokens_total` runs: the stats panel asks every frame).
    experts_run: (f64, u32),
}

/// Distinct experts one pass read per sparse layer: mean, fewest and most over the layers.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ExpertCounts {
    pub mean: f32,
    pub min: u32,
    pub max: u32,
}

impl ExpertCounts {
    fn of(per_layer: &[u32]) -> Option<Self> {
        let (min, max) = (*per_layer.iter().min()?, *per_layer.iter().max()?);
        let mean = per_layer.iter().map(|&n| n as f32).sum::<f32>() / per_layer.len() as f32;
        Some(ExpertCounts { mean, min, max })
    }
}

/// One (expert, weight) slot of a recorded route.
#[derive(Clone, Copy, Debug, PartialEq)]
struct RouteSlot {
    /// `NO_EXPERT` where the route had fewer than `top_k` experts.
    expert: u16,
    weight: f32,
}

const NO_EXPERT: u16 = u16::MAX;

/// One decode block that has at least one step.
#[derive(Clone, Debug, PartialEq)]
pub struct BlockRec {
    pub block: usize,
    /// Step index of its first step.
    pub first_step: usize,
    /// Steps recorded so far.
    pub steps: usize,
    /// Set by the block event (its last denoising pass done): forward count after it.
    pub done_forward: Option<usize>,
}

/// How many steps a block takes, as far as is known.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BlockSteps {
    /// The block is finished: the steps it took.
    Took(usize),
    /// Not finished (live, or a trace cut short): at most this many.
    AtMost(usize),
}

impl BlockSteps {
    /// The count once known.
    pub fn took(self) -> Option<usize> {
        match self {
            BlockSteps::Took(n) => Some(n),
            BlockSteps::AtMost(_) => None,
        }
    }
}

/// `3`, or `≤4` while the block is unfinished.
impl std::fmt::Display for BlockSteps {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BlockSteps::Took(n) => write!(f, "{n}"),
            BlockSteps::AtMost(n) => write!(f, "≤{n}"),
        }
    }
}

/// The model's preferred token for a masked cell at one step.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Cand {
    pos: u32,
    token: u32,
    conf: f32,
}

/// What a cell looks like at some step index.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum CellState {
    Prompt {
        token: u32,
    },
    Decoded(Decoded),
    /// Still masked; `cand` is the model's current preference (None before its block's first step).
    Masked {
        cand: Option<Candidate>,
    },
}

/// A decoded cell at some step index: the token it holds then, and the step that set it (its
/// commit, or the newest edit up to then).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Decoded {
    pub token: u32,
    /// Step index that set the token: the commit, or the newest edit.
    pub at: usize,
    /// Step within its block that set the token.
    pub step: usize,
    pub conf: f32,
    pub entropy: f32,
    /// How many times its token was replaced up to the step asked about (0: never edited).
    pub edits: usize,
    /// Step index that committed it (`at`, unless edited).
    pub committed_at: usize,
}

impl Decoded {
    /// Its token is not the one it was committed with.
    pub fn edited(&self) -> bool {
        self.edits > 0
    }
}

/// One token a position held: committed, or put there by an edit.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Held {
    pub token: u32,
    /// Step index that set it.
    pub at: usize,
    /// Step within its block that set it.
    pub step: usize,
    pub conf: f32,
    pub entropy: f32,
}

/// One replacement of a decoded position's token by a step (token editing).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Edit {
    pub pos: usize,
    /// Step index that made it.
    pub at: usize,
    /// The token the position held before.
    pub from: u32,
    pub token: u32,
    pub conf: f32,
    pub entropy: f32,
}

/// An edit as stored: compact, as every edited cell of a long decode keeps its list.
#[derive(Clone, Copy, Debug, PartialEq)]
struct EditRec {
    pos: u32,
    at: u32,
    from: u32,
    token: u32,
    conf: f32,
    entropy: f32,
}

impl EditRec {
    fn public(&self) -> Edit {
        Edit {
            pos: self.pos as usize,
            at: self.at as usize,
            from: self.from,
            token: self.token,
            conf: self.conf,
            entropy: self.entropy,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Candidate {
    pub token: u32,
    pub conf: f32,
}

/// One point of a cell's history: at step index `at` the model preferred `token`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TrajPoint {
    pub at: usize,
    pub step: usize,
    pub token: u32,
    pub conf: f32,
    /// This step committed it (the last point of a decoded cell that was never edited).
    pub committed: bool,
    /// This step replaced the cell's token with `token` (points after the commit).
    pub edited: bool,
}

/// Everything recorded for one decode, from its header on.
#[derive(Debug)]
pub struct Run {
    pub header: Header,
    cells: Vec<CellRec>,
    /// Every edit, in step order (each step's ascending by position).
    edits: Vec<EditRec>,
    /// Per edited position, its edits' indices in `edits`, oldest first.
    edits_of: HashMap<u32, Vec<u32>>,
    steps: Vec<StepRec>,
    blocks: Vec<BlockRec>,
    cands: Vec<Cand>,
    /// `--candidates` lists, all in one vector: `tops[top_of[(step index, pos)]]` is the list
    /// of `pos` at that step (committed or still masked). Empty for a trace without them.
    tops: Vec<Ranked>,
    top_of: HashMap<(u32, u32), Range<u32>>,
    /// `--routing` routes, all in one vector: the `top_k` slots per sparse layer (the header's
    /// `model.moe` order) of a position's row in the pass of step index `k` that committed or
    /// edited it start at `route_of[(pos, k)]`. Empty without them.
    routes: Vec<RouteSlot>,
    route_of: HashMap<(u32, u32), u32>,
    /// Text of every token id seen (a token's piece never changes within a run).
    pieces: HashMap<u32, Box<str>>,
    /// Bytes of the tokens whose bytes are not their piece (they split a character).
    raw: HashMap<u32, Box<[u8]>>,
    /// Columns of the widest decoded token as a cell shows it (its own text, made visible):
    /// how wide the grid's cells need to be.
    widest: usize,
    /// Final text of every position of the finished blocks (prompt blocks included), in order.
    texts: Vec<detok::Text>,
    /// Per block from 0: bytes of a character left incomplete by the blocks before it.
    carries: Vec<Box<[u8]>>,
    /// `(block, settings)` in force from that block on; the first entry is the header's.
    settings_log: Vec<(usize, DecodeSettings)>,
    /// `(pos, from, until)` of every EOS inside the output range: put there at step index
    /// `from` (a commit or an edit), replaced by an edit at `until` (`usize::MAX`: never).
    eos: Vec<(usize, usize, usize)>,
    pub finish: Option<FinishEvent>,
    /// Events that contradicted what came before and were dropped (a corrupt trace).
    pub ignored: usize,
    /// The most steps a block of this run may take (see `step_span`).
    step_span: usize,
}

/// The store: the current run, and how many runs have started (restarts bump it).
#[derive(Debug, Default)]
pub struct Store {
    run: Option<Run>,
    generation: usize,
}

impl Store {
    pub fn new() -> Self {
        Store::default()
    }

    pub fn from_events(events: impl IntoIterator<Item = Event>) -> Self {
        let mut s = Store::new();
        for ev in events {
            s.push(ev);
        }
        s
    }

    pub fn push(&mut self, ev: Event) {
        match ev {
            Event::Header(h) => {
                self.run = Some(Run::new(*h));
                self.generation += 1;
            }
            Event::Step(s) => self.with_run(|r| r.push_step(s)),
            Event::Block(b) => self.with_run(|r| r.push_block(b)),
            Event::Finish(f) => self.with_run(|r| r.push_finish(f)),
        }
    }

    /// Events before any header have nothing to attach to and are dropped.
    fn with_run(&mut self, f: impl FnOnce(&mut Run)) {
        if let Some(r) = self.run.as_mut() {
            f(r)
        }
    }

    pub fn run(&self) -> Option<&Run> {
        self.run.as_ref()
    }

    /// Bumped by every header: views reset their cursor when it changes.
    pub fn generation(&self) -> usize {
        self.generation
    }

    /// Heap bytes held by the store, for the memory-per-token figure in docs/perf.md.
    pub fn heap_bytes(&self) -> usize {
        self.run.as_ref().map_or(0, Run::heap_bytes)
    }
}

impl Run {
    fn new(header: Header) -> Self {
        let mut pieces = HashMap::new();
        let mut raw = HashMap::new();
        for (i, (&token, piece)) in header.prompt_ids.iter().zip(&header.prompt_pieces).enumerate()
        {
            match header.prompt_bytes.as_ref().and_then(|b| b.get(i)) {
                // The pieces are per position then; a token alone reads as its bytes do.
                Some(bytes) => {
                    pieces.entry(token).or_insert_with(|| String::from_utf8_lossy(bytes).into());
                    if std::str::from_utf8(bytes).is_err() {
                        raw.entry(token).or_insert_with(|| bytes.as_slice().into());
                    }
                }
                None => {
                    pieces.entry(token).or_insert_with(|| piece.as_str().into());
                }
            }
        }
        let cells = header
            .prompt_ids
            .iter()
            .map(|&token| CellRec { token, at: PROMPT, conf: 1.0, entropy: 0.0 })
            .collect();
        let settings_log = vec![(header.first_block, header.settings.clone())];
        let mut run = Run {
            header,
            cells,
            edits: Vec::new(),
            edits_of: HashMap::new(),
            steps: Vec::new(),
            blocks: Vec::new(),
            cands: Vec::new(),
            tops: Vec::new(),
            top_of: HashMap::new(),
            routes: Vec::new(),
            route_of: HashMap::new(),
            pieces,
            widest: 0,
            raw,
            texts: Vec::new(),
            carries: vec![Box::default()],
            settings_log,
            eos: Vec::new(),
            finish: None,
            ignored: 0,
            step_span: 1,
        };
        run.update_step_span();
        for block in 0..run.header.first_block {
            run.finish_block_texts(block, None);
        }
        run
    }

    pub fn block_length(&self) -> usize {
        self.header.settings.block_length.max(1)
    }

    pub fn prompt_len(&self) -> usize {
        self.header.prompt_ids.len()
    }

    /// Step index of the newest step, if any.
    pub fn head(&self) -> Option<usize> {
        self.steps.len().checked_sub(1)
    }

    pub fn steps(&self) -> &[StepRec] {
        &self.steps
    }

    pub fn step(&self, k: usize) -> Option<&StepRec> {
        self.steps.get(k)
    }

    pub fn blocks(&self) -> &[BlockRec] {
        &self.blocks
    }

    /// The record of decode block `block`, if it has started.
    pub fn block(&self, block: usize) -> Option<&BlockRec> {
        let i = block.checked_sub(self.header.first_block)?;
        self.blocks.get(i)
    }

    /// The most steps `block` may take (its settings' [`DecodeSettings::step_budget`], or the
    /// steps it took, if more).
    pub fn block_step_budget(&self, block: usize) -> usize {
        let took = self.block(block).map_or(0, |b| b.steps);
        self.settings_for(block).0.step_budget().max(took)
    }

    /// The `N` of "step k/N" wherever a step is shown: the steps `block` took once its block
    /// event is in, else at most its budget (a dynamic strategy or token editing decides the
    /// count as it goes).
    pub fn block_step_count(&self, block: usize) -> BlockSteps {
        match self.block(block) {
            Some(b) if b.done_forward.is_some() => BlockSteps::Took(b.steps),
            _ => BlockSteps::AtMost(self.block_step_budget(block)),
        }
    }

    /// Step indices of `block` recorded so far.
    pub fn block_steps(&self, block: usize) -> Range<usize> {
        self.block(block).map_or(0..0, |b| b.first_step..b.first_step + b.steps)
    }

    /// Total number of blocks this decode can have (prompt blocks included).
    pub fn max_blocks(&self) -> usize {
        self.header.max_len.div_ceil(self.block_length()).max(self.header.first_block + 1)
    }

    /// Columns of the widest token committed or edited in so far, as a cell shows it alone.
    pub fn widest_token(&self) -> usize {
        self.widest
    }

    /// Keeps [`Run::widest_token`] up to date with a decoded token's text.
    fn widen(&mut self, text: &str) {
        let w = crate::glyph::width(&crate::glyph::escape(text, crate::glyph::Mode::Cell));
        self.widest = self.widest.max(w);
    }

    /// The text piece of a token id, as the events spelled it.
    pub fn piece(&self, token: u32) -> &str {
        self.pieces.get(&token).map_or("", |p| p)
    }

    /// The bytes a token adds to a decode.
    pub fn token_bytes(&self, token: u32) -> &[u8] {
        self.raw.get(&token).map_or(self.piece(token).as_bytes(), |b| b)
    }

    /// Whether a token's bytes are not whole characters (it splits one, or is invalid UTF-8).
    pub fn is_raw(&self, token: u32) -> bool {
        self.raw.contains_key(&token)
    }

    /// A token on its own, as a candidate shows it: its piece, or its bytes as hex (`<E2 89>`)
    /// when it holds part of a character.
    pub fn token_label(&self, token: u32) -> std::borrow::Cow<'_, str> {
        match self.raw.get(&token) {
            Some(b) => detok::hex(b).into(),
            None => self.piece(token).into(),
        }
    }

    /// What cell `pos` shows at step `k` (`None` while masked): the text its bytes add to the
    /// positions before it, or its bytes while a masked neighbour leaves them incomplete.
    pub fn cell_piece(&self, pos: usize, k: Option<usize>) -> Option<Piece> {
        let b = self.block_length();
        let block = pos / b;
        let done = block < self.header.first_block || block < self.active_block(k);
        if done {
            if let Some(t) = self.texts.get(pos) {
                return Some(Piece::Text(t.clone()));
            }
        }
        let span = block * b..(block + 1) * b;
        let bytes: Vec<Option<&[u8]>> = span
            .clone()
            .map(|p| match self.cell(p, k) {
                CellState::Prompt { token } => Some(self.token_bytes(token)),
                CellState::Decoded(d) => Some(self.token_bytes(d.token)),
                CellState::Masked { .. } => None,
            })
            .collect();
        let carry = self.carries.get(block).map_or(&[][..], |c| c);
        detok::pieces(carry, &bytes, End::Open).0.swap_remove(pos - span.start)
    }

    /// The final text of the cells of `block`, once it is finished; `out_end` (absolute) is
    /// where the output ends if it ends in this block: an incomplete character there becomes
    /// `U+FFFD`, and later cells read on from nothing.
    fn finish_block_texts(&mut self, block: usize, out_end: Option<usize>) {
        let b = self.block_length();
        let span = block * b..(block + 1) * b;
        let Some(carry) = self.carries.get(block).cloned() else { return };
        let tokens: Vec<u32> =
            span.clone().filter(|&p| p < self.cells.len()).map(|p| self.final_token(p)).collect();
        let bytes: Vec<&[u8]> = tokens.iter().map(|&t| self.token_bytes(t)).collect();
        let cut = out_end
            .map_or(bytes.len(), |e| e.clamp(span.start, span.start + bytes.len()) - span.start);
        let end = if out_end.is_some() { End::Final } else { End::Open };
        let (mut texts, next) = detok::settled(&carry, &bytes[..cut], end);
        texts.extend(detok::settled(&[], &bytes[cut..], End::Open).0);
        self.texts.truncate(span.start);
        self.texts.extend(texts);
        self.carries.truncate(block + 1);
        self.carries.push(next.into());
    }

    /// State of `pos` right after step `k` (`None`: before any step).
    pub fn cell(&self, pos: usize, k: Option<usize>) -> CellState {
        let Some(c) = self.cells.get(pos) else { return CellState::Masked { cand: None } };
        match (c.at, k) {
            (PROMPT, _) => CellState::Prompt { token: c.token },
            (at, Some(k)) if at != NOT_DECODED && at as usize <= k => {
                let at = at as usize;
                let mut d = Decoded {
                    token: c.token,
                    at,
                    step: self.steps[at].step,
                    conf: c.conf,
                    entropy: c.entropy,
                    edits: 0,
                    committed_at: at,
                };
                // The newest edit at or before `k` (the list is in step order).
                if let Some(list) = self.edits_of.get(&(pos as u32)) {
                    let n = list.partition_point(|&i| self.edits[i as usize].at as usize <= k);
                    if let Some(e) = n.checked_sub(1).map(|i| self.edits[list[i] as usize]) {
                        let at = e.at as usize;
                        d = Decoded {
                            token: e.token,
                            at,
                            step: self.steps[at].step,
                            conf: e.conf,
                            entropy: e.entropy,
                            edits: n,
                            ..d
                        };
                    }
                }
                CellState::Decoded(d)
            }
            _ => CellState::Masked { cand: k.and_then(|k| self.candidate(pos, k)) },
        }
    }

    /// The token `pos` holds once every step recorded so far is applied (its edits included).
    fn final_token(&self, pos: usize) -> u32 {
        let last = self.edits_of.get(&(pos as u32)).and_then(|l| l.last());
        last.map_or(self.cells[pos].token, |&i| self.edits[i as usize].token)
    }

    /// Every token `pos` held up to step `k`, oldest first: its commit, then each edit's
    /// token (empty while masked, and for a prompt cell).
    pub fn history(&self, pos: usize, k: usize) -> Vec<Held> {
        let Some(c) = self.cells.get(pos).filter(|c| c.at != PROMPT && c.at != NOT_DECODED) else {
            return Vec::new();
        };
        if c.at as usize > k {
            return Vec::new();
        }
        let held = |token, at: usize, conf, entropy| Held {
            token,
            at,
            step: self.steps[at].step,
            conf,
            entropy,
        };
        let mut out = vec![held(c.token, c.at as usize, c.conf, c.entropy)];
        for e in self.edits_of.get(&(pos as u32)).into_iter().flatten() {
            let e = self.edits[*e as usize];
            if e.at as usize > k {
                break;
            }
            out.push(held(e.token, e.at as usize, e.conf, e.entropy));
        }
        out
    }

    /// The edits step `k` made, ascending by position.
    pub fn edits_at(&self, k: usize) -> impl Iterator<Item = Edit> + '_ {
        let r = self.steps.get(k).map_or(0..0, |s| s.edits.start as usize..s.edits.end as usize);
        self.edits[r].iter().map(EditRec::public)
    }

    /// Whether any step recorded so far edited a token: views that mark edits say so only then.
    pub fn has_edits(&self) -> bool {
        !self.edits.is_empty()
    }

    /// The model's preference for masked `pos` as of step `k`: from the newest step of its
    /// block at or before `k`.
    fn candidate(&self, pos: usize, k: usize) -> Option<Candidate> {
        let block = pos / self.block_length();
        let steps = self.block_steps(block);
        if steps.start > k || steps.is_empty() {
            return None;
        }
        let last = k.min(steps.end - 1);
        self.cand_in_step(pos, last).map(|c| Candidate { token: c.token, conf: c.conf })
    }

    fn cand_in_step(&self, pos: usize, k: usize) -> Option<Cand> {
        let r = &self.steps[k].cands;
        let slice = &self.cands[r.start as usize..r.end as usize];
        slice.binary_search_by_key(&(pos as u32), |c| c.pos).ok().map(|i| slice[i])
    }

    /// What the model preferred for `pos` at every step of its block up to `k`, while it was
    /// still masked; then the committing step, marked, and each edit up to `k` after it.
    pub fn trajectory(&self, pos: usize, k: usize) -> Vec<TrajPoint> {
        let block = pos / self.block_length();
        let decoded = match self.cell(pos, Some(k)) {
            CellState::Decoded(d) => Some(d),
            CellState::Prompt { .. } => return Vec::new(),
            CellState::Masked { .. } => None,
        };
        let steps = self.block_steps(block);
        let end = decoded.map_or(k + 1, |d| d.committed_at).min(steps.end);
        let mut out: Vec<TrajPoint> = (steps.start..end.max(steps.start))
            .filter_map(|i| {
                let c = self.cand_in_step(pos, i)?;
                Some(TrajPoint {
                    at: i,
                    step: self.steps[i].step,
                    token: c.token,
                    conf: c.conf,
                    committed: false,
                    edited: false,
                })
            })
            .collect();
        if decoded.is_some() {
            out.extend(self.history(pos, k).into_iter().enumerate().map(|(i, h)| TrajPoint {
                at: h.at,
                step: h.step,
                token: h.token,
                conf: h.conf,
                committed: i == 0,
                edited: i > 0,
            }));
        }
        out
    }

    /// The block whose step `k` is (the block being decoded in the view).
    pub fn active_block(&self, k: Option<usize>) -> usize {
        k.and_then(|k| self.steps.get(k)).map_or(self.header.first_block, |s| s.block)
    }

    /// Position one past the last cell the view shows at `k`: the end of the active block.
    pub fn shown_end(&self, k: Option<usize>) -> usize {
        (self.active_block(k) + 1) * self.block_length()
    }

    /// Position one past the last output token at `k`: cells after it (beyond the length, or
    /// after a decoded EOS) are decoded but dropped from the output.
    pub fn output_end(&self, k: Option<usize>) -> usize {
        let held =
            |k: usize| move |&&(_, from, until): &&(usize, usize, usize)| from <= k && k < until;
        let eos = k.and_then(|k| self.eos.iter().filter(held(k)).map(|&(p, _, _)| p + 1).min());
        eos.unwrap_or(usize::MAX).min(self.header.max_len)
    }

    /// Output tokens decoded by step `k`: commits inside `max_new_tokens`, none past a decoded
    /// EOS. What tokens/forward and tok/s count (the finish event's `output_ids`, at the end).
    pub fn tokens_out(&self, k: usize) -> usize {
        let Some(s) = self.step(k) else { return 0 };
        s.kept_total.min(self.output_end(Some(k)).saturating_sub(self.prompt_len()))
    }

    /// Settings in force for `block`, and the block they took effect at.
    pub fn settings_for(&self, block: usize) -> (&DecodeSettings, usize) {
        let (from, s) = self
            .settings_log
            .iter()
            .rev()
            .find(|(b, _)| *b <= block)
            .unwrap_or(&self.settings_log[0]);
        (s, *from)
    }

    /// The settings of the newest block (what the engine runs with now).
    pub fn latest_settings(&self) -> &DecodeSettings {
        &self.settings_log.last().expect("the header's settings are always logged").1
    }

    /// How many distinct step colours this run needs: the most steps a block may take.
    /// Kept up to date as events arrive: every drawn cell asks.
    pub fn step_span(&self) -> usize {
        self.step_span
    }

    fn update_step_span(&mut self) {
        let configured = self.settings_log.iter().map(|(_, s)| s.steps).max().unwrap_or(1);
        let observed = self.blocks.last().map_or(1, |b| b.steps);
        self.step_span =
            self.step_span.max(configured.min(self.block_length())).max(observed).max(1);
    }

    /// Forward passes before the first denoising step (the prompt prefill).
    pub fn prefill_forwards(&self) -> usize {
        self.steps.first().map_or(0, |s| s.forward.saturating_sub(1))
    }

    /// Forwards per finished block up to `k` (its denoising passes; storing it is free).
    pub fn forwards_per_block(&self, k: usize) -> Option<f64> {
        // Blocks are recorded in order and every block before the active one is done; the
        // active one too once `k` is its last step and its block event is in (a replay
        // stopped on the step that finished a block counted it only a step later).
        let active = self.active_block(Some(k)).checked_sub(self.header.first_block)?;
        let finished = self
            .blocks
            .get(active)
            .is_some_and(|b| b.done_forward.is_some() && k + 1 == b.first_step + b.steps);
        let done = active + usize::from(finished);
        let last = self.blocks.get(done.checked_sub(1)?)?.done_forward?;
        // Saturating: a recorded trace's counters are input, not arithmetic facts.
        Some(last.saturating_sub(self.prefill_forwards()) as f64 / done as f64)
    }

    fn push_step(&mut self, s: StepEvent) {
        if !self.accept_step(&s) {
            self.ignored += 1;
            return;
        }
        let b = self.block_length();
        let k = self.steps.len();
        if self.block(s.block).is_none() {
            self.blocks.push(BlockRec {
                block: s.block,
                first_step: k,
                steps: 0,
                done_forward: None,
            });
            self.grow_cells((s.block + 1) * b);
        }
        if let Some(new) = s.settings.clone() {
            self.settings_log.push((s.block, new));
        }
        let span = s.block * b..(s.block + 1) * b;
        // Before this step's commits: did its block have a mask left?
        let post = span
            .clone()
            .filter(|&p| p >= self.prompt_len())
            .all(|p| self.cells.get(p).is_some_and(|c| c.at != NOT_DECODED));
        let mut first_commit = None;
        let (mut committed, mut kept) = (0, 0);
        // Edits first, against what the cells held before the step (a position the step also
        // commits was masked, so cannot be edited by it).
        let edits_start = self.edits.len() as u32;
        let mut first_edit = None;
        let mut edited: Vec<&crate::trace::events::Edited> = s.edited.iter().collect();
        edited.sort_by_key(|e| e.pos);
        for e in edited {
            // Only a decoded, generated cell of this block, from the token it holds, to another.
            let held = span.contains(&e.pos)
                && e.pos >= self.prompt_len()
                && self.cells[e.pos].at != NOT_DECODED
                && self.final_token(e.pos) == e.from
                && e.token != e.from
                && self.edits_of.get(&(e.pos as u32)).is_none_or(|l| {
                    l.last().is_none_or(|&i| (self.edits[i as usize].at as usize) < k)
                });
            if !held {
                continue;
            }
            let pos = e.pos as u32;
            self.edits_of.entry(pos).or_default().push(self.edits.len() as u32);
            self.edits.push(EditRec {
                pos,
                at: k as u32,
                from: e.from,
                token: e.token,
                conf: e.conf,
                entropy: e.entropy,
            });
            self.learn(e.token, &e.text, e.bytes.as_deref());
            self.widen(&e.text);
            self.push_top(k, e.pos, &e.top);
            self.push_routes(e.pos, k, &e.routes);
            if e.pos < self.header.max_len {
                let eos = &self.header.eos_ids;
                if eos.contains(&e.from) {
                    let open = self.eos.iter_mut().find(|x| x.0 == e.pos && x.2 == usize::MAX);
                    if let Some(x) = open {
                        x.2 = k;
                    }
                }
                if eos.contains(&e.token) {
                    self.eos.push((e.pos, k, usize::MAX));
                }
            }
            first_edit = Some(first_edit.map_or(e.pos, |f: usize| f.min(e.pos)));
        }
        for c in &s.committed {
            // Only a masked, generated cell of this block can be committed, and only once.
            let fresh = span.contains(&c.pos)
                && c.pos >= self.prompt_len()
                && self.cells[c.pos].at == NOT_DECODED;
            if !fresh {
                continue;
            }
            self.cells[c.pos] =
                CellRec { token: c.token, at: k as u32, conf: c.conf, entropy: c.entropy };
            self.learn(c.token, &c.text, c.bytes.as_deref());
            self.widen(&c.text);
            self.push_top(k, c.pos, &c.top);
            self.push_routes(c.pos, k, &c.routes);
            if self.header.eos_ids.contains(&c.token) && c.pos < self.header.max_len {
                self.eos.push((c.pos, k, usize::MAX));
            }
            first_commit = Some(first_commit.map_or(c.pos, |f: usize| f.min(c.pos)));
            committed += 1;
            kept += usize::from(c.pos < self.header.max_len);
        }
        let start = self.cands.len() as u32;
        for c in s.masked.iter().filter(|c| span.contains(&c.pos)) {
            self.cands.push(Cand { pos: c.pos as u32, token: c.token, conf: c.conf });
            self.learn(c.token, &c.text, c.bytes.as_deref());
            self.push_top(k, c.pos, &c.top);
        }
        // Sorted so that a cell's candidate is a binary search away.
        self.cands[start as usize..].sort_by_key(|c| c.pos);
        let tokens_total = self.steps.last().map_or(0, |p| p.tokens_total) + committed;
        let edited = self.edits.len() - edits_start as usize;
        let edits_total = self.steps.last().map_or(0, |p| p.edits_total) + edited;
        let kept_total = self.steps.last().map_or(0, |p| p.kept_total) + kept;
        let experts = ExpertCounts::of(&s.distinct_experts);
        let (sum, n) = self.steps.last().map_or((0.0, 0), |p| p.experts_run);
        let experts_run = experts.map_or((sum, n), |e| (sum + f64::from(e.mean), n + 1));
        self.steps.push(StepRec {
            block: s.block,
            step: s.step,
            forward: s.forward,
            t_ms: s.t_ms,
            committed,
            edited,
            post,
            edits_total,
            edits: edits_start..self.edits.len() as u32,
            tokens_total,
            kept_total,
            first_commit: first_commit.or(first_edit),
            cands: start..self.cands.len() as u32,
            experts,
            experts_run,
        });
        self.blocks.last_mut().expect("pushed above").steps += 1;
        self.update_step_span();
    }

    /// Remembers a token's text (and bytes, where they differ) as the events spelled it.
    fn learn(&mut self, token: u32, text: &str, bytes: Option<&[u8]>) {
        self.pieces.entry(token).or_insert_with(|| text.into());
        if let Some(b) = bytes {
            self.raw.entry(token).or_insert_with(|| b.into());
        }
    }

    /// Keeps the `--candidates` list of `pos` at step index `k` (nothing for an empty one).
    fn push_top(&mut self, k: usize, pos: usize, top: &[TopCandidate]) {
        if top.is_empty() {
            return;
        }
        let start = self.tops.len() as u32;
        for t in top {
            self.learn(t.token, &t.text, t.bytes.as_deref());
            self.tops.push(Ranked { token: t.token, p: t.p });
        }
        self.top_of.insert((k as u32, pos as u32), start..self.tops.len() as u32);
    }

    /// Keeps the `--routing` routes of `pos`, committed or edited at step index `at` (nothing
    /// for none, or where the header has no layout for them: a trace checked by limits.rs
    /// always does).
    fn push_routes(&mut self, pos: usize, at: usize, routes: &[crate::trace::events::Route]) {
        let Some(k) = self.header.model.moe.as_ref().map(|m| m.top_k) else { return };
        if routes.is_empty() {
            return;
        }
        self.route_of.insert((pos as u32, at as u32), self.routes.len() as u32);
        for r in routes {
            let slots = (0..k).map(|i| match (r.experts.get(i), r.weights.get(i)) {
                (Some(&e), Some(&w)) => {
                    RouteSlot { expert: u16::try_from(e).unwrap_or(NO_EXPERT), weight: w }
                }
                _ => RouteSlot { expert: NO_EXPERT, weight: 0.0 },
            });
            self.routes.extend(slots);
        }
    }

    /// The `--routing` routes of `pos` in the pass that committed it, one per sparse layer
    /// (the header's `model.moe.sparse_layers`), or `None` where none were recorded.
    pub fn routes(&self, pos: usize) -> Option<Vec<crate::trace::events::Route>> {
        let at = self.cells.get(pos).map(|c| c.at).filter(|&a| a != PROMPT && a != NOT_DECODED)?;
        self.routes_at(pos, at as usize)
    }

    /// The `--routing` routes of `pos` in the pass of step index `at`, which committed or
    /// edited it (`Decoded::at`: the pass that set the token it holds).
    pub fn routes_at(&self, pos: usize, at: usize) -> Option<Vec<crate::trace::events::Route>> {
        let m = self.header.model.moe.as_ref()?;
        let start = *self.route_of.get(&(pos as u32, at as u32))? as usize;
        let all = self.routes.get(start..start + m.sparse_layers.len() * m.top_k)?;
        let route = |slots: &[RouteSlot]| {
            let used = slots.iter().filter(|s| s.expert != NO_EXPERT);
            crate::trace::events::Route {
                experts: used.clone().map(|s| s.expert.into()).collect(),
                weights: used.map(|s| s.weight).collect(),
            }
        };
        Some(all.chunks(m.top_k).map(route).collect())
    }

    /// The mean over the steps up to `k` of distinct experts a pass read per sparse layer.
    pub fn experts_mean(&self, k: usize) -> Option<f32> {
        let (sum, n) = self.steps.get(k)?.experts_run;
        (n > 0).then(|| (sum / f64::from(n)) as f32)
    }

    /// The most probable tokens of `pos` at step index `k`, most probable first, as
    /// `--candidates` recorded them (empty without them, or where `pos` was not sampled).
    pub fn top(&self, pos: usize, k: usize) -> &[Ranked] {
        self.top_of
            .get(&(k as u32, pos as u32))
            .map_or(&[], |r| &self.tops[r.start as usize..r.end as usize])
    }

    /// A step belongs to the newest block or starts the next one; anything else (a block that
    /// is finished, skipped blocks, a step after the finish) contradicts the recording.
    fn accept_step(&self, s: &StepEvent) -> bool {
        if self.finish.is_some() || s.block < self.header.first_block {
            return false;
        }
        match self.blocks.last() {
            None => s.block == self.header.first_block,
            Some(last) if last.block == s.block => last.done_forward.is_none(),
            Some(last) => s.block == last.block + 1 && last.done_forward.is_some(),
        }
    }

    fn push_block(&mut self, b: BlockEvent) {
        match self.blocks.last_mut() {
            Some(last) if last.block == b.block && last.done_forward.is_none() => {
                last.done_forward = Some(b.forward);
                self.finish_block_texts(b.block, None);
            }
            _ => self.ignored += 1,
        }
    }

    /// The output ends in the last finished block: its texts take the end of the decode.
    fn push_finish(&mut self, f: FinishEvent) {
        let out_end = self.prompt_len() + f.output_ids.len();
        let last_done = self.blocks.last().filter(|b| b.done_forward.is_some()).map(|b| b.block);
        if matches!(f.reason, FinishReason::Eos | FinishReason::Length | FinishReason::Stop) {
            if let Some(block) = last_done {
                self.finish_block_texts(block, Some(out_end));
            }
        }
        self.finish = Some(f);
    }

    fn grow_cells(&mut self, len: usize) {
        let mask = self.header.mask_token_id;
        if self.cells.len() < len {
            self.cells
                .resize(len, CellRec { token: mask, at: NOT_DECODED, conf: 0.0, entropy: 0.0 });
        }
    }

    fn heap_bytes(&self) -> usize {
        use std::mem::size_of;
        let pieces: usize = self
            .pieces
            .values()
            .map(|p| p.len() + size_of::<(u32, Box<str>)>())
            .sum::<usize>()
            + self.raw.values().map(|b| b.len() + size_of::<(u32, Box<[u8]>)>()).sum::<usize>()
            + self.texts.iter().map(|t| t.heap_bytes() + size_of::<detok::Text>()).sum::<usize>()
            + self.carries.iter().map(|c| c.len() + size_of::<Box<[u8]>>()).sum::<usize>();
        self.cells.capacity() * size_of::<CellRec>()
            + self.steps.capacity() * size_of::<StepRec>()
            + self.blocks.capacity() * size_of::<BlockRec>()
            + self.cands.capacity() * size_of::<Cand>()
            + self.eos.capacity() * size_of::<(usize, usize, usize)>()
            + self.edits.capacity() * size_of::<EditRec>()
            + self
                .edits_of
                .values()
                .map(|l| l.capacity() * size_of::<u32>() + size_of::<(u32, Vec<u32>)>())
                .sum::<usize>()
            + self.tops.capacity() * size_of::<Ranked>()
            + self.routes.capacity() * size_of::<RouteSlot>()
            + self.route_of.capacity() * size_of::<((u32, u32), u32)>()
            + self.top_of.capacity() * size_of::<((u32, u32), Range<u32>)>()
            + pieces
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::synth::{self, Synth};

    fn store() -> Store {
        Store::from_events(synth::trace(&Synth::small()))
    }

    #[test]
    fn cells_decode_at_their_step_and_not_before() {
        let s = store();
        let r = s.run().unwrap();
        let first = r.header.first_block * r.block_length();
        // Some cell of the first decode block is decoded at a step; before it, it is masked.
        let pos = (first..first + r.block_length()).find(|&p| p >= r.prompt_len()).unwrap();
        let CellState::Decoded(d) = r.cell(pos, r.head()) else {
            panic!("not decoded at the head")
        };
        assert!(matches!(r.cell(pos, Some(d.at)), CellState::Decoded(_)));
        if d.at > 0 {
            assert!(matches!(r.cell(pos, Some(d.at - 1)), CellState::Masked { cand: Some(_) }));
        }
        assert!(matches!(r.cell(pos, None), CellState::Masked { cand: None }));
        assert!(matches!(r.cell(0, None), CellState::Prompt { .. }));
    }

    #[test]
    fn every_generated_position_is_decoded_once_at_the_head() {
        let s = store();
        let r = s.run().unwrap();
        let end = r.shown_end(r.head());
        let decoded = (r.prompt_len()..end)
            .filter(|&p| matches!(r.cell(p, r.head()), CellState::Decoded(_)))
            .count();
        assert_eq!(decoded, end - r.prompt_len());
        assert_eq!(r.steps().last().unwrap().tokens_total, decoded);
    }

    /// tokens/forward and tok/s count output tokens: the last block's cells past
    /// max_new_tokens, and cells after a decoded EOS, are decoded but not output.
    #[test]
    fn tokens_out_leaves_out_cells_past_the_length_or_an_eos() {
        let s = store();
        let r = s.run().unwrap();
        let head = r.head().unwrap();
        // 6 prompt tokens, 24 new, blocks of 4: positions 30 and 31 are decoded and dropped
        assert_eq!(r.steps().last().unwrap().tokens_total, 26);
        assert_eq!(r.tokens_out(head), 24);
        assert_eq!(r.tokens_out(head), r.finish.as_ref().unwrap().output_ids.len());
        let eos = Store::from_events(synth::trace(&Synth { eos_at: Some(13), ..Synth::small() }));
        let r = eos.run().unwrap();
        let head = r.head().unwrap();
        assert_eq!(r.tokens_out(head), r.finish.as_ref().unwrap().output_ids.len());
        assert_eq!(r.tokens_out(head), 13 + 1 - 6);
    }

    #[test]
    fn trajectory_ends_with_the_commit() {
        let s = store();
        let r = s.run().unwrap();
        let pos = r.shown_end(r.head()) - 1;
        let t = r.trajectory(pos, r.head().unwrap());
        let last = t.last().unwrap();
        assert!(last.committed);
        assert!(t[..t.len() - 1].iter().all(|p| !p.committed));
        // Steps are increasing and all inside the cell's block.
        assert!(t.windows(2).all(|w| w[0].at < w[1].at));
        let block = pos / r.block_length();
        assert!(t.iter().all(|p| r.step(p.at).unwrap().block == block));
    }

    /// `--routing`: every committed position's routes come back as its event held them, and
    /// every step's distinct-expert counts as their mean, fewest and most.
    #[test]
    fn routes_and_expert_counts_are_kept() {
        let events = synth::with_routes(synth::trace(&Synth::small()), &synth::sdar_moe_layout());
        let s = Store::from_events(events.clone());
        let r = s.run().unwrap();
        let mut routed = 0;
        let mut k = 0;
        for ev in &events {
            let Event::Step(step) = ev else { continue };
            for c in &step.committed {
                assert_eq!(r.routes(c.pos).as_deref(), Some(&c.routes[..]), "pos {}", c.pos);
                routed += 1;
            }
            let n = &step.distinct_experts;
            let want = ExpertCounts {
                mean: n.iter().sum::<u32>() as f32 / 48.0,
                min: *n.iter().min().unwrap(),
                max: *n.iter().max().unwrap(),
            };
            assert_eq!(r.step(k).unwrap().experts, Some(want));
            k += 1;
        }
        assert!(routed > 20);
        assert_eq!(r.routes(0), None, "a prompt cell has none");
        let means: Vec<f32> = r.steps().iter().map(|s| s.experts.unwrap().mean).collect();
        let want = means.iter().sum::<f32>() / means.len() as f32;
        assert!((r.experts_mean(r.head().unwrap()).unwrap() - want).abs() < 1e-4);
        assert!((r.experts_mean(0).unwrap() - means[0]).abs() < 1e-6);
        // Without --routing: nothing, and no layout needed.
        let plain = Store::from_events(synth::trace(&Synth::small()));
        assert_eq!(plain.run().unwrap().routes(13), None);
        assert_eq!(plain.run().unwrap().step(0).unwrap().experts, None);
    }

    #[test]
    fn candidate_lists_are_kept_per_step_and_position() {
        let s = Store::from_events(synth::with_candidates(synth::trace(&Synth::small()), 3));
        let r = s.run().unwrap();
        let head = r.head().unwrap();
        let mut seen = 0;
        for pos in r.prompt_len()..r.header.max_len {
            for p in r.trajectory(pos, head) {
                let top = r.top(pos, p.at);
                assert_eq!(top.len(), 3, "pos {pos} step index {}", p.at);
                assert_eq!((top[0].token, top[0].p), (p.token, p.conf));
                assert_eq!(r.piece(top[1].token), synth::VOCAB[top[1].token as usize]);
                seen += 1;
            }
        }
        assert!(seen > 24);
        assert!(r.top(0, 0).is_empty(), "a prompt cell has none");
        assert!(store().run().unwrap().top(8, 0).is_empty(), "a trace without them has none");
    }

    /// What every position holds after each step, replayed from the events themselves: the
    /// oracle the store's one-lookup answers are checked against.
    fn replayed(events: &[Event]) -> Vec<HashMap<usize, (u32, usize, usize)>> {
        let mut held: HashMap<usize, (u32, usize, usize)> = HashMap::new();
        let mut out = Vec::new();
        for e in events {
            let Event::Step(s) = e else { continue };
            let k = out.len();
            for x in &s.edited {
                let edits = held[&x.pos].2 + 1;
                held.insert(x.pos, (x.token, k, edits));
            }
            held.extend(s.committed.iter().map(|c| (c.pos, (c.token, k, 0))));
            out.push(held.clone());
        }
        out
    }

    /// Each step applies its edits; any step index shows what each cell held then: going back
    /// undoes edits exactly and forward redoes them. History and trajectory end on that token.
    #[test]
    fn edits_apply_at_their_step_and_undo_before_it() {
        let events = synth::trace(&Synth::small_edits());
        let s = Store::from_events(events.clone());
        let r = s.run().unwrap();
        let want = replayed(&events);
        assert_eq!(r.steps().len(), want.len());
        let mut edited_seen = 0;
        // Backwards over the steps, then forwards: the store keeps no cursor state.
        for k in (0..want.len()).rev().chain(0..want.len()) {
            for pos in r.prompt_len()..r.header.max_len + 2 {
                match (r.cell(pos, Some(k)), want[k].get(&pos)) {
                    (CellState::Decoded(d), Some(&(token, at, edits))) => {
                        assert_eq!((d.token, d.at, d.edits), (token, at, edits), "pos {pos} k {k}");
                        assert_eq!(d.step, r.step(at).unwrap().step);
                        let h = r.history(pos, k);
                        assert_eq!(h.len(), edits + 1);
                        assert_eq!((h[0].at, h.last().unwrap().token), (d.committed_at, token));
                        let t = r.trajectory(pos, k);
                        let last = t.last().unwrap();
                        assert_eq!((last.token, last.edited), (token, edits > 0));
                        assert_eq!(t.iter().filter(|p| p.committed).count(), 1);
                        edited_seen += usize::from(edits > 0);
                    }
                    (CellState::Masked { .. }, None) => {}
                    (got, want) => panic!("pos {pos} at {k}: {got:?}, want {want:?}"),
                }
            }
        }
        assert!(edited_seen > 20, "{edited_seen}");
        assert!(r.has_edits() && !store().run().unwrap().has_edits());
    }

    /// A block's steps after its last mask are post-steps that only edit; the step records
    /// count the edits, and a post-step's first edit is the inspector's default cell.
    #[test]
    fn post_steps_and_edit_counts_are_recorded() {
        let s = Store::from_events(synth::trace(&Synth::small_edits()));
        let r = s.run().unwrap();
        let post: Vec<&StepRec> = r.steps().iter().filter(|s| s.post).collect();
        // Every block ends on a post-step that edits nothing; blocks 2 and 5 edit in one first.
        assert_eq!(post.len(), 7 + 2);
        assert!(post.iter().all(|s| s.committed == 0));
        let editing: Vec<(usize, usize, usize)> =
            post.iter().filter(|s| s.edited > 0).map(|s| (s.block, s.step, s.edited)).collect();
        assert_eq!(editing, [(2, 4, 2), (5, 4, 2)]);
        let k = r.steps().iter().position(|s| s.post && s.edited > 0).unwrap();
        assert_eq!(r.step(k).unwrap().first_commit, Some(10));
        let edits: Vec<Edit> = r.edits_at(k).collect();
        assert_eq!(edits.iter().map(|e| (e.pos, e.at)).collect::<Vec<_>>(), [(10, k), (11, k)]);
        assert_eq!(
            r.step(k).unwrap().edits_total,
            r.steps()[..=k].iter().map(|s| s.edited).sum::<usize>()
        );
        assert_eq!(r.head().map(|h| r.step(h).unwrap().edits_total), Some(9));
        // The block's texts are its final tokens'.
        let plain = store();
        let p = plain.run().unwrap();
        for pos in 0..r.header.max_len {
            assert_eq!(r.cell_piece(pos, r.head()), p.cell_piece(pos, p.head()), "pos {pos}");
        }
    }

    /// An EOS put in by an edit ends the output from that step; one edited away no longer does.
    #[test]
    fn an_eos_edited_in_or_out_moves_the_output_end() {
        let mut events = synth::trace(&Synth::small_edits());
        // Position 11 is edited twice, at step indices 5 and 6: make the first edit an EOS.
        let mut n = 0;
        for e in &mut events {
            let Event::Step(s) = e else { continue };
            for x in s.edited.iter_mut().filter(|x| x.pos == 11) {
                if n == 0 {
                    x.token = synth::EOS_ID;
                } else {
                    x.from = synth::EOS_ID;
                }
                n += 1;
            }
        }
        let s = Store::from_events(events);
        let r = s.run().unwrap();
        let at: Vec<usize> =
            (0..r.steps().len()).filter(|&k| r.edits_at(k).any(|e| e.pos == 11)).collect();
        assert_eq!(at.len(), 2);
        assert_eq!(r.output_end(Some(at[0] - 1)), r.header.max_len);
        assert_eq!(r.output_end(Some(at[0])), 12);
        assert_eq!(r.output_end(Some(at[1])), r.header.max_len);
    }

    /// `--routing` on an edit: the route of the pass that set the token held.
    #[test]
    fn an_edit_keeps_the_route_of_its_pass() {
        let events =
            synth::with_routes(synth::trace(&Synth::small_edits()), &synth::sdar_moe_layout());
        let s = Store::from_events(events.clone());
        let r = s.run().unwrap();
        let mut k = 0;
        for ev in &events {
            let Event::Step(step) = ev else { continue };
            for e in &step.edited {
                assert_eq!(r.routes_at(e.pos, k).as_deref(), Some(&e.routes[..]));
                assert_ne!(r.routes(e.pos).as_deref(), Some(&e.routes[..]), "the commit's differ");
            }
            k += 1;
        }
    }

    /// A contradicting edit (of a masked cell, from a token it does not hold, to the same
    /// token) is dropped, as contradicting commits are: the reader refuses such a trace, a
    /// live stream does not pass through the reader.
    #[test]
    fn a_contradicting_edit_is_dropped() {
        let mut events = synth::trace(&Synth::small_edits());
        let Some(Event::Step(s)) =
            events.iter_mut().find(|e| matches!(e, Event::Step(s) if !s.edited.is_empty()))
        else {
            panic!()
        };
        s.edited[0].from += 1;
        let st = Store::from_events(events);
        let r = st.run().unwrap();
        assert_eq!(r.steps()[1].edited, 0);
        assert!(matches!(r.cell(7, r.head()), CellState::Decoded(d) if d.edits == 0));
    }

    #[test]
    fn trajectory_of_a_masked_cell_stops_at_the_cursor() {
        let s = store();
        let r = s.run().unwrap();
        let b = r.blocks()[1].clone();
        let k = b.first_step; // first step of the second decode block
        let pos = (b.block * r.block_length()..(b.block + 1) * r.block_length())
            .find(|&p| matches!(r.cell(p, Some(k)), CellState::Masked { .. }))
            .expect("a masked cell after the first step");
        let t = r.trajectory(pos, k);
        assert_eq!(t.len(), 1);
        assert_eq!(t[0].at, k);
        assert!(!t[0].committed);
    }

    #[test]
    fn a_new_header_starts_a_new_run() {
        let mut s = store();
        assert_eq!(s.generation(), 1);
        let mut events = synth::trace(&Synth::small());
        s.push(events.remove(0));
        assert_eq!(s.generation(), 2);
        assert_eq!(s.run().unwrap().head(), None);
        assert!(s.run().unwrap().finish.is_none());
    }

    #[test]
    fn contradicting_events_are_ignored() {
        let mut events = synth::trace(&Synth::small());
        // Replay the first decode block's first step after the block is finished.
        let dup = events.iter().find(|e| matches!(e, Event::Step(_))).unwrap().clone();
        let at = events.iter().position(|e| matches!(e, Event::Block(_))).unwrap() + 1;
        events.insert(at, dup);
        let clean = Store::from_events(synth::trace(&Synth::small()));
        let s = Store::from_events(events);
        assert_eq!(s.run().unwrap().ignored, 1);
        assert_eq!(s.run().unwrap().steps().len(), clean.run().unwrap().steps().len());
    }

    #[test]
    fn events_before_a_header_are_dropped() {
        let mut events = synth::trace(&Synth::small());
        let header = events.remove(0);
        let mut s = Store::from_events(events.clone());
        assert!(s.run().is_none());
        s.push(header);
        assert_eq!(s.run().unwrap().head(), None);
    }

    #[test]
    fn settings_changes_are_logged_by_block() {
        let mut cfg = Synth::small();
        cfg.change_at = Some((cfg_first_block(&cfg) + 2, 2));
        let s = Store::from_events(synth::trace(&cfg));
        let r = s.run().unwrap();
        let (fb, ch) = (r.header.first_block, cfg.change_at.unwrap().0);
        assert_eq!(r.settings_for(fb).1, fb);
        assert_eq!(r.settings_for(ch).0.steps, 2);
        assert_eq!(r.settings_for(ch + 1).1, ch);
        assert_eq!(r.settings_for(ch - 1).0.steps, cfg.steps);
        assert_eq!(r.block(ch).unwrap().steps, 2);
    }

    fn cfg_first_block(c: &Synth) -> usize {
        c.prompt.len() / c.block_length
    }

    #[test]
    fn eos_cuts_the_output() {
        let mut cfg = Synth::small();
        cfg.eos_at = Some(cfg.prompt.len() + 6);
        let s = Store::from_events(synth::trace(&cfg));
        let r = s.run().unwrap();
        assert_eq!(r.output_end(r.head()), cfg.prompt.len() + 7);
        assert_eq!(r.output_end(None), r.header.max_len);
    }

    #[test]
    fn forwards_per_block_counts_denoising_passes() {
        let s = store();
        let r = s.run().unwrap();
        // At the first step of the third block, two blocks are done: each took its denoising
        // passes (the commit rides on the next block's first pass).
        let k = r.blocks()[2].first_step;
        let want = (r.blocks()[0].steps + r.blocks()[1].steps) as f64 / 2.0;
        assert_eq!(r.forwards_per_block(k), Some(want));
        // the same on the step that finished the second block
        assert_eq!(r.forwards_per_block(k - 1), Some(want));
        assert_eq!(r.forwards_per_block(0), None);
    }
}
