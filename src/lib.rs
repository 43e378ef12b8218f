//! unmask: watch a block-diffusion language model decode, step by step.
//!
//! Data flows one way: model -> engine loop -> events -> store -> view.

pub mod cli;
pub mod engine;
pub mod format;
pub mod fuzz;
pub mod glyph;
pub mod limits;
pub mod model;
pub mod notice;
pub mod panics;
pub mod sampler;
pub mod signals;
pub mod trace;
pub mod tui;
