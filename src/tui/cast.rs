//! asciicast v2 files (what `asciinema play` replays): a JSON header line, then one
//! `[time, "o", data]` line per chunk of terminal output. Pure formatting over any writer.

use std::io::Write;

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CastHeader {
    pub version: u32,
    pub width: u16,
    pub height: u16,
    /// Unix seconds when the recording was made.
    pub timestamp: u64,
    pub title: String,
    pub env: CastEnv,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub struct CastEnv {
    pub term: String,
    pub shell: String,
}

impl CastHeader {
    pub fn new(width: u16, height: u16, title: impl Into<String>) -> Self {
        let timestamp = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        CastHeader {
            version: 2,
            width,
            height,
            timestamp,
            title: title.into(),
            env: CastEnv { term: "xterm-256color".into(), shell: "/bin/sh".into() },
        }
    }
}

pub struct CastWriter<W: Write> {
    out: W,
    label: String,
    last_t: f64,
}

impl<W: Write> CastWriter<W> {
    pub fn new(mut out: W, label: impl Into<String>, header: &CastHeader) -> Result<Self> {
        let label = label.into();
        serde_json::to_writer(&mut out, header)
            .with_context(|| format!("{label}: cannot write"))?;
        out.write_all(b"\n").with_context(|| format!("{label}: cannot write"))?;
        Ok(CastWriter { out, label, last_t: 0.0 })
    }

    /// Appends terminal output at `t` seconds; times never go backwards.
    pub fn output(&mut self, t: f64, data: &str) -> Result<()> {
        if data.is_empty() {
            return Ok(());
        }
        let t = t.max(self.last_t);
        self.last_t = t;
        let line = serde_json::to_string(&(round_us(t), "o", data))?;
        writeln!(self.out, "{line}").with_context(|| format!("{}: cannot write", self.label))
    }

    pub fn finish(mut self) -> Result<W> {
        self.out.flush().with_context(|| format!("{}: cannot write", self.label))?;
        Ok(self.out)
    }
}

/// Microsecond precision keeps files small and times exactly comparable.
fn round_us(t: f64) -> f64 {
    (t * 1e6).round() / 1e6
}

/// One parsed output event of a cast.
pub type CastEvent = (f64, String, String);

/// Parses a cast back: the header and every event, failing with `line N: why` on the first
/// malformed line.
pub fn parse(text: &str) -> Result<(CastHeader, Vec<CastEvent>)> {
    let mut lines = text.lines();
    let first = lines.next().context("line 1: empty cast")?;
    let header: CastHeader = serde_json::from_str(first).context("line 1: invalid header")?;
    let mut events = Vec::new();
    for (i, line) in lines.enumerate() {
        let ev: CastEvent =
            serde_json::from_str(line).with_context(|| format!("line {}: invalid event", i + 2))?;
        events.push(ev);
    }
    Ok((header, events))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_a_header_then_monotone_events() {
        let h = CastHeader { timestamp: 7, ..CastHeader::new(80, 24, "t") };
        let mut w = CastWriter::new(Vec::new(), "mem", &h).unwrap();
        w.output(0.5, "a\x1b[1m").unwrap();
        w.output(0.25, "b").unwrap(); // earlier time: clamped
        w.output(1.0, "").unwrap(); // nothing to say: no line
        let text = String::from_utf8(w.finish().unwrap()).unwrap();
        assert_eq!(
            text,
            "{\"version\":2,\"width\":80,\"height\":24,\"timestamp\":7,\"title\":\"t\",\
             \"env\":{\"TERM\":\"xterm-256color\",\"SHELL\":\"/bin/sh\"}}\n\
             [0.5,\"o\",\"a\\u001b[1m\"]\n[0.5,\"o\",\"b\"]\n"
        );
        let (hh, evs) = parse(&text).unwrap();
        assert_eq!(hh, h);
        assert_eq!(evs, vec![(0.5, "o".into(), "a\x1b[1m".into()), (0.5, "o".into(), "b".into())]);
    }

    #[test]
    fn parse_names_the_bad_line() {
        let e = parse("{\"version\":2,\"width\":1,\"height\":1,\"timestamp\":0,\"title\":\"\",\"env\":{\"TERM\":\"x\",\"SHELL\":\"y\"}}\n[0.1,\"o\",\"x\"]\n[oops").unwrap_err();
        assert!(format!("{e:#}").starts_with("line 3: invalid event"), "{e:#}");
    }
}
