//! `unmask record` and `unmask replay FILE --cast OUT`: the TUI's screens of a decode written
//! as an asciicast, with no terminal involved.

use std::io::BufWriter;
use std::path::Path;

use anyhow::{Context, Result};

use crate::cli::{CastArgs, DecodeArgs};
use crate::events::Event;
use crate::record::{default_title, record};
use crate::trace::{self, TraceWriter};

/// Decodes to the end, then renders the cast (and writes the trace if asked).
pub fn run(args: &DecodeArgs, cast: &Path, trace_out: Option<&Path>, pacing: &CastArgs) -> Result<()> {
    pacing.pacing().validate()?;
    let events = super::compare::decode_side(args, "of the recording")?;
    if let Some(p) = trace_out {
        write_trace(&events, p)?;
    }
    write_cast(events, cast.display().to_string(), None, cast, pacing)
}

/// A recorded trace to a cast; a corrupt one records up to its last good event, with a warning.
pub fn from_trace(file: &Path, cast: &Path, pacing: &CastArgs) -> Result<()> {
    pacing.pacing().validate()?;
    let t = trace::read_file(file)?;
    if let Some(s) = &t.stopped {
        eprintln!("unmask: warning: trace stopped early: {}", crate::ui::glyph::escape_line(s));
    }
    write_cast(t.events, file.display().to_string(), t.stopped, cast, pacing)
}

fn write_cast(events: Vec<Event>, label: String, stopped: Option<String>, cast: &Path, pacing: &CastArgs) -> Result<()> {
    let title = pacing.title.clone().unwrap_or_else(|| default_title(&events));
    let name = cast.display().to_string();
    let f = std::fs::File::create(cast).with_context(|| format!("{name}: cannot create"))?;
    record(events, label, stopped, &pacing.pacing(), &title, BufWriter::new(f), &name)?;
    Ok(())
}

fn write_trace(events: &[Event], path: &Path) -> Result<()> {
    let name = path.display().to_string();
    let f = std::fs::File::create(path).with_context(|| format!("{name}: cannot create"))?;
    let mut w = TraceWriter::new(BufWriter::new(f), name);
    events.iter().try_for_each(|e| w.write(e))
}
