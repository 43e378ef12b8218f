//! Trace files: the events as JSON Lines, one object per line, versioned by the header.

use std::io::{BufRead, Write};

use anyhow::{Context, Result};

use crate::events::{Event, TRACE_VERSION};

/// Writes events as they come, flushing each line so that a crash loses nothing written.
pub struct TraceWriter<W: Write> {
    out: W,
    label: String,
}

impl<W: Write> TraceWriter<W> {
    pub fn new(out: W, label: impl Into<String>) -> Self {
        TraceWriter { out, label: label.into() }
    }

    pub fn write(&mut self, ev: &Event) -> Result<()> {
        serde_json::to_writer(&mut self.out, ev).with_context(|| format!("{}: cannot write", self.label))?;
        self.out.write_all(b"\n").with_context(|| format!("{}: cannot write", self.label))?;
        self.out.flush().with_context(|| format!("{}: cannot write", self.label))
    }
}

/// A trace read back: the events up to the first bad line, and what was wrong with it.
#[derive(Debug)]
pub struct ReadTrace {
    pub events: Vec<Event>,
    /// `file:line: what` for the line where reading stopped, if it stopped early.
    pub stopped: Option<String>,
}

/// Reads a trace, keeping every good event before the first bad line (a truncated recording
/// still replays). Fails only if nothing usable is there.
pub fn read(input: impl BufRead, label: &str) -> Result<ReadTrace> {
    let mut events = Vec::new();
    let mut stopped = None;
    for (i, line) in input.lines().enumerate() {
        let n = i + 1;
        let line = match line {
            Ok(l) => l,
            Err(e) => {
                stopped = Some(format!("{label}:{n}: cannot read: {e}"));
                break;
            }
        };
        if line.trim().is_empty() {
            continue;
        }
        match parse_line(&line, events.is_empty()) {
            Ok(ev) => events.push(ev),
            Err(e) => {
                stopped = Some(format!("{label}:{n}: {e}"));
                break;
            }
        }
    }
    if events.is_empty() {
        anyhow::bail!("{}", stopped.unwrap_or_else(|| format!("{label}: empty trace")));
    }
    Ok(ReadTrace { events, stopped })
}

fn parse_line(line: &str, first: bool) -> Result<Event, String> {
    let ev: Event = serde_json::from_str(line).map_err(|e| format!("invalid event: {e}"))?;
    match (&ev, first) {
        (Event::Header(h), _) if h.version > TRACE_VERSION => Err(format!(
            "trace version {} is newer than this unmask understands ({TRACE_VERSION})",
            h.version
        )),
        (Event::Header(_), _) => Ok(ev),
        (_, true) => Err("the first event must be a header".into()),
        _ => Ok(ev),
    }
}

pub fn read_file(path: &std::path::Path) -> Result<ReadTrace> {
    let label = path.display().to_string();
    let f = std::fs::File::open(path).with_context(|| format!("{label}: cannot open"))?;
    read(std::io::BufReader::new(f), &label)
}
