//! `unmask steps [TRACE]`: the per-step list of a trace, or of a decode as it runs.

use std::io::{BufRead, Write};
use std::path::Path;
use std::sync::mpsc;

use anyhow::{bail, Context, Result};

use crate::cli::{DecodeArgs, StepsArgs};
use crate::engine::EngineThread;
use crate::events::{Event, FinishReason};
use crate::session::Session;
use crate::steps::{StepLine, StepLines};

pub fn run(args: &StepsArgs) -> Result<()> {
    let mut out = Lines { out: std::io::stdout().lock(), json: args.json };
    match args.trace.as_deref() {
        Some(p) if p == Path::new("-") => from_trace(std::io::stdin().lock(), "stdin", &mut out),
        Some(p) => {
            let f = std::fs::File::open(p).with_context(|| format!("{}: cannot open", p.display()))?;
            from_trace(std::io::BufReader::new(f), &p.display().to_string(), &mut out)
        }
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

fn from_trace(input: impl BufRead, label: &str, out: &mut Lines<impl Write>) -> Result<()> {
    let read = crate::trace::read(input, label)?;
    if let Some(why) = &read.stopped {
        // The good part is still listed; say where the trace ended.
        eprintln!("unmask: warning: {why}; listing the steps before it");
    }
    let mut lines = StepLines::new();
    for ev in &read.events {
        if let Some(l) = lines.push(ev) {
            out.write(&l)?;
        }
    }
    Ok(())
}

fn live(args: &DecodeArgs, out: &mut Lines<impl Write>) -> Result<()> {
    let session = Session::open(args)?;
    let (tx, rx) = mpsc::channel::<Event>();
    let engine = EngineThread::spawn(Box::new(session.denoiser), Box::new(session.tokenizer), move |ev| {
        let _ = tx.send(ev);
    });
    engine.submit(session.request);
    let mut lines = StepLines::new();
    for ev in rx.iter() {
        if let Some(l) = lines.push(&ev) {
            out.write(&l)?;
        }
        if let Event::Finish(f) = &ev {
            if f.reason == FinishReason::Error {
                bail!("decode failed: {}", f.error.clone().unwrap_or_default());
            }
            break;
        }
    }
    Ok(())
}
