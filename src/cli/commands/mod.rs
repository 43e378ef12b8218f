//! One module per subcommand; each takes parsed flags and does its whole job.

pub mod bench;
pub mod check_device;
pub mod compare;
pub mod export;
pub mod meta;
pub mod models;
pub mod record;
pub mod replay;
pub mod steps;
pub mod trace;
pub mod tui;
