//! [`Denoiser`] over the real model: forward passes on the model's device, sampling of the
//! block's logits, and the KV cache contract (a pass stores the finished blocks it is given and
//! only reads the rest).
//!
//! On the CPU a denoising pass pulls the `[B, vocab]` f32 logits and runs the reference
//! sampler ([`crate::sampler::sample`]). On a GPU the sampler runs on the device
//! (kernels/sampler.cu) and only `B x (token, confidence, entropy, flag)` come back, and the
//! block passes run over fixed buffers ([`FixedPass`]) replayed as CUDA graphs. [`RunOptions`]
//! switches each of these (also on the CPU, where the device sampler is its CPU mirror), so
//! tests and the GPU check can compare every path with the reference one.

use anyhow::{anyhow, Result};
use candle_core::{DType, Device, Tensor};

use super::fixed::FixedPass;
use super::{Ask, Denoised, Denoiser, Pass, PassRouting};
use crate::engine::settings::SamplerSpec;
use crate::model::{KvCache, Model, PathChoices};
use crate::sampler::kernel::{native_dtype, sample_op, KernelParams, KernelSample};
use crate::sampler::{sample, sample_ranked, PosSample};

/// Which execution paths a [`ModelDenoiser`] takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct RunOptions {
    /// Sample with the device kernel (its CPU mirror on the CPU) instead of pulling logits.
    pub device_sampler: bool,
    /// Run block passes over fixed buffers (needs `device_sampler`).
    pub fixed_passes: bool,
    /// Capture fixed passes as CUDA graphs (CUDA only).
    pub cuda_graph: bool,
}

impl RunOptions {
    /// CPU: the reference path. GPU: everything on. Then `paths` turns each on or off where it
    /// names it (`UNMASK_DEVICE_SAMPLER`, `UNMASK_FIXED_PASSES`, `UNMASK_CUDA_GRAPH`); each
    /// still needs the one before it, and CUDA graphs a CUDA device.
    pub fn for_device(device: &Device, paths: &PathChoices) -> Self {
        let gpu = !device.is_cpu();
        #[allow(unused_mut)]
        let mut device_sampler = paths.device_sampler.unwrap_or(gpu);
        #[cfg(feature = "cuda")]
        if device_sampler && device.is_cuda() {
            if let Err(e) = crate::sampler::cuda::ptx() {
                crate::notice::warn(format!(
                    "sampler kernel unavailable, sampling on the host: {e}"
                ));
                device_sampler = false;
            }
        }
        let fixed_passes = paths.fixed_passes.unwrap_or(gpu) && device_sampler;
        let cuda_graph = paths.cuda_graph.unwrap_or(gpu) && fixed_passes && device.is_cuda();
        RunOptions { device_sampler, fixed_passes, cuda_graph }
    }

    pub fn reference() -> Self {
        RunOptions { device_sampler: false, fixed_passes: false, cuda_graph: false }
    }
}

/// What a denoiser actually did, for benchmark reports.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct RunStatus {
    pub options: Option<RunOptions>,
    /// Graph capture failed and passes ran eagerly: why.
    pub capture_error: Option<String>,
    /// Whether fixed passes are being replayed from CUDA graphs.
    pub graphs_live: bool,
    /// Positions the device sampler handed back to the host sampler (all of them with
    /// `--candidates` above 1).
    pub host_rows: usize,
    /// Whether every fixed pass runs the streamed layer (six kernels a layer into a workspace).
    pub streamed_layer: bool,
    /// Whether the streamed layer's projections are in the gemv kernel's packed order.
    pub packed_weights: bool,
}

pub struct ModelDenoiser {
    model: Model,
    cache: Option<KvCache>,
    /// Never sampled: a committed position must hold a real token.
    mask_id: u32,
    opts: RunOptions,
    /// One per pass shape a decode uses (a block alone; a block after the one it stores).
    fixed: Vec<FixedPass>,
    host_rows: usize,
}

impl ModelDenoiser {
    /// A denoiser on the paths `paths` chooses for the model's device ([`RunOptions::for_device`]).
    pub fn new(model: Model, mask_id: u32, paths: &PathChoices) -> Self {
        let opts = RunOptions::for_device(model.device(), paths);
        Self::with_options(model, mask_id, opts)
    }

    pub fn with_options(model: Model, mask_id: u32, opts: RunOptions) -> Self {
        ModelDenoiser { model, cache: None, mask_id, opts, fixed: Vec::new(), host_rows: 0 }
    }

    pub fn model(&self) -> &Model {
        &self.model
    }

    pub fn options(&self) -> RunOptions {
        self.opts
    }

    pub fn status(&self) -> RunStatus {
        RunStatus {
            options: Some(self.opts),
            capture_error: self.fixed.iter().find_map(|f| f.capture_error.clone()),
            graphs_live: !self.fixed.is_empty() && self.fixed.iter().all(|f| f.capturing()),
            host_rows: self.host_rows,
            streamed_layer: !self.fixed.is_empty() && self.fixed.iter().all(FixedPass::streams),
            packed_weights: self.model.packed(),
        }
    }

    /// One eager forward pass over `pass.store` then `pass.block`, storing the former.
    /// Returns the block's final hidden states, and (`routed`) how the pass routed.
    fn pass(&mut self, pass: Pass<'_>, routed: bool) -> Result<(Tensor, Option<PassRouting>)> {
        let cache = self.cache.as_mut().ok_or_else(|| anyhow!("denoiser used before reset"))?;
        let (s, b) = (pass.store.len(), pass.block.len());
        let ids = pass.ids();
        let done = prefill_chunks(&self.model, &ids[..s], cache, b)?;
        let (hidden, routes) = match routed {
            true => self.model.forward_routed(&ids[done..], cache, b, s - done)?,
            false => (self.model.forward(&ids[done..], cache, b, s - done)?, Vec::new()),
        };
        Ok((hidden.narrow(0, s - done, b)?, routed.then(|| PassRouting::of(routes, b))))
    }

    /// The fixed buffers for passes storing `s` and sampling `b` positions, made on first use.
    fn fixed_index(&mut self, s: usize, b: usize) -> Result<usize> {
        let capacity =
            self.cache.as_ref().ok_or_else(|| anyhow!("denoiser used before reset"))?.capacity();
        if let Some(i) = self.fixed.iter().position(|f| f.fits(s, b, capacity)) {
            return Ok(i);
        }
        self.fixed.push(FixedPass::new(&self.model, s, b, capacity, self.opts.cuda_graph)?);
        Ok(self.fixed.len() - 1)
    }

    /// Fixed-buffer pass `i`; returns its buffers (samples and logits on the device).
    fn fixed_pass(
        &mut self,
        i: usize,
        pass: Pass<'_>,
        head: &KernelParams,
        u: Option<&[f32]>,
    ) -> Result<&FixedPass> {
        let cache = self.cache.as_mut().ok_or_else(|| anyhow!("denoiser used before reset"))?;
        self.fixed[i].run(&self.model, cache, pass, head, u)?;
        cache.advance(pass.store.len())?;
        Ok(&self.fixed[i])
    }

    /// The reference sampler on one row of logits (the mask suppressed).
    fn host_sample(&mut self, mut row: Vec<f32>, sampling: &SamplerSpec, u: f32) -> PosSample {
        self.host_rows += 1;
        if let Some(z) = row.get_mut(self.mask_id as usize) {
            *z = f32::NEG_INFINITY;
        }
        sample(&row, sampling, u)
    }
}

fn to_pos(k: &KernelSample) -> PosSample {
    PosSample { token: k.token, conf: k.conf, entropy: k.entropy }
}

/// Rows a prompt is stored in at most per forward, before the pass that carries the block: a
/// long prompt's attention then holds `[chunk, keys]` scores, not `[prompt, prompt]` (a 32k
/// prompt's would need tens of GB). Short prompts (the common case, and every golden) take one
/// pass as before.
pub const PREFILL_CHUNK: usize = 512;

/// Stores the leading whole chunks of `store` (a multiple of `block` rows) into the cache, as
/// one committed forward each would (`Model::store_chunks`: layer by layer, so packed weights
/// are unpacked once for all of them), leaving at most [`PREFILL_CHUNK`] rows for the pass
/// that follows; returns the rows stored. Chunks start on block boundaries, so the
/// block-causal mask of each is the one the whole prompt would have had.
pub fn prefill_chunks(
    model: &Model,
    store: &[u32],
    cache: &mut KvCache,
    block: usize,
) -> Result<usize> {
    let chunk = (PREFILL_CHUNK / block).max(1) * block;
    let done = store.len().saturating_sub(1) / chunk * chunk;
    if done > 0 {
        model.store_chunks(&store[..done], chunk, cache, block)?;
    }
    Ok(done)
}

impl Denoiser for ModelDenoiser {
    fn reset(&mut self, capacity: usize) -> Result<()> {
        // Reuse the allocation when it is big enough: a restart should not reallocate.
        match &mut self.cache {
            Some(c) if c.capacity() >= capacity => c.clear(),
            _ => {
                // Captured graphs point into the old cache.
                self.fixed.clear();
                self.cache = Some(self.model.new_cache(capacity)?)
            }
        }
        Ok(())
    }

    /// `--candidates` above 1 always takes the host path, on any device: ranking needs every
    /// probability of a row, and the device sampler (kernels/sampler.cu) hands back one token
    /// per position. So such a decode runs eager passes and pulls `[B, vocab]` f32 logits every
    /// step (on a GPU, much slower than the default; its tokens are the reference sampler's).
    /// `--routing` alone keeps the pass the decode would run anyway.
    fn denoise_asked(
        &mut self,
        pass: Pass<'_>,
        sampling: &SamplerSpec,
        uniforms: &[f32],
        ask: Ask,
    ) -> Result<Denoised> {
        self.fit_layout(pass.block.len())?;
        let cpu = self.model.device().is_cpu();
        on_the_pool(cpu, || self.denoise_here(pass, sampling, uniforms, ask))
    }

    fn denoise(
        &mut self,
        pass: Pass<'_>,
        sampling: &SamplerSpec,
        uniforms: &[f32],
    ) -> Result<Vec<PosSample>> {
        self.fit_layout(pass.block.len())?;
        let cpu = self.model.device().is_cpu();
        on_the_pool(cpu, || Ok(self.sampled(pass, sampling, uniforms, false)?.0))
    }
}

/// Runs a CPU pass on one of the pool's threads rather than on the engine's: a pass forks
/// and joins about 140 times (every product, every attention), and from outside the pool each
/// fork wakes the workers and puts the engine's thread to sleep, where inside it the idle
/// worker is usually still spinning from the last product and steals its half at once.
fn on_the_pool<R: Send>(cpu: bool, f: impl FnOnce() -> R + Send) -> R {
    if cpu && crate::model::linear::threads() > 1 {
        rayon::scope(|_| f())
    } else {
        f()
    }
}

impl ModelDenoiser {
    /// Packed weights for a decode whose every pass the gemv takes in one launch: blocks of up
    /// to 4 (a block's first pass also stores the block before it, 2B rows). Longer blocks read
    /// rows: packed, their 16-row passes would read each weight twice and wider ones unpack it
    /// every pass. The layout changes only where the block length does; graphs captured
    /// before point at the old weights, so they go.
    fn fit_layout(&mut self, block: usize) -> Result<()> {
        if self.model.set_packed(2 * block <= crate::model::gemv::MAX_ROWS)? {
            self.fixed.clear();
        }
        Ok(())
    }

    fn denoise_here(
        &mut self,
        pass: Pass<'_>,
        sampling: &SamplerSpec,
        uniforms: &[f32],
        ask: Ask,
    ) -> Result<Denoised> {
        if ask.candidates <= 1 {
            let (samples, routing) = self.sampled(pass, sampling, uniforms, ask.routing)?;
            return Ok(Denoised { samples, ranked: Vec::new(), routing });
        }
        let (hidden, routing) = self.pass(pass, ask.routing)?;
        let mut logits = self.model.logits(&hidden)?.to_dtype(DType::F32)?.to_vec2::<f32>()?;
        if self.opts.device_sampler {
            self.host_rows += logits.len();
        }
        let (samples, ranked) = sample_rows(&mut logits, uniforms, self.mask_id, |row, u| {
            sample_ranked(row, sampling, u, ask.candidates)
        })
        .into_iter()
        .unzip();
        Ok(Denoised { samples, ranked, routing })
    }
}

impl ModelDenoiser {
    /// A pass sampled by the fastest path the options allow, and (`routed`) its routing. A pass
    /// replayed from fixed buffers reads its routing back from the device tables, which only the
    /// streamed layer fills; a routed pass that would not stream runs eagerly.
    fn sampled(
        &mut self,
        pass: Pass<'_>,
        sampling: &SamplerSpec,
        uniforms: &[f32],
        routed: bool,
    ) -> Result<(Vec<PosSample>, Option<PassRouting>)> {
        let params = KernelParams::new(sampling, self.mask_id);
        let u = (!sampling.is_greedy()).then_some(uniforms);
        let (s, b) = (pass.store.len(), pass.block.len());
        // A prompt prefill is a one-off of any length: eager, not worth a fixed shape.
        let fixed = match self.opts.fixed_passes && s <= b {
            true => Some(self.fixed_index(s, b)?),
            false => None,
        };
        if let Some(i) = fixed.filter(|&i| !routed || self.fixed[i].streams()) {
            let fixed = self.fixed_pass(i, pass, &params, u)?;
            let ks = fixed.samples()?;
            let rows: Vec<Option<Vec<f32>>> = ks
                .iter()
                .enumerate()
                .map(|(r, k)| if k.overflow { fixed.logits_row(r).map(Some) } else { Ok(None) })
                .collect::<Result<_>>()?;
            let routing = match routed {
                true => Some(PassRouting::of(self.model.streamed_routes(s + b)?, b)),
                false => None,
            };
            let samples = ks
                .iter()
                .zip(rows)
                .zip(uniforms)
                .map(|((k, row), &u)| match row {
                    Some(row) => self.host_sample(row, sampling, u),
                    None => to_pos(k),
                })
                .collect();
            return Ok((samples, routing));
        }
        let (hidden, routing) = self.pass(pass, routed)?;
        if self.opts.device_sampler {
            let mut logits = self.model.logits_raw(&hidden)?;
            if !native_dtype(logits.dtype()) {
                logits = logits.to_dtype(DType::F32)?;
            }
            let ut = Tensor::from_slice(uniforms, uniforms.len(), logits.device())?;
            let out = sample_op(&logits, &ut, params)?.to_vec2::<f32>()?;
            let mut samples = Vec::with_capacity(out.len());
            for (r, (o, &u)) in out.iter().zip(uniforms).enumerate() {
                let k = KernelSample::from_row(o);
                samples.push(if k.overflow {
                    let row =
                        logits.narrow(0, r, 1)?.to_dtype(DType::F32)?.flatten_all()?.to_vec1()?;
                    self.host_sample(row, sampling, u)
                } else {
                    to_pos(&k)
                });
            }
            return Ok((samples, routing));
        }
        let mut logits = self.model.logits(&hidden)?.to_vec2::<f32>()?;
        Ok((
            sample_rows(&mut logits, uniforms, self.mask_id, |row, u| sample(row, sampling, u)),
            routing,
        ))
    }
}

/// `f` on every row of `logits` with its uniform, the mask suppressed first. Rows of a real
/// vocabulary (a softmax over 152k logits takes about a millisecond) are shared out between
/// the threads; each row's result depends only on the row, so the order is the same.
fn sample_rows<T: Send>(
    logits: &mut [Vec<f32>],
    uniforms: &[f32],
    mask: u32,
    f: impl Fn(&[f32], f32) -> T + Sync,
) -> Vec<T> {
    use rayon::prelude::*;
    let one = |(row, &u): (&mut Vec<f32>, &f32)| {
        if let Some(z) = row.get_mut(mask as usize) {
            *z = f32::NEG_INFINITY;
        }
        f(row, u)
    };
    let wide =
        logits.len() > 1 && logits.iter().map(Vec::len).sum::<usize>() >= SAMPLE_PARALLEL_FROM;
    if wide && crate::model::linear::threads() > 1 {
        logits.par_iter_mut().zip(uniforms).map(one).collect()
    } else {
        logits.iter_mut().zip(uniforms).map(one).collect()
    }
}

/// Logits in a pass from which its rows are sampled on several threads.
const SAMPLE_PARALLEL_FROM: usize = 1 << 17;

#[cfg(test)]
mod sample_tests {
    use super::*;

    /// Rows wide enough to be shared out between threads sample as one row at a time does, in
    /// order, the mask suppressed (here the argmax of every row).
    #[test]
    fn rows_sampled_on_the_pool_equal_rows_sampled_one_by_one() {
        let (vocab, mask) = (50_000, 7u32);
        let mut logits: Vec<Vec<f32>> = (0..4)
            .map(|r| (0..vocab).map(|i| ((i * 31 + r * 17) % 1009) as f32 / 100.0).collect())
            .collect();
        for row in &mut logits {
            row[mask as usize] = 1e3;
        }
        assert!(4 * vocab >= SAMPLE_PARALLEL_FROM, "wide enough for the pool");
        let s = SamplerSpec::from(crate::engine::settings::Sampling {
            temperature: 0.7,
            top_k: 40,
            top_p: 0.95,
            seed: 0,
        });
        let u = [0.1, 0.5, 0.9, 0.3];
        let want: Vec<PosSample> = logits
            .iter()
            .zip(u)
            .map(|(row, u)| {
                let mut row = row.clone();
                row[mask as usize] = f32::NEG_INFINITY;
                sample(&row, &s, u)
            })
            .collect();
        let got = sample_rows(&mut logits, &u, mask, |row, u| sample(row, &s, u));
        assert_eq!(format!("{got:?}"), format!("{want:?}"));
        assert!(got.iter().all(|p| p.token != mask));
    }
}

#[cfg(test)]
mod prefill_tests {
    use super::*;
    use crate::model::random::{shape_config, RandomWeights};

    /// A 600-token prompt stored as 512 + 88 rows then the block gives the block the logits of
    /// the one-shot pass over all 604 rows (the same keys, the same mask).
    #[test]
    fn a_long_prompt_is_stored_in_chunks_with_the_same_result() {
        let cfg = shape_config("tiny").unwrap();
        let m =
            Model::load(&cfg, &RandomWeights::on_host(&cfg, 4), DType::F32, &Device::Cpu).unwrap();
        let ids: Vec<u32> = (0..604u32).map(|i| (i * 37 + 5) % 350).collect();
        let (store, block) = (&ids[..600], 4);
        let mut one = m.new_cache(608).unwrap();
        let whole = m
            .logits(&m.forward(&ids, &mut one, block, 600).unwrap().narrow(0, 600, 4).unwrap())
            .unwrap();
        let mut cache = m.new_cache(608).unwrap();
        let done = prefill_chunks(&m, store, &mut cache, block).unwrap();
        assert_eq!((done, cache.len()), (512, 512));
        let rest = m
            .forward(&ids[done..], &mut cache, block, 600 - done)
            .unwrap()
            .narrow(0, 600 - done, 4)
            .unwrap();
        let chunked = m.logits(&rest).unwrap();
        assert_eq!(cache.len(), 600);
        let (a, b) = (
            whole.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
            chunked.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
        );
        let worst = a.iter().zip(&b).map(|(x, y)| (x - y).abs()).fold(0f32, f32::max);
        assert!(worst < 1e-4, "chunked prefill differs by {worst}");
        // a short prompt is not chunked
        let mut c2 = m.new_cache(608).unwrap();
        assert_eq!(prefill_chunks(&m, &ids[..512], &mut c2, block).unwrap(), 0);
    }

    /// Chunks stored layer by layer (`Model::store_chunks`, what `prefill_chunks` runs) leave
    /// the cache one committed forward a chunk leaves, value for value: the pass after them
    /// gives the same logits bit for bit, in f32 and with packed bf16 weights (unpacked once a
    /// layer there, once a chunk in a forward).
    #[test]
    fn chunks_stored_layer_by_layer_equal_a_forward_a_chunk() {
        let cfg = shape_config("tiny").unwrap();
        let ids: Vec<u32> = (0..1040u32).map(|i| (i * 53 + 11) % 350).collect();
        let (block, chunk) = (4, 512);
        for packed in [false, true] {
            let dtype = if packed { DType::BF16 } else { DType::F32 };
            let load = || {
                let mut m =
                    Model::load(&cfg, &RandomWeights::on_host(&cfg, 7), dtype, &Device::Cpu)
                        .unwrap();
                if packed {
                    m.use_row_weights().unwrap();
                    assert!(m.packed());
                }
                m
            };
            let after = |m: &Model, cache: &mut KvCache| -> Vec<f32> {
                let h = m.forward(&ids[1024..], cache, block, 0).unwrap();
                m.logits(&h).unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap()
            };
            let (a, b) = (load(), load());
            let mut by_chunk = a.new_cache(1040).unwrap();
            for c in ids[..1024].chunks(chunk) {
                a.forward(c, &mut by_chunk, block, chunk).unwrap();
            }
            let mut by_layer = b.new_cache(1040).unwrap();
            assert_eq!(prefill_chunks(&b, &ids[..1030], &mut by_layer, block).unwrap(), 1024);
            // prefill_chunks stored 1024 of the 1030 (two chunks); the pass after reads them
            assert_eq!((by_chunk.len(), by_layer.len()), (1024, 1024));
            assert_eq!(after(&a, &mut by_chunk), after(&b, &mut by_layer), "packed {packed}");
        }
        let m =
            Model::load(&cfg, &RandomWeights::on_host(&cfg, 7), DType::F32, &Device::Cpu).unwrap();
        let mut small = m.new_cache(600).unwrap();
        assert!(
            m.store_chunks(&ids[..1024], chunk, &mut small, block).is_err(),
            "past the capacity"
        );
        assert!(m.store_chunks(&ids[..8], 0, &mut small, block).is_err(), "chunks of no rows");
    }

    /// A decode's blocks choose the layout: packed where every pass fits one launch of the
    /// gemv (blocks of up to 4), rows past that; and a block of 8 decodes alike either way.
    #[test]
    fn the_block_length_chooses_packed_weights_or_rows() {
        let cfg = shape_config("tiny").unwrap();
        let load = || {
            let mut m =
                Model::load(&cfg, &RandomWeights::on_host(&cfg, 3), DType::BF16, &Device::Cpu)
                    .unwrap();
            m.use_row_weights().unwrap();
            m
        };
        let greedy = SamplerSpec::default();
        let prompt: Vec<u32> = (0..16u32).map(|i| (i * 29 + 3) % 350).collect();
        let mut d = ModelDenoiser::new(load(), cfg.vocab_size as u32 - 1, &PathChoices::DEFAULT);
        assert!(d.model().packed());
        d.reset(64).unwrap();
        let block8 = [5u32; 8];
        let first = d.denoise(Pass { store: &prompt, block: &block8 }, &greedy, &[0.0; 8]).unwrap();
        assert!(!d.model().packed(), "16-row passes read rows");
        let mut rows = load();
        assert!(
            rows.set_packed(false).unwrap() && !rows.set_packed(false).unwrap(),
            "a change, then none"
        );
        let mut r = ModelDenoiser::new(rows, cfg.vocab_size as u32 - 1, &PathChoices::DEFAULT);
        r.reset(64).unwrap();
        let want = r.denoise(Pass { store: &prompt, block: &block8 }, &greedy, &[0.0; 8]).unwrap();
        let tokens =
            |s: &[PosSample]| s.iter().map(|p| (p.token, p.conf.to_bits())).collect::<Vec<_>>();
        assert_eq!(tokens(&first), tokens(&want));
        d.reset(64).unwrap();
        d.denoise(Pass { store: &prompt, block: &[5u32; 4] }, &greedy, &[0.0; 4]).unwrap();
        assert!(d.model().packed(), "blocks of 4: packed again");
    }
}
