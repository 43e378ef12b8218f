//! From flags to a ready engine: load the checkpoint, resolve settings, tokenize the prompt.

use anyhow::Result;

use crate::cli::DecodeArgs;
use crate::engine::{ModelDenoiser, Request};
use crate::model::{parse_device, parse_dtype, Checkpoint, Source};
use crate::tokenizer::Tok;

/// The prompt decoded when none is given and the checkpoint suggests none.
pub const DEFAULT_PROMPT: &str = "ROMEO:\n";

pub struct Session {
    pub denoiser: ModelDenoiser,
    pub tokenizer: Tok,
    pub request: Request,
}

impl Session {
    pub fn open(args: &DecodeArgs) -> Result<Self> {
        let source = match &args.model {
            Some(dir) => Source::Dir(dir.clone()),
            None => Source::Embedded(crate::embedded::default_model()?),
        };
        let device = parse_device(&args.device)?;
        let ckpt = Checkpoint::load(&source, &device, parse_dtype(&args.dtype, &device)?)?;
        let settings = args.settings(&ckpt.generation, ckpt.config.block_size)?;
        let prompt = args
            .prompt
            .clone()
            .or_else(|| ckpt.generation.default_prompt.clone())
            .unwrap_or_else(|| DEFAULT_PROMPT.to_string());
        let prompt_ids = ckpt.tokenizer.encode(&prompt)?;
        let request = Request {
            prompt,
            prompt_ids,
            settings,
            mask_id: ckpt.tokenizer.mask_id(),
            eos_ids: ckpt.eos_ids.clone(),
            model: ckpt.info.clone(),
            device: args.device.clone(),
        };
        let denoiser = ModelDenoiser::new(ckpt.model, ckpt.tokenizer.mask_id());
        Ok(Session { denoiser, tokenizer: ckpt.tokenizer, request })
    }
}
