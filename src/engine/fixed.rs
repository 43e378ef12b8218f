//! Fixed-shape block passes: the denoising passes of a decode, run over device buffers that
//! keep their address for the whole decode, so that on CUDA one captured graph per kind of
//! pass replays every one of them (no per-kernel launch cost on the host). A kind is a shape
//! (the block alone, or the block after the finished block it stores) and sampling parameters.
//!
//! A pass attends over the whole cache (`keys == capacity`) with a mask that hides the slots
//! not written yet, writes its K/V to the slots its positions name, and samples the block on
//! the device: only `[block, 4]` floats come back. The same code runs on the CPU
//! (without capture), which is how CI tests it; on CUDA, [`FixedPass::run`] captures the body
//! the first time it sees a kind of pass and replays the graph afterwards.

use anyhow::{bail, Result};
use candle_core::{DType, Tensor};

use super::Pass;
use crate::model::{KvCache, Model, PassInput};
use crate::sampler::kernel::{sample_op, KernelParams, KernelSample};

pub struct FixedPass {
    /// Positions stored before the block, and the block's length; a pass forwards both.
    store: usize,
    block: usize,
    capacity: usize,
    ids: Tensor,
    positions: Tensor,
    mask: Tensor,
    uniforms: Tensor,
    logits: Tensor,
    samples: Tensor,
    /// Start position the positions and mask buffers hold.
    written_start: Option<usize>,
    /// Try CUDA graph capture (turned off for good after a failure).
    capture: bool,
    #[cfg(feature = "cuda")]
    graphs: Vec<(KernelParams, graph::Graph)>,
    /// Why capture was turned off, if it was.
    pub capture_error: Option<String>,
    /// The passes run the model's streamed layer (`Model::streams`, asked once: it sizes a
    /// workspace to answer).
    streams: bool,
}

impl FixedPass {
    /// Buffers for passes that store `store` positions and sample the `block` after them, over
    /// a cache of `capacity` slots.
    pub fn new(
        model: &Model,
        store: usize,
        block: usize,
        capacity: usize,
        capture: bool,
    ) -> Result<Self> {
        let dev = model.device();
        let dt = model.dtype();
        let t = store + block;
        Ok(FixedPass {
            store,
            block,
            capacity,
            ids: Tensor::zeros(t, DType::U32, dev)?,
            positions: Tensor::zeros(t, DType::U32, dev)?,
            mask: Tensor::zeros((t, capacity), dt, dev)?,
            uniforms: Tensor::zeros(block, DType::F32, dev)?,
            logits: Tensor::zeros((block, model.vocab_size()), dt, dev)?,
            samples: Tensor::zeros((block, 4), DType::F32, dev)?,
            written_start: None,
            // a MoE model off the streamed layer routes on the host (MoeBlock::forward): no graph
            capture: capture
                && cfg!(feature = "cuda")
                && dev.is_cuda()
                && model.capturable(t, capacity),
            #[cfg(feature = "cuda")]
            graphs: Vec::new(),
            capture_error: None,
            streams: model.streams(t, capacity),
        })
    }

    pub fn fits(&self, store: usize, block: usize, capacity: usize) -> bool {
        self.store == store && self.block == block && self.capacity == capacity
    }

    /// Whether these passes run the model's streamed layer (see `Model::streams`).
    pub fn streams(&self) -> bool {
        self.streams
    }

    pub fn capturing(&self) -> bool {
        self.capture
    }

    /// Rewrites the input buffers for a pass at the cache's current length.
    fn write(
        &mut self,
        model: &Model,
        pass: Pass<'_>,
        start: usize,
        uniforms: Option<&[f32]>,
    ) -> Result<()> {
        let dev = model.device();
        if (pass.store.len(), pass.block.len()) != (self.store, self.block) {
            bail!(
                "fixed pass of {}+{} positions got {}+{}",
                self.store,
                self.block,
                pass.store.len(),
                pass.block.len()
            );
        }
        let t = self.store + self.block;
        if start + t > self.capacity {
            bail!("KV cache overflow: {start} + {t} positions > capacity {}", self.capacity);
        }
        self.ids.slice_set(&Tensor::from_vec(pass.ids(), t, dev)?, 0, 0)?;
        if self.written_start != Some(start) {
            let (pos, mask) = PassInput::window(start, t, self.block, self.capacity);
            self.positions.slice_set(&Tensor::from_vec(pos, t, dev)?, 0, 0)?;
            let mask = Tensor::from_vec(mask, (t, self.capacity), dev)?.to_dtype(model.dtype())?;
            self.mask.slice_set(&mask, 0, 0)?;
            self.written_start = Some(start);
        }
        if let Some(u) = uniforms {
            self.uniforms.slice_set(&Tensor::from_slice(u, self.block, dev)?, 0, 0)?;
        }
        Ok(())
    }

    /// The pass itself: everything a graph captures. Reads and writes only the buffers above
    /// and the cache; every temporary is freed before it returns.
    fn body(&self, model: &Model, cache: &KvCache, head: &KernelParams) -> Result<()> {
        let input = PassInput {
            ids: self.ids.clone(),
            positions: self.positions.clone(),
            keys: self.capacity,
            mask: Some(self.mask.clone()),
        };
        let hidden = model.forward_input(&input, cache)?.narrow(0, self.store, self.block)?;
        let logits = model.logits_raw(&hidden)?;
        self.logits.slice_set(&logits, 0, 0)?;
        let s = sample_op(&self.logits, &self.uniforms, *head)?;
        self.samples.slice_set(&s, 0, 0)?;
        Ok(())
    }

    /// Runs one pass placed after the cache's prefix and samples the block with `head`. Writes
    /// the K/V of every position; the caller commits `pass.store` by advancing the cache.
    pub fn run(
        &mut self,
        model: &Model,
        cache: &KvCache,
        pass: Pass<'_>,
        head: &KernelParams,
        uniforms: Option<&[f32]>,
    ) -> Result<()> {
        self.write(model, pass, cache.len(), uniforms)?;
        #[cfg(feature = "cuda")]
        if self.capture {
            let key = *head;
            if let Some((_, g)) = self.graphs.iter().find(|(k, _)| *k == key) {
                return g.launch();
            }
            match graph::capture(model, || self.body(model, cache, head)) {
                Ok(g) => {
                    g.launch()?;
                    self.graphs.push((key, g));
                    return Ok(());
                }
                Err(e) => {
                    self.capture = false;
                    self.capture_error = Some(format!("{e:#}"));
                    crate::notice::warn(format!(
                        "CUDA graph capture failed, running passes eagerly: {e:#}"
                    ));
                }
            }
        }
        self.body(model, cache, head)
    }

    /// The samples of the last pass, one per block position.
    pub fn samples(&self) -> Result<Vec<KernelSample>> {
        Ok(self.samples.to_vec2::<f32>()?.iter().map(|r| KernelSample::from_row(r)).collect())
    }

    /// Row `r` of the last denoising pass's logits, in f32 (for rows the kernel left to the host).
    pub fn logits_row(&self, r: usize) -> Result<Vec<f32>> {
        Ok(self.logits.narrow(0, r, 1)?.to_dtype(DType::F32)?.flatten_all()?.to_vec1()?)
    }
}

#[cfg(feature = "cuda")]
mod graph {
    use anyhow::{anyhow, Result};
    use candle_core::cuda_backend::cudarc::driver::sys::{
        CUgraphInstantiate_flags, CUstreamCaptureMode,
    };
    use candle_core::cuda_backend::cudarc::driver::CudaGraph;

    use crate::model::Model;

    /// A captured pass. cudarc's graph holds raw driver handles; it is only ever used by the one
    /// thread that owns the denoiser at a time.
    pub struct Graph(CudaGraph);
    // SAFETY: see above; the graph is never shared, only moved with its denoiser.
    unsafe impl Send for Graph {}

    impl Graph {
        pub fn launch(&self) -> Result<()> {
            self.0.launch().map_err(|e| anyhow!("CUDA graph launch: {e:?}"))
        }
    }

    /// Runs `body` once eagerly (loads modules, fills candle's cache of small parameter
    /// uploads, sizes cuBLAS's workspace), then captures it on the device's stream.
    pub fn capture(model: &Model, body: impl Fn() -> Result<()>) -> Result<Graph> {
        let dev = model.device().as_cuda_device()?;
        let stream = dev.cuda_stream();
        let _cache = dev.enable_cuda_graph_htod_cache();
        body()?;
        stream.synchronize().map_err(|e| anyhow!("synchronize: {e:?}"))?;
        stream
            .begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
            .map_err(|e| anyhow!("begin capture: {e:?}"))?;
        let r = body();
        let g = stream.end_capture(CUgraphInstantiate_flags(0));
        r?;
        let g =
            g.map_err(|e| anyhow!("end capture: {e:?}"))?.ok_or_else(|| anyhow!("empty graph"))?;
        g.upload().map_err(|e| anyhow!("graph upload: {e:?}"))?;
        Ok(Graph(g))
    }
}
