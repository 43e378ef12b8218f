//! The CUDA side of the device paths: each file compiles one kernel source of `kernels/` with
//! NVRTC and launches its kernels for the candle ops whose CPU bodies live one folder up.
//!
//! - [`ops`]: kernels/fused.cu, the fused ops of `model/ops.rs`.
//! - [`gemv`]: kernels/gemv.cu, the tensor-core gemv of `model/gemv.rs` (the streamed layer).
//! - [`moe`]: the grouped forms of kernels/gemv.cu around kernels/moe.cuh, the MoE block of
//!   `model/fast/moe_grouped.rs`.
//! - [`launch`]: launching either under programmatic dependent launch, and their NVRTC target.
//! - [`nvrtc`]: compiling the three sources, with kernels/common.cuh as a named header.
//!
//! (The sampler's kernel, kernels/sampler.cu, is launched from `sampler/cuda.rs`.)

pub mod gemv;
pub mod launch;
pub mod moe;
pub mod nvrtc;
pub mod ops;
