//! The block-diffusion decode loop of docs/decoding.md, over any [`Denoiser`]. It emits every
//! event through a sink that must not block; it only ever waits on the control channel, and only
//! while the user has paused it.

use std::sync::mpsc::{Receiver, TryRecvError};
use std::time::Instant;

use anyhow::Result;

use super::{Ask, Control, Denoised, Denoiser, Detok, Pass};
use crate::engine::settings::DecodeSettings;
use crate::sampler::strategy::{Cell, Held, StepRule};
use crate::sampler::{PosSample, Ranked, Uniforms};
use crate::trace::detok::{self, End};
use crate::trace::events::{
    BlockEvent, Candidate, Committed, Edited, Event, FinishEvent, FinishReason, Header, ModelInfo,
    StepEvent, TopCandidate, TRACE_VERSION,
};

/// What stays fixed for one decode.
#[derive(Clone)]
pub struct Request {
    pub prompt: String,
    pub prompt_ids: Vec<u32>,
    pub settings: DecodeSettings,
    pub mask_id: u32,
    pub eos_ids: Vec<u32>,
    pub model: ModelInfo,
    pub device: String,
    /// Copied into the header as is.
    pub chat: Option<crate::trace::events::ChatInfo>,
    pub sources: std::collections::BTreeMap<String, String>,
    /// `--candidates`: how many of its most probable tokens every sampled position's event
    /// carries (1: none beyond the token itself, the trace as before `--candidates` existed).
    pub candidates: usize,
    /// `--routing`: every committed position's event carries its route in each sparse layer,
    /// every step the distinct experts its pass read (a mixture-of-experts model only).
    pub routing: bool,
}

impl Request {
    /// What each pass is asked for beyond its samples.
    fn ask(&self) -> Ask {
        Ask { candidates: self.candidates, routing: self.routing }
    }
}

/// The outcome of control messages that arrive mid-decode.
enum Interrupt {
    None,
    Cancel,
}

struct Loop<'a> {
    denoiser: &'a mut dyn Denoiser,
    detok: &'a dyn Detok,
    sink: &'a mut dyn FnMut(Event),
    control: Option<&'a Receiver<Control>>,
    started: crate::engine::clock::Start,
    forwards: usize,
    steps: usize,
    /// Settings of the block being decoded; `pending` takes over at the next block.
    settings: DecodeSettings,
    pending: Option<DecodeSettings>,
    paused: bool,
    /// Build and send header, step and block events (off: only the finish event, without its
    /// text; what `unmask bench --events off` measures).
    events: bool,
    /// Text and bytes of every token seen, looked up once per decode (a tokenizer decode per
    /// candidate per step is most of what step events cost).
    tokens: std::cell::RefCell<std::collections::HashMap<u32, TokenText>>,
    /// Bytes of an incomplete character left by the blocks finished so far.
    carry: Vec<u8>,
    /// Denoising steps the last block took.
    block_steps: usize,
    /// Time spent building events (what `unmask bench` reports as their cost on this thread).
    event_time: std::time::Duration,
}

/// One token's text alone, and its bytes where they differ from that text.
#[derive(Clone)]
struct TokenText {
    text: String,
    bytes: Option<Vec<u8>>,
}

impl TokenText {
    fn of(detok: &dyn Detok, id: u32) -> Self {
        let text = detok.piece(id);
        let raw = detok.bytes(id);
        TokenText { bytes: (raw != text.as_bytes()).then_some(raw), text }
    }

    fn bytes(&self) -> &[u8] {
        self.bytes.as_deref().unwrap_or(self.text.as_bytes())
    }
}

/// Runs one decode to its end and returns the finish event (also sent to `sink`).
/// Settings must be validated by the caller.
pub fn decode(
    denoiser: &mut dyn Denoiser,
    detok: &dyn Detok,
    req: &Request,
    sink: &mut dyn FnMut(Event),
    control: Option<&Receiver<Control>>,
) -> FinishEvent {
    decode_with_events(denoiser, detok, req, sink, control, true)
}

/// [`decode`], optionally without building any event but the finish (which then carries no
/// text): the decode itself (forwards, sampling, strategy) is the same.
pub fn decode_with_events(
    denoiser: &mut dyn Denoiser,
    detok: &dyn Detok,
    req: &Request,
    sink: &mut dyn FnMut(Event),
    control: Option<&Receiver<Control>>,
    events: bool,
) -> FinishEvent {
    decode_measured(denoiser, detok, req, sink, control, events).0
}

/// [`decode_with_events`], also returning the time this thread spent building events (header,
/// steps, blocks, the finish event's text): the engine's share of what events cost.
pub fn decode_measured(
    denoiser: &mut dyn Denoiser,
    detok: &dyn Detok,
    req: &Request,
    sink: &mut dyn FnMut(Event),
    control: Option<&Receiver<Control>>,
    events: bool,
) -> (FinishEvent, std::time::Duration) {
    let mut lp = Loop {
        denoiser,
        detok,
        sink,
        control,
        started: crate::engine::clock::Start::now(),
        forwards: 0,
        steps: 0,
        settings: req.settings.clone(),
        pending: None,
        paused: false,
        events,
        tokens: Default::default(),
        carry: Vec::new(),
        block_steps: 0,
        event_time: Default::default(),
    };
    let mut output = Vec::new();
    let mut blocks = 0;
    // A panic anywhere in the model or sampler ends this decode like an error would: the
    // finish event still goes out, so no front end waits for it forever or reports success.
    let result = crate::panics::catch(|| lp.run(req, &mut output, &mut blocks));
    let (reason, error) = match result {
        Ok(Ok(r)) => (r, None),
        Ok(Err(e)) => (FinishReason::Error, Some(format!("{e:#}"))),
        Err(panic) => (FinishReason::Error, Some(panic)),
    };
    let t0 = Instant::now();
    let fin = FinishEvent {
        reason,
        text: if events { detok.decode(&output) } else { String::new() },
        output_ids: output,
        forwards: lp.forwards,
        blocks,
        steps: lp.steps,
        elapsed_ms: lp.ms(),
        error,
    };
    let event_time = lp.event_time + t0.elapsed();
    (lp.sink)(Event::Finish(fin.clone()));
    (fin, event_time)
}

/// The index of the token (of those whose bytes are `new`, following the output's `before`,
/// which holds none of `stops`) that completes the earliest-ending of `stops`; empty stops are
/// ignored. Bytes, not characters: a stop text may end inside a token, or a token split a
/// character, and the token that brings the stop's last byte completes it.
fn first_stop(stops: &[String], before: &[u8], new: &[Vec<u8>]) -> Option<usize> {
    let mut text = before.to_vec();
    let mut ends = Vec::with_capacity(new.len());
    for b in new {
        text.extend_from_slice(b);
        ends.push(text.len());
    }
    let end = stops
        .iter()
        .filter(|s| !s.is_empty())
        .filter_map(|s| {
            let s = s.as_bytes();
            text.windows(s.len()).position(|w| w == s).map(|at| at + s.len())
        })
        .filter(|&end| end > before.len())
        .min()?;
    ends.iter().position(|&e| e >= end)
}

/// Refuses a pass whose samples are not a distribution (NaN or infinite logits: NaN/Inf
/// weights, or activations that overflowed), naming the first bad position: decoding on would
/// commit made-up tokens and write `null` confidences.
fn check_samples(
    samples: &[PosSample],
    b: usize,
    start: usize,
    block: usize,
    step: usize,
    forward: usize,
) -> Result<()> {
    if samples.len() != b {
        anyhow::bail!("block {block} step {step} (forward {forward}): the model returned {} samples for {b} positions", samples.len());
    }
    match samples.iter().position(|s| !s.is_valid()) {
        None => Ok(()),
        Some(i) => anyhow::bail!(
            "block {block} step {step} (forward {forward}): non-finite logits at position {} \
             (NaN/Inf in the weights or an overflowing activation)",
            start + i
        ),
    }
}

impl Loop<'_> {
    /// Milliseconds the decode has run (a suspension of the process left out: crate::engine::clock).
    fn ms(&self) -> f64 {
        self.started.running().as_secs_f64() * 1000.0
    }

    fn header(&mut self, req: &Request, first_block: usize, max_len: usize) {
        let own: Vec<TokenText> = req.prompt_ids.iter().map(|&t| self.token(t)).collect();
        let bytes: Vec<&[u8]> = own.iter().map(TokenText::bytes).collect();
        let prompt_pieces = detok::texts(&bytes);
        let split = prompt_pieces.iter().zip(&bytes).any(|(p, b)| p.as_bytes() != *b);
        let whole = first_block * self.settings.block_length;
        self.carry = detok::settled(&[], &bytes[..whole], End::Open).1;
        (self.sink)(Event::Header(Box::new(Header {
            version: TRACE_VERSION,
            model: req.model.clone(),
            settings: self.settings.clone(),
            mask_token_id: req.mask_id,
            eos_ids: req.eos_ids.clone(),
            prompt: req.prompt.clone(),
            prompt_ids: req.prompt_ids.clone(),
            prompt_pieces,
            prompt_bytes: split.then(|| bytes.iter().map(|b| b.to_vec()).collect()),
            first_block,
            max_len,
            device: req.device.clone(),
            chat: req.chat.clone().map(Box::new),
            sources: req.sources.clone(),
        })));
    }

    fn run(
        &mut self,
        req: &Request,
        output: &mut Vec<u32>,
        blocks: &mut usize,
    ) -> Result<FinishReason> {
        let b = self.settings.block_length;
        let p = req.prompt_ids.len();
        let n = self.settings.max_new_tokens;
        let first_block = p / b;
        let max_len = p.checked_add(n).filter(|&m| m.div_ceil(b).checked_mul(b).is_some());
        let Some(max_len) = max_len else {
            anyhow::bail!("prompt of {p} tokens + --max-new-tokens {n} is too long");
        };
        let end_blocks = max_len.div_ceil(b);
        if self.events {
            let t0 = Instant::now();
            self.header(req, first_block, max_len);
            self.event_time += t0.elapsed();
        }
        self.denoiser.reset(end_blocks * b)?;
        // Finished blocks not in the cache yet: the next block's first pass stores them.
        let mut unstored = req.prompt_ids[..first_block * b].to_vec();
        let mut uniforms = Uniforms::new(self.settings.sampling.seed);
        // Whether the output has ended at an EOS: without `eos_early_stop` the blocks after it
        // are still decoded (LLaDA2.1's generate()), and all their cells are dropped.
        let mut ended = false;
        // The output's last bytes, as many as a stop text can reach back (`--stop`).
        let mut tail = Vec::new();
        for block in first_block..end_blocks {
            let start = block * b;
            let mut cells: Vec<u32> = (start..start + b)
                .map(|pos| if pos < p { req.prompt_ids[pos] } else { req.mask_id })
                .collect();
            if let Interrupt::Cancel =
                self.block(req, block, &mut cells, &mut unstored, &mut uniforms)?
            {
                return Ok(FinishReason::Cancelled);
            }
            *blocks += 1;
            let generated: Vec<u32> =
                (start.max(p)..(start + b).min(p + n)).map(|pos| cells[pos - start]).collect();
            let eos_at =
                if ended { None } else { generated.iter().position(|t| req.eos_ids.contains(t)) };
            let stop_at = match ended {
                true => None,
                false => {
                    self.stop_at(&mut tail, &generated[..eos_at.map_or(generated.len(), |i| i + 1)])
                }
            };
            // (a stop text completed before the EOS ends the output there, and the decode)
            let stopped = stop_at.is_some();
            let eos_at = stop_at.or(eos_at);
            if self.events {
                // The output ends here at an EOS or in the last block; cells after it are dropped.
                let out_end = match eos_at {
                    _ if ended => Some(0),
                    Some(i) => Some(start.max(p) + i + 1 - start),
                    None => (block + 1 == end_blocks).then(|| (p + n).min(start + b) - start),
                };
                let t0 = Instant::now();
                self.block_event(block, start, &cells, out_end);
                self.event_time += t0.elapsed();
            }
            unstored = cells;
            match eos_at {
                _ if ended => {}
                Some(i) => {
                    output.extend_from_slice(&generated[..=i]);
                    if stopped {
                        return Ok(FinishReason::Stop);
                    }
                    if self.settings.eos_early_stop {
                        return Ok(FinishReason::Eos);
                    }
                    ended = true;
                }
                None => output.extend_from_slice(&generated),
            }
        }
        Ok(if ended { FinishReason::Eos } else { FinishReason::Length })
    }

    /// The index in `new` (the block's output tokens) of the token that completes the first
    /// `--stop` text in the output, whose last bytes before `new` are `tail`; `tail` then
    /// holds the output's last bytes after them.
    fn stop_at(&self, tail: &mut Vec<u8>, new: &[u32]) -> Option<usize> {
        let stops = &self.settings.stop;
        let longest = stops.iter().map(String::len).max()?;
        let bytes: Vec<Vec<u8>> = new.iter().map(|&t| self.detok.bytes(t)).collect();
        let found = first_stop(stops, tail, &bytes);
        tail.extend(bytes.concat());
        let keep = longest.saturating_sub(1);
        tail.drain(..tail.len().saturating_sub(keep));
        found
    }

    /// Denoises one block to the end and emits its events. Its first pass also stores
    /// `unstored` (the blocks before it that are not cached yet).
    fn block(
        &mut self,
        req: &Request,
        block: usize,
        cells: &mut [u32],
        unstored: &mut Vec<u32>,
        uniforms: &mut Uniforms,
    ) -> Result<Interrupt> {
        let b = cells.len();
        let start = block * b;
        let mut changed = None;
        if let Some(s) = self.pending.take() {
            let s = s.keeping_layout_of(&self.settings);
            if s != self.settings {
                self.settings = s.clone();
                changed = Some(s);
            }
        }
        let rule = StepRule::from_settings(&self.settings);
        let sampling = self.settings.sampler();
        // A prompt token that happens to be the mask id is still prompt.
        let mut held: Vec<Held> = (0..b)
            .map(|i| if start + i < req.prompt_ids.len() { Held::Prompt } else { Held::Mask })
            .collect();
        // Every block holds a mask (the first starts before the prompt's end, the rest after
        // it), so its first pass always runs and stores `unstored`.
        debug_assert!(held.contains(&Held::Mask));
        let mut step = 0;
        // Passes begun with no mask left: only an editing strategy takes any.
        let mut post = 0;
        loop {
            let masks_left = held.contains(&Held::Mask);
            if !masks_left {
                post += 1;
                if !rule.post_step_allowed(post) {
                    break;
                }
            }
            if let Interrupt::Cancel = self.poll_control()? {
                return Ok(Interrupt::Cancel);
            }
            let u = uniforms.draw(b, &sampling.sampling);
            let store = std::mem::take(unstored);
            let pass = Pass { store: &store, block: cells };
            // Ranked lists and routes only when someone reads them: the decode never needs them.
            let Denoised { samples, ranked, mut routing } = match req.ask() {
                ask if ask.any() && self.events => {
                    self.denoiser.denoise_asked(pass, &sampling, &u, ask)?
                }
                _ => Denoised {
                    samples: self.denoiser.denoise(pass, &sampling, &u)?,
                    ..Denoised::default()
                },
            };
            self.forwards += 1;
            check_samples(&samples, b, start, block, step, self.forwards)?;
            let view: Vec<Cell> = (0..b)
                .map(|i| Cell {
                    held: match held[i] {
                        Held::Decoded { .. } => {
                            Held::Decoded { differs: samples[i].token != cells[i] }
                        }
                        h => h,
                    },
                    conf: samples[i].conf,
                    entropy: samples[i].entropy,
                })
                .collect();
            let picked = rule.select(&view, step);
            let edits = rule.edit(&view);
            let replaced: Vec<u32> = edits.iter().map(|&i| cells[i]).collect();
            for &i in picked.iter().chain(&edits) {
                cells[i] = samples[i].token;
                held[i] = Held::Decoded { differs: false };
            }
            self.steps += 1;
            // A pass begun with no mask that replaced nothing ends the block (its forward
            // counts): LLaDA2.1's generate().
            let settled = !masks_left && edits.is_empty();
            if self.events {
                let t0 = Instant::now();
                let top = |i: usize| ranked.get(i).map_or(&[][..], Vec::as_slice);
                // Each position's routes, moved out: a pass commits or edits a position once.
                let mut routes = |i: usize| {
                    routing
                        .as_mut()
                        .and_then(|r| r.block.get_mut(i))
                        .map(std::mem::take)
                        .unwrap_or_default()
                };
                let committed = picked
                    .iter()
                    .map(|&i| Committed {
                        routes: routes(i),
                        ..self.committed(start + i, &samples[i], top(i))
                    })
                    .collect();
                let edited = edits
                    .iter()
                    .zip(replaced)
                    .map(|(&i, from)| Edited {
                        routes: routes(i),
                        ..self.edited(start + i, from, &samples[i], top(i))
                    })
                    .collect();
                let candidates = (0..b)
                    .filter(|&i| held[i] == Held::Mask)
                    .map(|i| self.candidate(start + i, &samples[i], top(i)))
                    .collect();
                let ev = StepEvent {
                    block,
                    step,
                    forward: self.forwards,
                    committed,
                    edited,
                    masked: candidates,
                    t_ms: self.ms(),
                    settings: if step == 0 { changed.take() } else { None },
                    distinct_experts: routing.map(|r| r.distinct).unwrap_or_default(),
                };
                self.event_time += t0.elapsed();
                (self.sink)(Event::Step(ev));
            }
            step += 1;
            if settled {
                break;
            }
        }
        self.block_steps = step;
        Ok(Interrupt::None)
    }

    /// Emits the block event of a finished block, with the final text of its cells.
    /// `out_end` (in-block index) is where the output ends, if it ends in this block.
    fn block_event(&mut self, block: usize, start: usize, cells: &[u32], out_end: Option<usize>) {
        let own: Vec<TokenText> = cells.iter().map(|&t| self.token(t)).collect();
        let bytes: Vec<&[u8]> = own.iter().map(TokenText::bytes).collect();
        let cut = out_end.unwrap_or(cells.len());
        let end = if out_end.is_some() { End::Final } else { End::Open };
        let (mut texts, carry) = detok::settled(&self.carry, &bytes[..cut], end);
        // Cells after the output's end are dropped: their text reads on from nothing.
        texts.extend(detok::settled(&[], &bytes[cut..], End::Open).0);
        // As JSON spells them: one U+FFFD per invalid sequence (the step events' `bytes` keep
        // the raw bytes).
        let texts = texts.iter().map(detok::Text::lossy).collect();
        self.carry = carry;
        let ev = BlockEvent {
            block,
            start,
            tokens: cells.to_vec(),
            texts: Some(texts),
            steps: self.block_steps,
            forward: self.forwards,
            t_ms: self.ms(),
        };
        (self.sink)(Event::Block(ev));
    }

    /// The text and bytes of a token, looked up once per decode.
    fn token(&self, id: u32) -> TokenText {
        let mut cache = self.tokens.borrow_mut();
        cache.entry(id).or_insert_with(|| TokenText::of(self.detok, id)).clone()
    }

    fn committed(&self, pos: usize, s: &PosSample, top: &[Ranked]) -> Committed {
        let TokenText { text, bytes } = self.token(s.token);
        Committed {
            pos,
            token: s.token,
            text,
            bytes,
            conf: s.conf,
            entropy: s.entropy,
            top: self.top(top),
            routes: Vec::new(),
        }
    }

    /// As [`Loop::committed`], for a decoded position that held `from`.
    fn edited(&self, pos: usize, from: u32, s: &PosSample, top: &[Ranked]) -> Edited {
        let Committed { token, text, bytes, conf, entropy, top, .. } = self.committed(pos, s, top);
        Edited { pos, from, token, text, bytes, conf, entropy, top, routes: Vec::new() }
    }

    fn candidate(&self, pos: usize, s: &PosSample, top: &[Ranked]) -> Candidate {
        let TokenText { text, bytes } = self.token(s.token);
        Candidate { pos, token: s.token, text, bytes, conf: s.conf, top: self.top(top) }
    }

    fn top(&self, ranked: &[Ranked]) -> Vec<TopCandidate> {
        ranked
            .iter()
            .map(|r| {
                let TokenText { text, bytes } = self.token(r.token);
                TopCandidate { token: r.token, text, bytes, p: r.p }
            })
            .collect()
    }

    /// Applies queued control messages; while paused, waits for the next one.
    fn poll_control(&mut self) -> Result<Interrupt> {
        let Some(rx) = self.control else { return Ok(Interrupt::None) };
        loop {
            let msg = if self.paused {
                match rx.recv() {
                    Ok(m) => m,
                    Err(_) => return Ok(Interrupt::Cancel),
                }
            } else {
                match rx.try_recv() {
                    Ok(m) => m,
                    Err(TryRecvError::Empty) => return Ok(Interrupt::None),
                    // Nobody can resume or stop us any more: finish the decode.
                    Err(TryRecvError::Disconnected) => return Ok(Interrupt::None),
                }
            };
            match msg {
                Control::Pause => self.paused = true,
                Control::Resume => self.paused = false,
                Control::Settings(s) => self.pending = Some(s),
                Control::Cancel => return Ok(Interrupt::Cancel),
            }
        }
    }
}
