//! `unmask bench`: decode speed per strategy, with step events on and off, for a checkpoint or
//! random weights of a named real shape, on any device. docs/perf.md holds the figures.
//!
//! What is measured, per (strategy, events) configuration: `--warmup` untimed decodes, then
//! `--repeat` timed ones of `--max-new-tokens` tokens after a `--prompt-len` prompt (no EOS:
//! every decode runs to its length); with `--events both` the on and off decodes of a strategy
//! alternate. Per decode: the wall time of the whole decode (prefill
//! included), and the time of every forward call. The device is synchronised after each call
//! so each forward's time is its own (denoising calls synchronise anyway: they read the
//! samples back). Medians over the timed decodes are reported.
//!
//! Events on: every event is built (text pieces included) and sent through a channel to a
//! thread that serialises it to JSON, as `unmask trace` does. Events off: the decode loop
//! builds no header, step or block event and decodes no text (`decode_with_events`).

use std::io::Write;
use std::sync::mpsc;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use candle_core::Device;
use serde::Serialize;

use crate::cli::{BenchArgs, EventsMode};
use crate::engine::settings::{DecodeSettings, SamplerSpec, Sampling, Strategy};
use crate::engine::{
    decode_measured, decode_with_events, Ask, Denoised, Denoiser, Detok, ModelDenoiser, Pass,
    Request, RunStatus,
};
use crate::model::config::ModelConfig;
use crate::model::memory::{HostNeed, Origin};
use crate::model::random::RandomWeights;
use crate::model::{Checkpoint, Compute, GenerationConfig, Model, PathChoices, Products};
use crate::sampler::PosSample;
use crate::trace::events::{Event, ModelInfo};

/// Wraps a denoiser and times every call, synchronising the device after each. Calls are
/// told apart by what they store: nothing (`denoise`), the previous block (`stored`: the
/// first pass of every block after the first) or the prompt's whole blocks (`prefill`).
#[derive(Default)]
struct Times {
    prefill_ms: Vec<f64>,
    denoise_ms: Vec<f64>,
    stored_ms: Vec<f64>,
}

struct Timed<'a> {
    inner: &'a mut ModelDenoiser,
    device: Device,
    times: Times,
}

impl Timed<'_> {
    fn time<T>(&mut self, f: impl FnOnce(&mut ModelDenoiser) -> Result<T>) -> Result<(T, f64)> {
        let t0 = Instant::now();
        let r = f(self.inner)?;
        self.device.synchronize()?;
        Ok((r, t0.elapsed().as_secs_f64() * 1e3))
    }
}

impl Denoiser for Timed<'_> {
    fn reset(&mut self, capacity: usize) -> Result<()> {
        self.inner.reset(capacity)
    }
    fn denoise(&mut self, pass: Pass<'_>, s: &SamplerSpec, u: &[f32]) -> Result<Vec<PosSample>> {
        let (r, ms) = self.time(|d| d.denoise(pass, s, u))?;
        self.times.push(pass, ms);
        Ok(r)
    }
    fn denoise_asked(
        &mut self,
        pass: Pass<'_>,
        s: &SamplerSpec,
        u: &[f32],
        ask: Ask,
    ) -> Result<Denoised> {
        let (r, ms) = self.time(|d| d.denoise_asked(pass, s, u, ask))?;
        self.times.push(pass, ms);
        Ok(r)
    }
}

impl Times {
    fn push(&mut self, pass: Pass<'_>, ms: f64) {
        match pass.store.len() {
            0 => self.denoise_ms.push(ms),
            n if n == pass.block.len() => self.stored_ms.push(ms),
            _ => self.prefill_ms.push(ms),
        }
    }
}

/// Text pieces for random weights: no tokenizer, but a string per token like a real one.
struct SyntheticDetok;

impl Detok for SyntheticDetok {
    fn piece(&self, id: u32) -> String {
        format!("<{id}>")
    }
    fn decode(&self, ids: &[u32]) -> String {
        ids.iter().map(|&i| self.piece(i)).collect()
    }
}

#[derive(Serialize)]
struct Row {
    strategy: String,
    events: &'static str,
    decodes: usize,
    tokens: usize,
    forwards: usize,
    steps: usize,
    tokens_per_forward: f64,
    decode_ms: f64,
    tokens_per_s: f64,
    forwards_per_s: f64,
    /// (decode wall time - prefill pass) / (forwards - prefill pass), median over decodes.
    ms_per_forward: f64,
    /// A pass over the block alone.
    denoise_ms_median: f64,
    /// A block's first pass, which also stores the block before it.
    stored_ms_median: f64,
    /// The first block's first pass, which also stores the prompt's whole blocks.
    prefill_ms_median: f64,
    event_bytes: usize,
    /// Events on: time the engine thread spent building events, per decode (median).
    event_build_ms: f64,
    /// Events on: time the consumer thread spent serialising them to JSON, per decode (median).
    event_write_ms: f64,
}

/// How long the weights took to open, and a read of the same files in the same run (after
/// the load, so from the page cache where the files fit it): the floor a load is held to.
#[derive(Serialize, Default)]
struct Load {
    /// Where the weights came from: `files`, `embedded` or `random`.
    from: &'static str,
    seconds: f64,
    /// Bytes of the checkpoint's safetensors files; 0 for random weights.
    file_bytes: u64,
    /// Seconds one sequential read of those files took; `None` for random weights.
    read_s: Option<f64>,
}

impl Load {
    fn words(&self) -> String {
        let Some(read) = self.read_s else {
            let what = if self.from == "random" { "random weights made" } else { "embedded model" };
            return format!("# load: {what} in {:.2} s", self.seconds);
        };
        let gb = self.file_bytes as f64 / 1e9;
        format!(
            "# load: {:.2} s for {gb:.2} GB of checkpoint files ({:.2} GB/s); one read of the same files {read:.2} s ({:.1} GB/s): the load takes {:.1}x the read",
            self.seconds,
            gb / self.seconds,
            gb / read.max(1e-9),
            self.seconds / read.max(1e-9),
        )
    }
}

/// Reads `files` once, start to end, through one reused buffer (what `cat FILE > /dev/null`
/// does): their bytes and the seconds it took.
fn read_once(files: &[std::path::PathBuf]) -> Result<(u64, f64)> {
    use std::io::Read;
    let t0 = Instant::now();
    let mut buf = vec![0u8; 1 << 24];
    let mut total = 0u64;
    for f in files {
        let mut file =
            std::fs::File::open(f).with_context(|| format!("{}: cannot open", f.display()))?;
        loop {
            let n = file.read(&mut buf).with_context(|| format!("{}: cannot read", f.display()))?;
            if n == 0 {
                break;
            }
            total += n as u64;
        }
    }
    Ok((total, t0.elapsed().as_secs_f64()))
}

#[derive(Serialize)]
struct Report {
    /// MoE models: distinct experts per sparse layer per block pass, counted on the device.
    moe_experts_per_layer_pass: Option<f64>,
    model: String,
    device: String,
    dtype: String,
    params: usize,
    weight_bytes: usize,
    floor: Floor,
    prompt_len: usize,
    max_new_tokens: usize,
    block_length: usize,
    steps: usize,
    sampling: Sampling,
    candidates: usize,
    routing: bool,
    warmup: usize,
    repeat: usize,
    load_s: f64,
    /// The load against one read of the checkpoint's files in the same run.
    load: Load,
    run: RunStatus,
    rows: Vec<Row>,
}

/// The order of the modes in round `i`: forwards in even rounds, backwards in odd ones.
fn interleaved(modes: usize, i: usize) -> Vec<usize> {
    let mut order: Vec<usize> = (0..modes).collect();
    if i % 2 == 1 {
        order.reverse();
    }
    order
}

fn median(v: &mut [f64]) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// A deterministic prompt of `n` ids that avoids the mask and EOS ids.
fn synthetic_prompt(n: usize, vocab: usize, avoid: &[u32]) -> Vec<u32> {
    let mut out = Vec::with_capacity(n);
    let mut x: u64 = 12345;
    while out.len() < n {
        x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        let id = ((x >> 33) % vocab as u64) as u32;
        if !avoid.contains(&id) {
            out.push(id);
        }
    }
    out
}

/// What one forward of `rows` positions reads of the weights, in bytes of `elem` each (as
/// the kernels read them: 2 for bf16): every layer (projections and norms), the final norm,
/// lm_head, and `rows` rows of the embedding. A tied lm_head is the embedding, read whole once
/// (the rows looked up are among the bytes it reads anyway). docs/perf.md's floor is this over
/// the bandwidth measured in the same run.
pub fn pass_bytes(cfg: &ModelConfig, rows: usize, elem: usize) -> usize {
    moe_pass_bytes(cfg, rows, elem, 0.0)
}

/// [`pass_bytes`] of a model with sparse layers, each of which reads its router, its shared
/// experts (LLaDA2) and the `experts` distinct experts the pass's rows were routed to (a mean,
/// counted on the device: `Model::moe_stats`); dense layers as in [`pass_bytes`].
pub fn moe_pass_bytes(cfg: &ModelConfig, rows: usize, elem: usize, experts: f64) -> usize {
    let (h, d, i) = (cfg.hidden_size, cfg.head_dim(), cfg.intermediate_size);
    let (q, kv) = (cfg.num_attention_heads * d, cfg.kv_heads() * d);
    let attn = h * (q + 2 * kv) + q * h + 2 * h + 2 * d;
    let (n_experts, moe_i) =
        (cfg.moe.num_experts.unwrap_or(0), cfg.moe.moe_intermediate_size.unwrap_or(0));
    let shared = cfg.moe.num_shared_experts.unwrap_or(0) * 3 * h * moe_i;
    let layers: f64 = (0..cfg.num_hidden_layers)
        .map(|l| {
            if cfg.is_sparse(l) {
                (attn + n_experts * h + shared) as f64 + experts * (3 * h * moe_i) as f64
            } else {
                (attn + 3 * h * i) as f64
            }
        })
        .sum();
    let embed = cfg.vocab_size * h;
    let head_and_rows =
        if cfg.tie_word_embeddings { embed } else { embed + rows.min(cfg.vocab_size) * h };
    (layers as usize + h + head_and_rows) * elem
}

/// What a pass's attention reads of the KV cache: K and V of `keys` positions in every layer,
/// `elem` bytes a value (the compute dtype's: 4 on the CPU, which keeps the cache in f32).
pub fn kv_bytes(cfg: &ModelConfig, keys: usize, elem: usize) -> usize {
    2 * cfg.num_hidden_layers * cfg.kv_heads() * cfg.head_dim() * keys * elem
}

/// Floating-point operations (2 per multiply-add) of a pass of `rows` rows over `keys` keys
/// on average, `head_rows` of which go through lm_head (the block's): every layer's
/// projections (a sparse layer: its router, `num_experts_per_tok` experts a row and its shared
/// experts), the attention's two products, lm_head.
pub fn pass_flops(cfg: &ModelConfig, rows: usize, head_rows: usize, keys: f64) -> f64 {
    let (h, d, i) = (cfg.hidden_size, cfg.head_dim(), cfg.intermediate_size);
    let (heads, kv) = (cfg.num_attention_heads, cfg.kv_heads());
    let attn_proj = h * (heads + 2 * kv) * d + heads * d * h;
    let m = &cfg.moe;
    let sparse = m.num_experts.unwrap_or(0) * h
        + (m.num_experts_per_tok.unwrap_or(0) + m.num_shared_experts.unwrap_or(0))
            * 3
            * h
            * m.moe_intermediate_size.unwrap_or(0);
    let per_row: usize = (0..cfg.num_hidden_layers)
        .map(|l| attn_proj + if cfg.is_sparse(l) { sparse } else { 3 * h * i })
        .sum();
    2.0 * (per_row as f64 * rows as f64 + (cfg.vocab_size * h * head_rows) as f64)
        + attention_flops(cfg, rows, keys)
}

/// The part of [`pass_flops`] that is attention (its two products over the keys): f32 on the
/// CPU whatever the projections' [`Products`].
pub fn attention_flops(cfg: &ModelConfig, rows: usize, keys: f64) -> f64 {
    4.0 * (cfg.num_attention_heads * cfg.head_dim() * cfg.num_hidden_layers) as f64
        * keys
        * rows as f64
}

/// Bytes of a weight value and of a cached K/V value, and the distinct experts a sparse layer
/// reads a pass (0 for a dense model).
struct Elems {
    weight: usize,
    kv: usize,
    experts: f64,
}

/// The cost of the three kinds of pass of the decode `args` asks for: denoising (B rows),
/// storing (2B) over the cache at the decode's mean length (the prompt and half the new
/// tokens), and the prefill.
fn pass_costs(
    cfg: &ModelConfig,
    args: &BenchArgs,
    max_new: usize,
    b: usize,
    e: &Elems,
) -> [PassCost; 3] {
    let keys = args.prompt_len + max_new / 2;
    let stored = args.prompt_len / b * b;
    [
        PassCost::block(cfg, b, b, keys, e),
        PassCost::block(cfg, 2 * b, b, keys, e),
        PassCost::prefill(cfg, stored, b, e),
    ]
}

/// A pass's bytes read (weights and KV cache) and floating-point operations.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct PassCost {
    pub rows: usize,
    pub bytes: usize,
    pub flops: f64,
    /// Of `flops`, attention's.
    pub attention_flops: f64,
}

impl PassCost {
    /// A block pass of `rows` rows over `keys` keys, `b` of them through lm_head, on `e`: the
    /// bytes of a value of the weights and of the cache, and the distinct experts a sparse layer
    /// reads (see [`moe_pass_bytes`]).
    fn block(cfg: &ModelConfig, rows: usize, b: usize, keys: usize, e: &Elems) -> Self {
        let bytes = moe_pass_bytes(cfg, rows, e.weight, e.experts) + kv_bytes(cfg, keys, e.kv);
        PassCost {
            rows,
            bytes,
            flops: pass_flops(cfg, rows, b, keys as f64),
            attention_flops: attention_flops(cfg, rows, keys as f64),
        }
    }

    /// The first pass of a decode: the prompt's `stored` whole-block rows in chunks of
    /// [`crate::engine::PREFILL_CHUNK`] (one forward each, as the runner stores them), the last
    /// with the block's `b` rows. Each forward reads the weights and the keys up to its end;
    /// each row sees the keys before it (the causal half of its chunk).
    fn prefill(cfg: &ModelConfig, stored: usize, b: usize, e: &Elems) -> Self {
        let chunk = (crate::engine::PREFILL_CHUNK / b).max(1) * b;
        let mut cost = PassCost::default();
        let mut done = 0;
        loop {
            let last = stored - done <= chunk;
            let rows = if last { stored - done + b } else { chunk };
            cost.rows += rows;
            cost.bytes +=
                moe_pass_bytes(cfg, rows, e.weight, e.experts) + kv_bytes(cfg, done + rows, e.kv);
            let keys = done as f64 + rows as f64 / 2.0;
            cost.flops += pass_flops(cfg, rows, if last { b } else { 0 }, keys);
            cost.attention_flops += attention_flops(cfg, rows, keys);
            if last {
                return cost;
            }
            done += rows;
        }
    }
}

/// The host's memory read bandwidth in bytes/s: the best of 5 sums over a 512 MiB buffer (16
/// times the L3 of the machines we use), one contiguous share per thread as the products
/// share out their panels. The floor of a CPU pass divides [`pass_bytes`] by this.
pub fn host_read_bandwidth() -> f64 {
    use rayon::prelude::*;
    // Backed like the panels (2 MB pages where Linux grants them: 27-29 GB/s on 4 kB pages
    // against 33-35 on the dev box), then written, so that no page is the shared zero page.
    let mut buf = vec![0f32; 128 << 20];
    crate::model::linear::huge_pages(&mut buf);
    buf.fill(1.0);
    let threads = crate::model::linear::threads();
    let share = buf.len().div_ceil(threads);
    let mut best = f64::INFINITY;
    for _ in 0..5 {
        let t0 = Instant::now();
        let total: f32 = buf.par_chunks(share).map(sum_lanes).sum();
        best = best.min(t0.elapsed().as_secs_f64());
        std::hint::black_box(total);
    }
    (buf.len() * 4) as f64 / best
}

/// FLOP/s of `chains` (`flops` of work) run on every product thread at once, best of 3.
fn peak(flops: usize, chains: impl Fn() -> f32 + Sync) -> f64 {
    use rayon::prelude::*;
    let threads = crate::model::linear::threads();
    let mut best = f64::INFINITY;
    for _ in 0..3 {
        let t0 = Instant::now();
        let s: f32 = (0..threads).into_par_iter().map(|_| chains()).sum();
        best = best.min(t0.elapsed().as_secs_f64());
        std::hint::black_box(s);
    }
    (threads * flops) as f64 / best
}

/// The host's f32 FMA peak in FLOP/s: every thread runs 12 independent chains of 8-lane fused
/// multiply-adds (enough to hide the units' latency), best of 3. `None` without AVX2+FMA.
fn host_fma_peak() -> Option<f64> {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
        const STEPS: usize = 20_000_000;
        // SAFETY: the features were just detected.
        return Some(peak(STEPS * FMA_CHAINS * 16, || unsafe { fma_chains(STEPS) }));
    }
    None
}

const FMA_CHAINS: usize = 12;

/// The host's bf16 dot-product peak in FLOP/s, as [`host_fma_peak`] with AVX512-BF16's
/// `vdpbf16ps` (16 lanes x 2 multiply-adds an instruction): what bf16 products can reach.
/// `None` where the CPU lacks it.
fn host_dot_peak() -> Option<f64> {
    #[cfg(target_arch = "x86_64")]
    if crate::model::bf16_products::native() {
        const STEPS: usize = 10_000_000;
        // SAFETY: the features were detected.
        return Some(peak(STEPS * FMA_CHAINS * 64, || unsafe { dot_chains(STEPS) }));
    }
    None
}

/// # Safety
/// The CPU has AVX512F and AVX512-BF16.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bf16")]
unsafe fn dot_chains(steps: usize) -> f32 {
    use std::arch::x86_64::*;
    let mut acc = [_mm512_set1_ps(0.0); FMA_CHAINS];
    // SAFETY (both transmutes): 32 bf16 are the bits of 16 i32.
    let a: __m512bh = unsafe { std::mem::transmute(_mm512_set1_epi32(0x3f80_3f80)) };
    let b: __m512bh = unsafe { std::mem::transmute(_mm512_set1_epi32(0x3380_3380)) };
    for _ in 0..steps {
        for s in acc.iter_mut() {
            *s = _mm512_dpbf16_ps(*s, a, b);
        }
    }
    _mm512_reduce_add_ps(acc.iter().fold(_mm512_setzero_ps(), |s, &a| _mm512_add_ps(s, a)))
}

/// # Safety
/// The CPU has AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn fma_chains(steps: usize) -> f32 {
    use std::arch::x86_64::*;
    let mut acc = [_mm256_set1_ps(0.0); FMA_CHAINS];
    let (m, c) = (_mm256_set1_ps(0.999_999), _mm256_set1_ps(1e-7));
    for _ in 0..steps {
        for a in acc.iter_mut() {
            *a = _mm256_fmadd_ps(*a, m, c);
        }
    }
    let mut lanes = [0f32; 8];
    // SAFETY: 8 floats.
    unsafe {
        _mm256_storeu_ps(
            lanes.as_mut_ptr(),
            acc.iter().fold(_mm256_setzero_ps(), |s, &a| _mm256_add_ps(s, a)),
        )
    };
    lanes.iter().sum()
}

/// A sum in 16 independent lanes, so that it vectorises and is bound by memory.
fn sum_lanes(v: &[f32]) -> f32 {
    let mut acc = [0f32; 16];
    let mut chunks = v.chunks_exact(16);
    for c in &mut chunks {
        for (a, x) in acc.iter_mut().zip(c) {
            *a += x;
        }
    }
    acc.iter().sum::<f32>() + chunks.remainder().iter().sum::<f32>()
}

/// Bytes per weight value as the projections read them: bf16 weights on the CPU stay bf16
/// under f32 compute (linear.rs), so a bf16 source reads 2 whatever the compute dtype, and
/// bf16 products read every weight in bf16.
fn weight_elem_bytes(stored: &str, compute: Compute) -> usize {
    match stored {
        _ if compute.products == Products::Bf16 => 2,
        "bf16" | "f16" => 2,
        _ => compute.dtype.size_in_bytes(),
    }
}

/// The floor of each kind of pass, for the report.
#[derive(Serialize)]
struct Floor {
    /// Bytes a denoising pass (B rows), a storing pass (2B rows) and the prefill (every chunk
    /// of it) read: weights and KV cache, the block passes' cache at the decode's mean length.
    denoise_bytes: usize,
    stored_bytes: usize,
    prefill_bytes: usize,
    /// Rows, bytes and FLOPs of the same passes.
    passes: [PassCost; 3],
    /// Host read bandwidth measured in this run (CPU only; on a GPU scripts/gpu_run.sh
    /// divides by the device's copy bandwidth).
    read_bytes_per_s: Option<f64>,
    /// Host f32 FMA peak measured in this run (CPU with AVX2+FMA only).
    fma_flops_per_s: Option<f64>,
    /// Host bf16 dot-product peak measured in this run, where the projections run bf16
    /// products on a CPU with AVX512-BF16: their compute floor.
    dot_flops_per_s: Option<f64>,
    /// Threads both were measured on (the products' count).
    threads: usize,
}

impl Floor {
    fn new(passes: [PassCost; 3], cpu: bool, products: Products) -> Self {
        let mut f = Floor {
            denoise_bytes: 0,
            stored_bytes: 0,
            prefill_bytes: 0,
            passes,
            read_bytes_per_s: cpu.then(host_read_bandwidth),
            fma_flops_per_s: if cpu { host_fma_peak() } else { None },
            dot_flops_per_s: if cpu && products == Products::Bf16 { host_dot_peak() } else { None },
            threads: crate::model::linear::threads(),
        };
        f.set_passes(passes);
        f
    }

    fn set_passes(&mut self, passes: [PassCost; 3]) {
        self.passes = passes;
        [self.denoise_bytes, self.stored_bytes, self.prefill_bytes] = passes.map(|p| p.bytes);
    }

    fn ms(&self, bytes: usize) -> Option<f64> {
        self.read_bytes_per_s.map(|bw| bytes as f64 / bw * 1e3)
    }
}

/// The flags over the checkpoint's generation config over its family's published defaults
/// (a `llada2_moe` shape decodes in LLaDA2's blocks of 32), as `trace` settles them.
fn family_settings(
    args: &BenchArgs,
    generation: &GenerationConfig,
    cfg: &ModelConfig,
    name: Option<&str>,
) -> Result<DecodeSettings> {
    let family = crate::model::registry::family(cfg)?;
    let defaults = (family.decoding)(generation, name).unwrap_or_default();
    args.decode.settings_over(generation, cfg.block_size, &defaults)
}

/// `--prompt-len` and `--max-new-tokens` must fit the model's positions, as a decode's prompt
/// must (it used to allocate the synthetic prompt first: 2^64 tokens panicked, 2^32 ran out of
/// memory).
fn check_prompt_len(args: &BenchArgs, s: &DecodeSettings, cfg: &ModelConfig) -> Result<()> {
    crate::cli::session::check_positions(args.prompt_len, s, cfg.max_position_embeddings)
        .with_context(|| format!("--prompt-len {}", args.prompt_len))
}

pub fn run(args: &BenchArgs) -> Result<()> {
    if args.repeat == 0 {
        bail!("--repeat must be at least 1");
    }
    if let Some(p) = &args.json {
        // Not a file of the checkpoint it benchmarks (there is no --random-init --model), and
        // one that can be written, checked before the benchmark.
        crate::cli::output::check_report_path("bench", p)?;
        crate::cli::session::check_decode_outputs(&args.decode, &[("--json", p)])?;
    }
    let paths = PathChoices::from_env()?;
    let device = args.decode.device.open()?;
    let compute = Compute { paths, ..args.decode.dtype.compute(&device) };
    let dtype = compute.dtype;
    let t0 = Instant::now();
    let mut files = Vec::new();
    let (model, mask_id, detok, info, generation, cfg, name): (
        Model,
        u32,
        Box<dyn Detok>,
        ModelInfo,
        GenerationConfig,
        ModelConfig,
        Option<String>,
    ) = match (&args.random_init, &args.decode.model) {
        (Some(shape), _) => {
            let cfg = shape.config()?;
            let name = shape.name;
            if args.decode.routing {
                crate::cli::session::require_moe(&cfg, &format!("--random-init {name}"))?;
            }
            // before the weights are made: a --prompt-len past the model, or a shape this
            // host cannot hold, is one line, not minutes of random weights and then an
            // allocation that fails
            let settings = family_settings(args, &GenerationConfig::default(), &cfg, Some(name))?;
            check_prompt_len(args, &settings, &cfg)?;
            let need = HostNeed::new().weights(&cfg, Origin::Random, compute, &device);
            crate::cli::session::with_decode(
                need,
                &cfg,
                (compute, &device),
                args.prompt_len,
                &settings,
            )
            .check(&format!("--random-init {name}"), "choose a smaller shape")?;
            let w = RandomWeights::new(&cfg, args.decode.seed.unwrap_or(0), &device)?;
            let model = Model::load(&cfg, &w, compute, &device)
                .with_context(|| format!("--random-init {name}"))?;
            let info = ModelInfo {
                source: format!("random:{name}"),
                model_type: cfg.model_type.clone(),
                vocab_size: cfg.vocab_size,
                hidden_size: cfg.hidden_size,
                num_layers: cfg.num_hidden_layers,
                num_params: cfg.num_params(),
                dtype: w.stored_dtype(dtype),
                compute: Some(compute.label().to_string()),
                moe: cfg.moe_info(),
            };
            let mask = cfg.mask_token_id.unwrap_or(cfg.vocab_size as u32 - 1);
            (
                model,
                mask,
                Box::new(SyntheticDetok),
                info,
                GenerationConfig::default(),
                cfg,
                Some(name.to_string()),
            )
        }
        (None, _) => {
            let (source, name) = crate::cli::session::model_source(&args.decode)?;
            if args.decode.routing {
                crate::cli::session::check_routing(&source)?;
            }
            let ck = Checkpoint::load(&source, &device, compute)?;
            if let crate::model::Source::Dir(dir) = &source {
                files = crate::model::weight_files(dir)?;
            }
            let mask = ck.tokenizer.mask_id();
            (ck.model, mask, Box::new(ck.tokenizer), ck.info, ck.generation, ck.config, name)
        }
    };
    device.synchronize()?;
    crate::cli::session::single_thread_for_small_models(info.num_params, &device);
    let load_s = t0.elapsed().as_secs_f64();
    let load = if !files.is_empty() {
        let (file_bytes, read_s) = read_once(&files)?;
        Load { from: "files", seconds: load_s, file_bytes, read_s: Some(read_s) }
    } else {
        let from = if args.random_init.is_some() { "random" } else { "embedded" };
        Load { from, seconds: load_s, ..Load::default() }
    };
    let base = family_settings(args, &generation, &cfg, name.as_deref())?;
    check_prompt_len(args, &base, &cfg)?;
    if args.random_init.is_none() {
        crate::cli::session::with_decode(
            HostNeed::new(),
            &cfg,
            (compute, &device),
            args.prompt_len,
            &base,
        )
        .check("the decode", "lower --max-new-tokens or --prompt-len")?;
    }
    let strategies: Vec<Strategy> = match args.decode.strategy {
        Some(s) => vec![s],
        None => Strategy::ALL.to_vec(),
    };
    let modes: Vec<bool> = match args.events {
        EventsMode::On => vec![true],
        EventsMode::Off => vec![false],
        EventsMode::Both => vec![true, false],
    };
    let vocab = model.vocab_size();
    let weight_bytes = model.weight_bytes();
    let prompt_ids = synthetic_prompt(args.prompt_len, vocab, &[mask_id]);
    let elem = weight_elem_bytes(&info.dtype, compute);
    let b = base.block_length;
    let mut elems = Elems { weight: elem, kv: dtype.size_in_bytes(), experts: 0.0 };
    let floor = Floor::new(
        pass_costs(&cfg, args, base.max_new_tokens, b, &elems),
        device.is_cpu(),
        compute.products,
    );
    let mut den = ModelDenoiser::new(model, mask_id, &paths);
    eprintln!(
        "unmask bench: {} on {} ({}), {:.2} GB of weights, loaded in {load_s:.1} s; {}",
        info.source,
        args.decode.device,
        compute.label(),
        weight_bytes as f64 / 1e9,
        paths_in_words(&den.options())
    );

    let mut rows = Vec::new();
    for &strategy in &strategies {
        let settings = DecodeSettings { strategy, ..base.clone() };
        let req = Request {
            prompt: String::new(),
            prompt_ids: prompt_ids.clone(),
            settings,
            mask_id,
            eos_ids: vec![],
            model: info.clone(),
            device: crate::cli::session::device_label(
                args.decode.device,
                compute,
                crate::model::compute_dtype(&device),
            ),
            chat: None,
            sources: Default::default(),
            candidates: args.decode.candidates(),
            routing: args.decode.routing,
        };
        // With events both on and off, their decodes alternate (on, off, then off, on, ...), so
        // a drift of the machine's speed during the run falls on both alike: the cost is a
        // difference of a few percent, about the size of run-to-run drift.
        let mut per: Vec<Vec<OneDecode>> = modes.iter().map(|_| Vec::new()).collect();
        for i in 0..args.warmup + args.repeat {
            for m in interleaved(modes.len(), i) {
                let r = one_decode(&mut den, &device, detok.as_ref(), &req, modes[m])?;
                if i >= args.warmup {
                    per[m].push(r);
                }
            }
        }
        for (&events, per) in modes.iter().zip(per) {
            rows.push(summarise(strategy, events, per));
        }
    }
    let run = den.status();
    // MoE: the floor counts the distinct experts the passes really touched (the grouped
    // kernels count them on the device), not the config's experts
    let mut floor = floor;
    let mut moe_experts = None;
    if let Some((touched, layer_passes)) = den.model().moe_stats()? {
        let mean = touched as f64 / layer_passes.max(1) as f64;
        moe_experts = Some(mean);
        elems.experts = mean;
        floor.set_passes(pass_costs(&cfg, args, base.max_new_tokens, b, &elems));
        eprintln!("MoE: {mean:.1} distinct experts per sparse layer per block pass ({layer_passes} layer passes counted on the device)");
    }
    let report = Report {
        moe_experts_per_layer_pass: moe_experts,
        model: info.source.clone(),
        device: args.decode.device.to_string(),
        dtype: compute.label().to_string(),
        params: info.num_params,
        weight_bytes,
        floor,
        prompt_len: args.prompt_len,
        max_new_tokens: base.max_new_tokens,
        block_length: base.block_length,
        steps: base.steps,
        sampling: base.sampling,
        candidates: args.decode.candidates(),
        routing: args.decode.routing,
        warmup: args.warmup,
        repeat: args.repeat,
        load_s,
        load,
        run,
        rows,
    };
    // the table first: a JSON file that cannot be written (a full disk) must not lose it
    crate::cli::output::print(&render(&report))?;
    if let Some(path) = &args.json {
        crate::cli::output::write_json(path, &report)?;
    }
    Ok(())
}

struct OneDecode {
    wall_ms: f64,
    tokens: usize,
    forwards: usize,
    steps: usize,
    times: Times,
    event_bytes: usize,
    build_ms: f64,
    write_ms: f64,
}

fn one_decode(
    den: &mut ModelDenoiser,
    device: &Device,
    detok: &dyn Detok,
    req: &Request,
    events: bool,
) -> Result<OneDecode> {
    let mut timed = Timed { inner: den, device: device.clone(), times: Times::default() };
    let (fin, event_bytes, build_ms, write_ms) = if events {
        let (tx, rx) = mpsc::channel::<Event>();
        // As `unmask trace` does, minus the file: serialise each event as it comes, timing it.
        let consumer = std::thread::spawn(move || {
            let mut counter = ByteCounter(0);
            let mut busy = std::time::Duration::ZERO;
            for ev in rx {
                let t0 = Instant::now();
                let _ = serde_json::to_writer(&mut counter, &ev);
                let _ = counter.write_all(b"\n");
                drop(ev);
                busy += t0.elapsed();
            }
            (counter.0, busy)
        });
        let t0 = Instant::now();
        let (mut fin, build) =
            decode_measured(&mut timed, detok, req, &mut |e| drop(tx.send(e)), None, true);
        fin.elapsed_ms = t0.elapsed().as_secs_f64() * 1e3;
        drop(tx);
        let (bytes, write) = consumer.join().unwrap_or_default();
        (fin, bytes, build.as_secs_f64() * 1e3, write.as_secs_f64() * 1e3)
    } else {
        let t0 = Instant::now();
        let mut fin = decode_with_events(&mut timed, detok, req, &mut |_| {}, None, false);
        fin.elapsed_ms = t0.elapsed().as_secs_f64() * 1e3;
        (fin, 0, 0.0, 0.0)
    };
    if let Some(e) = &fin.error {
        bail!("decode failed: {e}");
    }
    Ok(OneDecode {
        wall_ms: fin.elapsed_ms,
        tokens: fin.output_ids.len(),
        forwards: fin.forwards,
        steps: fin.steps,
        times: timed.times,
        event_bytes,
        build_ms,
        write_ms,
    })
}

struct ByteCounter(usize);

impl Write for ByteCounter {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0 += b.len();
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn summarise(strategy: Strategy, events: bool, per: Vec<OneDecode>) -> Row {
    let first = &per[0];
    let (tokens, forwards, steps) = (first.tokens, first.forwards, first.steps);
    let mut wall: Vec<f64> = per.iter().map(|d| d.wall_ms).collect();
    let mut mpf: Vec<f64> = per
        .iter()
        .map(|d| {
            let prefill: f64 = d.times.prefill_ms.iter().sum();
            let n = d.forwards - d.times.prefill_ms.len();
            (d.wall_ms - prefill) / n.max(1) as f64
        })
        .collect();
    let all = |f: fn(&Times) -> &Vec<f64>| -> Vec<f64> {
        per.iter().flat_map(|d| f(&d.times).iter().copied()).collect()
    };
    let (mut den, mut sto, mut pre) =
        (all(|t| &t.denoise_ms), all(|t| &t.stored_ms), all(|t| &t.prefill_ms));
    let decode_ms = median(&mut wall);
    let mut build: Vec<f64> = per.iter().map(|d| d.build_ms).collect();
    let mut write: Vec<f64> = per.iter().map(|d| d.write_ms).collect();
    Row {
        strategy: strategy.name().to_string(),
        events: if events { "on" } else { "off" },
        decodes: per.len(),
        tokens,
        forwards,
        steps,
        tokens_per_forward: tokens as f64 / forwards.max(1) as f64,
        decode_ms,
        tokens_per_s: tokens as f64 / (decode_ms / 1e3),
        forwards_per_s: forwards as f64 / (decode_ms / 1e3),
        ms_per_forward: median(&mut mpf),
        denoise_ms_median: median(&mut den),
        stored_ms_median: median(&mut sto),
        prefill_ms_median: median(&mut pre),
        event_bytes: per[0].event_bytes,
        event_build_ms: median(&mut build),
        event_write_ms: median(&mut write),
    }
}

/// The execution paths in words, for the banner on stderr.
fn paths_in_words(o: &crate::engine::RunOptions) -> String {
    let on = |b: bool| if b { "on" } else { "off" };
    format!(
        "paths: device sampler {}, fixed passes {}, CUDA graphs {}",
        on(o.device_sampler),
        on(o.fixed_passes),
        on(o.cuda_graph)
    )
}

/// `writeln!` into a String, which cannot fail.
macro_rules! out {
    ($s:expr, $($t:tt)*) => {{
        use std::fmt::Write as _;
        let _ = writeln!($s, $($t)*);
    }};
}

/// Each pass of each row against both floors of this run (a CPU with AVX2+FMA): its bytes over
/// the read bandwidth and its FLOPs over the peak that computes them (the projections' over the
/// bf16 dot peak where they run bf16 products, the rest over the FMA peak). A pass is no faster
/// than the larger; where that is the compute floor, a ratio to the read floor alone cannot
/// reach 1.
fn write_passes(s: &mut String, r: &Report) {
    let f = &r.floor;
    let (Some(bw), Some(fma)) = (f.read_bytes_per_s, f.fma_flops_per_s) else { return };
    let dot = f.dot_flops_per_s;
    match dot {
        Some(d) => out!(
            s,
            "# compute: f32 FMA peak {:.1}, bf16 dot peak {:.1} GFLOP/s (this run, {} threads)",
            fma / 1e9,
            d / 1e9,
            f.threads
        ),
        None => out!(
            s,
            "# compute: f32 FMA peak {:.1} GFLOP/s (this run, {} threads)",
            fma / 1e9,
            f.threads
        ),
    }
    out!(s, "| strategy | events | pass | rows | ms | read floor ms | x read floor | GFLOP | GFLOP/s | % of peak | compute floor ms |");
    out!(s, "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    for row in &r.rows {
        let ms = [row.denoise_ms_median, row.stored_ms_median, row.prefill_ms_median];
        for ((name, p), ms) in ["denoise", "+store", "prefill"].into_iter().zip(&f.passes).zip(ms) {
            if ms.is_nan() {
                continue;
            }
            let read = p.bytes as f64 / bw * 1e3;
            let compute = compute_floor_s(p, fma, dot) * 1e3;
            out!(s,
                "| {} | {} | {name} | {} | {ms:.1} | {read:.1} | {:.2} | {:.2} | {:.1} | {:.0} % | {compute:.1} |",
                row.strategy,
                row.events,
                p.rows,
                ms / read,
                p.flops / 1e9,
                p.flops / (ms / 1e3) / 1e9,
                compute / ms * 100.0,
            );
        }
    }
}

/// Seconds a pass's arithmetic takes at least: attention at the FMA peak, the projections at
/// the bf16 dot peak where given, else at the FMA peak too.
fn compute_floor_s(p: &PassCost, fma: f64, dot: Option<f64>) -> f64 {
    let proj = p.flops - p.attention_flops;
    p.attention_flops / fma + proj / dot.unwrap_or(fma)
}

/// The table's first line: what was measured, in words.
fn heading(r: &Report) -> String {
    use crate::format::count;
    let s = &r.sampling;
    let sampling = if s.is_greedy() {
        "greedy".to_string()
    } else {
        format!(
            "temperature {}, top-k {}, top-p {}, seed {}",
            s.temperature, s.top_k, s.top_p, s.seed
        )
    };
    format!(
        "# {} on {} ({}), {:.3} GB weights, prompt of {}, {} at most, block length {}, {} per block, {sampling}; median of {}",
        r.model,
        r.device,
        r.dtype,
        r.weight_bytes as f64 / 1e9,
        count(r.prompt_len, "token"),
        count(r.max_new_tokens, "new token"),
        r.block_length,
        count(r.steps, "step"),
        count(r.repeat, "timed decode"),
    )
}

/// The report as `bench` prints it: the table, the passes against their floors, the events.
fn render(r: &Report) -> String {
    let mut s = String::new();
    out!(s, "{}", heading(r));
    out!(s, "{}", r.load.words());
    if let Some(o) = &r.run.options {
        out!(s,
            "# paths: device sampler {}, fixed passes {}, CUDA graphs {}, streamed layer {}, packed weights {}{}",
            o.device_sampler,
            o.fixed_passes,
            r.run.graphs_live,
            r.run.streamed_layer,
            r.run.packed_weights,
            r.run.capture_error.as_ref().map(|e| format!(" (capture failed: {e})")).unwrap_or_default()
        );
    }
    let f = &r.floor;
    let gb = |b: usize| b as f64 / 1e9;
    match f.read_bytes_per_s {
        Some(bw) => out!(s,
            "# floor: host read bandwidth {:.1} GB/s (this run); a pass reads {:.3} GB of weights and cache (denoise, {} rows) / {:.3} GB (+store) / {:.3} GB (prefill): {:.1} / {:.1} / {:.1} ms",
            bw / 1e9,
            gb(f.denoise_bytes),
            r.block_length,
            gb(f.stored_bytes),
            gb(f.prefill_bytes),
            f.ms(f.denoise_bytes).unwrap_or(f64::NAN),
            f.ms(f.stored_bytes).unwrap_or(f64::NAN),
            f.ms(f.prefill_bytes).unwrap_or(f64::NAN)
        ),
        None => out!(s,
            "# bytes a pass reads: {:.3} GB (denoise, {} rows) / {:.3} GB (+store) / {:.3} GB (prefill); the floor is these over the device's bandwidth",
            gb(f.denoise_bytes),
            r.block_length,
            gb(f.stored_bytes),
            gb(f.prefill_bytes)
        ),
    }
    let x = |ms: f64, bytes: usize| {
        f.ms(bytes).map(|fl| format!("{:.2}", ms / fl)).unwrap_or_else(|| "-".into())
    };
    out!(s,
        "| strategy | events | tok/s | forwards/s | ms/forward | denoise ms | x floor | +store ms | x floor | prefill ms | x floor | tok/forward | decode ms |"
    );
    out!(s, "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for row in &r.rows {
        // No whole prompt block, no prefill pass.
        let no_prefill = row.prefill_ms_median.is_nan();
        out!(s,
            "| {} | {} | {:.1} | {:.1} | {:.3} | {:.3} | {} | {:.3} | {} | {} | {} | {:.3} | {:.1} |",
            row.strategy,
            row.events,
            row.tokens_per_s,
            row.forwards_per_s,
            row.ms_per_forward,
            row.denoise_ms_median,
            x(row.denoise_ms_median, f.denoise_bytes),
            row.stored_ms_median,
            x(row.stored_ms_median, f.stored_bytes),
            if no_prefill { "-".to_string() } else { format!("{:.2}", row.prefill_ms_median) },
            if no_prefill { "-".to_string() } else { x(row.prefill_ms_median, f.prefill_bytes) },
            row.tokens_per_forward,
            row.decode_ms
        );
    }
    write_passes(&mut s, r);
    // Events cost per strategy, two ways. The wall-time difference of the decodes with and
    // without them is what a user waits, but on a shared 2-core box its noise is larger than
    // the cost; the work itself (building on the engine thread, serialising on the writer's,
    // each timed where it runs) is what they take from the cores, against the decode time.
    for on in r.rows.iter().filter(|x| x.events == "on") {
        let off = r.rows.iter().find(|x| x.events == "off" && x.strategy == on.strategy);
        let base = off.map_or(on.decode_ms, |o| o.decode_ms);
        let work = on.event_build_ms + on.event_write_ms;
        out!(s,
            "# events work, {}: {:.2} ms per decode ({:.2} building + {:.2} serialising, {} bytes) = {:.2} % of {:.1} ms",
            on.strategy,
            work,
            on.event_build_ms,
            on.event_write_ms,
            on.event_bytes,
            work / base * 100.0,
            base
        );
        if let Some(off) = off {
            out!(
                s,
                "# events cost, {}: {:+.2} % decode time ({:.1} vs {:.1} ms)",
                on.strategy,
                (on.decode_ms / off.decode_ms - 1.0) * 100.0,
                on.decode_ms,
                off.decode_ms
            );
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::random::shape_config;

    /// At 4.17 TB/s the SDAR shapes' block passes (B = 4, bf16) take at least
    /// 0.825 / 1.93 / 3.63 ms; the embedding counts 4 rows, lm_head whole.
    #[test]
    fn a_pass_reads_the_layers_the_head_and_b_embedding_rows() {
        let floor_ms =
            |shape: &str| pass_bytes(&shape_config(shape).unwrap(), 4, 2) as f64 / 4.17e12 * 1e3;
        assert_eq!(pass_bytes(&shape_config("sdar-1.7b").unwrap(), 4, 2), 3_441_166_336);
        assert_eq!(format!("{:.3}", floor_ms("sdar-1.7b")), "0.825");
        assert_eq!(format!("{:.2}", floor_ms("sdar-4b")), "1.93");
        assert_eq!(format!("{:.2}", floor_ms("sdar-8b")), "3.63");
        // 8 rows read 4 more embedding rows; a tied head reads the embedding once, whatever B
        let c = shape_config("sdar-1.7b").unwrap();
        assert_eq!(pass_bytes(&c, 8, 2) - pass_bytes(&c, 4, 2), 4 * 2048 * 2);
        let tied = shape_config("qwen3-0.6b").unwrap();
        assert_eq!(pass_bytes(&tied, 4, 2), pass_bytes(&tied, 8, 2));
        assert_eq!(pass_bytes(&tied, 4, 2), 2 * tied.num_params(), "tied: every weight once");
        assert_eq!(pass_bytes(&c, 4, 4), 2 * pass_bytes(&c, 4, 2));
    }

    /// LLaDA2-mini's block pass reads, in each of its 19 sparse layers, the router, the shared
    /// expert and the distinct routed experts (the device's count); its dense layer 0 a SwiGLU
    /// of 5120.
    #[test]
    fn a_llada2_pass_reads_its_shared_expert_and_the_distinct_experts() {
        let c = shape_config("llada2-mini").unwrap();
        let expert = 3 * 2048 * 512 * 2;
        let (none, some) = (moe_pass_bytes(&c, 4, 2, 0.0), moe_pass_bytes(&c, 4, 2, 20.0));
        assert_eq!(some - none, 19 * 20 * expert);
        let mut alone = c.clone();
        alone.moe.num_shared_experts = Some(0);
        assert_eq!(none - moe_pass_bytes(&alone, 4, 2, 0.0), 19 * expert);
        // every expert a layer, read once: the weights but the embedding's unread rows
        let all = moe_pass_bytes(&c, 4, 2, 256.0);
        assert_eq!(all, 2 * (c.num_params() - (c.vocab_size - 4) * 2048));
        // its FLOPs count the shared expert beside the 8 routed ones a row
        let (f, g) = (pass_flops(&c, 1, 0, 0.0), pass_flops(&alone, 1, 0, 0.0));
        assert_eq!(f - g, 2.0 * 19.0 * (3 * 2048 * 512) as f64);
    }

    /// qwen3-0.6b (28 layers, 8 KV heads of 128, 16 query heads): a 4096-key f32 cache is
    /// 0.94 GB a pass; a pass's FLOPs are twice its projections' weights per row (lm_head for
    /// the block's rows only) plus attention's two products over the keys.
    #[test]
    fn passes_count_the_cache_the_projections_and_attention() {
        let c = shape_config("qwen3-0.6b").unwrap();
        assert_eq!(kv_bytes(&c, 4096, 4), 939_524_096);
        let (h, v) = (c.hidden_size, c.vocab_size);
        let layers =
            (c.num_params() - v * h - h - c.num_hidden_layers * (2 * h + 2 * c.head_dim())) as f64;
        let attention = |keys: f64| 2.0 * 2.0 * (16 * 128 * 28) as f64 * keys;
        assert_eq!(
            pass_flops(&c, 8, 4, 100.0),
            2.0 * (layers * 8.0 + (v * h * 4) as f64) + 8.0 * attention(100.0)
        );
    }

    /// A 4096-token prompt is stored in eight forwards of 512 rows, the last with the block's 4:
    /// eight reads of the weights, each with the cache up to its end.
    #[test]
    fn a_long_prefill_reads_the_weights_once_a_chunk() {
        let c = shape_config("qwen3-0.6b").unwrap();
        let e = Elems { weight: 2, kv: 4, experts: 0.0 };
        let p = PassCost::prefill(&c, 4096, 4, &e);
        assert_eq!(p.rows, 4100);
        let kv: usize =
            (1..=8).map(|i| kv_bytes(&c, 512 * i, 4)).sum::<usize>() + kv_bytes(&c, 4, 4);
        assert_eq!(p.bytes, 8 * pass_bytes(&c, 512, 2) + kv);
        let short = PassCost::prefill(&c, 64, 4, &e);
        assert_eq!((short.rows, short.bytes), (68, pass_bytes(&c, 68, 2) + kv_bytes(&c, 68, 4)));
    }

    #[test]
    fn the_bandwidth_sum_adds_every_element() {
        let v: Vec<f32> = (0..1000).map(|i| i as f32).collect();
        assert_eq!(sum_lanes(&v), 499_500.0);
        assert_eq!(weight_elem_bytes("bf16", candle_core::DType::F32.into()), 2);
        assert_eq!(weight_elem_bytes("f32", candle_core::DType::F32.into()), 4);
        assert_eq!(
            weight_elem_bytes("f32", Compute::CPU_BF16),
            2,
            "bf16 products round f32 weights to bf16"
        );
    }

    #[test]
    fn settings_print_in_words() {
        let r = Report {
            model: "embedded:tiny-sdar".into(),
            device: "cpu".into(),
            dtype: candle_core::DType::F32.as_str().into(),
            params: 1,
            weight_bytes: 2_500_000,
            prompt_len: 64,
            max_new_tokens: 1,
            block_length: 4,
            steps: 1,
            sampling: Sampling { temperature: 0.7, top_k: 40, top_p: 0.95, seed: 0 },
            warmup: 1,
            repeat: 3,
            load_s: 0.0,
            load: Load::default(),
            run: RunStatus::default(),
            rows: Vec::new(),
            moe_experts_per_layer_pass: None,
            candidates: 1,
            routing: false,
            floor: Floor::new([PassCost::default(); 3], false, Products::F32),
        };
        assert_eq!(
            heading(&r),
            "# embedded:tiny-sdar on cpu (f32), 0.003 GB weights, prompt of 64 tokens, 1 new token at most, \
             block length 4, 1 step per block, temperature 0.7, top-k 40, top-p 0.95, seed 0; median of 3 timed decodes"
        );
        let o = crate::engine::RunOptions {
            device_sampler: true,
            fixed_passes: false,
            cuda_graph: false,
        };
        assert_eq!(
            paths_in_words(&o),
            "paths: device sampler on, fixed passes off, CUDA graphs off"
        );
    }

    #[test]
    fn events_on_and_off_alternate_which_goes_first() {
        assert_eq!(interleaved(2, 0), vec![0, 1]);
        assert_eq!(interleaved(2, 1), vec![1, 0]);
        assert_eq!(interleaved(2, 2), vec![0, 1]);
        assert_eq!(interleaved(1, 1), vec![0], "one mode: nothing to alternate");
    }
}
