//! From flags to a ready engine: load the checkpoint, resolve settings, tokenize the prompt.

use anyhow::Result;

use crate::cli::DecodeArgs;
use crate::engine::{EngineThread, ModelDenoiser, Request};
use crate::model::{parse_device, parse_dtype, Checkpoint, Source};
use crate::tokenizer::Tok;

/// The prompt decoded when none is given and the checkpoint suggests none.
pub const DEFAULT_PROMPT: &str = "ROMEO:\n";

pub struct Session {
    pub denoiser: ModelDenoiser,
    pub tokenizer: Tok,
    pub request: Request,
}

/// Events of an engine thread, for an async front end.
pub type EventRx = tokio::sync::mpsc::UnboundedReceiver<crate::events::Event>;

impl Session {
    /// Moves the model onto its engine thread, whose events arrive on the returned channel;
    /// hands back the request, not yet submitted.
    pub fn spawn(self) -> (EngineThread, Request, EventRx) {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let engine = EngineThread::spawn(Box::new(self.denoiser), Box::new(self.tokenizer), move |ev| {
            // The UI may be gone (quitting); the engine must not care.
            let _ = tx.send(ev);
        });
        (engine, self.request, rx)
    }

    pub fn open(args: &DecodeArgs) -> Result<Self> {
        let source = match &args.model {
            Some(dir) => Source::Dir(dir.clone()),
            None => Source::Embedded(crate::embedded::default_model()?),
        };
        let device = parse_device(&args.device)?;
        let ckpt = Checkpoint::load(&source, &device, parse_dtype(&args.dtype, &device)?)?;
        single_thread_for_small_models(ckpt.info.num_params, ckpt.model.device());
        let settings = args.settings(&ckpt.generation, ckpt.config.block_size)?;
        let prompt = args
            .prompt
            .clone()
            .or_else(|| ckpt.generation.default_prompt.clone())
            .unwrap_or_else(|| DEFAULT_PROMPT.to_string());
        let prompt_ids = ckpt.tokenizer.encode(&prompt)?;
        check_prompt_ids(&prompt_ids, ckpt.config.vocab_size, &ckpt.tokenizer)?;
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

/// Every prompt token must index the embedding: a tokenizer.json larger than config.json's
/// `vocab_size` would otherwise fail deep in the first forward with a tensor index error.
fn check_prompt_ids(ids: &[u32], vocab: usize, tok: &Tok) -> Result<()> {
    match ids.iter().enumerate().find(|(_, &t)| t as usize >= vocab) {
        None => Ok(()),
        Some((i, &t)) => anyhow::bail!(
            "--prompt: token {i} ({:?}) has id {t}, outside the model's vocabulary of {vocab} \
             (config.json `vocab_size`); tokenizer.json and config.json disagree",
            tok.piece(t)
        ),
    }
}

/// Parameters under which the CPU decodes faster on one thread: every matmul has only
/// `block_length` rows, and splitting such a product over threads costs more than it saves
/// (tiny-sdar, 256 tokens on the idle 2-core dev box: 1.03-1.04 s on one thread, 1.39 s on two).
const SINGLE_THREAD_BELOW_PARAMS: usize = 50_000_000;

/// Chooses one matmul thread for small models on the CPU, unless the user set
/// `RAYON_NUM_THREADS` (which candle reads on every matmul).
pub fn single_thread_for_small_models(num_params: usize, device: &candle_core::Device) {
    let small = num_params < SINGLE_THREAD_BELOW_PARAMS;
    if small && device.is_cpu() && std::env::var_os("RAYON_NUM_THREADS").is_none() {
        std::env::set_var("RAYON_NUM_THREADS", "1");
    }
}
