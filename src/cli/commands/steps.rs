//! `unmask steps [TRACE]`: the per-step list of a trace, or of a decode as it runs.

use std::io::Write;

use anyhow::{bail, Context, Result};

use crate::cli::session::Session;
use crate::cli::{DecodeArgs, StepsArgs};
use crate::trace::events::{Event, FinishReason};
use crate::trace::steps::{StepLine, StepLines};

pub fn run(args: &StepsArgs) -> Result<()> {
    let mut out = Lines { out: std::io::stdout().lock(), json: args.json };
    match args.trace.as_deref() {
        // `-` is stdin; a file must be a regular file (a FIFO, /dev/zero is refused before
        // reading).
        Some(p) => list(p, &mut out),
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
        self.line(&text)
    }

    /// A step's line, or the run's closing line after its finish event.
    fn event(&mut self, lines: &mut StepLines, ev: &Event) -> Result<()> {
        if let Some(l) = lines.push(ev) {
            return self.write(&l);
        }
        if let Event::Block(b) = ev {
            let done = lines.block_done(b);
            return self.line(&if self.json { done.json() } else { done.text() });
        }
        let Event::Finish(f) = ev else { return Ok(()) };
        let end = lines.finish(f);
        let text = if self.json { end.json() } else { end.text() };
        self.line(&text)
    }

    /// The line before the steps of run `n` (the second or a later) of a trace.
    fn run(&mut self, n: usize) -> Result<()> {
        let text = if self.json { format!("{{\"run\":{n}}}") } else { format!("# run {n}") };
        self.line(&text)
    }

    fn line(&mut self, text: &str) -> Result<()> {
        writeln!(self.out, "{text}").and_then(|()| self.out.flush()).context("stdout: cannot write")
    }
}

/// The steps of a trace, each printed as soon as its event line is read (`unmask trace |
/// unmask steps -` is a live view). A trace of several runs (traces put end to end; each
/// header starts a run) lists each, counted from step 1, after a line `# run N` (`--json`:
/// `{"run":N}`) from the second on: a stream cannot know whether a later run will follow, so
/// it cannot show only the last, which is the one export and replay read.
fn list(path: &std::path::Path, out: &mut Lines<impl Write>) -> Result<()> {
    let mut lines = StepLines::new();
    let mut runs = 0;
    let stopped = crate::trace::file::read_path_each(path, |ev| {
        if matches!(ev, Event::Header(_)) {
            runs += 1;
            if runs > 1 {
                out.run(runs)?;
            }
        }
        out.event(&mut lines, &ev)
    })?;
    // The good part is listed; say where the trace ended, and exit so that a script knows.
    crate::cli::PartialTrace::check(stopped, "listed the steps before it")
}

/// The decode's steps as they happen, through the same engine loop as `unmask trace` (a signal
/// cancels it between forwards; an engine that stops without a finish event is an error).
fn live(args: &DecodeArgs, out: &mut Lines<impl Write>) -> Result<()> {
    let mut lines = StepLines::new();
    let fin =
        crate::cli::commands::trace::stream(Session::open(args)?, |ev| out.event(&mut lines, ev))?;
    if fin.reason == FinishReason::Error {
        bail!("decode failed: {}", fin.error.unwrap_or_default());
    }
    Ok(())
}
