//! unmask: watch a block-diffusion language model decode, step by step.
//!
//! Data flows one way: model -> engine loop -> events -> store -> view.

pub mod cast;
pub mod chat;
pub mod cli;
pub mod clock;
pub mod compare;
pub mod detok;
pub mod commands;
pub mod embedded;
pub mod engine;
pub mod events;
pub mod export;
pub mod figure;
pub mod format;
pub mod fuzz;
pub mod keys;
pub mod limits;
pub mod hub;
pub mod model;
pub mod notice;
pub mod output;
pub mod panics;
pub mod record;
pub mod sampler;
pub mod session;
pub mod settings;
pub mod steps;
pub mod signals;
pub mod tokenizer;
pub mod trace;
pub mod store;
pub mod synth;
pub mod terminal;
pub mod ui;
