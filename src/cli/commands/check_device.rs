//! `unmask check-device` (hidden): what scripts/gpu_run.sh runs on the GPU host to show that
//! the GPU path computes what the CPU path computes.
//!
//! 1. Logits of the test checkpoint on the device (bf16 and f32) against the CPU in f32: a
//!    block-causal prefill, a cached denoising pass, and the same denoising pass in the
//!    fixed-shape form that CUDA graphs replay (whole-cache window, mask); with real head
//!    geometry also through the streamed layer (`Model::use_row_weights`), and the streamed
//!    layer's attention kernels alone (staged, split, plain) against the CPU's; a random
//!    SDAR-MoE and a random LLaDA2 (grouped sigmoid router, shared expert, half of each head
//!    rotated) of real head geometry, and the grouped route kernel alone. `--model` names the
//!    test checkpoint: tests/fixtures/tiny-random, or tests/fixtures/tiny-llada2 for LLaDA2's.
//! 2. The device sampler against the reference sampler on the same logits: the model's, and
//!    synthetic rows of a real vocabulary (bf16 ties included) for greedy and for
//!    temperature / top-k / top-p settings.
//! 3. The sampler kernel's time per call for a block of 4 positions.
//! 4. The gemv kernel against cuBLAS on the SDAR-1.7B projection shapes, checked and timed;
//!    its norm and residual forms against the unfused chain.
//!
//! Prints one line per check (`PASS`/`FAIL`) and exits non-zero if any fails.

use std::time::Instant;

use anyhow::{bail, Context, Result};
use candle_core::{DType, Device, Tensor};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::Serialize;

use crate::cli::CheckDeviceArgs;
use crate::engine::settings::{Confidence, SamplerSpec, Sampling, TopK};
use crate::model::random::{check_config, RandomWeights};
use crate::model::{Checkpoint, Compute, Model, PassInput, PathChoices, Source};
use crate::sampler::kernel::{sample_op, KernelParams, KernelSample};
use crate::sampler::sample;

#[derive(Serialize)]
struct Check {
    name: String,
    value: f64,
    limit: f64,
    pass: bool,
    detail: String,
}

#[derive(Default, Serialize)]
struct Report {
    device: String,
    checks: Vec<Check>,
    timings_us: Vec<(String, f64)>,
}

impl Report {
    fn check(
        &mut self,
        name: impl Into<String>,
        value: f64,
        limit: f64,
        detail: impl Into<String>,
    ) {
        let (name, detail) = (name.into(), detail.into());
        let pass = value <= limit && value.is_finite();
        println!(
            "{} {name}: {value:.3e} (limit {limit:.1e}) {detail}",
            if pass { "PASS" } else { "FAIL" }
        );
        self.checks.push(Check { name, value, limit, pass, detail });
    }
}

/// `dtype` on the paths the environment chose: every model here, the CPU's references too, loads
/// as a decode would.
fn with(dtype: DType, paths: PathChoices) -> Compute {
    Compute { paths, ..dtype.into() }
}

fn rel_err(a: &Tensor, b: &Tensor) -> Result<f64> {
    let a = a.to_device(&Device::Cpu)?.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?;
    let b = b.to_device(&Device::Cpu)?.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?;
    if a.len() != b.len() {
        bail!("shapes differ: {} vs {} elements", a.len(), b.len());
    }
    let num: f64 = a.iter().zip(&b).map(|(x, y)| ((x - y) as f64).powi(2)).sum();
    let den: f64 = b.iter().map(|y| (*y as f64).powi(2)).sum();
    Ok((num / den).sqrt())
}

/// `block` as the fixed-shape window pass after `committed` positions of a `capacity` cache.
fn window_input(m: &Model, block: &[u32], committed: usize, capacity: usize) -> Result<PassInput> {
    let (b, dev) = (block.len(), m.device());
    let (pos, mask) = PassInput::window(committed, b, b, capacity);
    Ok(PassInput {
        ids: Tensor::from_slice(block, b, dev)?,
        positions: Tensor::from_vec(pos, b, dev)?,
        keys: capacity,
        mask: Some(Tensor::from_vec(mask, (b, capacity), dev)?.to_dtype(m.dtype())?),
    })
}

/// Logits `[rows, vocab]` of: prefill over `prompt`; a cached denoising pass over `block`
/// after `prompt`; the same pass in the fixed-shape window form.
fn three_passes(m: &Model, prompt: &[u32], block: &[u32], capacity: usize) -> Result<[Tensor; 3]> {
    let b = block.len();
    let mut cache = m.new_cache(capacity)?;
    let prefill = m.logits(&m.forward(prompt, &mut cache, b, prompt.len())?)?;
    let denoise = m.logits(&m.forward(block, &mut cache, b, 0)?)?;
    let input = window_input(m, block, cache.len(), capacity)?;
    let window = m.logits(&m.forward_input(&input, &cache)?)?;
    Ok([prefill, denoise, window])
}

/// [`three_passes`] with each pass's routing: the experts each row took in every sparse layer.
fn three_passes_routed(
    m: &Model,
    prompt: &[u32],
    block: &[u32],
    capacity: usize,
) -> Result<[(Tensor, Vec<crate::model::LayerRoutes>); 3]> {
    let b = block.len();
    let mut cache = m.new_cache(capacity)?;
    let (h, prefill) = m.forward_routed(prompt, &mut cache, b, prompt.len())?;
    let prefill = (m.logits(&h)?, prefill);
    let (h, denoise) = m.forward_routed(block, &mut cache, b, 0)?;
    let denoise = (m.logits(&h)?, denoise);
    let input = window_input(m, block, cache.len(), capacity)?;
    let (h, window) = m.forward_input_routed(&input, &cache)?;
    Ok([prefill, denoise, (m.logits(&h)?, window)])
}

/// A routed pass held against its reference over the rows routed alike in every sparse layer:
/// `(rel. L2 error over those rows, rows routed otherwise, rows)`. Under another rounding a
/// near tie of the router flips between nearly equal experts (bf16 against f32 on the CPU
/// itself), and such a row's logits then move by the two experts' difference, which says
/// nothing of the device; its count is reported beside the error. A broken router leaves no
/// row alike (an infinite error, failed); a broken expert moves the rows that agree too.
fn routed_alike_err(
    got: &(Tensor, Vec<crate::model::LayerRoutes>),
    want: &(Tensor, Vec<crate::model::LayerRoutes>),
) -> Result<(f64, usize, usize)> {
    let rows = want.0.dim(0)?;
    let alike: Vec<u32> = (0..rows)
        .filter(|&r| {
            got.1.iter().zip(&want.1).all(|(a, b)| {
                a.rows.get(r).map(|x| &x.experts) == b.rows.get(r).map(|x| &x.experts)
            })
        })
        .map(|r| r as u32)
        .collect();
    let flipped = rows - alike.len();
    if alike.is_empty() {
        return Ok((f64::INFINITY, flipped, rows));
    }
    let pick = |t: &Tensor| -> Result<Tensor> {
        let t = t.to_device(&Device::Cpu)?.to_dtype(DType::F32)?;
        Ok(t.index_select(&Tensor::new(alike.as_slice(), &Device::Cpu)?, 0)?)
    };
    Ok((rel_err(&pick(&got.0)?, &pick(&want.0)?)?, flipped, rows))
}

/// A random SDAR-MoE of real head geometry (16/4 heads of 128, top 8 of 32 experts), a dense
/// layer between two sparse ones: the GPU in bf16 (the streamed layer: router gemv, routing
/// table, grouped expert products, combine) and in f32 (the standard layer: per-expert
/// products) against the CPU in f32.
fn moe_checks(rep: &mut Report, dev: &Device, capacity: usize, paths: PathChoices) -> Result<()> {
    let cfg = crate::model::random::three_layer_moe((1024, 16, 4, 32000, 3072), (32, 8, 512));
    let weights = || {
        let mut w = RandomWeights::on_host(&cfg, 11);
        w.std = 0.05;
        w
    };
    let prompt: Vec<u32> = (0..10u32).map(|i| i * 997 + 13).collect();
    let block = [5u32, 31999, 31999, 7];
    let cpu_m = Model::load(&cfg, &weights(), with(DType::F32, paths), &Device::Cpu)?;
    let want = three_passes(&cpu_m, &prompt, &block, capacity)?;
    for (dt, limit) in [(DType::BF16, 5e-2), (DType::F32, 1e-4)] {
        let g = Model::load(&cfg, &weights(), with(dt, paths), dev)?;
        let path = if g.streams(block.len(), capacity) {
            "streamed (grouped experts)"
        } else {
            "standard"
        };
        if dt == DType::BF16 && dev.is_cuda() && path == "standard" {
            bail!("MoE: the streamed layer does not take a bf16 block pass on the GPU");
        }
        let got = three_passes(&g, &prompt, &block, capacity)?;
        for (name, (a, b)) in
            ["prefill", "cached denoise", "fixed-window denoise"].iter().zip(got.iter().zip(&want))
        {
            rep.check(
                format!("logits MoE 16/4x128 top 8 of 32 {dt:?} {path} {name}"),
                rel_err(a, b)?,
                limit,
                "rel. L2 error vs CPU f32",
            );
        }
        if let Some((touched, passes)) = g.moe_stats()? {
            println!("MoE {dt:?}: {:.1} distinct experts per sparse layer per pass ({passes} layer passes)", touched as f64 / passes.max(1) as f64);
        }
    }
    Ok(())
}

/// A random LLaDA2 of real head geometry (16/4 heads of 128, half of each rotated; top 8 of 32
/// experts in 8 groups of which 4 are kept; a shared expert), its first layer dense: the GPU in
/// f32 (the standard layer, the host router) against the CPU in f32; in bf16 (the streamed
/// layer: the grouped sigmoid route kernel, the shared expert's two gemvs, q/k prep rotating
/// half a head) against the CPU running the streamed layer's own bodies in bf16. The grouped
/// router decides at many cuts a row, so roundings that differ between the two (the gemv's sums
/// in another order) can flip a near tie, as they do between the CPU in bf16 and in f32: the
/// bf16 limit leaves room for such rows (they flip between nearly equal experts: 3 of 8 rows
/// moved the logits by 1.3e-2 between the CPU's standard and streamed layers), whose count is
/// printed; a broken route or shared expert moves them by far more. The route kernel itself is
/// held to its body exactly ([`grouped_route_checks`]).
fn llada2_checks(
    rep: &mut Report,
    dev: &Device,
    capacity: usize,
    paths: PathChoices,
) -> Result<()> {
    let cfg =
        crate::model::random::three_layer_llada2((1024, 16, 4, 32000, 3072), (32, 8, 512), (8, 4));
    let weights = || {
        let mut w = RandomWeights::on_host(&cfg, 11);
        w.std = 0.05;
        w
    };
    let prompt: Vec<u32> = (0..10u32).map(|i| i * 997 + 13).collect();
    let block = [5u32, 31999, 31999, 7];
    let label = "LLaDA2 16/4x128 rotary 64, top 8 of 32 in 8 groups, shared expert";
    let names = ["prefill", "cached denoise", "fixed-window denoise"];
    let denoise_routes = |m: &Model| -> Result<Vec<crate::model::LayerRoutes>> {
        let mut cache = m.new_cache(capacity)?;
        m.forward(&prompt, &mut cache, block.len(), prompt.len())?;
        Ok(m.forward_routed(&block, &mut cache, block.len(), 0)?.1)
    };
    let cpu = Model::load(&cfg, &weights(), with(DType::F32, paths), &Device::Cpu)?;
    let want = three_passes(&cpu, &prompt, &block, capacity)?;
    let g = Model::load(&cfg, &weights(), with(DType::F32, paths), dev)?;
    let got = three_passes(&g, &prompt, &block, capacity)?;
    for (name, (a, b)) in names.iter().zip(got.iter().zip(&want)) {
        let what = format!("logits {label} F32 standard {name}");
        rep.check(what, rel_err(a, b)?, 1e-4, "rel. L2 error vs CPU f32");
    }
    let mut cpu = Model::load(&cfg, &weights(), with(DType::BF16, paths), &Device::Cpu)?;
    cpu.use_row_weights()?;
    let g = Model::load(&cfg, &weights(), with(DType::BF16, paths), dev)?;
    let path =
        if g.streams(block.len(), capacity) { "streamed (grouped experts)" } else { "standard" };
    if dev.is_cuda() && path == "standard" {
        bail!("LLaDA2: the streamed layer does not take a bf16 block pass on the GPU");
    }
    let got = three_passes_routed(&g, &prompt, &block, capacity)?;
    let want = three_passes_routed(&cpu, &prompt, &block, capacity)?;
    for (name, (a, b)) in names.iter().zip(got.iter().zip(&want)) {
        let (err, flipped, rows) = routed_alike_err(a, b)?;
        let what = format!("logits {label} BF16 {path} {name}");
        let why = format!("rel. L2 error vs the CPU's streamed bodies, bf16, over the rows routed alike ({flipped} of {rows} routed otherwise)");
        rep.check(what, err, 1e-1, why);
    }
    // a near tie flips between nearly equal experts: the logits above are the measure, this
    // count is what they are read with
    let (a, b) = (denoise_routes(&g)?, denoise_routes(&cpu)?);
    let rows: Vec<bool> = a
        .iter()
        .zip(&b)
        .flat_map(|(x, y)| x.rows.iter().zip(&y.rows).map(|(p, q)| p.experts == q.experts))
        .collect();
    let differ = rows.iter().filter(|same| !**same).count();
    println!(
        "LLaDA2 BF16 {path}: {differ} of {} (row, sparse layer) pairs of the cached denoise routed otherwise than on the CPU",
        rows.len()
    );
    if let Some((touched, passes)) = g.moe_stats()? {
        println!(
            "LLaDA2 BF16: {:.1} distinct experts per sparse layer per pass ({passes} layer passes)",
            touched as f64 / passes.max(1) as f64
        );
    }
    Ok(())
}

/// The grouped sigmoid route op alone (moe_grouped.rs, `ExpertsUpInto` with
/// `RouteRule::GroupedSigmoid`: on the GPU the `unmask_moe_route_grouped` kernel) against its
/// CPU body on the same bf16 logits, for LLaDA2-mini's router (8 rows, 256 experts in 8 groups,
/// 4 kept, top 8) and the test fixture's (8 experts in 4 groups, 2 kept, top 2, and a row of
/// equal logits, a tie of groups and of experts): the same experts in the same order, the same
/// weights within 1e-5, the distinct experts counted.
fn grouped_route_checks(rep: &mut Report, dev: &Device) -> Result<()> {
    use crate::model::fast::moe_grouped::{new_tables, read_stats, read_table, route_grouped};
    use crate::model::fast::moe_grouped::{ExpertsUpInto, RouteRule};
    use crate::model::layers::router::GroupedSigmoid;
    let mut rng = ChaCha8Rng::seed_from_u64(5);
    for (e, groups, keep, k, h, i) in [(256, 8, 4, 8, 64, 32), (8, 4, 2, 2, 64, 32)] {
        let t = 8;
        let bias: Vec<f32> = (0..e).map(|_| (rng.random::<f32>() - 0.5) * 0.1).collect();
        let mut z: Vec<f32> = (0..t * e).map(|_| (rng.random::<f32>() - 0.5) * 8.0).collect();
        z[..e].iter_mut().for_each(|v| *v = 0.0); // row 0: every score 0.5, the bias decides
        let router = GroupedSigmoid { bias: bias.clone(), groups, keep, scale: 2.5 };
        let logits = Tensor::from_vec(z, (t, e), dev)?.to_dtype(DType::BF16)?;
        let host: Vec<f32> = logits.to_dtype(DType::F32)?.flatten_all()?.to_vec1()?;
        let want = route_grouped(&host, t, e, k, &router);
        let bias_t = Tensor::from_slice(&bias, e, dev)?;
        let tables = new_tables(1, dev)?;
        let x = Tensor::randn(0f32, 1.0, (t, h), dev)?.to_dtype(DType::BF16)?;
        let w = Tensor::randn(0f32, 0.05, (e, 2 * i, h), dev)?.to_dtype(DType::BF16)?;
        let act = Tensor::zeros((t * k, i), DType::BF16, dev)?;
        let rule = RouteRule::GroupedSigmoid { router: &router, bias: &bias_t };
        ExpertsUpInto { tables: &tables, logits: &logits, layer: 0, k, rule, eps: 1e-6 }
            .run(&act, &x, &w)?;
        let got = read_table(&tables, 0, t)?;
        let what = format!(
            "grouped route {t} rows, {e} experts in {groups} groups ({keep} kept), top {k}"
        );
        let order =
            (0..t).filter(|&r| got.row(r).map(|x| x.0).ne(want.row(r).map(|x| x.0))).count();
        rep.check(format!("{what}: rows with other experts"), order as f64, 0.0, "vs the CPU body");
        let dw = got.weight.iter().zip(&want.weight).fold(0f32, |m, (a, b)| m.max((a - b).abs()));
        rep.check(format!("{what}: max |d weight|"), dw as f64, 1e-5, "vs the CPU body");
        let (touched, passes) = read_stats(&tables)?;
        let stats_ok = (touched as usize, passes) == (want.experts.len(), 1);
        rep.check(
            format!("{what}: distinct experts counted"),
            f64::from(!stats_ok),
            0.0,
            format!("{touched} in {passes} pass, want {}", want.experts.len()),
        );
    }
    Ok(())
}

/// A cache of 2048 slots, 1900 of them committed: the streamed layer's attention over more
/// than 512 keys (the split-K kernels on the GPU), in bf16 against the CPU in f32. Each block of
/// the split kernel takes the query rows of one KV head: 8 (1.7B's heads, 4 rows), 16 (4B's, 4
/// rows) and 32 (4B's, a storing pass of 8 rows; 30B-A3B's group of 8 at 4 rows), its three forms.
fn long_cache_checks(rep: &mut Report, dev: &Device, paths: PathChoices) -> Result<()> {
    let prompt: Vec<u32> = (0..1900u32).map(|i| (i * 7919 + 13) % 31990).collect();
    let blocks = [5u32, 31999, 31999, 7, 9, 31999, 31999, 11];
    let cap = 2048;
    for (heads, kv, rows) in [(32, 8, 4), (32, 8, 8), (16, 8, 4)] {
        let cfg = check_config(1024, 2, heads, kv, 128, 3072, 32000)?;
        let block = &blocks[..rows];
        let cpu_m = Model::load(
            &cfg,
            &RandomWeights::on_host(&cfg, 9),
            with(DType::F32, paths),
            &Device::Cpu,
        )?;
        let want = three_passes(&cpu_m, &prompt, block, cap)?;
        let g = Model::load(&cfg, &RandomWeights::on_host(&cfg, 9), with(DType::BF16, paths), dev)?;
        let path = if g.streams(block.len(), cap) { "streamed" } else { "standard" };
        let got = three_passes(&g, &prompt, block, cap)?;
        for (name, (a, b)) in
            ["prefill", "cached denoise", "fixed-window denoise"].iter().zip(got.iter().zip(&want))
        {
            let label = format!("logits {heads}/{kv} heads, {rows} rows, cache {cap}, 1900 committed, BF16 {path} {name}");
            rep.check(label, rel_err(a, b)?, 4e-2, "rel. L2 error vs CPU f32");
        }
    }
    Ok(())
}

/// The streamed layer's attention kernels on their own (ops.rs, `attention_into`), against the
/// CPU body of the attention op on the same bf16 values: the staged kernel (heads of 128, up to
/// 512 keys), which a model reaches only where the GPU cannot fold q/k prep into it; the split
/// kernels (more keys); the plain kernel (another head size). Each with a mask hiding keys.
fn attention_into_checks(rep: &mut Report, dev: &Device) -> Result<()> {
    use crate::model::ops::{attention, attention_into, Attention};
    for (label, d, keys) in [("staged", 128, 320), ("split", 128, 1900), ("plain", 64, 320)] {
        let (h, kv, t, cap) = (16, 8, 4, 2048);
        let op =
            Attention { heads: h, kv_heads: kv, head_dim: d, keys, scale: 1.0 / (d as f32).sqrt() };
        let q = Tensor::randn(0f32, 1.0, (h, t, d), dev)?.to_dtype(DType::BF16)?;
        let cache = Tensor::randn(0f32, 1.0, (2, kv, cap, d), dev)?.to_dtype(DType::BF16)?;
        // the pass's own slots are the last `t` keys; every third key hidden
        let mask: Vec<f32> =
            (0..t * keys).map(|i| if i % 3 == 1 { f32::NEG_INFINITY } else { 0.0 }).collect();
        let mask = Tensor::from_vec(mask, (t, keys), dev)?.to_dtype(DType::BF16)?;
        let positions =
            Tensor::from_vec(((keys - t) as u32..keys as u32).collect::<Vec<_>>(), t, dev)?;
        let out = Tensor::zeros((t, h * d), DType::BF16, dev)?;
        attention_into(&out, &q, &cache, Some(&mask), &positions, &op)?;
        let cpu = |x: &Tensor| x.to_device(&Device::Cpu);
        let want = attention(&cpu(&q)?, &cpu(&cache)?, Some(&cpu(&mask)?), &op)?;
        let what =
            format!("attention-into {label} {h}/{kv} heads of {d}, {t} rows, {keys} keys vs CPU");
        rep.check(what, rel_err(&out, &want)?, 1e-2, "rel. L2 error, bf16");
    }
    Ok(())
}

fn sampler_settings() -> Vec<(&'static str, SamplerSpec)> {
    let t = |temperature, top_k, top_p| {
        SamplerSpec::from(Sampling { temperature, top_k, top_p, seed: 0 })
    };
    let scaled = |s: SamplerSpec| SamplerSpec { confidence: Confidence::Scaled, ..s };
    let ties_kept = |s: SamplerSpec| SamplerSpec { top_k_rule: TopK::TiesKept, ..s };
    vec![
        ("greedy", Sampling::default().into()),
        ("T=0.7 k=1", t(0.7, 1, 1.0)),
        ("T=1 k=20 p=0.9", t(1.0, 20, 0.9)),
        // --schedule lmdeploy's confidence: the whole scaled row's
        ("T=1 k=20 p=0.9 scaled", scaled(t(1.0, 20, 0.9))),
        ("T=1 p=0.9 scaled", scaled(t(1.0, 0, 0.9))),
        // --schedule sdar's top-k: generate.py keeps the ties at the k-th (bf16 logits tie often)
        ("T=0.8 k=20 p=0.9 ties kept", ties_kept(t(0.8, 20, 0.9))),
        ("T=0.8 k=256", t(0.8, 256, 1.0)),
        ("T=1 p=0.9", t(1.0, 0, 0.9)),
        ("T=1", t(1.0, 0, 1.0)),
        ("T=0.3", t(0.3, 0, 1.0)),
    ]
}

/// Device sampler vs reference on `logits` (any device/dtype). Returns (token mismatches,
/// max |d conf|, max |d entropy|, rows the kernel handed to the host, rows).
fn compare_sampler(
    logits: &Tensor,
    s: &SamplerSpec,
    mask: u32,
    rng: &mut ChaCha8Rng,
) -> Result<(usize, f64, f64, usize, usize)> {
    let rows = logits.dim(0)?;
    let us: Vec<f32> =
        (0..rows).map(|_| if s.is_greedy() { 0.0 } else { rng.random::<f32>() }).collect();
    let ut = Tensor::from_slice(&us, rows, logits.device())?;
    let out = sample_op(logits, &ut, KernelParams::new(s, mask))?.to_vec2::<f32>()?;
    let host = logits.to_device(&Device::Cpu)?.to_dtype(DType::F32)?.to_vec2::<f32>()?;
    let (mut bad, mut dc, mut de, mut over) = (0, 0f64, 0f64, 0);
    for (r, mut row) in host.into_iter().enumerate() {
        let k = KernelSample::from_row(&out[r]);
        if k.overflow {
            over += 1;
            continue;
        }
        if let Some(z) = row.get_mut(mask as usize) {
            *z = f32::NEG_INFINITY;
        }
        let want = sample(&row, s, us[r]);
        if k.token != want.token {
            bad += 1;
        }
        dc = dc.max((k.conf - want.conf).abs() as f64);
        // relative for large entropies: the reference sums -p ln p over the whole vocabulary
        // sequentially in f32, the kernel accumulates ln S - W/S in a tree
        de = de.max(((k.entropy - want.entropy).abs() / want.entropy.abs().max(1.0)) as f64);
    }
    Ok((bad, dc, de, over, rows))
}

/// Synthetic logits like a model's: heavy top, optionally rounded to bf16 (exact ties).
fn synthetic_rows(rng: &mut ChaCha8Rng, rows: usize, vocab: usize) -> Vec<f32> {
    let mut v = Vec::with_capacity(rows * vocab);
    for r in 0..rows {
        let scale = [0.5f32, 2.0, 6.0, 12.0][r % 4];
        for _ in 0..vocab {
            let g: f32 = (0..4).map(|_| rng.random::<f32>() - 0.5).sum();
            v.push(half::bf16::from_f32(scale * g * g.abs()).to_f32());
        }
    }
    v
}

/// The gemv kernel (the few-row path of `Linear::Rows` and `Linear::Packed`) against candle's matmul (cuBLAS on a GPU)
/// on random bf16 data of the SDAR-1.7B projection shapes, and both timed. Each timing cycles
/// through enough copies of the weight (>= 256 MB) that none is served from L2 (50 MB), as in
/// a forward, where every weight is read once.
fn gemv_checks(rep: &mut Report, dev: &Device) -> Result<()> {
    use crate::model::gemv::{pack, Epilogue, Gemv};
    let shapes = [
        ("qkv", 4096, 2048),
        ("o", 2048, 2048),
        ("gate_up", 12288, 2048),
        ("down", 2048, 6144),
        ("lm_head", 151936, 2048),
    ];
    for (name, n, k) in shapes {
        let bytes = n * k * 2;
        let copies = (256usize << 20).div_ceil(bytes);
        let ws = (0..copies)
            .map(|_| Tensor::randn(0f32, 0.02, (n, k), dev)?.to_dtype(DType::BF16))
            .collect::<candle_core::Result<Vec<_>>>()?;
        for t in [1, 4, 8] {
            let x = Tensor::randn(0f32, 1.0, (t, k), dev)?.to_dtype(DType::BF16)?;
            let got = Gemv::PLAIN.forward(&x, &ws[0])?;
            let want = x.matmul(&ws[0].t()?)?;
            rep.check(
                format!("gemv {name} [{t}x{k}]·[{n}x{k}]ᵀ vs matmul"),
                rel_err(&got, &want)?,
                1e-2,
                "rel. L2 error, bf16",
            );
            let paired = |w: &Tensor| -> candle_core::Result<Tensor> {
                let gu = x.matmul(&w.t()?)?;
                let i = n / 2;
                candle_nn::ops::silu(&gu.narrow(1, 0, i)?)? * gu.narrow(1, i, i)?
            };
            if name == "gate_up" {
                // the paired form: silu(gate) * up from one kernel, against matmul + the chain
                let got = Gemv::SILU_MUL.forward(&x, &ws[0])?;
                rep.check(
                    format!("gemv silu(gate)*up [{t}x{k}]·[{n}x{k}]ᵀ vs matmul + silu"),
                    rel_err(&got, &paired(&ws[0])?)?,
                    1e-2,
                    "rel. L2 error, bf16",
                );
            }
            if name != "lm_head" {
                gemv_form_checks(rep, name, &x, &ws[0])?;
            }
            let mut time_over = |ws: &[Tensor],
                                 label: &str,
                                 f: &dyn Fn(&Tensor) -> candle_core::Result<Tensor>|
             -> Result<()> {
                for w in ws {
                    f(w)?;
                }
                dev.synchronize()?;
                let calls = copies.max(64).div_ceil(copies) * copies;
                let t0 = Instant::now();
                for i in 0..calls {
                    f(&ws[i % copies])?;
                }
                dev.synchronize()?;
                let us = t0.elapsed().as_secs_f64() * 1e6 / calls as f64;
                let gbs = bytes as f64 / us / 1e3;
                println!("TIME {label} {name} T={t} N={n} K={k}: {us:.2} us per call, {gbs:.0} GB/s of weights (host-timed, back to back)");
                rep.timings_us.push((format!("{label} {name} T={t}"), us));
                Ok(())
            };
            time_over(&ws, "gemv", &|w| Gemv::PLAIN.forward(&x, w))?;
            time_over(&ws, "matmul", &|w| x.matmul(&w.t()?))?;
            if name == "gate_up" {
                time_over(&ws, "gemv+silu", &|w| Gemv::SILU_MUL.forward(&x, w))?;
                time_over(&ws, "matmul+silu", &paired)?;
            }
            if name != "lm_head" {
                // the same copies packed (gemv.rs, WeightLayout::Packed): the layout the
                // streamed layer reads; the packed times beside the rows' above
                let packed = ws.iter().map(pack).collect::<candle_core::Result<Vec<_>>>()?;
                time_over(&packed, "gemv packed", &|w| Gemv::PLAIN.forward(&x, w))?;
                if name == "gate_up" {
                    time_over(&packed, "gemv+silu packed", &|w| Gemv::SILU_MUL.forward(&x, w))?;
                }
                let label = format!("gemv {name} [{t}x{k}]·[{n}x{k}]ᵀ");
                packed_checks(
                    rep,
                    &label,
                    Epilogue::Plain,
                    (n, k),
                    &Gemv::PLAIN.forward(&x, &packed[0])?,
                    &got,
                    &want,
                )?;
            }
        }
    }
    Ok(())
}

/// The streamed layer's forms at the shapes whose split was measured rather than ruled
/// (`gemv::MEASURED`: SDAR-4B and 8B; `gemv::MEASURED_PACKED`: their packed splits and
/// 1.7B's), some with kernels no other shape runs (the paired form with 8 steps a batch, the
/// normed and adding forms with 4), at T = 4 and 8, rows and packed.
fn measured_split_checks(rep: &mut Report, dev: &Device) -> Result<()> {
    use crate::model::gemv::{Epilogue, Measured, MEASURED, MEASURED_PACKED};
    // every form runs rows and packed: each table's shapes take their split in both layouts
    for &Measured { n, k, epilogue, .. } in MEASURED.iter().chain(&MEASURED_PACKED) {
        let rows = if epilogue == Epilogue::SiluMul { 2 * n } else { n };
        let w = Tensor::randn(0f32, 0.02, (rows, k), dev)?.to_dtype(DType::BF16)?;
        let names: &[&str] =
            if epilogue == Epilogue::SiluMul { &["gate_up"] } else { &["qkv", "down"] };
        for t in [4, 8] {
            let x = Tensor::randn(0f32, 1.0, (t, k), dev)?.to_dtype(DType::BF16)?;
            for name in names {
                gemv_form_checks(rep, name, &x, &w)?;
            }
        }
    }
    Ok(())
}

/// The streamed layer's forms of one projection on the device against the unfused chain
/// (f32 RMSNorm rounded to bf16, cuBLAS, the silu chain, a bf16 add): the norm form, with the
/// norm weight folded into W, where the projection reads the residual stream (qkv, gate|up),
/// the residual form where it writes it (o, down).
fn gemv_form_checks(rep: &mut Report, name: &str, x: &Tensor, w: &Tensor) -> Result<()> {
    use crate::model::gemv::{pack, Epilogue, GemvInto};
    let (t, k) = x.dims2()?;
    let n = w.dim(0)?;
    let dev = x.device();
    if matches!(name, "qkv" | "gate_up") {
        let nw = (Tensor::rand(0.5f32, 1.5, k, dev)?).to_dtype(DType::BF16)?;
        let f32 = |t: &Tensor| t.to_dtype(DType::F32);
        let normed = candle_nn::ops::rms_norm(&f32(x)?, &f32(&nw)?, 1e-6)?.to_dtype(DType::BF16)?;
        let product = normed.matmul(&w.t()?)?;
        let (epilogue, want) = match name {
            "gate_up" => (
                Epilogue::SiluMul,
                (candle_nn::ops::silu(&product.narrow(1, 0, n / 2)?)?
                    * product.narrow(1, n / 2, n / 2)?)?,
            ),
            _ => (Epilogue::Plain, product),
        };
        let folded = w.broadcast_mul(&nw.unsqueeze(0)?)?.contiguous()?;
        let op = GemvInto { epilogue, rms: Some(1e-6), residual: None };
        if !op.fits(x, &folded) {
            bail!("gemv {name}: the norm form does not take [{t}x{k}]");
        }
        let out = Tensor::zeros(want.shape(), DType::BF16, dev)?;
        op.run(&out, x, &folded)?;
        rep.check(
            format!("gemv {name} norm form [{t}x{k}]·[{n}x{k}]ᵀ vs rms_norm + matmul"),
            rel_err(&out, &want)?,
            1e-2,
            "rel. L2 error, bf16",
        );
        let packed = Tensor::zeros(want.shape(), DType::BF16, dev)?;
        op.run(&packed, x, &pack(&folded)?)?;
        let label = format!("gemv {name} norm form [{t}x{k}]·[{n}x{k}]ᵀ");
        packed_checks(rep, &label, epilogue, (epilogue.out_rows(n), k), &packed, &out, &want)?;
    }
    if matches!(name, "o" | "down") {
        let res = Tensor::randn(0f32, 1.0, (t, n), dev)?.to_dtype(DType::BF16)?;
        let want = (x.matmul(&w.t()?)? + &res)?;
        let out = Tensor::zeros((t, n), DType::BF16, dev)?;
        let op = GemvInto { epilogue: Epilogue::Plain, rms: None, residual: Some(&res) };
        op.run(&out, x, w)?;
        rep.check(
            format!("gemv {name} residual form [{t}x{k}]·[{n}x{k}]ᵀ vs matmul + add"),
            rel_err(&out, &want)?,
            1e-2,
            "rel. L2 error, bf16",
        );
        let packed = Tensor::zeros((t, n), DType::BF16, dev)?;
        op.run(&packed, x, &pack(w)?)?;
        packed_checks(
            rep,
            &format!("gemv {name} residual form [{t}x{k}]·[{n}x{k}]ᵀ"),
            Epilogue::Plain,
            (n, k),
            &packed,
            &out,
            &want,
        )?;
    }
    Ok(())
}

/// The repack kernel (`unmask_repack`) both ways, bit for bit: a projection packed on the
/// device equals it packed on the host, unpacked it is the weight again; the same for a layer's
/// stacked experts, each expert's packed slice where the grouped kernels look for it.
fn repack_checks(rep: &mut Report, dev: &Device) -> Result<()> {
    use crate::model::gemv::{pack, pack_experts, unpack, unpack_experts};
    let w = Tensor::randn(0f32, 0.02, (4096, 2048), dev)?.to_dtype(DType::BF16)?;
    let packed = pack(&w)?;
    let on_host = pack(&w.to_device(&Device::Cpu)?)?;
    rep.check(
        "repack: [4096x2048] packed here = packed on the host",
        rel_err(&packed, &on_host)?,
        0.0,
        "bit for bit",
    );
    rep.check(
        "repack: [4096x2048] packed then unpacked = the rows",
        rel_err(&unpack(&packed)?, &w)?,
        0.0,
        "bit for bit",
    );
    let experts = Tensor::randn(0f32, 0.02, (8, 1536, 2048), dev)?.to_dtype(DType::BF16)?;
    let stacked = pack_experts(&experts)?;
    rep.check(
        "repack: experts [8x1536x2048] packed then unpacked = the rows",
        rel_err(&unpack_experts(&stacked)?, &experts)?,
        0.0,
        "bit for bit",
    );
    rep.check(
        "repack: expert 5 of the packed stack = expert 5 packed alone",
        rel_err(&stacked.get(5)?, &pack(&experts.get(5)?)?)?,
        0.0,
        "bit for bit",
    );
    Ok(())
}

/// A product from a packed weight against the reference (`want`) as the rows' is, and where
/// both layouts take the same split (so the same sums in the same order), against the rows'
/// result (`rows`) bit for bit.
fn packed_checks(
    rep: &mut Report,
    label: &str,
    epilogue: crate::model::gemv::Epilogue,
    (n, k): (usize, usize),
    packed: &Tensor,
    rows: &Tensor,
    want: &Tensor,
) -> Result<()> {
    use crate::model::gemv::{split_for, WeightLayout};
    rep.check(
        format!("{label} packed vs reference"),
        rel_err(packed, want)?,
        1e-2,
        "rel. L2 error, bf16",
    );
    if split_for(n, k, epilogue, WeightLayout::Rows)
        == split_for(n, k, epilogue, WeightLayout::Packed)
    {
        rep.check(
            format!("{label} packed = rows"),
            rel_err(packed, rows)?,
            0.0,
            "bit for bit (the same split)",
        );
    }
    Ok(())
}

pub fn run(args: &CheckDeviceArgs) -> Result<()> {
    let paths = PathChoices::from_env()?;
    let dev = args.decode.device.open()?;
    // the kernel checks below that run without a model launch as the models do
    paths.launch_on(&dev);
    let dir = args
        .decode
        .model
        .clone()
        .context("check-device needs --model DIR (the test checkpoint)")?;
    if let Some(p) = &args.json {
        crate::cli::output::check_report_path("check-device", p)?;
        crate::cli::session::check_decode_outputs(&args.decode, &[("--json", p)])?;
    }
    let mut rep = Report { device: args.decode.device.to_string(), ..Default::default() };
    let cpu = Checkpoint::load(&Source::Dir(dir.clone()), &Device::Cpu, with(DType::F32, paths))?;
    let mask = cpu.tokenizer.mask_id();
    let vocab = cpu.config.vocab_size;
    let prompt: Vec<u32> =
        (0..10u32).map(|i| (i * 37 + 5) % vocab as u32).filter(|&t| t != mask).collect();
    let block = [7u32, mask, mask, 11];
    let capacity = 32;
    let want = three_passes(&cpu.model, &prompt, &block, capacity)?;
    let mut rng = ChaCha8Rng::seed_from_u64(1);

    // A routed checkpoint (tests/fixtures/tiny-llada2) in bf16 is held to the CPU in f32 over
    // the rows routed alike ([`routed_alike_err`]): its routers decide at cuts where any two
    // roundings flip near ties (bf16 against f32 on the CPU's own generic chain moves the
    // logits by 0.27), which would say nothing of the device.
    let sparse = cpu.config.moe_info().is_some();
    let want_routed = if sparse {
        Some(three_passes_routed(&cpu.model, &prompt, &block, capacity)?)
    } else {
        None
    };

    // 1 + 2a: logits and sampler on the model's logits; fused kernels and generic chains
    // bf16: the CPU in bf16 lands at ~1.9e-2 on this checkpoint (weights and activations rounded)
    for (dt, limit) in [(DType::BF16, 4e-2), (DType::F32, 1e-4)] {
        let mut g = Checkpoint::load(&Source::Dir(dir.clone()), &dev, with(dt, paths))?;
        for fused in [true, false] {
            g.model.set_fused(fused);
            let path = if g.model.fused() { "fused" } else { "generic" };
            let names = ["prefill", "cached denoise", "fixed-window denoise"];
            match (&want_routed, dt) {
                (Some(want), DType::BF16) => {
                    let got = three_passes_routed(&g.model, &prompt, &block, capacity)?;
                    for (name, (a, b)) in names.iter().zip(got.iter().zip(want)) {
                        let (err, flipped, rows) = routed_alike_err(a, b)?;
                        let why = format!("rel. L2 error vs CPU f32 over the rows routed alike ({flipped} of {rows} routed otherwise)");
                        rep.check(format!("logits {dt:?} {path} {name}"), err, limit, why);
                    }
                }
                _ => {
                    let got = three_passes(&g.model, &prompt, &block, capacity)?;
                    for (name, (a, b)) in names.iter().zip(got.iter().zip(&want)) {
                        let what = format!("logits {dt:?} {path} {name}");
                        rep.check(what, rel_err(a, b)?, limit, "rel. L2 error vs CPU f32");
                    }
                }
            }
        }
        g.model.set_fused(true);
        // the model's own logits, in the dtype the device computed them in
        let raw = g.model.logits_raw(&g.model.forward(
            &prompt,
            &mut g.model.new_cache(capacity)?,
            4,
            0,
        )?)?;
        for (name, s) in sampler_settings() {
            let (bad, dc, de, over, rows) = compare_sampler(&raw, &s, mask, &mut rng)?;
            rep.check(
                format!("sampler on model logits {dt:?} {name}: token mismatches"),
                bad as f64,
                0.0,
                format!(
                    "{rows} rows, {over} to host, max |dconf| {dc:.1e}, max |dH|/max(1,H) {de:.1e}"
                ),
            );
        }
    }

    // 1b: real head geometry (d = 128, GQA groups of 2 and 4), same random weights everywhere
    for (label, cfg) in [
        ("1.7B heads (16/8 x 128)", check_config(1024, 2, 16, 8, 128, 3072, 32000)?),
        ("4B heads (32/8 x 128)", check_config(1024, 2, 32, 8, 128, 3072, 32000)?),
    ] {
        let prompt: Vec<u32> = (0..10u32).map(|i| i * 997 + 13).collect();
        let block = [5u32, 31999, 31999, 7];
        let cpu_m = Model::load(
            &cfg,
            &RandomWeights::on_host(&cfg, 9),
            with(DType::F32, paths),
            &Device::Cpu,
        )?;
        // 320: the bench's cache, so the fixed window's mask hides most of its slots
        for cap in [capacity, 320] {
            let want = three_passes(&cpu_m, &prompt, &block, cap)?;
            for (dt, limit) in [(DType::BF16, 4e-2), (DType::F32, 1e-4)] {
                let mut g =
                    Model::load(&cfg, &RandomWeights::on_host(&cfg, 9), with(dt, paths), &dev)?;
                for fused in [true, false] {
                    g.set_fused(fused);
                    let path = if g.fused() { "fused" } else { "generic" };
                    let got = three_passes(&g, &prompt, &block, cap)?;
                    for (name, (a, b)) in ["prefill", "cached denoise", "fixed-window denoise"]
                        .iter()
                        .zip(got.iter().zip(&want))
                    {
                        let what = format!("logits {label} cache {cap} {dt:?} {path} {name}");
                        rep.check(what, rel_err(a, b)?, limit, "rel. L2 error vs CPU f32");
                    }
                }
                if dt == DType::BF16 {
                    // the streamed layer: projections [out, in] through the gemv kernel's norm,
                    // add and silu forms, q/k prep writing the cache, attention into its buffer
                    g.set_fused(true);
                    g.use_row_weights()?;
                    if !g.streams(block.len(), cap) {
                        bail!("{label}: the streamed layer does not take a block pass here");
                    }
                    let got = three_passes(&g, &prompt, &block, cap)?;
                    for (name, (a, b)) in ["prefill", "cached denoise", "fixed-window denoise"]
                        .iter()
                        .zip(got.iter().zip(&want))
                    {
                        let what = format!("logits {label} cache {cap} {dt:?} streamed {name}");
                        rep.check(what, rel_err(a, b)?, limit, "rel. L2 error vs CPU f32");
                    }
                }
            }
        }
    }

    // 1c: the MoE block (grouped kernels on the streamed layer) and long caches (split-K attention)
    moe_checks(&mut rep, &dev, capacity, paths)?;
    llada2_checks(&mut rep, &dev, capacity, paths)?;
    grouped_route_checks(&mut rep, &dev)?;
    long_cache_checks(&mut rep, &dev, paths)?;
    attention_into_checks(&mut rep, &dev)?;

    // 2b: synthetic rows of a real vocabulary
    let rows = 16;
    let data = synthetic_rows(&mut rng, rows, args.vocab);
    let host = Tensor::from_vec(data, (rows, args.vocab), &Device::Cpu)?;
    for dt in [DType::F32, DType::BF16] {
        let lg = host.to_dtype(dt)?.to_device(&dev)?;
        let syn_mask = (args.vocab as u32).saturating_sub(100);
        for (name, s) in sampler_settings() {
            let (bad, dc, de, over, n) = compare_sampler(&lg, &s, syn_mask, &mut rng)?;
            rep.check(
                format!(
                    "sampler on synthetic {}-vocab {dt:?} {name}: token mismatches",
                    args.vocab
                ),
                bad as f64,
                0.0,
                format!(
                    "{n} rows, {over} to host, max |dconf| {dc:.1e}, max |dH|/max(1,H) {de:.1e}"
                ),
            );
            rep.check(format!("sampler synthetic {dt:?} {name}: max |d conf|"), dc, 1e-4, "");
            rep.check(
                format!("sampler synthetic {dt:?} {name}: max |d entropy| / max(1, H)"),
                de,
                1e-3,
                "",
            );
        }
    }

    // 3: sampler time per call, [4, vocab] bf16
    let lg = host.narrow(0, 0, 4)?.to_dtype(DType::BF16)?.to_device(&dev)?;
    let ut = Tensor::from_slice(&[0.3f32, 0.6, 0.9, 0.1], 4, &dev)?;
    for (name, s) in [
        ("greedy", Sampling::default()),
        ("T=1 k=50 p=0.9", Sampling { temperature: 1.0, top_k: 50, top_p: 0.9, seed: 0 }),
    ] {
        let s = SamplerSpec::from(s);
        let p = KernelParams::new(&s, 0);
        for _ in 0..3 {
            sample_op(&lg, &ut, p)?;
        }
        dev.synchronize()?;
        let n = 200;
        let t0 = Instant::now();
        for _ in 0..n {
            sample_op(&lg, &ut, p)?;
        }
        dev.synchronize()?;
        let us = t0.elapsed().as_secs_f64() * 1e6 / n as f64;
        println!(
            "TIME sampler [4, {}] bf16 {name}: {us:.1} us per call (host-timed, back to back)",
            args.vocab
        );
        rep.timings_us.push((format!("sampler {name}"), us));
    }

    // 4: the gemv kernel against cuBLAS on the SDAR-1.7B projections
    gemv_checks(&mut rep, &dev)?;
    measured_split_checks(&mut rep, &dev)?;
    repack_checks(&mut rep, &dev)?;

    let failed = rep.checks.iter().filter(|c| !c.pass).count();
    println!("{} checks, {failed} failed", rep.checks.len());
    if let Some(path) = &args.json {
        crate::cli::output::write_json(path, &rep)?;
    }
    if failed > 0 {
        bail!("{failed} device checks failed");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The repack checks hold on the host too (where pack and unpack are the CPU bodies), and
    /// fail on a weight that is not what was packed.
    /// The attention-into checks run on the host too (where the op is the CPU body's copy).
    #[test]
    fn attention_into_checks_pass_on_the_cpu() {
        let mut rep = Report::default();
        attention_into_checks(&mut rep, &Device::Cpu).unwrap();
        assert_eq!(rep.checks.len(), 3);
        assert!(
            rep.checks.iter().all(|c| c.pass && c.value == 0.0),
            "{:?}",
            rep.checks.iter().map(|c| (&c.name, c.value)).collect::<Vec<_>>()
        );
    }

    /// The grouped route checks hold on the host too (where the op is the CPU body itself).
    #[test]
    fn grouped_route_checks_pass_on_the_cpu() {
        let mut rep = Report::default();
        grouped_route_checks(&mut rep, &Device::Cpu).unwrap();
        assert_eq!(rep.checks.len(), 6);
        assert!(
            rep.checks.iter().all(|c| c.pass && c.value == 0.0),
            "{:?}",
            rep.checks.iter().map(|c| (&c.name, c.value, &c.detail)).collect::<Vec<_>>()
        );
    }

    #[test]
    fn repack_checks_pass_on_the_cpu() {
        let mut rep = Report::default();
        repack_checks(&mut rep, &Device::Cpu).unwrap();
        assert_eq!(rep.checks.len(), 4);
        assert!(
            rep.checks.iter().all(|c| c.pass),
            "{:?}",
            rep.checks.iter().map(|c| (&c.name, c.value)).collect::<Vec<_>>()
        );
        let w = Tensor::randn(0f32, 0.02, (64, 64), &Device::Cpu)
            .unwrap()
            .to_dtype(DType::BF16)
            .unwrap();
        assert!(
            rel_err(
                &crate::model::gemv::pack(&w).unwrap().flatten_all().unwrap(),
                &w.flatten_all().unwrap()
            )
            .unwrap()
                > 0.1,
            "packing moves values"
        );
    }
}
