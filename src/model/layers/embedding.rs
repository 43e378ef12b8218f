//! The ends of the network: the token embedding, and lm_head, which may be the embedding
//! itself (tied).

use anyhow::Result;
use candle_core::{DType, Tensor};

use crate::model::linear::Linear;
use crate::model::loader::Loader;

/// The token embedding `[vocab, hidden]`.
pub struct Embedding {
    /// As stored where the projections keep bf16 (the CPU's bf16 path widens the rows a pass
    /// looks up, not the whole table at load), else in the compute dtype.
    pub table: Tensor,
    /// The checkpoint's name for it: a tied lm_head maps the same bytes.
    name: String,
}

impl Embedding {
    pub fn load(b: &Loader, name: &str, (vocab, hidden): (usize, usize)) -> Result<Self> {
        Ok(Embedding { table: b.embedding(name, &[vocab, hidden])?, name: name.to_string() })
    }

    /// The rows of `ids` `[T]` in `dtype`.
    pub fn forward(&self, ids: &Tensor, dtype: DType) -> Result<Tensor> {
        Ok(self.table.index_select(ids, 0)?.to_dtype(dtype)?)
    }

    pub fn vocab(&self) -> usize {
        self.table.dims()[0]
    }

    pub fn bytes(&self) -> usize {
        self.table.elem_count() * self.table.dtype().size_in_bytes()
    }
}

/// The output projection `hidden -> vocab`.
pub struct LmHead {
    pub proj: Linear,
    /// The projection is the embedding matrix (its bytes are counted once).
    pub tied: bool,
}

impl LmHead {
    /// `name` `[vocab, hidden]`, or the embedding where `tie` (config.json
    /// `tie_word_embeddings`) and the checkpoint lacks `name`: some tied checkpoints still ship
    /// lm_head; an untied one must.
    pub fn load(b: &Loader, name: &str, embed: &Embedding, tie: bool) -> Result<Self> {
        let (vocab, h) = embed.table.dims2()?;
        let tied = tie && !b.contains(name);
        let proj = if tied {
            // the embedding already loaded (a second read would be a second draw from random
            // weights), or its mapped bytes
            let e = &embed.name;
            match b.bf16(e).then(|| b.mapped_panels(&[(e.clone(), vocab)], h)).flatten() {
                Some(p) => Linear::Bf16(p),
                None => b.linear(embed.table.clone(), b.bf16(e))?,
            }
        } else {
            // lm_head is cuBLAS's on every path (too wide for the gemv kernel), so it keeps
            // the plain `[in, out]` layout the cuBLAS path has always used for it
            match b.proj(&[(name.to_string(), vocab)], h)? {
                Linear::Rows(w) => Linear::Dense(w.t()?.contiguous()?),
                other => other,
            }
        };
        Ok(LmHead { proj, tied })
    }

    /// Logits `[T, vocab]` in the compute dtype.
    pub fn forward(&self, hidden: &Tensor) -> Result<Tensor> {
        Ok(self.proj.forward(hidden)?)
    }
}
