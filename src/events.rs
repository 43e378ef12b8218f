//! The step-event schema: the one contract between the engine, the trace file, the store and
//! every view. docs/events.md documents it for people; this module is the source of truth.
//!
//! A decode is a sequence `header, (step+, block)*, finish`. Serialised, each event is one JSON
//! object on its own line with `"event"` naming the kind.

use serde::{Deserialize, Serialize};

use crate::settings::DecodeSettings;

/// Bumped whenever a field changes meaning or disappears. Added optional fields do not bump it.
pub const TRACE_VERSION: u32 = 1;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum Event {
    Header(Header),
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
    pub dtype: String,
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
    /// Still-masked positions after this step, with the candidate the model preferred.
    pub masked: Vec<Candidate>,
    /// Milliseconds since the decode started, at the end of this step.
    pub t_ms: f64,
    /// Present on the first step of a block whose settings differ from the previous block's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub settings: Option<DecodeSettings>,
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
    /// Denoising steps this block took.
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

impl FinishEvent {
    pub fn tokens_per_second(&self) -> f64 {
        if self.elapsed_ms <= 0.0 {
            return 0.0;
        }
        self.output_ids.len() as f64 / (self.elapsed_ms / 1000.0)
    }
}
