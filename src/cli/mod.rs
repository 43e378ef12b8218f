//! The binary's side: flags and how they resolve against a checkpoint's defaults (args), from
//! flags to a ready engine (session), the files the commands write (output), and the commands.

mod args;
pub mod commands;
pub mod output;
pub mod session;

pub use args::*;
