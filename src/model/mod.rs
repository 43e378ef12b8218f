//! Loading a checkpoint of a family unmask knows (SDAR / Qwen3, SDAR-MoE / Qwen3-MoE, LLaDA2;
//! Hugging Face layout) from a folder or from the bytes embedded in the binary, through one
//! code path.

// How the folder is organised (docs/architecture.md): one file per family, the registry that
// picks one, the decoder and `Model`, the shared blocks in layers/, the device fast paths in
// fast/, the projections and CPU kernels, and the CUDA launchers in cuda/.
pub mod bf16_products;
pub mod chat;
pub mod config;
pub mod cpu_attention;
#[cfg(feature = "cuda")]
mod cuda;
pub mod decoder;
pub mod embedded;
pub mod fast;
pub mod fastmath;
pub mod gemv;
pub mod hub;
pub mod layers;
pub mod linear;
pub mod llada2;
pub mod loader;
pub mod memory;
pub mod ops;
mod paths;
pub mod qwen3;
pub mod qwen3_moe;
pub mod random;
pub mod registry;
pub mod tokenizer;
pub mod weights;

use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context, Result};
use candle_core::{DType, Device};
use serde::Deserialize;

use crate::model::chat::ChatTemplate;
use crate::model::tokenizer::Tok;
use crate::trace::events::ModelInfo;
pub use config::ModelConfig;
use config::OneOrMany;
pub use decoder::Model;
pub use layers::kv_cache::{KvCache, PassInput};
pub use layers::moe::LayerRoutes;
pub use linear::Products;
pub use paths::PathChoices;
use weights::Weights;

/// A checkpoint compiled into the binary: file name -> bytes.
pub struct Embedded {
    pub name: &'static str,
    pub files: &'static [(&'static str, &'static [u8])],
}

pub enum Source {
    Dir(PathBuf),
    Embedded(&'static Embedded),
}

impl Source {
    pub fn label(&self) -> String {
        match self {
            Source::Dir(p) => p.display().to_string(),
            Source::Embedded(e) => format!("embedded:{}", e.name),
        }
    }

    /// How errors name a file of this checkpoint.
    fn file_label(&self, name: &str) -> String {
        match self {
            Source::Dir(p) => p.join(name).display().to_string(),
            Source::Embedded(e) => format!("embedded:{}/{name}", e.name),
        }
    }

    fn check(&self) -> Result<()> {
        if let Source::Dir(p) = self {
            // `exists()` would call a symlink loop or a folder we may not enter "missing".
            let meta = std::fs::metadata(p).map_err(|e| {
                anyhow!("model folder {}: {}", p.display(), crate::limits::io_reason(&e))
            })?;
            if !meta.is_dir() {
                bail!("model folder {}: is not a folder", p.display());
            }
            std::fs::read_dir(p).map_err(|e| {
                anyhow!("model folder {}: {}", p.display(), crate::limits::io_reason(&e))
            })?;
        }
        Ok(())
    }

    fn bytes(&self, name: &str) -> Result<Option<std::borrow::Cow<'static, [u8]>>> {
        match self {
            Source::Dir(p) => match read_if_present(&p.join(name))? {
                Some(b) => Ok(Some(b.into())),
                None => gunzip_file(&p.join(format!("{name}.gz"))),
            },
            Source::Embedded(e) => Ok(e.files.iter().find(|f| f.0 == name).map(|f| f.1.into())),
        }
    }

    fn text(&self, name: &str) -> Result<Option<String>> {
        let Some(b) = self.bytes(name)? else { return Ok(None) };
        let label = self.file_label(name);
        String::from_utf8(b.into_owned())
            .map(Some)
            .map_err(|e| anyhow!("{label}: not UTF-8 (byte {})", e.utf8_error().valid_up_to()))
    }

    fn required_text(&self, name: &str) -> Result<String> {
        self.text(name)?.ok_or_else(|| anyhow!("{}: missing", self.file_label(name)))
    }

    /// The checkpoint's config.json, parsed and bounded (no weights read), and how errors name it.
    pub fn config(&self) -> Result<(ModelConfig, String)> {
        let label = self.file_label("config.json");
        Ok((
            crate::model::registry::parse_config(&self.required_text("config.json")?, &label)?,
            label,
        ))
    }

    fn weights(&self) -> Result<Weights> {
        match self {
            Source::Embedded(e) => {
                let bytes = e.files.iter().find(|f| f.0 == "model.safetensors").map(|f| f.1);
                let bytes = bytes
                    .ok_or_else(|| anyhow!("{}: missing", self.file_label("model.safetensors")))?;
                Weights::from_static(&self.file_label("model.safetensors"), bytes)
            }
            Source::Dir(dir) => Weights::open_files(&weight_files(dir)?),
        }
    }
}

/// Whether `path` exists: `false` only when it is really not there. Any other failure (a
/// symlink loop, a folder we may not read) is an error saying so, not "missing".
fn present(path: &Path) -> Result<bool> {
    match std::fs::symlink_metadata(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(e) => bail!("{}: {}", path.display(), crate::limits::io_reason(&e)),
        // A link is followed: a dangling or looping one is an error, not an absent file.
        Ok(m) if m.file_type().is_symlink() => match std::fs::metadata(path) {
            Ok(_) => Ok(true),
            Err(e) => bail!("{}: {}", path.display(), crate::limits::io_reason(&e)),
        },
        Ok(_) => Ok(true),
    }
}

/// The bytes of `path`, `None` when it is really not there; it must be a regular file.
fn read_if_present(path: &Path) -> Result<Option<Vec<u8>>> {
    if !present(path)? {
        return Ok(None);
    }
    crate::limits::regular_file(path)?;
    std::fs::read(path).map(Some).with_context(|| format!("{}: cannot read", path.display()))
}

/// The bytes of `FILE.gz` when a folder ships a file gzipped (the chat fixture's 11 MB
/// tokenizer.json, tests/fixtures/README.md says why); `None` when it is absent too.
fn gunzip_file(path: &Path) -> Result<Option<std::borrow::Cow<'static, [u8]>>> {
    use std::io::Read;
    let Some(gz) = read_if_present(path)? else { return Ok(None) };
    let mut out = Vec::new();
    flate2::read::GzDecoder::new(&gz[..])
        .read_to_end(&mut out)
        .with_context(|| format!("{}: not a valid gzip file", path.display()))?;
    Ok(Some(out.into()))
}

/// The safetensors files of a folder: the shards an index names, or the single file.
pub(crate) fn weight_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let index = dir.join("model.safetensors.index.json");
    if present(&index)? {
        crate::limits::regular_file(&index)?;
        #[derive(Deserialize)]
        struct Index {
            weight_map: std::collections::BTreeMap<String, String>,
        }
        let label = index.display().to_string();
        let text =
            std::fs::read_to_string(&index).with_context(|| format!("{label}: cannot read"))?;
        let idx: Index =
            serde_json::from_str(&text).with_context(|| format!("{label}: invalid index"))?;
        let mut files: Vec<&String> = idx.weight_map.values().collect();
        files.sort();
        files.dedup();
        if files.is_empty() {
            bail!("{label}: field `weight_map` is empty");
        }
        return Ok(files.into_iter().map(|f| dir.join(f)).collect());
    }
    let single = dir.join("model.safetensors");
    if present(&single)? {
        return Ok(vec![single]);
    }
    bail!("model folder {}: no model.safetensors or model.safetensors.index.json", dir.display())
}

/// Defaults a checkpoint may suggest in generation_config.json. Flags override them.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct GenerationConfig {
    #[serde(default)]
    pub eos_token_id: Option<OneOrMany>,
    #[serde(default)]
    pub block_length: Option<usize>,
    #[serde(default)]
    pub denoising_steps: Option<usize>,
    /// LLaDA2's `generate()` spelling of `denoising_steps`, folded into it by
    /// [`GenerationConfig::parse`].
    #[serde(default)]
    pub(crate) steps: Option<usize>,
    /// Either spelling's value, once parsed: lmdeploy and our recipe spell it
    /// `confidence_threshold`.
    #[serde(default)]
    pub threshold: Option<f32>,
    /// The other spelling, folded into `threshold` by [`GenerationConfig::parse`] (so `None`
    /// after it).
    #[serde(default)]
    pub(crate) confidence_threshold: Option<f32>,
    #[serde(default)]
    pub eb_threshold: Option<f32>,
    /// joint_threshold's `--edit-threshold`, as LLaDA2.1's `generate()` names it.
    #[serde(default)]
    pub editing_threshold: Option<f32>,
    #[serde(default)]
    pub max_post_steps: Option<usize>,
    #[serde(default)]
    pub eos_early_stop: Option<bool>,
    #[serde(default)]
    pub max_new_tokens: Option<usize>,
    #[serde(default)]
    pub remasking_strategy: Option<String>,
    #[serde(default)]
    pub temperature: Option<f32>,
    #[serde(default)]
    pub top_k: Option<usize>,
    #[serde(default)]
    pub top_p: Option<f32>,
    #[serde(default)]
    pub default_prompt: Option<String>,
    /// transformers' switch between sampling and greedy search: `false` is greedy, whatever
    /// `temperature` says (unless `--temperature` is given).
    #[serde(default)]
    pub do_sample: Option<bool>,
    /// The file, as errors name it (`DIR/generation_config.json`); empty for none.
    #[serde(skip)]
    pub origin: String,
    /// How the file spells the threshold: `threshold` or `confidence_threshold`.
    #[serde(skip)]
    pub threshold_field: &'static str,
    /// How the file spells the steps: `denoising_steps` or `steps`.
    #[serde(skip)]
    pub steps_field: &'static str,
}

impl GenerationConfig {
    /// Parses generation_config.json, the file `origin` (named in errors). Its values are
    /// checked when a decode takes them ([`crate::cli::DecodeArgs::settings`]), naming this
    /// file and the field: a flag may stand in for a bad one.
    pub fn parse(text: &str, origin: &str) -> Result<Self> {
        let mut gen: GenerationConfig =
            config::parse_object(text, origin, "invalid generation config")?;
        gen.origin = origin.to_string();
        let alias = gen.confidence_threshold.take();
        gen.threshold_field =
            one_spelling(origin, &mut gen.threshold, alias, ["threshold", "confidence_threshold"])?;
        let alias = gen.steps.take();
        gen.steps_field =
            one_spelling(origin, &mut gen.denoising_steps, alias, ["denoising_steps", "steps"])?;
        Ok(gen)
    }

    /// The file, as errors name it.
    pub fn label(&self) -> &str {
        if self.origin.is_empty() {
            "generation_config.json"
        } else {
            &self.origin
        }
    }
}

/// Folds a field's other spelling (`alias`, named `names[1]`) into `field` (`names[0]`),
/// refusing a file that gives both; returns the name the file used, for errors.
fn one_spelling<T>(
    origin: &str,
    field: &mut Option<T>,
    alias: Option<T>,
    names: [&'static str; 2],
) -> Result<&'static str> {
    match (field.is_some(), alias) {
        (true, Some(_)) => {
            bail!("{origin}: both `{}` and `{}` are given; keep one", names[0], names[1])
        }
        (false, Some(v)) => {
            *field = Some(v);
            Ok(names[1])
        }
        (_, None) => Ok(names[0]),
    }
}

#[derive(Deserialize, Default)]
struct TokenizerConfig {
    #[serde(default)]
    mask_token: Option<serde_json::Value>,
    #[serde(default)]
    eos_token: Option<serde_json::Value>,
    #[serde(default)]
    bos_token: Option<serde_json::Value>,
    #[serde(default)]
    pad_token: Option<serde_json::Value>,
    #[serde(default)]
    unk_token: Option<serde_json::Value>,
    #[serde(default)]
    chat_template: Option<serde_json::Value>,
}

/// A special token of tokenizer_config.json: a string or an AddedToken object with `content`.
fn token_text(v: Option<&serde_json::Value>) -> Option<String> {
    match v? {
        serde_json::Value::String(s) => Some(s.clone()),
        v => v.get("content")?.as_str().map(str::to_string),
    }
}

impl TokenizerConfig {
    fn mask_text(&self) -> Option<String> {
        token_text(self.mask_token.as_ref())
    }

    /// The special tokens transformers hands a chat template as variables.
    fn template_vars(&self) -> crate::model::chat::Vars {
        let named = [
            ("bos_token", &self.bos_token),
            ("eos_token", &self.eos_token),
            ("pad_token", &self.pad_token),
            ("unk_token", &self.unk_token),
        ];
        named
            .into_iter()
            .filter_map(|(k, v)| {
                Some((k.to_string(), serde_json::Value::String(token_text(v.as_ref())?)))
            })
            .collect()
    }
}

/// The checkpoint's chat template: `chat_template.jinja` (how SDAR ships it; transformers
/// prefers it too), else tokenizer_config.json's `chat_template`; `None` for a base model.
fn chat_template(source: &Source, tok_config: &TokenizerConfig) -> Result<Option<ChatTemplate>> {
    if let Some(text) = source.text("chat_template.jinja")? {
        return Ok(Some(ChatTemplate::new(text, source.file_label("chat_template.jinja"))?));
    }
    match &tok_config.chat_template {
        None | Some(serde_json::Value::Null) => Ok(None),
        Some(v) => Ok(Some(ChatTemplate::from_config_value(
            v,
            &source.file_label("tokenizer_config.json"),
        )?)),
    }
}

pub struct Checkpoint {
    pub config: ModelConfig,
    pub generation: GenerationConfig,
    pub tokenizer: Tok,
    pub eos_ids: Vec<u32>,
    pub model: Model,
    pub info: ModelInfo,
    /// The chat template, if the checkpoint has one.
    pub chat_template: Option<ChatTemplate>,
    /// `bos_token`, `eos_token`, ... as the template sees them.
    pub template_vars: crate::model::chat::Vars,
    /// Which file set the mask token: the header's `sources.mask_token`.
    pub mask_source: String,
}

impl Checkpoint {
    pub fn load(source: &Source, device: &Device, compute: impl Into<Compute>) -> Result<Self> {
        source.check()?;
        let (config, _) = source.config()?;
        let generation = match source.text("generation_config.json")? {
            None => GenerationConfig::default(),
            Some(t) => GenerationConfig::parse(&t, &source.file_label("generation_config.json"))?,
        };
        let tok_config: TokenizerConfig = match source.text("tokenizer_config.json")? {
            None => TokenizerConfig::default(),
            Some(t) => config::parse_object(
                &t,
                &source.file_label("tokenizer_config.json"),
                "invalid tokenizer config",
            )?,
        };
        let tok_label = source.file_label("tokenizer.json");
        let tok_bytes =
            source.bytes("tokenizer.json")?.ok_or_else(|| anyhow!("{tok_label}: missing"))?;
        let mask_text = tok_config.mask_text();
        let tokenizer =
            Tok::from_bytes(&tok_bytes, &tok_label, config.mask_token_id, mask_text.as_deref())?;
        if tokenizer.mask_id() as usize >= config.vocab_size {
            bail!(
                "{tok_label}: mask token id {} is outside the model's vocabulary ({})",
                tokenizer.mask_id(),
                config.vocab_size
            );
        }
        let mask_source = mask_source(&config, mask_text.as_deref(), &tokenizer);
        let eos_text = token_text(tok_config.eos_token.as_ref());
        let eos_ids = eos_ids(&config, &generation, eos_text.as_deref(), &tokenizer);
        let chat_template = chat_template(source, &tok_config)?;
        let template_vars = tok_config.template_vars();
        let weights = source.weights()?;
        let config_label = source.file_label("config.json");
        check_layers(&config, &weights, &config_label)?;
        let compute = compute.into();
        memory::HostNeed::new()
            .weights(&config, memory::Origin::Checkpoint(weights.stored()), compute, device)
            .check(&format!("{config_label}: the model"), "")?;
        let model = Model::load(&config, &weights, compute, device)?;
        let info = ModelInfo {
            source: source.label(),
            model_type: config.model_type.clone(),
            vocab_size: config.vocab_size,
            hidden_size: config.hidden_size,
            num_layers: config.num_hidden_layers,
            num_params: config.num_params(),
            dtype: weights.stored_dtype(),
            compute: Some(compute.label().to_string()),
            moe: config.moe_info(),
        };
        Ok(Checkpoint {
            config,
            generation,
            tokenizer,
            eos_ids,
            model,
            info,
            chat_template,
            template_vars,
            mask_source,
        })
    }
}

/// config.json's layer count against the checkpoint's tensors, before anything is sized by it.
fn check_layers(config: &ModelConfig, weights: &Weights, label: &str) -> Result<()> {
    let n = config.num_hidden_layers;
    let layer_tensor = registry::family(config)?.layer_tensor;
    let has = |l: usize| weights.contains(&layer_tensor(l));
    if !has(n - 1) || has(n) {
        let real = (0..=crate::limits::MAX_LAYERS).find(|&l| !has(l)).unwrap_or(0);
        bail!("{label}: field `num_hidden_layers` is {n}, but the weights hold {real} layers");
    }
    Ok(())
}

/// Where the mask id came from, for the header.
fn mask_source(config: &ModelConfig, config_text: Option<&str>, tok: &Tok) -> String {
    if config.mask_token_id.is_some() {
        return "config.json mask_token_id".into();
    }
    let from_config = config_text.is_some_and(|t| tok.token_to_id(t) == Some(tok.mask_id()));
    match from_config {
        true => format!("tokenizer_config.json mask_token {:?}", config_text.unwrap_or_default()),
        false => format!("tokenizer.json {:?}", tok.piece(tok.mask_id())),
    }
}

/// Stop ids: the union, first seen first, of generation_config.json `eos_token_id`,
/// config.json `eos_token_id` and tokenizer_config.json `eos_token` (chat checkpoints name
/// `<|im_end|>` only there). With none of them, the tokenizer's `<|endoftext|>`/`<|im_end|>`.
fn eos_ids(
    config: &ModelConfig,
    generation: &GenerationConfig,
    eos_text: Option<&str>,
    tok: &Tok,
) -> Vec<u32> {
    let listed = [&generation.eos_token_id, &config.eos_token_id]
        .into_iter()
        .flatten()
        .flat_map(OneOrMany::to_vec);
    let named = eos_text.and_then(|t| tok.token_to_id(t));
    let ids = dedup(listed.chain(named));
    if !ids.is_empty() {
        return ids;
    }
    dedup(["<|endoftext|>", "<|im_end|>"].iter().filter_map(|s| tok.token_to_id(s)))
}

fn dedup(ids: impl Iterator<Item = u32>) -> Vec<u32> {
    let mut out: Vec<u32> = Vec::new();
    for id in ids {
        if !out.contains(&id) {
            out.push(id);
        }
    }
    out
}

/// A `--device` value: `cpu`, `cuda` (the first GPU) or `cuda:N`. Parsed by clap
/// ([`FromStr`](std::str::FromStr)), so a value that names no device is refused with the
/// command line's errors; [`DeviceSpec::open`] opens it. Shown as given (`cuda` stays `cuda`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum DeviceSpec {
    #[default]
    Cpu,
    /// `cuda:N`, or `None` for plain `cuda` (GPU 0).
    Cuda(Option<usize>),
}

impl std::str::FromStr for DeviceSpec {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "cpu" => Ok(DeviceSpec::Cpu),
            "cuda" => Ok(DeviceSpec::Cuda(None)),
            _ => match s.strip_prefix("cuda:") {
                Some(n) => n
                    .parse()
                    .map(|n| DeviceSpec::Cuda(Some(n)))
                    .map_err(|_| "expected cuda:N with N a GPU index".into()),
                None => Err("expected cpu, cuda or cuda:N".into()),
            },
        }
    }
}

impl std::fmt::Display for DeviceSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DeviceSpec::Cpu => f.write_str("cpu"),
            DeviceSpec::Cuda(None) => f.write_str("cuda"),
            DeviceSpec::Cuda(Some(n)) => write!(f, "cuda:{n}"),
        }
    }
}

impl DeviceSpec {
    /// The device, opened (a GPU fails here: no such GPU, or no CUDA in this binary).
    pub fn open(self) -> Result<Device> {
        match self {
            DeviceSpec::Cpu => Ok(Device::Cpu),
            DeviceSpec::Cuda(n) => cuda_device(n.unwrap_or(0)),
        }
    }
}

/// One explicit stream per device, and no per-allocation CUDA events: every kernel, copy and
/// free goes through that one stream in order, so cudarc's cross-stream tracking would only add
/// two driver calls per tensor (and forbid graph capture).
#[cfg(feature = "cuda")]
fn cuda_device(n: usize) -> Result<Device> {
    let dev = Device::new_cuda_with_stream(n)
        .with_context(|| format!("--device cuda:{n}: cannot open the GPU"))?;
    if let Device::Cuda(d) = &dev {
        // SAFETY: single stream (see above); no tensor exists on this device yet.
        unsafe { d.disable_event_tracking() };
    }
    Ok(dev)
}

#[cfg(not(feature = "cuda"))]
fn cuda_device(n: usize) -> Result<Device> {
    bail!("--device cuda:{n}: this binary was built without CUDA; rebuild with `--features cuda`")
}

/// What a model computes in: the dtype of its tensors and, for the CPU's bf16 projections,
/// how they multiply. A bare [`DType`] is that dtype with exact (f32) products. `products`
/// only acts where the projections are bf16 panels (the CPU computing in f32, paths.rs);
/// [`DtypeSpec::compute`] sets it nowhere else.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Compute {
    pub dtype: DType,
    pub products: Products,
    /// The device paths the model takes (paths.rs).
    pub paths: PathChoices,
}

impl From<DType> for Compute {
    fn from(dtype: DType) -> Self {
        Compute { dtype, products: Products::F32, paths: PathChoices::DEFAULT }
    }
}

impl Compute {
    /// `--dtype bf16` on the CPU: f32 tensors, projections in bf16 (bf16_products.rs).
    pub const CPU_BF16: Compute =
        Compute { dtype: DType::F32, products: Products::Bf16, paths: PathChoices::DEFAULT };

    /// As `--dtype` says it.
    pub fn label(&self) -> &'static str {
        match self.products {
            Products::Bf16 => "bf16",
            Products::F32 => self.dtype.as_str(),
        }
    }
}

/// A `--dtype` value: `auto` (the device's [`compute_dtype`]), `f32`, `bf16` or `f16`; clap
/// refuses any other. [`DtypeSpec::compute`] is what it means on a device.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum DtypeSpec {
    // `auto`, or an empty value. (A doc comment here would show in --help's list of values.)
    #[default]
    #[value(alias = "")]
    Auto,
    F32,
    Bf16,
    F16,
}

impl DtypeSpec {
    /// What the model computes in on `device`. On the CPU `bf16` keeps the residual stream,
    /// norms, attention and sampling in f32 and runs the projections in bf16
    /// ([`Compute::CPU_BF16`]): where the CPU gains speed from bf16 (its dot product
    /// instruction) and nowhere else.
    pub fn compute(self, device: &Device) -> Compute {
        let dtype = match self {
            DtypeSpec::Auto => compute_dtype(device),
            DtypeSpec::F32 => DType::F32,
            DtypeSpec::Bf16 if device.is_cpu() => {
                if !bf16_products::native() {
                    crate::notice::warn("this CPU lacks AVX512-BF16: --dtype bf16 gives the same tokens as on one that has it, but more slowly than f32");
                }
                return Compute::CPU_BF16;
            }
            DtypeSpec::Bf16 => DType::BF16,
            DtypeSpec::F16 => DType::F16,
        };
        dtype.into()
    }
}

/// The compute dtype for a device: f32 on the CPU, bf16 on a GPU.
pub fn compute_dtype(device: &Device) -> DType {
    if device.is_cpu() {
        DType::F32
    } else {
        DType::BF16
    }
}
