//! The binary's side: flags and how they resolve against a checkpoint's defaults (args), from
//! flags to a ready engine (session), the files the commands write (output), and the commands.

mod args;
pub mod commands;
pub mod output;
pub mod session;

pub use args::*;

/// A command did its work on the part of a trace before a cut or bad line: what it wrote is
/// good, but not the whole recording. The binary prints it as a warning and exits with
/// [`PartialTrace::EXIT`], so that a script can tell (docs/reliability.md).
#[derive(Debug)]
pub struct PartialTrace {
    /// Where and why the trace stopped (`FILE:LINE: ...`).
    pub why: String,
    /// What was done with the part before it (`exported the events before it`).
    pub did: &'static str,
}

impl PartialTrace {
    pub const EXIT: u8 = 3;

    /// `Err` when the read stopped early (`stopped`), after the command wrote its output.
    pub fn check(stopped: Option<String>, did: &'static str) -> anyhow::Result<()> {
        match stopped {
            None => Ok(()),
            Some(why) => Err(PartialTrace { why, did }.into()),
        }
    }
}

impl std::fmt::Display for PartialTrace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}; {}", self.why, self.did)
    }
}

impl std::error::Error for PartialTrace {}
