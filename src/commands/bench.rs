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
use crate::engine::{decode_measured, decode_with_events, Denoiser, Detok, ModelDenoiser, Pass, Request, RunStatus};
use crate::events::{Event, ModelInfo};
use crate::model::random::{shape_config, RandomWeights};
use crate::model::{parse_device, parse_dtype, Checkpoint, GenerationConfig, Qwen3};
use crate::sampler::{PosSample, Ranked};
use crate::settings::{DecodeSettings, Sampling, Strategy};

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
    fn denoise(&mut self, pass: Pass<'_>, s: &Sampling, u: &[f32]) -> Result<Vec<PosSample>> {
        let (r, ms) = self.time(|d| d.denoise(pass, s, u))?;
        self.times.push(pass, ms);
        Ok(r)
    }
    fn denoise_ranked(&mut self, pass: Pass<'_>, s: &Sampling, u: &[f32], k: usize) -> Result<(Vec<PosSample>, Vec<Vec<Ranked>>)> {
        let (r, ms) = self.time(|d| d.denoise_ranked(pass, s, u, k))?;
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

#[derive(Serialize)]
struct Report {
    model: String,
    device: String,
    dtype: String,
    params: usize,
    weight_bytes: usize,
    prompt_len: usize,
    max_new_tokens: usize,
    block_length: usize,
    steps: usize,
    sampling: Sampling,
    candidates: usize,
    warmup: usize,
    repeat: usize,
    load_s: f64,
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

pub fn run(args: &BenchArgs) -> Result<()> {
    if args.repeat == 0 {
        bail!("--repeat must be at least 1");
    }
    let device = parse_device(&args.decode.device)?;
    let dtype = parse_dtype(&args.decode.dtype, &device)?;
    let t0 = Instant::now();
    let (model, mask_id, detok, info, generation, block_size): (Qwen3, u32, Box<dyn Detok>, ModelInfo, GenerationConfig, Option<usize>) =
        match (&args.random_init, &args.decode.model) {
            (Some(shape), _) => {
                let cfg = shape_config(shape)?;
                let w = RandomWeights::new(&cfg, args.decode.seed.unwrap_or(0), &device)?;
                let model = Qwen3::load(&cfg, &w, dtype, &device).with_context(|| format!("--random-init {shape}"))?;
                let info = ModelInfo {
                    source: format!("random:{shape}"),
                    model_type: cfg.model_type.clone(),
                    vocab_size: cfg.vocab_size,
                    hidden_size: cfg.hidden_size,
                    num_layers: cfg.num_hidden_layers,
                    num_params: cfg.num_params(),
                    dtype: format!("{dtype:?}").to_lowercase(),
                };
                let mask = cfg.mask_token_id.unwrap_or(cfg.vocab_size as u32 - 1);
                (model, mask, Box::new(SyntheticDetok), info, GenerationConfig::default(), cfg.block_size)
            }
            (None, _) => {
                let (source, _) = crate::session::model_source(&args.decode)?;
                let ck = Checkpoint::load(&source, &device, dtype)?;
                let mask = ck.tokenizer.mask_id();
                (ck.model, mask, Box::new(ck.tokenizer), ck.info, ck.generation, ck.config.block_size)
            }
        };
    device.synchronize()?;
    crate::session::single_thread_for_small_models(info.num_params, &device);
    let load_s = t0.elapsed().as_secs_f64();
    let base: DecodeSettings = args.decode.settings(&generation, block_size)?;
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
    let mut den = ModelDenoiser::new(model, mask_id);
    eprintln!(
        "unmask bench: {} on {} ({dtype:?}), {:.2} GB of weights, loaded in {load_s:.1} s; paths {:?}",
        info.source,
        args.decode.device,
        weight_bytes as f64 / 1e9,
        den.options()
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
            device: args.decode.device.clone(),
            chat: None,
            sources: Default::default(),
            candidates: args.decode.candidates(),
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
    let report = Report {
        model: info.source.clone(),
        device: args.decode.device.clone(),
        dtype: format!("{dtype:?}").to_lowercase(),
        params: info.num_params,
        weight_bytes,
        prompt_len: args.prompt_len,
        max_new_tokens: base.max_new_tokens,
        block_length: base.block_length,
        steps: base.steps,
        sampling: base.sampling,
        candidates: args.decode.candidates(),
        warmup: args.warmup,
        repeat: args.repeat,
        load_s,
        run,
        rows,
    };
    print_table(&report);
    if let Some(path) = &args.json {
        let f = std::fs::File::create(path).with_context(|| format!("{}: cannot create", path.display()))?;
        serde_json::to_writer_pretty(f, &report).with_context(|| format!("{}: cannot write", path.display()))?;
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

fn one_decode(den: &mut ModelDenoiser, device: &Device, detok: &dyn Detok, req: &Request, events: bool) -> Result<OneDecode> {
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
        let (mut fin, build) = decode_measured(&mut timed, detok, req, &mut |e| drop(tx.send(e)), None, true);
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
    let all = |f: fn(&Times) -> &Vec<f64>| -> Vec<f64> { per.iter().flat_map(|d| f(&d.times).iter().copied()).collect() };
    let (mut den, mut sto, mut pre) = (all(|t| &t.denoise_ms), all(|t| &t.stored_ms), all(|t| &t.prefill_ms));
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

fn print_table(r: &Report) {
    println!(
        "# {} on {} ({}), {:.3} GB weights, prompt {}, {} new tokens, B={} S={}, {} timed decodes (median)",
        r.model,
        r.device,
        r.dtype,
        r.weight_bytes as f64 / 1e9,
        r.prompt_len,
        r.max_new_tokens,
        r.block_length,
        r.steps,
        r.repeat
    );
    if let Some(o) = &r.run.options {
        println!(
            "# paths: device sampler {}, fixed passes {}, CUDA graphs {}, streamed layer {}{}",
            o.device_sampler,
            o.fixed_passes,
            r.run.graphs_live,
            r.run.streamed_layer,
            r.run.capture_error.as_ref().map(|e| format!(" (capture failed: {e})")).unwrap_or_default()
        );
    }
    println!(
        "| strategy | events | tok/s | forwards/s | ms/forward | denoise ms | +store ms | prefill ms | tok/forward | decode ms |"
    );
    println!("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    for row in &r.rows {
        println!(
            "| {} | {} | {:.1} | {:.1} | {:.3} | {:.3} | {:.3} | {} | {:.3} | {:.1} |",
            row.strategy,
            row.events,
            row.tokens_per_s,
            row.forwards_per_s,
            row.ms_per_forward,
            row.denoise_ms_median,
            row.stored_ms_median,
            // No whole prompt block, no prefill pass.
            if row.prefill_ms_median.is_nan() { "-".to_string() } else { format!("{:.2}", row.prefill_ms_median) },
            row.tokens_per_forward,
            row.decode_ms
        );
    }
    // Events cost per strategy, two ways. The wall-time difference of the decodes with and
    // without them is what a user waits, but on a shared 2-core box its noise is larger than
    // the cost; the work itself (building on the engine thread, serialising on the writer's,
    // each timed where it runs) is what they take from the cores, against the decode time.
    for on in r.rows.iter().filter(|x| x.events == "on") {
        let off = r.rows.iter().find(|x| x.events == "off" && x.strategy == on.strategy);
        let base = off.map_or(on.decode_ms, |o| o.decode_ms);
        let work = on.event_build_ms + on.event_write_ms;
        println!(
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
            println!(
                "# events cost, {}: {:+.2} % decode time ({:.1} vs {:.1} ms)",
                on.strategy,
                (on.decode_ms / off.decode_ms - 1.0) * 100.0,
                on.decode_ms,
                off.decode_ms
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::interleaved;

    #[test]
    fn events_on_and_off_alternate_which_goes_first() {
        assert_eq!(interleaved(2, 0), vec![0, 1]);
        assert_eq!(interleaved(2, 1), vec![1, 0]);
        assert_eq!(interleaved(2, 2), vec![0, 1]);
        assert_eq!(interleaved(1, 1), vec![0], "one mode: nothing to alternate");
    }
}
