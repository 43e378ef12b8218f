//! The step-event schema: the one contract between the engine, the trace file, the store and
//! every view. docs/events.md documents it for people; this module is the source of truth.
//!
//! A decode is a sequence `header, (step+, block)*, finish`. Serialised, each event is one JSON
//! object on its own line with `"event"` naming the kind.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::engine::settings::DecodeSettings;

/// Bumped whenever a field changes meaning or disappears. Added optional fields do not bump it.
/// Version 2: a committed position may be replaced later (`StepEvent::edited`), so a step's
/// `committed` is no longer a position's final token; the block event's `tokens` are. Every
/// version up to this one is read.
pub const TRACE_VERSION: u32 = 2;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum Event {
    /// Boxed: once per trace, and much larger than the step events that make up most of it
    /// (`Event` is as big as its largest variant).
    Header(Box<Header>),
    Step(StepEvent),
    Block(BlockEvent),
    Finish(FinishEvent),
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Header {
    pub version: u32,
    pub model: ModelInfo,
    pub settings: DecodeSettings,
    pub mask_token_id: u32,
    pub eos_ids: Vec<u32>,
    /// The text that was tokenized: the rendered chat template when one was applied.
    pub prompt: String,
    pub prompt_ids: Vec<u32>,
    /// Text of every prompt token, so a replay needs no tokenizer: what its bytes add to the
    /// tokens before it (a token that only starts a character is `""`, the one completing it
    /// holds it), so the pieces concatenate to the prompt.
    pub prompt_pieces: Vec<String>,
    /// The bytes of every prompt token; present only when some token's bytes are not its piece
    /// (the prompt splits a character across tokens).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_bytes: Option<Vec<Vec<u8>>>,
    /// Index of the first block that is decoded (every block before it is pure prompt).
    pub first_block: usize,
    /// Position one past the last position that may be generated (`prompt + max_new_tokens`).
    pub max_len: usize,
    pub device: String,
    /// How `prompt` was made from the user's message (absent in traces written before chat
    /// templates were supported).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chat: Option<Box<ChatInfo>>,
    /// Which file or flag set each checkpoint-derived value (`block_length`, `mask_token`,
    /// `sampling`, ...): e.g. `"config.json block_size"`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub sources: BTreeMap<String, String>,
}

impl Header {
    /// What the person asked: the user's message, not the chat template around it.
    pub fn shown_prompt(&self) -> &str {
        self.chat.as_ref().map_or(&self.prompt, |c| &c.user)
    }
}

/// The conversation behind a prompt.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ChatInfo {
    /// The user's message, byte for byte.
    pub user: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub system: Option<String>,
    /// Whether the checkpoint's chat template rendered `prompt` (false: `--raw`, or no template).
    pub template_applied: bool,
    /// Template variables set with `--chat-arg`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub chat_args: BTreeMap<String, serde_json::Value>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ModelInfo {
    /// Folder the checkpoint came from, or `embedded:<name>`.
    pub source: String,
    pub model_type: String,
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub num_layers: usize,
    pub num_params: usize,
    /// The dtype the weights are stored in.
    pub dtype: String,
    /// The dtype the decode computes in (`f32`, `bf16`, `f16`; `bf16` too for the CPU's bf16
    /// products); absent in traces written before it existed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compute: Option<String>,
    /// A mixture-of-experts model's routing layout (absent for a dense model, and in traces
    /// written before it existed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub moe: Option<MoeInfo>,
}

/// How a mixture-of-experts model routes: what `--routing` fields index.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MoeInfo {
    /// Experts per sparse layer.
    pub experts: usize,
    /// Experts each row is routed to per sparse layer.
    pub top_k: usize,
    /// The sparse layers, ascending: `routes[i]` and `distinct_experts[i]` are layer
    /// `sparse_layers[i]`'s.
    pub sparse_layers: Vec<usize>,
}

/// One denoising pass: what it committed and what it would pick for every position still masked.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StepEvent {
    pub block: usize,
    pub step: usize,
    /// Running count of forward passes, this one included (one per denoising pass: the prompt
    /// prefill and each block's commit ride on the next denoising pass).
    pub forward: usize,
    pub committed: Vec<Committed>,
    /// Positions of this block decoded before this step whose token this step replaced (token
    /// editing: `--strategy joint_threshold`), ascending. Never a prompt position, never an
    /// earlier block's. Absent when nothing was replaced (always, for strategies that do not
    /// edit, and in version 1 traces).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub edited: Vec<Edited>,
    /// Still-masked positions after this step, with the candidate the model preferred.
    pub masked: Vec<Candidate>,
    /// Milliseconds since the decode started, at the end of this step.
    pub t_ms: f64,
    /// Present on the first step of a block whose settings differ from the previous block's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub settings: Option<DecodeSettings>,
    /// `--routing`: per sparse layer (`model.moe.sparse_layers`), how many distinct experts the
    /// rows of this step's forward pass (the blocks it stored and the block) were routed to:
    /// the experts whose weights the pass read. Absent otherwise.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub distinct_experts: Vec<u32>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Committed {
    pub pos: usize,
    pub token: u32,
    /// The token decoded alone (`�` where its bytes are not valid UTF-8 on their own).
    pub text: String,
    /// The token's bytes, present only when they differ from `text` (a split character).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes: Option<Vec<u8>>,
    pub conf: f32,
    pub entropy: f32,
    /// `--candidates K` above 1: the K most probable tokens of the distribution `token` was
    /// drawn from, most probable first. Absent otherwise (and in older traces).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub top: Vec<TopCandidate>,
    /// `--routing` on a mixture-of-experts model: per sparse layer (`model.moe.sparse_layers`),
    /// the experts this position's row was routed to in the pass that committed it, and their
    /// weights. Absent otherwise.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub routes: Vec<Route>,
}

/// A decoded position whose token a step replaced: what it held (`from`) and what it holds now,
/// with the distribution the new token was drawn from, as in [`Committed`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Edited {
    pub pos: usize,
    /// The token it held before this step.
    pub from: u32,
    pub token: u32,
    /// As in [`Committed`].
    pub text: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes: Option<Vec<u8>>,
    pub conf: f32,
    pub entropy: f32,
    /// As in [`Committed`].
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub top: Vec<TopCandidate>,
    /// As in [`Committed`]: the route of the pass that made this edit.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub routes: Vec<Route>,
}

/// The experts one row was routed to in one sparse layer, most probable first, and the weights
/// its output summed them with (renormalised to sum 1 where the checkpoint's `norm_topk_prob`
/// asks).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Route {
    pub experts: Vec<u32>,
    pub weights: Vec<f32>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Candidate {
    pub pos: usize,
    pub token: u32,
    /// As in [`Committed`].
    pub text: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes: Option<Vec<u8>>,
    pub conf: f32,
    /// As in [`Committed`].
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub top: Vec<TopCandidate>,
}

/// One of a position's most probable tokens at a step (`--candidates`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TopCandidate {
    pub token: u32,
    /// As in [`Committed`].
    pub text: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes: Option<Vec<u8>>,
    /// Its probability under the distribution the position's token was drawn from.
    pub p: f32,
}

/// A block is finished and its K/V are committed to the cache.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BlockEvent {
    pub block: usize,
    /// Absolute position of the block's first cell.
    pub start: usize,
    pub tokens: Vec<u32>,
    /// Final text of every cell (as `prompt_pieces`): what its bytes add to the text of the
    /// positions before it. A character completed in a later block belongs to that later
    /// position; at the end of the output, an incomplete character is `U+FFFD`. The output
    /// cells' texts in position order concatenate to the decode of the output, special tokens
    /// spelled out. Absent in traces written before it existed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub texts: Option<Vec<String>>,
    /// Denoising steps this block took (with token editing: every pass, those after its last
    /// mask included).
    pub steps: usize,
    pub forward: usize,
    pub t_ms: f64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FinishReason {
    /// A generated EOS id ended the decode.
    Eos,
    /// `max_new_tokens` were generated.
    Length,
    /// The output's text reached a `--stop` text (`settings.stop`).
    Stop,
    /// The user stopped it (restart, quit).
    Cancelled,
    /// The engine failed; `error` on the finish event says why.
    Error,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FinishEvent {
    pub reason: FinishReason,
    /// Generated tokens after trimming (EOS included as the last one when reason is `eos`).
    pub output_ids: Vec<u32>,
    pub text: String,
    pub forwards: usize,
    pub blocks: usize,
    pub steps: usize,
    pub elapsed_ms: f64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl Event {
    /// The first number in this event that JSON cannot hold (NaN or infinite: serde_json would
    /// write it as `null`, which no reader accepts back), as `(field, value)`.
    pub fn non_finite(&self) -> Option<(&'static str, f64)> {
        let settings = |s: &DecodeSettings| {
            [
                ("settings.threshold", s.threshold as f64),
                ("settings.eb_threshold", s.eb_threshold as f64),
                ("settings.sampling.temperature", s.sampling.temperature as f64),
                ("settings.sampling.top_p", s.sampling.top_p as f64),
            ]
        };
        let mut nums: Vec<(&'static str, f64)> = Vec::new();
        match self {
            Event::Header(h) => nums.extend(settings(&h.settings)),
            Event::Step(s) => {
                nums.push(("t_ms", s.t_ms));
                for c in &s.committed {
                    nums.extend([
                        ("committed.conf", c.conf as f64),
                        ("committed.entropy", c.entropy as f64),
                    ]);
                    nums.extend(c.top.iter().map(|t| ("committed.top.p", t.p as f64)));
                }
                for c in &s.edited {
                    nums.extend([
                        ("edited.conf", c.conf as f64),
                        ("edited.entropy", c.entropy as f64),
                    ]);
                    nums.extend(c.top.iter().map(|t| ("edited.top.p", t.p as f64)));
                }
                for c in &s.masked {
                    nums.push(("masked.conf", c.conf as f64));
                    nums.extend(c.top.iter().map(|t| ("masked.top.p", t.p as f64)));
                }
                if let Some(st) = &s.settings {
                    nums.extend(settings(st));
                }
            }
            Event::Block(b) => nums.push(("t_ms", b.t_ms)),
            Event::Finish(f) => nums.push(("elapsed_ms", f.elapsed_ms)),
        }
        nums.into_iter().find(|(_, v)| !v.is_finite())
    }
}

impl FinishEvent {
    pub fn tokens_per_second(&self) -> f64 {
        if self.elapsed_ms <= 0.0 {
            return 0.0;
        }
        self.output_ids.len() as f64 / (self.elapsed_ms / 1000.0)
    }
}
