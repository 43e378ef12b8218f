//! `unmask steps [TRACE]`: the per-step list of a trace, or of a decode as it runs.

use std::io::Write;

use anyhow::{bail, Context, Result};

use crate::cli::{DecodeArgs, StepsArgs};
use crate::events::FinishReason;
use crate::session::Session;
use crate::steps::{StepLine, StepLines};

pub fn run(args: &StepsArgs) -> Result<()> {
    let mut out = Lines { out: std::io::stdout().lock(), json: args.json };
    match args.trace.as_deref() {
        // `-` is stdin; read_file refuses what is not a regular file (a FIFO, /dev/zero) before
        // reading.
        Some(p) => list(crate::trace::read_path(p)?, &mut out),
        None => live(&args.decode, &mut out),
    }
}

/// Where the lines go: each is flushed, so a pipe sees every step as it is decoded.
struct Lines<W: Write> {
    out: W,
    json: bool,
}

impl<W: Write> Lines<W> {
    fn write(&mut self, l: &StepLine) -> Result<()> {
        let text = if self.json { l.json() } else { l.text() };
        writeln!(self.out, "{text}").and_then(|()| self.out.flush()).context("stdout: cannot write")
    }
}

fn list(read: crate::trace::ReadTrace, out: &mut Lines<impl Write>) -> Result<()> {
    if let Some(why) = &read.stopped {
        // The good part is still listed; say where the trace ended.
        eprintln!("unmask: warning: {why}; listing the steps before it");
    }
    for l in crate::steps::lines(&read.events) {
        out.write(&l)?;
    }
    Ok(())
}

/// The decode's steps as they happen, through the same engine loop as `unmask trace` (a signal
/// cancels it between forwards; an engine that stops without a finish event is an error).
fn live(args: &DecodeArgs, out: &mut Lines<impl Write>) -> Result<()> {
    let mut lines = StepLines::new();
    let fin = crate::commands::trace::stream(Session::open(args)?, |ev| match lines.push(ev) {
        Some(l) => out.write(&l),
        None => Ok(()),
    })?;
    if fin.reason == FinishReason::Error {
        bail!("decode failed: {}", fin.error.unwrap_or_default());
    }
    Ok(())
}
