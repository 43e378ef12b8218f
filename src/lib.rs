//! unmask: watch a block-diffusion language model decode, step by step.
//!
//! Data flows one way: model -> engine loop -> events -> store -> view.

pub mod cast;
pub mod cli;
pub mod compare;
pub mod detok;
pub mod commands;
pub mod embedded;
pub mod engine;
pub mod events;
pub mod export;
pub mod model;
pub mod record;
pub mod sampler;
pub mod session;
pub mod settings;
pub mod tokenizer;
pub mod trace;
pub mod store;
pub mod synth;
pub mod terminal;
pub mod ui;
