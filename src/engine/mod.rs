//! The generation side: a decode loop over a [`Denoiser`], run on its own thread, talking to
//! the rest of the program only through events out and [`Control`] messages in.

pub mod clock;
mod decode;
pub mod fixed;
mod runner;
pub mod settings;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;

use anyhow::Result;

pub use decode::{decode, decode_measured, decode_with_events, Request};
pub use runner::{ModelDenoiser, RunOptions, RunStatus, PREFILL_CHUNK};

use crate::engine::settings::{DecodeSettings, SamplerSpec};
use crate::sampler::{PosSample, Ranked};
use crate::trace::events::Event;

/// What one forward pass of a decode takes, placed right after the cached prefix.
#[derive(Clone, Copy, Debug)]
pub struct Pass<'a> {
    /// Finished whole blocks that are not cached yet, forwarded first and stored by this pass:
    /// the prompt's whole blocks before the first decoded block, the previous block after it,
    /// nothing on a block's later steps. Storing them here instead of in a pass of their own
    /// is the same computation (they cannot attend to `block`) one forward cheaper.
    pub store: &'a [u32],
    /// The block being denoised, masks included: sampled at every position, not stored.
    pub block: &'a [u32],
}

impl Pass<'_> {
    /// Every id the pass forwards, in order: `store` then `block`.
    pub fn ids(&self) -> Vec<u32> {
        [self.store, self.block].concat()
    }
}

/// The forward passes of a block-diffusion decode (docs/decoding.md).
pub trait Denoiser: Send {
    /// Forgets every cached position and makes room for `capacity` positions.
    fn reset(&mut self, capacity: usize) -> Result<()>;
    /// One denoising pass: stores `pass.store` (block-causal among themselves) and returns a
    /// sample for every position of `pass.block`. `uniforms` holds one draw per position of
    /// the block (unused when greedy).
    fn denoise(
        &mut self,
        pass: Pass<'_>,
        sampling: &SamplerSpec,
        uniforms: &[f32],
    ) -> Result<Vec<PosSample>>;
    /// [`Denoiser::denoise`], and what `ask` asks for beyond the samples: for every position of
    /// the block its most probable tokens (`--candidates`), the pass's routing (`--routing`).
    /// A denoiser that has neither (a scripted one) returns the samples alone, as this default
    /// does.
    fn denoise_asked(
        &mut self,
        pass: Pass<'_>,
        sampling: &SamplerSpec,
        uniforms: &[f32],
        ask: Ask,
    ) -> Result<Denoised> {
        let _ = ask;
        Ok(Denoised { samples: self.denoise(pass, sampling, uniforms)?, ..Denoised::default() })
    }
}

/// What a decode asks of each pass beyond its samples.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Ask {
    /// Ranked tokens kept per position ([`crate::sampler::sample_ranked`]); 0 or 1: none.
    pub candidates: usize,
    /// The routing of a mixture-of-experts model's sparse layers.
    pub routing: bool,
}

impl Ask {
    /// Whether anything beyond the samples is asked.
    pub fn any(&self) -> bool {
        self.candidates > 1 || self.routing
    }
}

/// A pass's samples, and what an [`Ask`] asked for (empty where it was not asked or the
/// denoiser has none).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Denoised {
    pub samples: Vec<PosSample>,
    /// Per block position, its most probable tokens, most probable first.
    pub ranked: Vec<Vec<Ranked>>,
    pub routing: Option<PassRouting>,
}

/// How one pass routed, in the sparse layers' order (`ModelInfo::moe`).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PassRouting {
    /// Per sparse layer: distinct experts over every row the pass forwarded (stored and block).
    pub distinct: Vec<u32>,
    /// Per block position: its route in each sparse layer.
    pub block: Vec<Vec<crate::trace::events::Route>>,
}

impl PassRouting {
    /// From the routes of every row of a forward whose last `b` rows are the block.
    pub fn of(layers: Vec<crate::model::LayerRoutes>, b: usize) -> Self {
        let distinct = layers.iter().map(|l| l.distinct_experts() as u32).collect();
        let mut block = vec![Vec::with_capacity(layers.len()); b];
        for layer in layers {
            let first = layer.rows.len().saturating_sub(b);
            for (i, route) in layer.rows.into_iter().skip(first).enumerate() {
                block[i].push(route);
            }
        }
        PassRouting { distinct, block }
    }
}

/// Token ids to text, for event payloads.
pub trait Detok: Send + Sync {
    /// The token decoded alone.
    fn piece(&self, id: u32) -> String;
    fn decode(&self, ids: &[u32]) -> String;
    /// The bytes the token adds to a decode (its piece's bytes unless it splits a character).
    fn bytes(&self, id: u32) -> Vec<u8> {
        self.piece(id).into_bytes()
    }
}

impl Detok for crate::model::tokenizer::Tok {
    fn piece(&self, id: u32) -> String {
        crate::model::tokenizer::Tok::piece(self, id)
    }
    fn bytes(&self, id: u32) -> Vec<u8> {
        self.token_bytes(id)
    }
    fn decode(&self, ids: &[u32]) -> String {
        crate::model::tokenizer::Tok::decode(self, ids)
    }
}

/// Messages the front end sends to a running engine.
#[derive(Clone, Debug, PartialEq)]
pub enum Control {
    /// Stop before the next forward pass until `Resume`.
    Pause,
    Resume,
    /// Use these settings from the next block on (block length and length stay).
    Settings(DecodeSettings),
    /// End the current decode with reason `cancelled`.
    Cancel,
}

/// Messages to the engine thread between decodes.
pub enum Job {
    /// Decode this request (settings already validated), unless a later one superseded it
    /// before it started; the number orders submissions.
    Decode(Box<Request>, u64),
    /// Leave the thread.
    Quit,
}

/// A running engine thread: submit jobs, steer the current one, read its events elsewhere.
pub struct EngineThread {
    pub jobs: mpsc::Sender<Job>,
    pub control: mpsc::Sender<Control>,
    /// The number of the newest submission: an older queued job is skipped.
    latest: Arc<AtomicU64>,
    /// Set when the owner goes: no further job starts.
    closing: Arc<AtomicBool>,
    handle: Option<JoinHandle<()>>,
}

impl EngineThread {
    /// Spawns the thread. `sink` receives every event and must never block (an unbounded
    /// channel's sender, typically).
    pub fn spawn<S>(mut denoiser: Box<dyn Denoiser>, detok: Box<dyn Detok>, mut sink: S) -> Self
    where
        S: FnMut(Event) + Send + 'static,
    {
        let (jobs, job_rx) = mpsc::channel::<Job>();
        let (control, control_rx) = mpsc::channel::<Control>();
        let latest = Arc::new(AtomicU64::new(0));
        let closing = Arc::new(AtomicBool::new(false));
        let (latest_in, closing_in) = (latest.clone(), closing.clone());
        let handle = std::thread::Builder::new()
            .name("unmask-engine".into())
            .spawn(move || {
                while let Ok(Job::Decode(req, n)) = job_rx.recv() {
                    // Controls meant for an earlier decode must not leak into this one.
                    while control_rx.try_recv().is_ok() {}
                    // Checked after the drain: whoever set these sent a Cancel after setting
                    // them, so either the check sees them or the decode sees that Cancel.
                    if closing_in.load(Ordering::SeqCst) {
                        break;
                    }
                    if n != latest_in.load(Ordering::SeqCst) {
                        continue;
                    }
                    decode(denoiser.as_mut(), detok.as_ref(), &req, &mut sink, Some(&control_rx));
                }
            })
            .expect("spawning the engine thread");
        EngineThread { jobs, control, latest, closing, handle: Some(handle) }
    }

    /// Decodes `req`, replacing the decode under way (cancelled: its finish event says so)
    /// and any submitted earlier that has not started (skipped: it sends no event at all).
    pub fn submit(&self, req: Request) {
        let n = self.latest.fetch_add(1, Ordering::SeqCst) + 1;
        let _ = self.control.send(Control::Cancel);
        let _ = self.jobs.send(Job::Decode(Box::new(req), n));
    }

    pub fn send(&self, c: Control) {
        let _ = self.control.send(c);
    }
}

impl Drop for EngineThread {
    /// Cancels the decode between two forwards and skips any queued one, then joins.
    fn drop(&mut self) {
        self.closing.store(true, Ordering::SeqCst);
        let _ = self.control.send(Control::Cancel);
        let _ = self.jobs.send(Job::Quit);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}
