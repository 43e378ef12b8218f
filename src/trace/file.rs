//! Trace files: the events as JSON Lines, one object per line, versioned by the header.

use std::io::{BufRead, Read, Write};

use anyhow::{Context, Result};

use crate::limits::{TraceCheck, MAX_TRACE_LINE};
use crate::trace::events::{Event, TRACE_VERSION};

/// Writes events as they come, flushing each line so that a crash loses nothing written.
pub struct TraceWriter<W: Write> {
    out: W,
    label: String,
}

impl<W: Write> TraceWriter<W> {
    pub fn new(out: W, label: impl Into<String>) -> Self {
        TraceWriter { out, label: label.into() }
    }

    /// Writes one event; refuses one holding NaN or an infinity (JSON has no such numbers).
    pub fn write(&mut self, ev: &Event) -> Result<()> {
        if let Some((field, v)) = ev.non_finite() {
            anyhow::bail!(
                "{}: refusing to write a {} event whose `{field}` is {v}",
                self.label,
                kind(ev)
            );
        }
        serde_json::to_writer(&mut self.out, ev)
            .with_context(|| format!("{}: cannot write", self.label))?;
        self.out.write_all(b"\n").with_context(|| format!("{}: cannot write", self.label))?;
        self.out.flush().with_context(|| format!("{}: cannot write", self.label))
    }
}

fn kind(ev: &Event) -> &'static str {
    match ev {
        Event::Header(_) => "header",
        Event::Step(_) => "step",
        Event::Block(_) => "block",
        Event::Finish(_) => "finish",
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
/// still replays). Fails only if nothing usable is there. A line is bad when it is not an
/// event, is longer than [`MAX_TRACE_LINE`], or contradicts the events before it
/// ([`TraceCheck`]: sizes out of bounds, a position committed twice, ...).
pub fn read(input: impl BufRead, label: &str) -> Result<ReadTrace> {
    let mut events = Vec::new();
    let stopped = read_each(input, label, |ev| {
        events.push(ev);
        Ok(())
    })?;
    Ok(ReadTrace { events, stopped })
}

/// [`read`], handing each good event to `each` as soon as its line has been read (a pipe's
/// reader sees a decode's steps as they are decoded), and returning where reading stopped
/// early, if it did. An error of `each` ends the reading and is returned.
pub fn read_each(
    mut input: impl BufRead,
    label: &str,
    mut each: impl FnMut(Event) -> Result<()>,
) -> Result<Option<String>> {
    let mut any = false;
    let mut stopped = None;
    let mut check = TraceCheck::default();
    let mut buf = Vec::new();
    for n in 1.. {
        buf.clear();
        // At most one byte past the limit is read: a line without end (/dev/zero-like
        // content in a regular file) cannot exhaust memory.
        match (&mut input).take(MAX_TRACE_LINE as u64 + 1).read_until(b'\n', &mut buf) {
            Ok(0) => break,
            Ok(_) => {}
            Err(e) => {
                stopped = Some(format!("{label}:{n}: cannot read: {e}"));
                break;
            }
        }
        if let Some(kind) = export_kind(&buf).filter(|_| !any) {
            anyhow::bail!(
                "{label}: this is {kind}, not a trace; `unmask trace --out FILE` writes a trace (replay, steps and export read one)"
            );
        }
        if buf.len() > MAX_TRACE_LINE {
            stopped = Some(format!("{label}:{n}: line longer than {MAX_TRACE_LINE} bytes"));
            break;
        }
        let Ok(mut line) = std::str::from_utf8(&buf) else {
            stopped = Some(format!("{label}:{n}: not UTF-8"));
            break;
        };
        if n == 1 {
            // A byte-order mark that an editor saved the file with is not part of the JSON.
            line = line.strip_prefix('\u{FEFF}').unwrap_or(line);
        }
        if line.trim().is_empty() {
            continue;
        }
        match parse_line(line, !any).and_then(|ev| check.check(&ev).map(|()| ev)) {
            Ok(ev) => {
                any = true;
                each(ev)?;
            }
            Err(e) => {
                stopped = Some(format!("{label}:{n}: {e}"));
                break;
            }
        }
    }
    if !any {
        anyhow::bail!("{}", stopped.unwrap_or_else(|| format!("{label}: empty trace")));
    }
    Ok(stopped)
}

/// What an `unmask export` output looks like from its first line, if the line is one: people
/// hand those to `replay` for a trace.
fn export_kind(first: &[u8]) -> Option<&'static str> {
    let line = String::from_utf8_lossy(first);
    let line = line.trim();
    // (`global_step,block,step,`: the steps and edits tables of earlier versions)
    let csv_headers =
        ["pos,index,block,", "step,block,block_step,", "global_step,block,step,", "index,step_map"];
    if first.starts_with(b"\x89PNG") {
        Some("a PNG image (`unmask export --format png`)")
    } else if line.starts_with("<svg") || line.starts_with("<?xml") {
        Some("an SVG image (`unmask export --format svg`)")
    } else if csv_headers.iter().any(|h| line.starts_with(h)) {
        Some("a CSV table from `unmask export`")
    } else if line == "{" {
        // A trace's every line is a whole event; a lone brace opens a multi-line document.
        Some("a JSON document (`unmask export --format json` writes these)")
    } else {
        None
    }
}

fn parse_line(line: &str, first: bool) -> Result<Event, String> {
    // Without its newline: an error at the end of the line is in its last column, not line 2's first.
    let line = line.trim_end_matches(['\n', '\r']);
    let ev: Event = serde_json::from_str(line).map_err(|e| invalid_event(line, &e))?;
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

/// Why `line` is not an event, naming the field by its JSON path (`model.hidden_size`,
/// `committed[2].conf`) and the column. serde buffers an internally tagged enum before it
/// picks the variant, which loses the path (`invalid value: integer -1, expected usize`, no
/// field named), so a line whose `event` tag names a kind is parsed again as that kind
/// through serde_path_to_error.
fn invalid_event(line: &str, e: &serde_json::Error) -> String {
    #[derive(serde::Deserialize)]
    struct Tag {
        event: String,
    }
    fn at<T: serde::de::DeserializeOwned>(line: &str) -> Option<(String, serde_json::Error)> {
        let mut de = serde_json::Deserializer::from_str(line);
        serde_path_to_error::deserialize::<_, T>(&mut de)
            .err()
            .map(|e| (e.path().to_string(), e.into_inner()))
    }
    use crate::trace::events::{BlockEvent, FinishEvent, Header, StepEvent};
    let tag = serde_json::from_str::<Tag>(line).ok().map(|t| t.event);
    let found = match tag.as_deref() {
        Some("header") => at::<Header>(line),
        Some("step") => at::<StepEvent>(line),
        Some("block") => at::<BlockEvent>(line),
        Some("finish") => at::<FinishEvent>(line),
        _ => None,
    };
    match (tag, found) {
        (Some(kind), Some((path, inner))) => {
            let field = if path == "." { String::new() } else { format!("field `{path}`: ") };
            format!(
                "invalid {kind} event: {field}{} (column {})",
                without_position(&inner),
                inner.column()
            )
        }
        _ => format!("invalid event: {} (column {})", without_position(e), e.column()),
    }
}

/// serde_json's message without its ` at line 1 column N` (the line is always 1 within one
/// line of the trace; the caller names the file's line).
fn without_position(e: &serde_json::Error) -> String {
    let text = e.to_string();
    let suffix = format!(" at line {} column {}", e.line(), e.column());
    text.strip_suffix(&suffix).unwrap_or(&text).to_string()
}

/// Reads the trace `path` names: `-` is stdin, anything else a file ([`read_file`]).
pub fn read_path(path: &std::path::Path) -> Result<ReadTrace> {
    if path == std::path::Path::new("-") {
        return read(std::io::stdin().lock(), "stdin");
    }
    read_file(path)
}

/// [`read_path`] event by event ([`read_each`]): `-` is stdin, read line by line as it comes.
pub fn read_path_each(
    path: &std::path::Path,
    each: impl FnMut(Event) -> Result<()>,
) -> Result<Option<String>> {
    if path == std::path::Path::new("-") {
        return read_each(std::io::stdin().lock(), "stdin", each);
    }
    let label = path.display().to_string();
    crate::limits::regular_file(path)?;
    let f = std::fs::File::open(path).with_context(|| format!("{label}: cannot open"))?;
    read_each(std::io::BufReader::new(f), &label, each)
}

/// Reads a trace file, which must be a regular file (a FIFO or device is refused before it is
/// opened: reading one could block forever or never end).
pub fn read_file(path: &std::path::Path) -> Result<ReadTrace> {
    let label = path.display().to_string();
    crate::limits::regular_file(path)?;
    let f = std::fs::File::open(path).with_context(|| format!("{label}: cannot open"))?;
    read(std::io::BufReader::new(f), &label)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture(name: &str) -> std::path::PathBuf {
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/traces").join(name)
    }

    /// A field of the wrong type names its JSON path and column, not only serde's `invalid
    /// value: integer -1, expected usize` (the enum's tag buffered the path away).
    #[test]
    fn a_bad_field_is_named_by_its_path() {
        let text = std::fs::read_to_string(fixture("tiny-dynamic.jsonl")).unwrap();
        let mut lines: Vec<String> = text.lines().map(str::to_string).collect();
        let header = lines[0].replace("\"hidden_size\":64", "\"hidden_size\":-1");
        assert_ne!(header, lines[0]);
        let e = read(header.as_bytes(), "t.jsonl").unwrap_err().to_string();
        let col = header.find("-1").unwrap() + 2;
        assert_eq!(e, format!("t.jsonl:1: invalid header event: field `model.hidden_size`: invalid value: integer `-1`, expected usize (column {col})"));
        let step = lines
            .iter()
            .position(|l| l.contains("\"event\":\"step\"") && l.contains("\"committed\":[{"))
            .unwrap();
        let conf = lines[step].find("\"conf\":").unwrap();
        lines[step].replace_range(conf..conf + 7, "\"conf\":\"x\",\"c\":");
        let r = read(lines.join("\n").as_bytes(), "t.jsonl").unwrap();
        let why = r.stopped.unwrap();
        assert!(why.starts_with(&format!("t.jsonl:{}: invalid step event: field `committed[0].conf`: invalid type: string \"x\", expected f32 (column ", step + 1)), "{why}");
        // A line that is no JSON object still says why.
        let e = read(&b"{\"event\":\"header\",\n"[..], "t.jsonl").unwrap_err().to_string();
        assert_eq!(e, "t.jsonl:1: invalid event: EOF while parsing a value (column 18)");
    }

    /// A trace saved by an editor that adds a byte-order mark reads as the trace.
    #[test]
    fn a_byte_order_mark_is_skipped() {
        let text = std::fs::read(fixture("tiny-dynamic.jsonl")).unwrap();
        let plain = read(&text[..], "t.jsonl").unwrap();
        let marked = read(&[b"\xEF\xBB\xBF".as_slice(), &text].concat()[..], "t.jsonl").unwrap();
        assert_eq!((marked.events.len(), marked.stopped), (plain.events.len(), None));
    }

    #[test]
    fn an_export_file_is_named_as_one() {
        for (file, kind) in [
            ("tiny-dynamic.json", "a JSON document (`unmask export --format json` writes these)"),
            ("tiny-dynamic.tokens.csv", "a CSV table from `unmask export`"),
            ("tiny-dynamic.steps.csv", "a CSV table from `unmask export`"),
            ("tiny-dynamic.step_map.csv", "a CSV table from `unmask export`"),
        ] {
            let path = fixture(file);
            let e = read_file(&path).unwrap_err().to_string();
            let want = format!(
                "{}: this is {kind}, not a trace; `unmask trace --out FILE` writes a trace (replay, steps and export read one)",
                path.display()
            );
            assert_eq!(e, want);
        }
        let e = read(&b"<?xml version=\"1.0\"?>\n<svg>"[..], "map.svg").unwrap_err().to_string();
        assert!(e.starts_with("map.svg: this is an SVG image"), "{e}");
        let e = read(&b"\x89PNG\r\n\x1a\n\0\0"[..], "map.png").unwrap_err().to_string();
        assert!(e.starts_with("map.png: this is a PNG image"), "{e}");
        // A trace is still a trace.
        assert!(read_file(&fixture("tiny-dynamic.jsonl")).unwrap().stopped.is_none());
    }
}
