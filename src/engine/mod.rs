//! The generation side: a decode loop over a [`Denoiser`], run on its own thread, talking to
//! the rest of the program only through events out and [`Control`] messages in.

mod decode;
pub mod fixed;
mod runner;

use std::sync::mpsc;
use std::thread::JoinHandle;

use anyhow::Result;

pub use decode::{decode, decode_with_events, Request};
pub use runner::{ModelDenoiser, RunOptions, RunStatus};

use crate::events::Event;
use crate::sampler::PosSample;
use crate::settings::{DecodeSettings, Sampling};

/// The three kinds of forward pass a block-diffusion decode needs (docs/decoding.md).
pub trait Denoiser: Send {
    /// Forgets every cached position and makes room for `capacity` positions.
    fn reset(&mut self, capacity: usize) -> Result<()>;
    /// Stores the K/V of whole prompt blocks (block-causal among themselves).
    fn prefill(&mut self, ids: &[u32], block: usize) -> Result<()>;
    /// One denoising pass over the current block, not stored: a sample for every position.
    /// `uniforms` holds one draw per position (unused when greedy).
    fn denoise(&mut self, ids: &[u32], block: usize, sampling: &Sampling, uniforms: &[f32]) -> Result<Vec<PosSample>>;
    /// Stores the K/V of the finished block.
    fn commit(&mut self, ids: &[u32], block: usize) -> Result<()>;
}

/// Token ids to text, for event payloads.
pub trait Detok: Send + Sync {
    fn piece(&self, id: u32) -> String;
    fn decode(&self, ids: &[u32]) -> String;
}

impl Detok for crate::tokenizer::Tok {
    fn piece(&self, id: u32) -> String {
        crate::tokenizer::Tok::piece(self, id)
    }
    fn decode(&self, ids: &[u32]) -> String {
        crate::tokenizer::Tok::decode(self, ids)
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
    /// Decode this request (settings already validated).
    Decode(Box<Request>),
    /// Leave the thread.
    Quit,
}

/// A running engine thread: submit jobs, steer the current one, read its events elsewhere.
pub struct EngineThread {
    pub jobs: mpsc::Sender<Job>,
    pub control: mpsc::Sender<Control>,
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
        let handle = std::thread::Builder::new()
            .name("unmask-engine".into())
            .spawn(move || {
                while let Ok(Job::Decode(req)) = job_rx.recv() {
                    // Controls meant for an earlier decode must not leak into this one.
                    while control_rx.try_recv().is_ok() {}
                    decode(denoiser.as_mut(), detok.as_ref(), &req, &mut sink, Some(&control_rx));
                }
            })
            .expect("spawning the engine thread");
        EngineThread { jobs, control, handle: Some(handle) }
    }

    pub fn submit(&self, req: Request) {
        let _ = self.jobs.send(Job::Decode(Box::new(req)));
    }

    pub fn send(&self, c: Control) {
        let _ = self.control.send(c);
    }
}

impl Drop for EngineThread {
    fn drop(&mut self) {
        let _ = self.control.send(Control::Cancel);
        let _ = self.jobs.send(Job::Quit);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}
