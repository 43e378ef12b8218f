//! `unmask trace`: decode headless and write the events as JSON Lines.

use std::io::Write;
use std::path::Path;
use std::sync::mpsc;

use anyhow::{bail, Context, Result};

use crate::cli::DecodeArgs;
use crate::engine::EngineThread;
use crate::events::{Event, FinishReason};
use crate::session::Session;
use crate::trace::TraceWriter;

pub fn run(args: &DecodeArgs, out: Option<&Path>) -> Result<()> {
    let session = Session::open(args)?;
    let writer: Box<dyn Write> = match out {
        Some(p) => Box::new(std::fs::File::create(p).with_context(|| format!("{}: cannot create", p.display()))?),
        None => Box::new(std::io::stdout().lock()),
    };
    let label = out.map(|p| p.display().to_string()).unwrap_or_else(|| "stdout".into());
    let mut writer = TraceWriter::new(std::io::BufWriter::new(writer), label);
    let (tx, rx) = mpsc::channel::<Event>();
    let engine = EngineThread::spawn(Box::new(session.denoiser), Box::new(session.tokenizer), move |ev| {
        let _ = tx.send(ev);
    });
    engine.submit(session.request);
    for ev in rx.iter() {
        writer.write(&ev)?;
        if let Event::Finish(f) = &ev {
            if f.reason == FinishReason::Error {
                bail!("decode failed: {}", f.error.clone().unwrap_or_default());
            }
            return Ok(());
        }
    }
    // The engine thread ended without a finish event: the trace is incomplete.
    bail!("decode failed: the engine stopped before finishing the decode")
}
