//! `unmask record` and `unmask replay FILE --cast OUT`: the TUI's screens of a decode written
//! as an asciicast, with no terminal involved.

use std::io::{BufWriter, Write};
use std::path::Path;

use anyhow::{bail, Result};

use crate::cli::output::{check_outputs, create_streamed, is_stdout, write_atomically};
use crate::cli::session::Session;
use crate::cli::{CastArgs, DecodeArgs, LookArgs};
use crate::trace::events::{Event, FinishReason};
use crate::trace::file::{self as trace, TraceWriter};
use crate::tui::record::{default_title, record_until, Pacing};

/// Decodes, streaming the trace (if asked) line by line as the events come, then renders the
/// cast of everything decoded. Interrupted by a signal, the decode is cancelled and both
/// files are still written whole: the trace ends with its `cancelled` finish event, the cast
/// shows the screens up to it. A signal while the cast renders ends it on the frames
/// rendered so far, written whole. Outputs that are inputs of the decode (its prompt file, a
/// file of its checkpoint) or each other are refused, and both are checked writable,
/// before the checkpoint loads; `-` is stdout for either.
pub fn run(
    args: &DecodeArgs,
    cast: &Path,
    trace_out: Option<&Path>,
    cast_args: &CastArgs,
    look: &LookArgs,
) -> Result<()> {
    let pacing = cast_args.pacing(look.cast_theme());
    pacing.validate()?;
    let mut outputs = vec![("--cast", cast)];
    outputs.extend(trace_out.map(|t| ("--trace", t)));
    crate::cli::session::check_decode_outputs(args, &outputs)?;
    let session = Session::open(args)?;
    let mut writer = match trace_out {
        Some(p) if is_stdout(p) => Some(TraceWriter::new(
            BufWriter::new(Box::new(std::io::stdout()) as Box<dyn Write>),
            "stdout",
        )),
        Some(p) => Some(TraceWriter::new(
            BufWriter::new(Box::new(create_streamed(p)?) as Box<dyn Write>),
            p.display().to_string(),
        )),
        None => None,
    };
    // Subscribed from the decode to the end of the cast: a signal between the two (once the
    // decode's own subscription has ended) must not cut the run short either.
    let _signals = crate::signals::subscribe(|_| {});
    let mut events = Vec::new();
    let fin = super::trace::stream(session, |ev| {
        events.push(ev.clone());
        writer.as_mut().map_or(Ok(()), |w| w.write(ev))
    })?;
    drop(writer);
    write_cast(events, None, None, cast, (&pacing, cast_args.title.as_deref()))?;
    if fin.reason == FinishReason::Error {
        bail!("decode of the recording failed: {}", fin.error.unwrap_or_default());
    }
    Ok(())
}

/// A recorded trace to a cast; a corrupt one records up to its last good event, with a warning.
pub fn from_trace(file: &Path, cast: &Path, cast_args: &CastArgs, look: &LookArgs) -> Result<()> {
    let pacing = cast_args.pacing(look.cast_theme());
    pacing.validate()?;
    check_outputs(&[("--cast", cast)], &[("trace", file)])?;
    let t = trace::read_path(file)?;
    write_cast(
        t.events,
        Some(file.display().to_string()),
        t.stopped.clone(),
        cast,
        (&pacing, cast_args.title.as_deref()),
    )?;
    // The cast holds the good part; say where the trace ended, and exit so that a script knows.
    crate::cli::PartialTrace::check(t.stopped, "recorded the events before it")
}

/// Renders and writes the cast, to a file whole (or not at all) or to stdout (`-`). A signal
/// that comes while it renders (not one that cancelled the decode before: that decode's cast
/// is rendered to its end) stops the rendering; the frames so far are written as a whole cast.
/// `label`: the trace replayed, `None` for a live decode.
fn write_cast(
    events: Vec<Event>,
    label: Option<String>,
    stopped: Option<String>,
    cast: &Path,
    (pacing, title): (&Pacing, Option<&str>),
) -> Result<()> {
    let title = title.map_or_else(|| default_title(&events), str::to_string);
    let signalled_before = crate::signals::caught().is_some();
    let stop = || !signalled_before && crate::signals::caught().is_some();
    // While subscribed, a signal does not end the process: rendering stops at the next frame.
    let _signals = crate::signals::subscribe(|_| {});
    crate::signals::finishing(|| {
        if is_stdout(cast) {
            let out = BufWriter::new(std::io::stdout().lock());
            record_until(events, label, stopped, pacing, &title, out, "stdout", &stop)?;
            return Ok(());
        }
        let name = cast.display().to_string();
        write_atomically(cast, |w| {
            record_until(events, label, stopped, pacing, &title, w, &name, &stop)?;
            Ok(())
        })
    })
}
