//! The one place that bounds sizes read from untrusted input (a trace, config.json, a flag)
//! before anything is allocated from them, and checks that input paths are regular files.
//! Every error names the file or flag, the field and the value, on one line.
//!
//! The bounds are far above any real checkpoint or decode (SDAR blocks are 4-64 positions,
//! Qwen3 models have at most 94 layers and a 151,936-token vocabulary) and far below what
//! would exhaust memory or wrap arithmetic.

use std::collections::HashMap;
use std::fs::Metadata;
use std::path::Path;

use anyhow::{bail, Result};

use crate::engine::settings::DecodeSettings;
pub use crate::sampler::MAX_CANDIDATES;
use crate::trace::events::{
    BlockEvent, Event, FinishEvent, Header, MoeInfo, Route, StepEvent, TopCandidate,
};

/// Positions per block (`--block-length`, `settings.block_length`, `block_size`).
pub const MAX_BLOCK_LENGTH: usize = 4096;
/// Denoising steps per block.
pub const MAX_STEPS: usize = 4096;
/// Generated tokens per decode (`--max-new-tokens`).
pub const MAX_NEW_TOKENS: usize = 1 << 20;
/// Prompt tokens a trace header may hold.
pub const MAX_PROMPT_TOKENS: usize = 1 << 20;
/// Bytes in one trace line (a step of a 4096-position block is well under 1 MiB).
pub const MAX_TRACE_LINE: usize = 64 << 20;
/// Columns and rows of a recorded cast (`--width`, `--height`).
pub const MAX_CAST_WIDTH: u16 = 1000;
pub const MAX_CAST_HEIGHT: u16 = 1000;

// Largest value each config.json size may take (model/config.rs checks them).
/// `vocab_size`.
pub const MAX_VOCAB: usize = 1 << 22;
/// `hidden_size`.
pub const MAX_HIDDEN: usize = 1 << 16;
/// `intermediate_size`.
pub const MAX_INTERMEDIATE: usize = 1 << 20;
/// `num_hidden_layers`.
pub const MAX_LAYERS: usize = 1024;
/// `num_attention_heads`.
pub const MAX_HEADS: usize = 1024;
/// `num_key_value_heads`.
pub const MAX_KV_HEADS: usize = 1024;
/// `head_dim`.
pub const MAX_HEAD_DIM: usize = 4096;
/// `max_position_embeddings`.
pub const MAX_POSITIONS: usize = 1 << 24;

// Bounds on the mixture-of-experts fields of config.json (qwen3_moe.rs): SDAR-30B-A3B has 128
// experts, 8 per token, 768 wide; Qwen3-235B-A22B the same counts.
/// `num_experts`.
pub const MAX_EXPERTS: usize = 1024;
/// `num_experts_per_tok`.
pub const MAX_EXPERTS_PER_TOK: usize = 64;
/// `moe_intermediate_size`.
pub const MAX_MOE_INTERMEDIATE: usize = 1 << 20;

/// `value` of `what` is at most `max`.
pub fn at_most(what: &str, value: usize, max: usize) -> Result<()> {
    if value > max {
        bail!("{what} is {value}, more than the limit of {max}");
    }
    Ok(())
}

/// The metadata of `path`, which must be a regular file (following symlinks). A FIFO or a
/// device would block or never end when read; a folder cannot be read at all. Errors say what
/// went wrong (missing, a symlink loop, permission denied), never just "cannot open".
pub fn regular_file(path: &Path) -> Result<Metadata> {
    let label = crate::glyph::escape_line(&path.display().to_string()).into_owned();
    let meta =
        std::fs::metadata(path).map_err(|e| anyhow::anyhow!("{label}: {}", io_reason(&e)))?;
    if !meta.is_file() {
        bail!("{label}: not a regular file ({})", file_kind(&meta));
    }
    Ok(meta)
}

/// What an I/O error means for a path, in words: its kind first, then the OS's message.
pub fn io_reason(e: &std::io::Error) -> String {
    use std::io::ErrorKind as K;
    let what = match e.kind() {
        K::NotFound => "does not exist",
        K::PermissionDenied => "permission denied",
        K::NotADirectory => "a component of the path is not a folder",
        _ if e.raw_os_error() == Some(40) => "is a symlink loop",
        _ => "cannot read",
    };
    format!("{what} ({e})")
}

fn file_kind(meta: &Metadata) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    let t = meta.file_type();
    match () {
        _ if t.is_dir() => "a folder",
        _ if t.is_fifo() => "a FIFO",
        _ if t.is_char_device() => "a character device",
        _ if t.is_block_device() => "a block device",
        _ if t.is_socket() => "a socket",
        _ => "not a file",
    }
}

/// Refuses an allocation of `bytes` (`None`: more than a usize holds) on the CPU when it is more
/// than the host can give now, where the allocator would abort the process instead of failing:
/// more than the memory available (`MemAvailable`), or than the address space left under the
/// process's limit (`ulimit -v`, `RLIMIT_AS`, which counts every mapping: the checkpoint's
/// mapped files too). `detail` follows the amount in the message (what it is made of), `advice`
/// ends it. Device memory is not checked here: candle reports a failed CUDA allocation as an
/// error.
///
/// `UNMASK_MEMORY_CHECK=0` skips the comparison with `MemAvailable` (which leaves out swap, and
/// the sizes compared are estimates of a peak); the address-space limit always holds.
pub fn fits_in_memory(
    what: &str,
    bytes: Option<usize>,
    detail: &str,
    device: &candle_core::Device,
    advice: &str,
) -> Result<()> {
    let Some(bytes) = bytes else {
        bail!("{what} would need more bytes than this machine can address")
    };
    if !device.is_cpu() {
        return Ok(());
    }
    let advice = if advice.is_empty() { String::new() } else { format!("; {advice}") };
    if let Some((left, limit)) = address_space_left() {
        if bytes > left {
            bail!(
                "{what} needs {:.1} GiB{detail}, more than the {:.1} GiB of address space left under the limit of {:.1} GiB (ulimit -v){advice}",
                gib(bytes),
                gib(left),
                gib(limit)
            );
        }
    }
    if !memory_check_on()? {
        return Ok(());
    }
    match available_memory() {
        Some(avail) if bytes > avail => bail!(
            "{what} needs {:.1} GiB{detail}, more than the {:.1} GiB of memory available (MemAvailable){advice}",
            gib(bytes),
            gib(avail)
        ),
        _ => Ok(()),
    }
}

/// `UNMASK_MEMORY_CHECK`: unset or `1` compares with `MemAvailable`, `0` does not.
fn memory_check_on() -> Result<bool> {
    match std::env::var("UNMASK_MEMORY_CHECK").as_deref() {
        Err(_) | Ok("1") => Ok(true),
        Ok("0") => Ok(false),
        Ok(other) => {
            bail!("UNMASK_MEMORY_CHECK={}: expected 0 or 1", crate::glyph::escape_line(other))
        }
    }
}

fn gib(b: usize) -> f64 {
    b as f64 / (1u64 << 30) as f64
}

/// `MemAvailable` of /proc/meminfo in bytes (Linux), if it can be read.
fn available_memory() -> Option<usize> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    kib_field(&text, "MemAvailable:")
}

/// The address space a new mapping may still take under `RLIMIT_AS` (its soft limit, less
/// the process's `VmSize`), and the limit; `None` when there is no limit.
#[cfg(target_os = "linux")]
fn address_space_left() -> Option<(usize, usize)> {
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit writes one rlimit into the struct it is given.
    if unsafe { libc::getrlimit(libc::RLIMIT_AS, &mut lim) } != 0
        || lim.rlim_cur == libc::RLIM_INFINITY
    {
        return None;
    }
    let limit = usize::try_from(lim.rlim_cur).unwrap_or(usize::MAX);
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let used = kib_field(&status, "VmSize:")?;
    Some((limit.saturating_sub(used), limit))
}

#[cfg(not(target_os = "linux"))]
fn address_space_left() -> Option<(usize, usize)> {
    None
}

/// The value in bytes of a `Name:   123 kB` line of a /proc file.
fn kib_field(text: &str, name: &str) -> Option<usize> {
    let line = text.lines().find(|l| l.starts_with(name))?;
    let kib: usize = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

/// Checks a settings record read from a trace (the header's or a step's).
fn settings(s: &DecodeSettings, field: &str) -> Result<(), String> {
    let bound = |name: &str, v: usize, lo: usize, hi: usize| {
        if v < lo || v > hi {
            Err(format!("field `{field}.{name}` is {v}, outside {lo} to {hi}"))
        } else {
            Ok(())
        }
    };
    bound("block_length", s.block_length, 1, MAX_BLOCK_LENGTH)?;
    bound("steps", s.steps, 1, MAX_STEPS)?;
    bound("max_new_tokens", s.max_new_tokens, 1, MAX_NEW_TOKENS)?;
    s.validate().map_err(|e| format!("field `{field}`: {e}"))
}

/// The facts of the current run a later event is checked against.
struct RunShape {
    block_length: usize,
    prompt_len: usize,
    first_block: usize,
    max_len: usize,
    vocab: usize,
    /// Past the last block the decode may have.
    end_block: usize,
    /// `forward` of the newest step: the running count only grows.
    last_forward: usize,
    /// Every decoded position and the token it holds now (an edit replaces it).
    held: HashMap<usize, u32>,
    /// The header's routing layout, which `--routing` fields must follow.
    moe: Option<MoeInfo>,
    /// The settings in force (the header's, then a step's change), for a block's step budget.
    settings: crate::engine::settings::DecodeSettings,
    /// The block and step of the newest step: a block's steps count 0, 1, 2, ...
    last_step: Option<(usize, usize)>,
}

/// Checks each event of a trace against its header and the events before it, so that nothing
/// downstream (store, export, views) allocates or indexes from an unchecked number: a header's
/// sizes are bounded and consistent with each other, a step stays inside its block and the
/// decode, commits each position at most once, edits only positions its block decoded before
/// it (from the token they hold), and names only tokens of the vocabulary.
#[derive(Default)]
pub struct TraceCheck {
    run: Option<RunShape>,
}

impl TraceCheck {
    pub fn check(&mut self, ev: &Event) -> Result<(), String> {
        match ev {
            Event::Header(h) => {
                self.run = Some(header(h)?);
                Ok(())
            }
            Event::Step(s) => match self.run.as_mut() {
                Some(r) => r.step(s),
                None => Err("a step before any header".into()),
            },
            Event::Block(b) => self.run.as_ref().map_or(Ok(()), |r| r.block(b)),
            Event::Finish(f) => self.run.as_ref().map_or(Ok(()), |r| r.finish(f)),
        }
    }
}

/// A probability: 0 to 1 (NaN and infinities are refused where the line is read).
/// `field` names it, made only for the error (every position of every step is checked).
fn probability(field: impl FnOnce() -> String, p: f32) -> Result<(), String> {
    if !(0.0..=1.0).contains(&p) {
        return Err(format!("field `{}` is {p}, not a probability from 0 to 1", field()));
    }
    Ok(())
}

/// A header's routing layout: bounded as config.json's is, top-k within the experts, sparse
/// layers ascending and inside the model.
fn moe_info(m: MoeInfo, layers: usize) -> Result<MoeInfo, String> {
    if m.experts == 0 || m.experts > MAX_EXPERTS {
        return Err(format!(
            "field `model.moe.experts` is {}, outside 1 to {MAX_EXPERTS}",
            m.experts
        ));
    }
    let max_k = MAX_EXPERTS_PER_TOK.min(m.experts);
    if m.top_k == 0 || m.top_k > max_k {
        return Err(format!("field `model.moe.top_k` is {}, outside 1 to {max_k}", m.top_k));
    }
    if m.sparse_layers.len() > layers
        || m.sparse_layers.windows(2).any(|w| w[0] >= w[1])
        || m.sparse_layers.iter().any(|&l| l >= layers)
    {
        return Err(format!("field `model.moe.sparse_layers` is not an ascending list of layers below model.num_layers {layers}"));
    }
    Ok(m)
}

fn header(h: &Header) -> Result<RunShape, String> {
    settings(&h.settings, "settings")?;
    let b = h.settings.block_length;
    let p = h.prompt_ids.len();
    if p > MAX_PROMPT_TOKENS {
        return Err(format!(
            "field `prompt_ids` holds {p} tokens, more than the limit of {MAX_PROMPT_TOKENS}"
        ));
    }
    if h.prompt_pieces.len() != p {
        return Err(format!(
            "field `prompt_pieces` holds {} pieces for {p} prompt ids",
            h.prompt_pieces.len()
        ));
    }
    if h.first_block != p / b {
        return Err(format!(
            "field `first_block` is {}, but {p} prompt tokens in blocks of {b} start at block {}",
            h.first_block,
            p / b
        ));
    }
    let want = p + h.settings.max_new_tokens; // both bounded above: cannot wrap
    if h.max_len != want {
        return Err(format!(
            "field `max_len` is {}, but prompt {p} + max_new_tokens {} is {want}",
            h.max_len, h.settings.max_new_tokens
        ));
    }
    let vocab = h.model.vocab_size;
    if vocab == 0 || vocab > MAX_VOCAB {
        return Err(format!("field `model.vocab_size` is {vocab}, outside 1 to {MAX_VOCAB}"));
    }
    if h.mask_token_id as usize >= vocab {
        return Err(format!(
            "field `mask_token_id` is {}, outside the vocabulary of {vocab}",
            h.mask_token_id
        ));
    }
    if let Some((i, t)) = h.prompt_ids.iter().enumerate().find(|(_, &t)| t as usize >= vocab) {
        return Err(format!("field `prompt_ids[{i}]` is {t}, outside the vocabulary of {vocab}"));
    }
    Ok(RunShape {
        block_length: b,
        prompt_len: p,
        first_block: h.first_block,
        max_len: h.max_len,
        vocab,
        end_block: h.max_len.div_ceil(b).max(h.first_block + 1),
        last_forward: 0,
        held: HashMap::new(),
        moe: h.model.moe.clone().map(|m| moe_info(m, h.model.num_layers)).transpose()?,
        settings: h.settings.clone(),
        last_step: None,
    })
}

impl RunShape {
    fn block_in_range(&self, block: usize) -> Result<(), String> {
        if block < self.first_block || block >= self.end_block {
            return Err(format!(
                "field `block` is {block}, outside this decode's blocks {} to {}",
                self.first_block,
                self.end_block - 1
            ));
        }
        Ok(())
    }

    /// `field` names the token, made only for the error (this runs for every position).
    fn token(&self, field: impl FnOnce() -> String, t: u32) -> Result<(), String> {
        if t as usize >= self.vocab {
            return Err(format!(
                "field `{}` is {t}, outside the vocabulary of {}",
                field(),
                self.vocab
            ));
        }
        Ok(())
    }

    /// A `top` list (`--candidates`): bounded, tokens of the vocabulary, probabilities.
    fn top(&self, list: &str, top: &[TopCandidate]) -> Result<(), String> {
        if top.len() > MAX_CANDIDATES {
            return Err(format!(
                "field `{list}.top` holds {} candidates, more than the limit of {MAX_CANDIDATES}",
                top.len()
            ));
        }
        for t in top {
            self.token(|| format!("{list}.top.token"), t.token)?;
            probability(|| format!("{list}.top.p"), t.p)?;
        }
        Ok(())
    }

    /// The layout `--routing` fields follow, for a trace that has them: one entry per sparse
    /// layer of the header's `model.moe`.
    fn layout(&self, field: &str, entries: usize) -> Result<&MoeInfo, String> {
        let Some(m) = &self.moe else {
            return Err(format!(
                "field `{field}` is present, but the header's model has no `moe` layout"
            ));
        };
        if entries != m.sparse_layers.len() {
            return Err(format!(
                "field `{field}` holds {entries} entries for {} sparse layers",
                m.sparse_layers.len()
            ));
        }
        Ok(m)
    }

    /// A committed or edited position's routes (`--routing`; `list` names which): at most
    /// top-k experts of the layout's per sparse layer, each with a weight.
    fn routes(&self, list: &str, pos: usize, routes: &[Route]) -> Result<(), String> {
        if routes.is_empty() {
            return Ok(());
        }
        let m = self.layout(&format!("{list}.routes"), routes.len())?;
        for (r, &layer) in routes.iter().zip(&m.sparse_layers) {
            let at = format!("position {pos} layer {layer}");
            if r.experts.len() > m.top_k || r.weights.len() != r.experts.len() {
                return Err(format!(
                    "field `{list}.routes` of {at} holds {} experts and {} weights; top_k is {}",
                    r.experts.len(),
                    r.weights.len(),
                    m.top_k
                ));
            }
            if let Some(e) = r.experts.iter().find(|&&e| e as usize >= m.experts) {
                return Err(format!(
                    "field `{list}.routes.experts` of {at} is {e}, outside the {} experts",
                    m.experts
                ));
            }
            if let Some(w) = r.weights.iter().find(|w| !(0.0..=1.0).contains(*w)) {
                return Err(format!(
                    "field `{list}.routes.weights` of {at} is {w}, not a weight from 0 to 1"
                ));
            }
        }
        Ok(())
    }

    fn distinct_experts(&self, counts: &[u32]) -> Result<(), String> {
        if counts.is_empty() {
            return Ok(());
        }
        let m = self.layout("distinct_experts", counts.len())?;
        match counts.iter().find(|&&n| n as usize > m.experts) {
            Some(n) => Err(format!(
                "field `distinct_experts` holds {n}, more than the {} experts",
                m.experts
            )),
            None => Ok(()),
        }
    }

    fn step(&mut self, s: &StepEvent) -> Result<(), String> {
        self.block_in_range(s.block)?;
        if s.step >= MAX_STEPS.max(self.block_length) {
            return Err(format!("field `step` is {}, more than a block can take", s.step));
        }
        if let Some(st) = &s.settings {
            settings(st, "settings")?;
            self.settings = st.clone();
        }
        self.step_order(s)?;

        let span = s.block * self.block_length..(s.block + 1) * self.block_length;
        let generated = self.prompt_len.max(span.start)..span.end;
        self.edited(s, &generated)?;
        for (i, c) in s.committed.iter().enumerate() {
            if !generated.contains(&c.pos) {
                return Err(format!(
                    "committed position {} is outside block {}'s generated positions {} to {}",
                    c.pos,
                    s.block,
                    generated.start,
                    generated.end - 1
                ));
            }
            self.token(|| format!("committed[{i}].token"), c.token)?;
            probability(|| format!("committed[{i}].conf"), c.conf)?;
            // (a certain row's entropy may round to a hair under 0)
            if c.entropy < -1e-6 {
                return Err(format!("field `committed[{i}].entropy` is {}, below 0", c.entropy));
            }
            self.top("committed", &c.top)?;
            self.routes("committed", c.pos, &c.routes)?;
            if self.held.insert(c.pos, c.token).is_some() {
                return Err(format!("committed position {} a second time", c.pos));
            }
        }
        for e in &s.edited {
            self.held.insert(e.pos, e.token);
        }
        for (i, c) in s.masked.iter().enumerate() {
            if !generated.contains(&c.pos) {
                return Err(format!(
                    "masked position {} is outside block {}'s generated positions {} to {}",
                    c.pos,
                    s.block,
                    generated.start,
                    generated.end - 1
                ));
            }
            self.token(|| format!("masked[{i}].token"), c.token)?;
            probability(|| format!("masked[{i}].conf"), c.conf)?;
            self.top("masked", &c.top)?;
        }
        self.distinct_experts(&s.distinct_experts)?;
        if s.forward <= self.last_forward {
            return Err(format!(
                "field `forward` is {}, not more than the previous step's {}",
                s.forward, self.last_forward
            ));
        }
        self.last_forward = s.forward;
        Ok(())
    }

    /// A step's edits (token editing): each replaces the token a decoded position of this block
    /// holds before the step (`from`) with another, in ascending positions, with the same checks
    /// as a commit. Checked before the step's own commits: a position the step commits was
    /// still masked before it.
    fn edited(&self, s: &StepEvent, generated: &std::ops::Range<usize>) -> Result<(), String> {
        let mut prev: Option<usize> = None;
        for (i, e) in s.edited.iter().enumerate() {
            let pos = e.pos;
            if pos < self.prompt_len {
                return Err(format!(
                    "field `edited[{i}].pos` is {pos}, a prompt position (the prompt ends at {}): only a decoded position can be edited",
                    self.prompt_len - 1
                ));
            }
            if !generated.contains(&pos) {
                return Err(format!(
                    "field `edited[{i}].pos` is {pos}, outside block {}'s generated positions {} to {}",
                    s.block,
                    generated.start,
                    generated.end - 1
                ));
            }
            if let Some(p) = prev.filter(|&p| p >= pos) {
                return Err(format!(
                    "field `edited[{i}].pos` is {pos}, not after `edited[{}].pos` {p}: the list is ascending, each position once",
                    i - 1
                ));
            }
            prev = Some(pos);
            match self.held.get(&pos) {
                None => {
                    return Err(format!(
                        "field `edited[{i}].pos` is {pos}, a position still masked before this step: only a decoded position can be edited"
                    ))
                }
                Some(&held) if held != e.from => {
                    return Err(format!(
                        "field `edited[{i}].from` is {}, but position {pos} holds token {held} before this step",
                        e.from
                    ))
                }
                Some(_) => {}
            }
            self.token(|| format!("edited[{i}].token"), e.token)?;
            if e.token == e.from {
                return Err(format!(
                    "field `edited[{i}].token` is {}, the token position {pos} already holds: an edit replaces it",
                    e.token
                ));
            }
            probability(|| format!("edited[{i}].conf"), e.conf)?;
            if e.entropy < -1e-6 {
                return Err(format!("field `edited[{i}].entropy` is {}, below 0", e.entropy));
            }
            self.top("edited", &e.top)?;
            self.routes("edited", pos, &e.routes)?;
        }
        Ok(())
    }

    /// A block's steps come 0, 1, 2, ... and stay within what a block under the settings in
    /// force may take (for a strategy that edits, its passes after the last mask included).
    fn step_order(&mut self, s: &StepEvent) -> Result<(), String> {
        let want = match self.last_step {
            Some((b, k)) if b == s.block => k + 1,
            _ => 0,
        };
        if s.step != want {
            return Err(format!(
                "field `step` is {}, but block {}'s steps so far call for step {want}",
                s.step, s.block
            ));
        }
        let budget = self.settings.step_budget();
        if s.step >= budget {
            return Err(format!("field `step` is {}, but a block of these settings takes at most {budget} steps (0 to {})", s.step, budget - 1));
        }
        self.last_step = Some((s.block, s.step));
        Ok(())
    }

    fn block(&self, b: &BlockEvent) -> Result<(), String> {
        self.block_in_range(b.block)?;
        if b.tokens.len() > self.block_length {
            return Err(format!(
                "field `tokens` holds {} tokens for a block of {}",
                b.tokens.len(),
                self.block_length
            ));
        }
        Ok(())
    }

    fn finish(&self, f: &FinishEvent) -> Result<(), String> {
        let most = self.max_len - self.prompt_len;
        if f.output_ids.len() > most {
            return Err(format!(
                "field `output_ids` holds {} tokens, more than max_new_tokens {most}",
                f.output_ids.len()
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::synth::{self, Synth};

    fn check_all(events: &[Event]) -> Result<(), String> {
        let mut c = TraceCheck::default();
        events.iter().try_for_each(|e| c.check(e))
    }

    #[test]
    fn real_and_synthetic_traces_pass() {
        for cfg in [Synth::small(), Synth::long(300, 8, 3), Synth::long(64, 4, 4)] {
            assert_eq!(check_all(&synth::trace(&cfg)), Ok(()));
        }
        let routed = synth::with_routes(synth::trace(&Synth::small()), &synth::sdar_moe_layout());
        assert_eq!(check_all(&routed), Ok(()));
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/traces");
        for name in ["tiny-dynamic.jsonl", "compare-a.jsonl", "compare-b.jsonl"] {
            let t = crate::trace::file::read_file(&dir.join(name)).unwrap();
            assert_eq!(t.stopped, None, "{name}");
        }
    }

    #[test]
    fn each_inconsistency_is_named() {
        let good = synth::trace(&Synth::small());
        let Event::Header(h) = &good[0] else { panic!() };
        let step_at = good
            .iter()
            .position(|e| matches!(e, Event::Step(s) if !s.committed.is_empty()))
            .unwrap();
        type Edit = Box<dyn Fn(&mut Vec<Event>)>;
        let cases: Vec<(Edit, String)> = vec![
            (
                Box::new(|ev| if let Event::Header(h) = &mut ev[0] { h.mask_token_id = 1 << 30 }),
                format!("field `mask_token_id` is {}, outside the vocabulary of {}", 1 << 30, h.model.vocab_size),
            ),
            (
                Box::new(|ev| if let Event::Header(h) = &mut ev[0] { h.prompt_pieces.pop(); }),
                format!("field `prompt_pieces` holds {} pieces for {} prompt ids", h.prompt_ids.len() - 1, h.prompt_ids.len()),
            ),
            (
                Box::new(move |ev| {
                    // the same commits again, as the block's next step
                    let Event::Step(mut dup) = ev[step_at].clone() else { panic!() };
                    (dup.step, dup.forward) = (dup.step + 1, dup.forward + 1);
                    ev.insert(step_at + 1, Event::Step(dup));
                }),
                "a second time".into(),
            ),
            (
                Box::new(move |ev| if let Event::Step(s) = &mut ev[step_at] { s.step = 50; }),
                "field `step` is 50, but block".into(),
            ),
            (
                Box::new(move |ev| {
                    let Event::Step(mut dup) = ev[step_at].clone() else { panic!() };
                    (dup.block, dup.step) = (dup.block + 1, 1);
                    ev.insert(step_at + 1, Event::Step(dup));
                }),
                "steps so far call for step 0".into(),
            ),
            (
                Box::new(move |ev| if let Event::Step(s) = &mut ev[step_at] { s.committed[0].conf = 1.5; }),
                "field `committed[0].conf` is 1.5, not a probability from 0 to 1".into(),
            ),
            (
                Box::new(move |ev| if let Event::Step(s) = &mut ev[step_at] { s.block = 1 << 40 }),
                format!("field `block` is {}, outside this decode's blocks", 1u64 << 40),
            ),
            (
                // 6 prompt + 24 new tokens in blocks of 4: blocks 1 to 7 (an inclusive range, as
                // every range in these messages; `1..8` read as if 8 were allowed)
                Box::new(move |ev| if let Event::Step(s) = &mut ev[step_at] { s.block = 8 }),
                "field `block` is 8, outside this decode's blocks 1 to 7".into(),
            ),
            (
                Box::new(move |ev| if let Event::Step(s) = &mut ev[step_at] { s.committed[0].pos = 8 }),
                "committed position 8 is outside block 1's generated positions 6 to 7".into(),
            ),
            (
                Box::new(move |ev| *ev = synth::with_candidates(std::mem::take(ev), MAX_CANDIDATES + 1)),
                format!("field `committed.top` holds {} candidates, more than the limit of {MAX_CANDIDATES}", MAX_CANDIDATES + 1),
            ),
            (
                Box::new(move |ev| {
                    *ev = synth::with_candidates(std::mem::take(ev), 2);
                    if let Event::Step(s) = &mut ev[step_at] {
                        s.committed[0].top[1].token = 1 << 30;
                    }
                }),
                format!("field `committed.top.token` is {}, outside the vocabulary", 1 << 30),
            ),
            (
                Box::new(move |ev| {
                    *ev = synth::with_routes(std::mem::take(ev), &synth::sdar_moe_layout());
                    if let Event::Step(s) = &mut ev[step_at] {
                        s.committed[0].routes[3].experts.push(1);
                    }
                }),
                "holds 9 experts and 8 weights; top_k is 8".into(),
            ),
            (
                Box::new(move |ev| {
                    *ev = synth::with_routes(std::mem::take(ev), &synth::sdar_moe_layout());
                    if let Event::Step(s) = &mut ev[step_at] {
                        s.committed[0].routes[47].experts[2] = 128;
                    }
                }),
                "field `committed.routes.experts` of position".into(),
            ),
            (
                Box::new(move |ev| {
                    *ev = synth::with_routes(std::mem::take(ev), &synth::sdar_moe_layout());
                    if let Event::Step(s) = &mut ev[step_at] {
                        s.committed[0].routes[0].weights[0] = f32::NAN;
                    }
                }),
                "layer 0 is NaN, not a weight from 0 to 1".into(),
            ),
            (
                Box::new(move |ev| {
                    *ev = synth::with_routes(std::mem::take(ev), &synth::sdar_moe_layout());
                    if let Event::Header(h) = &mut ev[0] {
                        h.model.moe = None;
                    }
                }),
                "field `committed.routes` is present, but the header's model has no `moe` layout".into(),
            ),
            (
                Box::new(move |ev| {
                    *ev = synth::with_routes(std::mem::take(ev), &synth::sdar_moe_layout());
                    if let Event::Step(s) = &mut ev[step_at] {
                        s.distinct_experts.pop();
                    }
                }),
                "field `distinct_experts` holds 47 entries for 48 sparse layers".into(),
            ),
            (
                Box::new(move |ev| {
                    *ev = synth::with_routes(std::mem::take(ev), &synth::sdar_moe_layout());
                    if let Event::Header(h) = &mut ev[0] {
                        h.model.moe.as_mut().unwrap().top_k = 129;
                    }
                }),
                "field `model.moe.top_k` is 129, outside 1 to 64".into(),
            ),
        ];
        for (edit, want) in cases {
            let mut ev = good.clone();
            edit(&mut ev);
            let e = check_all(&ev).unwrap_err();
            assert!(e.contains(&want), "{e} / {want}");
        }
    }

    /// An edit names a decoded position of its block and the token it holds: each other case is
    /// named by its field, and the reader says which line of which file.
    #[test]
    fn each_bad_edit_is_named() {
        let good = synth::trace(&Synth::small_edits());
        assert_eq!(check_all(&good), Ok(()));
        // Block 1 holds prompt positions 4 and 5; its step 1 edits position 7.
        let at =
            good.iter().position(|e| matches!(e, Event::Step(s) if !s.edited.is_empty())).unwrap();
        let Event::Step(s) = &good[at] else { panic!() };
        assert_eq!((s.block, s.step, s.edited[0].pos, s.edited[0].from), (1, 1, 7, 15));
        type Edit = Box<dyn Fn(&mut crate::trace::events::Edited)>;
        let cases: Vec<(Edit, &str)> = vec![
            (
                Box::new(|e| e.pos = 5),
                "field `edited[0].pos` is 5, a prompt position (the prompt ends at 5): only a decoded position can be edited",
            ),
            (Box::new(|e| e.pos = 8), "field `edited[0].pos` is 8, outside block 1's generated positions 6 to 7"),
            (
                // Position 6 is committed by this very step: masked before it.
                Box::new(|e| e.pos = 6),
                "field `edited[0].pos` is 6, a position still masked before this step: only a decoded position can be edited",
            ),
            (Box::new(|e| e.from = 3), "field `edited[0].from` is 3, but position 7 holds token 15 before this step"),
            (
                Box::new(|e| e.token = e.from),
                "field `edited[0].token` is 15, the token position 7 already holds: an edit replaces it",
            ),
            (Box::new(|e| e.token = 1 << 30), "field `edited[0].token` is 1073741824, outside the vocabulary of 34"),
            (Box::new(|e| e.conf = 2.0), "field `edited[0].conf` is 2, not a probability from 0 to 1"),
            (Box::new(|e| e.entropy = -1.0), "field `edited[0].entropy` is -1, below 0"),
        ];
        for (edit, want) in cases {
            let mut ev = good.clone();
            let Event::Step(s) = &mut ev[at] else { panic!() };
            edit(&mut s.edited[0]);
            assert_eq!(check_all(&ev).unwrap_err(), want);
        }
        // The same position twice in one step, or out of order.
        let mut ev = good.clone();
        let Event::Step(s) = &mut ev[at] else { panic!() };
        s.edited.push(s.edited[0].clone());
        let e = check_all(&ev).unwrap_err();
        assert_eq!(e, "field `edited[1].pos` is 7, not after `edited[0].pos` 7: the list is ascending, each position once");
        // As the reader reports it: the file, the line, the field.
        let mut ev = good.clone();
        let Event::Step(s) = &mut ev[at] else { panic!() };
        s.edited[0].from = 3;
        let text: String = ev.iter().map(|e| serde_json::to_string(e).unwrap() + "\n").collect();
        let read = crate::trace::file::read(text.as_bytes(), "edits.jsonl").unwrap();
        assert_eq!(
            read.stopped.as_deref(),
            Some(format!("edits.jsonl:{}: field `edited[0].from` is 3, but position 7 holds token 15 before this step", at + 1).as_str())
        );
        assert_eq!(read.events.len(), at);
    }

    /// A block of an editing strategy may take its post-steps (passes after its last mask,
    /// which only edit): the settings' step budget counts them (`max_post_steps`), and a step
    /// past it is refused as any other.
    #[test]
    fn post_steps_count_in_the_step_budget() {
        let good = synth::trace(&Synth::small_edits());
        let last = good
            .iter()
            .filter_map(|e| if let Event::Step(s) = e { Some(s.step) } else { None })
            .max();
        assert_eq!(last, Some(5), "block 2's second post-step, within 4 + 2");
        let mut ev = good.clone();
        let Event::Header(h) = &mut ev[0] else { panic!() };
        h.settings.max_post_steps = 1;
        let e = check_all(&ev).unwrap_err();
        assert!(
            e.contains("field `step` is 5, but a block of these settings takes at most 5 steps"),
            "{e}"
        );
    }

    #[test]
    fn devices_fifos_and_folders_are_not_regular_files() {
        let e = format!("{:#}", regular_file(Path::new("/dev/null")).unwrap_err());
        assert_eq!(e, "/dev/null: not a regular file (a character device)");
        let e = format!("{:#}", regular_file(Path::new("/")).unwrap_err());
        assert_eq!(e, "/: not a regular file (a folder)");
        let e = format!("{:#}", regular_file(Path::new("/nonexistent/x")).unwrap_err());
        assert!(e.starts_with("/nonexistent/x: does not exist ("), "{e}");
    }
}
