//! From flags to a ready engine: load the checkpoint, resolve settings, tokenize the prompt.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::Path;

use anyhow::{anyhow, bail, Context, Result};

use crate::cli::DecodeArgs;
use crate::engine::{EngineThread, ModelDenoiser, Request};
use crate::model::chat::{self, ChatTemplate};
use crate::model::config::block_size_from_name;
use crate::model::hub;
use crate::model::memory::HostNeed;
use crate::model::tokenizer::Tok;
use crate::model::{
    Checkpoint, Compute, DeviceSpec, GenerationConfig, PathChoices, Products, Source,
};
use crate::trace::events::ChatInfo;

/// The prompt decoded when none is given and the checkpoint suggests none.
pub const DEFAULT_PROMPT: &str = "ROMEO:\n";

pub struct Session {
    pub denoiser: ModelDenoiser,
    pub tokenizer: Tok,
    pub request: Request,
}

/// Events of an engine thread, for an async front end.
pub type EventRx = tokio::sync::mpsc::UnboundedReceiver<crate::trace::events::Event>;

impl Session {
    /// Moves the model onto its engine thread, whose events arrive on the returned channel;
    /// hands back the request, not yet submitted.
    pub fn spawn(self) -> (EngineThread, Request, EventRx) {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let engine =
            EngineThread::spawn(Box::new(self.denoiser), Box::new(self.tokenizer), move |ev| {
                // The UI may be gone (quitting); the engine must not care.
                let _ = tx.send(ev);
            });
        (engine, self.request, rx)
    }

    pub fn open(args: &DecodeArgs) -> Result<Self> {
        let paths = PathChoices::from_env()?;
        let (source, name) = model_source(args)?;
        let device = args.device.open()?;
        if args.routing {
            check_routing(&source)?;
        }
        let compute = Compute { paths, ..args.dtype.compute(&device) };
        // read and compiled before the weights load: a wrong path fails at once
        let template_file = args.chat_template.as_deref().map(read_chat_template).transpose()?;
        let mut ckpt = Checkpoint::load(&source, &device, compute)?;
        if let Some(t) = template_file {
            ckpt.chat_template = Some(t);
        }
        if let (Some(id), Source::Dir(snapshot)) = (hub_id(args), &source) {
            // The snapshot's folder is its commit: which revision was decoded, for the record.
            let commit =
                snapshot.file_name().map(|c| c.to_string_lossy().into_owned()).unwrap_or_default();
            ckpt.info.source = format!("{id}@{commit}");
        }
        single_thread_for_small_models(ckpt.info.num_params, ckpt.model.device());
        let block = checkpoint_block_size(ckpt.config.block_size, name.as_deref());
        if args.block_length.is_none() && ckpt.generation.block_length.is_none() {
            check_name_block(block.as_ref())?;
        }
        let family = crate::model::registry::family(&ckpt.config)?;
        let defaults = (family.decoding)(&ckpt.generation, name.as_deref());
        let settings = args.settings_over(
            &ckpt.generation,
            block.as_ref().map(|b| b.0),
            defaults.as_ref().unwrap_or(&GenerationConfig::default()),
        )?;
        if let Some(n) = settings.capped_steps() {
            crate::notice::warn(format!(
                "steps {} is more than a block's {n} positions: each block takes at most {n} steps",
                settings.steps
            ));
        }
        let user = user_message(args, &ckpt)?;
        let template = if args.raw { None } else { ckpt.chat_template.as_ref() };
        let ask =
            PromptSpec { system: args.system.as_deref(), chat_args: &args.chat_arg, user: &user };
        let (prompt, chat) = render_prompt(template, &ckpt.template_vars, &ask, &source.label())?;
        let prompt_ids = ckpt.tokenizer.encode(&prompt)?;
        check_prompt_ids(&prompt_ids, ckpt.config.vocab_size, &ckpt.tokenizer)?;
        check_positions(prompt_ids.len(), &settings, ckpt.config.max_position_embeddings)?;
        // the weights are in: what is left must hold the decode's cache and workspace
        with_decode(HostNeed::new(), &ckpt.config, (compute, &device), prompt_ids.len(), &settings)
            .check("the decode", "lower --max-new-tokens or shorten the prompt")?;
        let mut sources = BTreeMap::new();
        sources.insert(
            "block_length".into(),
            block_length_source(args, &ckpt.generation, block, defaults.as_ref()),
        );
        if let Some(d) = &defaults {
            sources.insert("decoding".into(), d.origin.clone());
        }
        sources.insert("mask_token".into(), ckpt.mask_source.clone());
        sources.insert("sampling".into(), sampling_source(args, &ckpt.generation));
        if let Some(t) = template {
            sources.insert("chat_template".into(), t.origin().to_string());
        }
        if args.ignore_eos {
            let ids: Vec<String> = ckpt.eos_ids.iter().map(u32::to_string).collect();
            sources.insert("eos".into(), format!("ignored (--ignore-eos): {}", ids.join(", ")));
        }
        let request = Request {
            prompt,
            prompt_ids,
            settings,
            mask_id: ckpt.tokenizer.mask_id(),
            eos_ids: if args.ignore_eos { Vec::new() } else { ckpt.eos_ids.clone() },
            model: ckpt.info.clone(),
            device: device_label(args.device, compute, crate::model::compute_dtype(&device)),
            chat: Some(chat),
            sources,
            candidates: args.candidates(),
            routing: args.routing,
        };
        let denoiser = ModelDenoiser::new(ckpt.model, ckpt.tokenizer.mask_id(), &paths);
        Ok(Session { denoiser, tokenizer: ckpt.tokenizer, request })
    }
}

/// The device as the header and the status bar name it: `--device`, and what makes its tokens
/// differ from the device's default: on the CPU with `--dtype bf16` the bf16 products, else a
/// compute dtype that is not the device's own (`cpu (f16)`, `cuda (f32)`).
pub fn device_label(device: DeviceSpec, compute: Compute, default: candle_core::DType) -> String {
    match compute.products {
        Products::Bf16 => format!("{device} (bf16 products)"),
        Products::F32 if compute.dtype == default => device.to_string(),
        Products::F32 => format!("{device} ({})", compute.dtype.as_str()),
    }
}

/// `--routing` needs a mixture-of-experts model: checked from config.json before the weights
/// load (a dense checkpoint can be many GB).
pub fn check_routing(source: &Source) -> Result<()> {
    let (config, label) = source.config()?;
    require_moe(&config, &label)
}

/// `--routing` on the model `config` (named `label` in the error): it must have sparse layers.
pub fn require_moe(config: &crate::model::ModelConfig, label: &str) -> Result<()> {
    config.moe_info().map(|_| ()).ok_or_else(|| {
        anyhow!(
            "--routing: {label} describes a dense model (model_type {:?}, no sparse layers); routing needs a \
             mixture-of-experts checkpoint such as SDAR-30B-A3B (model_type \"sdar_moe\")",
            config.model_type
        )
    })
}

/// The decode's positions (whole blocks over prompt + `max_new_tokens`) must fit the model's
/// `max_position_embeddings`: checked here, before a TUI takes the terminal, rather than when
/// the engine sizes its cache (where it would end the decode with an error on screen).
pub(crate) fn check_positions(
    prompt: usize,
    s: &crate::engine::settings::DecodeSettings,
    max: usize,
) -> Result<()> {
    let (b, n) = (s.block_length.max(1), s.max_new_tokens);
    if positions(prompt, n, b).is_some_and(|need| need <= max) {
        return Ok(());
    }
    let limit = "config.json `max_position_embeddings`";
    if prompt >= max {
        anyhow::bail!(
            "the prompt's {} fill the model's {max} positions ({limit})",
            crate::format::count(prompt, "token")
        );
    }
    let fit = (max / b * b).saturating_sub(prompt);
    if fit == 0 {
        // No length helps: the blocks are too long. Say which block lengths fit this decode
        // (or, if it is too long for any, as many new tokens as the model has room for).
        let n = n.min(max - prompt);
        let best = (1..=max)
            .rev()
            .find(|&c| positions(prompt, n, c).is_some_and(|need| need <= max))
            .unwrap_or(1);
        anyhow::bail!(
            "--block-length {b}: in blocks of {b}, not one new token fits after the prompt's {} in the model's \
             {max} positions ({limit}); blocks of at most {best} fit {}",
            crate::format::count(prompt, "token"),
            crate::format::count(n, "new token")
        );
    }
    anyhow::bail!(
        "--max-new-tokens {n}: the prompt's {prompt} tokens plus {n} new ones, in blocks of {b}, \
         exceed the model's {max} positions ({limit}); at most {} fit",
        crate::format::count(fit, "new token")
    )
}

/// `need` and the host memory of a decode of `prompt` tokens under `s`: the KV cache of its
/// positions and the workspace of its largest pass (the rest of a long prompt, up to
/// [`crate::engine::PREFILL_CHUNK`] rows, with the first block). Called once the positions are
/// checked.
pub(crate) fn with_decode(
    need: HostNeed,
    cfg: &crate::model::ModelConfig,
    (compute, device): (Compute, &candle_core::Device),
    prompt: usize,
    s: &crate::engine::settings::DecodeSettings,
) -> HostNeed {
    let b = s.block_length.max(1);
    let capacity = positions(prompt, s.max_new_tokens, b).unwrap_or(usize::MAX);
    let rows = prompt.min(crate::engine::PREFILL_CHUNK) + 2 * b;
    need.decode(cfg, compute, device, capacity, (rows, 2 * b))
}

/// Positions a decode takes: the prompt and the new tokens, in whole blocks.
fn positions(prompt: usize, new: usize, block: usize) -> Option<usize> {
    prompt.checked_add(new).and_then(|t| t.div_ceil(block).checked_mul(block))
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

/// The question a chat checkpoint answers when no prompt is given: SDAR's users ask math.
pub const DEFAULT_CHAT_PROMPT: &str =
    "What is the sum of the first 20 odd numbers? Explain briefly.";

/// `--model`: a folder that exists, else a hub id from the local cache, else the embedded
/// model. Also the name a `-bN` block-size suffix is read from (the id's, not the snapshot
/// hash's).
pub fn model_source(args: &DecodeArgs) -> Result<(Source, Option<String>)> {
    let Some(model) = &args.model else {
        let e = crate::model::embedded::default_model()?;
        return Ok((Source::Embedded(e), Some(e.name.to_string())));
    };
    let folder_name = |p: &Path| p.file_name().map(|n| n.to_string_lossy().into_owned());
    let Some(id) = hub_id(args) else {
        if revision(args) != "main" {
            bail!("--revision {}: {} is a folder, and a revision picks a snapshot of an ORG/NAME in the hub cache", args.revision, model.display());
        }
        return Ok((Source::Dir(model.clone()), folder_name(model)));
    };
    let root = hub::cache_dir(|k| std::env::var(k).ok()).context(
        "--model: cannot find the Hugging Face cache (set HF_HUB_CACHE, HF_HOME or HOME)",
    )?;
    let snapshot = hub::resolve(&root, &id, revision(args))?;
    let name = id.split('/').nth(1).map(str::to_string);
    Ok((Source::Dir(snapshot), name))
}

/// The files a decode reads, `(role, path)` for [`crate::cli::output::check_outputs`]: the
/// `--prompt-file` (not `-`, stdin) and every file of the checkpoint folder it loads (`--model
/// DIR`, or the snapshot a hub id resolves to, whose files are symlinks into `blobs/`: they
/// are compared by device and inode). The embedded model has no files. Resolving a hub id
/// may fail as loading it would, with the same error.
pub fn decode_inputs(args: &DecodeArgs) -> Result<Vec<(&'static str, std::path::PathBuf)>> {
    let mut inputs = Vec::new();
    if let Some(p) = args.prompt_file.as_ref().filter(|p| !crate::cli::output::is_stdout(p)) {
        inputs.push(("--prompt-file", p.clone()));
    }
    if args.model.is_some() {
        if let (Source::Dir(dir), _) = model_source(args)? {
            match std::fs::read_dir(&dir) {
                Ok(entries) => {
                    inputs.extend(entries.flatten().map(|e| ("checkpoint file", e.path())))
                }
                // Not a folder (loading it will say why); the path itself is still an input.
                Err(_) => inputs.push(("checkpoint", dir)),
            }
        }
    }
    Ok(inputs)
}

/// Refuses `outputs` (`(flag, path)`) that are one of the decode's inputs ([`decode_inputs`])
/// or one another, or that cannot be written ([`crate::cli::output::check_outputs`]): called before
/// the checkpoint loads.
pub fn check_decode_outputs(args: &DecodeArgs, outputs: &[(&str, &Path)]) -> Result<()> {
    let inputs = decode_inputs(args)?;
    let inputs: Vec<(&str, &Path)> = inputs.iter().map(|(r, p)| (*r, p.as_path())).collect();
    crate::cli::output::check_outputs(outputs, &inputs)
}

/// `--model` as a hub id: it reads as ORG/NAME and no such folder exists.
fn hub_id(args: &DecodeArgs) -> Option<String> {
    let m = args.model.as_ref()?;
    let s = m.to_str()?;
    (!m.exists() && hub::looks_like_id(s)).then(|| s.to_string())
}

fn revision(args: &DecodeArgs) -> &str {
    if args.revision.is_empty() {
        "main"
    } else {
        &args.revision
    }
}

/// The checkpoint's own block size and where it was found: config.json, else the name.
fn checkpoint_block_size(config: Option<usize>, name: Option<&str>) -> Option<(usize, String)> {
    if let Some(b) = config {
        return Some((b, "config.json block_size".into()));
    }
    let name = name?;
    block_size_from_name(name).map(|b| (b, format!("-b{b} in the name {name:?}")))
}

/// A block size read from the checkpoint's name is refused in the name's terms (the user gave
/// no `--block-length` to blame); config.json's was checked when config.json was read.
fn check_name_block(block: Option<&(usize, String)>) -> Result<()> {
    let Some((b, from)) = block else { return Ok(()) };
    crate::engine::settings::check_block_length(*b).map_err(|e| {
        anyhow!("block length {b} from {from} {}; pass --block-length", e.requirement())
    })
}

fn block_length_source(
    args: &DecodeArgs,
    gen: &GenerationConfig,
    block: Option<(usize, String)>,
    family: Option<&GenerationConfig>,
) -> String {
    if args.block_length.is_some() {
        return "--block-length".into();
    }
    if gen.block_length.is_some() {
        return "generation_config.json block_length".into();
    }
    match (block, family) {
        (Some(b), _) => b.1,
        (None, Some(f)) if f.block_length.is_some() => f.origin.clone(),
        (None, _) => "default".into(),
    }
}

fn sampling_source(args: &DecodeArgs, gen: &GenerationConfig) -> String {
    let flags = [args.temperature.is_some(), args.top_k.is_some(), args.top_p.is_some()];
    // do_sample false sets the temperature (to 0, greedy) unless --temperature does; do_sample
    // true fills in transformers' temperature and top-k where neither the file nor a flag does.
    let greedy_by_file = gen.do_sample == Some(false) && !flags[0];
    let sampling_by_file = gen.do_sample == Some(true);
    let filled: Vec<String> = [
        (
            sampling_by_file && gen.temperature.is_none() && !flags[0],
            format!("temperature {:?}", crate::cli::TRANSFORMERS_TEMPERATURE),
        ),
        (
            sampling_by_file && gen.top_k.is_none() && !flags[1],
            format!("top_k {}", crate::cli::TRANSFORMERS_TOP_K),
        ),
    ]
    .into_iter()
    .filter_map(|(on, what)| on.then_some(what))
    .collect();
    let from_gen = [
        gen.temperature.is_some() && !flags[0],
        gen.top_k.is_some() && !flags[1],
        gen.top_p.is_some() && !flags[2],
    ];
    let by_file = from_gen.contains(&true) || greedy_by_file || !filled.is_empty();
    let source = match (flags.contains(&true), by_file) {
        (true, true) => "flags over generation_config.json",
        (true, false) => "flags",
        (false, true) => "generation_config.json",
        (false, false) => "default (greedy)",
    };
    if greedy_by_file {
        format!("{source} (do_sample false: greedy)")
    } else if !filled.is_empty() {
        format!("{source} (do_sample true: transformers' {})", filled.join(", "))
    } else {
        source.into()
    }
}

/// The user's message: `--prompt-file`, `--prompt`, the checkpoint's `default_prompt`, a math
/// question for a chat checkpoint, else `ROMEO:\n`.
fn user_message(args: &DecodeArgs, ckpt: &Checkpoint) -> Result<String> {
    if let Some(path) = &args.prompt_file {
        return read_prompt_file(path);
    }
    let chat = ckpt.chat_template.is_some() && !args.raw;
    let fallback = if chat { DEFAULT_CHAT_PROMPT } else { DEFAULT_PROMPT };
    Ok(args
        .prompt
        .clone()
        .or_else(|| ckpt.generation.default_prompt.clone())
        .unwrap_or_else(|| fallback.to_string()))
}

/// Most bytes `--chat-template` reads: released templates are a few KiB, the longest tens.
const MAX_TEMPLATE_BYTES: u64 = 1 << 20;

/// `--chat-template FILE`: read whole, bounded, compiled; errors name the flag and the file.
pub fn read_chat_template(path: &Path) -> Result<ChatTemplate> {
    let label = format!("--chat-template {}", path.display());
    let meta = crate::limits::regular_file(path).map_err(|e| anyhow!("--chat-template {e}"))?;
    if meta.len() > MAX_TEMPLATE_BYTES {
        bail!("{label}: more than {} MiB, not a chat template", MAX_TEMPLATE_BYTES >> 20);
    }
    let bytes =
        std::fs::read(path).map_err(|e| anyhow!("{label}: {}", crate::limits::io_reason(&e)))?;
    let text = String::from_utf8(bytes)
        .map_err(|e| anyhow!("{label}: not UTF-8 (byte {})", e.utf8_error().valid_up_to()))?;
    ChatTemplate::new(text, path.display().to_string())
}

/// Most bytes `--prompt-file` reads: far more text than any model's positions hold (131,072
/// tokens are about 0.5 MiB of text), so a larger file is a mistake (`/dev/zero` read forever).
const MAX_PROMPT_BYTES: u64 = 4 << 20;

/// `--prompt-file FILE` (`-`: stdin), byte for byte.
pub fn read_prompt_file(path: &Path) -> Result<String> {
    let label = path.display();
    let mut bytes = Vec::new();
    let read = if path == Path::new("-") {
        std::io::stdin().take(MAX_PROMPT_BYTES + 1).read_to_end(&mut bytes)
    } else {
        let f = std::fs::File::open(path)
            .with_context(|| format!("--prompt-file {label}: cannot read"))?;
        f.take(MAX_PROMPT_BYTES + 1).read_to_end(&mut bytes)
    };
    read.with_context(|| format!("--prompt-file {label}: cannot read"))?;
    if bytes.len() as u64 > MAX_PROMPT_BYTES {
        bail!(
            "--prompt-file {label}: more than {} MiB; no model's positions hold a prompt that long",
            MAX_PROMPT_BYTES >> 20
        );
    }
    String::from_utf8(bytes).map_err(|e| {
        anyhow!("--prompt-file {label}: not UTF-8 (byte {})", e.utf8_error().valid_up_to())
    })
}

/// What the person asked for, before any template.
pub struct PromptSpec<'a> {
    pub system: Option<&'a str>,
    /// `--chat-arg KEY=VALUE`, unparsed.
    pub chat_args: &'a [String],
    pub user: &'a str,
}

/// The text to tokenize and how it was made. With a template: the conversation rendered with
/// `vars` (the tokenizer's special tokens) under the `--chat-arg`s. Without one (`--raw`, or a
/// base checkpoint): the user's message as is; a system message or chat argument is then an
/// error, as it would be silently dropped. `model` names the checkpoint in that error.
pub fn render_prompt(
    template: Option<&ChatTemplate>,
    vars: &chat::Vars,
    ask: &PromptSpec<'_>,
    model: &str,
) -> Result<(String, ChatInfo)> {
    let mut chat_args = BTreeMap::new();
    for a in ask.chat_args {
        let (k, v) = chat::parse_chat_arg(a)?;
        chat_args.insert(k, v);
    }
    let info = |applied| ChatInfo {
        user: ask.user.to_string(),
        system: ask.system.map(str::to_string),
        template_applied: applied,
        chat_args: chat_args.clone(),
    };
    let Some(template) = template else {
        let flag = match (ask.system, ask.chat_args.first()) {
            (Some(_), _) => Some("--system"),
            (None, Some(_)) => Some("--chat-arg"),
            (None, None) => None,
        };
        if let Some(flag) = flag {
            bail!("{flag}: {model} has no chat template (no chat_template.jinja, no `chat_template` in tokenizer_config.json)");
        }
        return Ok((ask.user.to_string(), info(false)));
    };
    template.check_reads(chat_args.keys())?;
    let mut all = vars.clone();
    all.extend(chat_args.clone());
    let text = template.render(&chat::conversation(ask.system, ask.user), &all)?;
    Ok((text, info(true)))
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
