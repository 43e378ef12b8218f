//! `unmask trace`: decode headless and write the events as JSON Lines.

use std::io::Write;
use std::path::Path;
use std::sync::mpsc;

use anyhow::{bail, Result};

use crate::cli::session::Session;
use crate::cli::DecodeArgs;
use crate::engine::{Control, EngineThread};
use crate::trace::events::{Event, FinishEvent, FinishReason};
use crate::trace::file::TraceWriter;

/// `out`: the trace's file; `None` or `-`, stdout. A file that is an input of the decode (the
/// prompt file, a file of the checkpoint) or that cannot be written is refused before the
/// checkpoint loads.
pub fn run(args: &DecodeArgs, out: Option<&Path>) -> Result<()> {
    let out = out.filter(|p| !crate::cli::output::is_stdout(p));
    if let Some(p) = out {
        // before the checkpoint loads (minutes, for a large one), named by its flag
        crate::cli::session::check_decode_outputs(args, &[("--out", p)])?;
    }
    let session = Session::open(args)?;
    let writer: Box<dyn Write> = match out {
        Some(p) => Box::new(crate::cli::output::create_streamed(p)?),
        None => Box::new(std::io::stdout().lock()),
    };
    let label = out.map(|p| p.display().to_string()).unwrap_or_else(|| "stdout".into());
    let mut writer = TraceWriter::new(std::io::BufWriter::new(writer), label);
    let fin = stream(session, |ev| writer.write(ev))?;
    if fin.reason == FinishReason::Error {
        bail!("decode failed: {}", fin.error.unwrap_or_default());
    }
    Ok(())
}

/// Decodes on an engine thread and hands every event to `each` as it arrives, the finish
/// event last, which is returned. SIGTERM, SIGHUP, SIGINT or SIGQUIT cancel the decode between
/// two forwards: its finish event (reason `cancelled`) still comes, so what `each` wrote is a
/// whole trace, and `main` then exits with 128 + the signal.
pub fn stream(session: Session, mut each: impl FnMut(&Event) -> Result<()>) -> Result<FinishEvent> {
    let (tx, rx) = mpsc::channel::<Event>();
    let engine =
        EngineThread::spawn(Box::new(session.denoiser), Box::new(session.tokenizer), move |ev| {
            let _ = tx.send(ev);
        });
    let control = engine.control.clone();
    let _signals = crate::signals::subscribe(move |_| {
        let _ = control.send(Control::Cancel);
    });
    engine.submit(session.request);
    let mut cancelled = false;
    for ev in rx.iter() {
        // A signal that came before the decode started had its Cancel dropped with the
        // controls of earlier decodes: send it again.
        if !cancelled && crate::signals::caught().is_some() {
            engine.send(Control::Cancel);
            cancelled = true;
        }
        each(&ev)?;
        if let Event::Finish(f) = ev {
            return Ok(f);
        }
    }
    // The engine thread ended without a finish event: the trace is incomplete.
    bail!("decode failed: the engine stopped before finishing the decode")
}
