//! `unmask record` and `unmask replay FILE --cast OUT`: the TUI's screens of a decode written
//! as an asciicast, with no terminal involved.

use std::io::BufWriter;
use std::path::Path;

use anyhow::{bail, Result};

use crate::cli::{CastArgs, DecodeArgs, LookArgs};
use crate::events::{Event, FinishReason};
use crate::output::{create_streamed, refuse_clashes, write_atomically};
use crate::record::{default_title, record, Pacing};
use crate::session::Session;
use crate::trace::{self, TraceWriter};

/// Decodes, streaming the trace (if asked) line by line as the events come, then renders the
/// cast of everything decoded. Interrupted by a signal, the decode is cancelled and both
/// files are still written whole: the trace ends with its `cancelled` finish event, the cast
/// shows the screens up to it.
pub fn run(args: &DecodeArgs, cast: &Path, trace_out: Option<&Path>, cast_args: &CastArgs, look: &LookArgs) -> Result<()> {
    let pacing = cast_args.pacing(look.cast_theme());
    pacing.validate()?;
    let mut outputs = vec![("--cast", cast)];
    outputs.extend(trace_out.map(|t| ("--trace", t)));
    refuse_clashes(&outputs, &[])?;
    let session = Session::open(args)?;
    let mut writer = match trace_out {
        Some(p) => Some(TraceWriter::new(BufWriter::new(create_streamed(p)?), p.display().to_string())),
        None => None,
    };
    let mut events = Vec::new();
    let fin = super::trace::stream(session, |ev| {
        events.push(ev.clone());
        writer.as_mut().map_or(Ok(()), |w| w.write(ev))
    })?;
    crate::signals::finishing(|| write_cast(events, None, None, cast, (&pacing, cast_args.title.as_deref())))?;
    if fin.reason == FinishReason::Error {
        bail!("decode of the recording failed: {}", fin.error.unwrap_or_default());
    }
    Ok(())
}

/// A recorded trace to a cast; a corrupt one records up to its last good event, with a warning.
pub fn from_trace(file: &Path, cast: &Path, cast_args: &CastArgs, look: &LookArgs) -> Result<()> {
    let pacing = cast_args.pacing(look.cast_theme());
    pacing.validate()?;
    refuse_clashes(&[("--cast", cast)], &[("trace", file)])?;
    let t = trace::read_path(file)?;
    if let Some(s) = &t.stopped {
        eprintln!("unmask: warning: trace stopped early: {}", crate::ui::glyph::escape_line(s));
    }
    write_cast(t.events, Some(file.display().to_string()), t.stopped, cast, (&pacing, cast_args.title.as_deref()))
}

fn write_cast(events: Vec<Event>, label: Option<String>, stopped: Option<String>, cast: &Path, (pacing, title): (&Pacing, Option<&str>)) -> Result<()> {
    let title = title.map_or_else(|| default_title(&events), str::to_string);
    let name = cast.display().to_string();
    write_atomically(cast, |w| {
        record(events, label, stopped, pacing, &title, w, &name)?;
        Ok(())
    })
}
