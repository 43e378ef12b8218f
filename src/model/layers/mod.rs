//! The blocks a family builds its layers from, each named for what it holds: the embedding
//! and lm_head, [`SelfAttention`](attention::SelfAttention) over the [`KvCache`](kv_cache::KvCache),
//! the feed-forward blocks ([`FeedForward`](feed_forward::FeedForward): a dense
//! [`SwiGlu`](swiglu::SwiGlu) or a [`MoeBlock`](moe::MoeBlock), which routes by a
//! [`Routing`](router::Routing)), and the
//! [`DecoderLayer`](decoder_layer::DecoderLayer) that joins attention and feed-forward with
//! their norms and residuals. Tensor names are the family's: every block loads from names or
//! a prefix it is given.

pub mod attention;
pub mod decoder_layer;
pub mod embedding;
pub mod feed_forward;
pub mod kv_cache;
pub mod moe;
pub mod router;
pub mod swiglu;
pub mod topk;
