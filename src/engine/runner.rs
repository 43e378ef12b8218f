//! [`Denoiser`] over the real model: forward passes on the model's device, sampling of the
//! block's logits, and the KV cache contract (denoise reads, prefill and commit store).

use anyhow::Result;

use super::Denoiser;
use crate::model::{KvCache, Qwen3};
use crate::sampler::{sample, PosSample};
use crate::settings::Sampling;

pub struct ModelDenoiser {
    model: Qwen3,
    cache: Option<KvCache>,
    /// Never sampled: a committed position must hold a real token.
    mask_id: u32,
}

impl ModelDenoiser {
    pub fn new(model: Qwen3, mask_id: u32) -> Self {
        ModelDenoiser { model, cache: None, mask_id }
    }

    pub fn model(&self) -> &Qwen3 {
        &self.model
    }

    /// One forward pass; `store` commits its K/V. Returns the final hidden states.
    fn pass(&mut self, ids: &[u32], block: usize, store: bool) -> Result<candle_core::Tensor> {
        let cache = self.cache.as_mut().ok_or_else(|| anyhow::anyhow!("denoiser used before reset"))?;
        self.model.forward(ids, cache, block, store)
    }
}

impl Denoiser for ModelDenoiser {
    fn reset(&mut self, capacity: usize) -> Result<()> {
        // Reuse the allocation when it is big enough: a restart should not reallocate.
        match &mut self.cache {
            Some(c) if c.capacity() >= capacity => c.clear(),
            _ => self.cache = Some(self.model.new_cache(capacity)?),
        }
        Ok(())
    }

    fn prefill(&mut self, ids: &[u32], block: usize) -> Result<()> {
        self.pass(ids, block, true).map(drop)
    }

    fn denoise(&mut self, ids: &[u32], block: usize, sampling: &Sampling, uniforms: &[f32]) -> Result<Vec<PosSample>> {
        let hidden = self.pass(ids, block, false)?;
        let mut logits = self.model.logits(&hidden)?.to_vec2::<f32>()?;
        let mask = self.mask_id as usize;
        Ok(logits
            .iter_mut()
            .zip(uniforms)
            .map(|(row, &u)| {
                if let Some(z) = row.get_mut(mask) {
                    *z = f32::NEG_INFINITY;
                }
                sample(row, sampling, u)
            })
            .collect())
    }

    fn commit(&mut self, ids: &[u32], block: usize) -> Result<()> {
        self.pass(ids, block, true).map(drop)
    }
}
