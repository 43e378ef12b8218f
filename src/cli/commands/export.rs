//! `unmask export`: a trace's per-token table, per-step table, step map and edits, as CSV or
//! JSON, or the step map drawn as an SVG figure.

use std::path::Path;

use anyhow::{Context, Result};

use crate::cli::{ExportFormat, ExportTable};
use crate::trace::export::{
    edits_csv, escape_for_terminal, step_map_csv, steps_csv, tables, tokens_csv,
};

/// Why there is no `--format png`: resvg would rasterise the SVG, but it needs fonts (a system
/// font, or one embedded in the binary), and resvg 0.45 with its default (text) features adds
/// 66 crates and 148 CPU-seconds to a clean build (measured: a bare crate depending on it,
/// this repository's profile, deps at opt-level 3), over a minute on CI's 2 cores; any SVG
/// converter does the same job.
pub const PNG_ADVICE: &str = "--format png is not built in; write the figure with --format svg and convert it, e.g. \
    rsvg-convert --dpi-x 300 --dpi-y 300 map.svg -o map.png (librsvg), or resvg --dpi 300 map.svg map.png";

pub fn run(
    trace: &Path,
    format: ExportFormat,
    table: ExportTable,
    out: Option<&Path>,
) -> Result<()> {
    if format == ExportFormat::Png {
        anyhow::bail!("{PNG_ADVICE}");
    }
    // `--out -` is stdout, as no --out is.
    let out = out.filter(|p| !crate::cli::output::is_stdout(p));
    if let Some(p) = out {
        crate::cli::output::check_outputs(&[("--out", p)], &[("trace", trace)])?;
    }
    let read = crate::trace::file::read_path(trace)?;
    let text = match format {
        ExportFormat::Svg => crate::tui::figure::step_map_svg(&read.events)
            .with_context(|| format!("{}: cannot draw the step map", trace.display()))?,
        _ => table_text(&read.events, format, table, out.is_none())?,
    };
    write_out(out, &text)?;
    // The good part is exported; say where the trace ended, and exit so that a script knows.
    crate::cli::PartialTrace::check(read.stopped, "exported the events before it")
}

/// A table as CSV, or all of them as JSON; token text escaped for a terminal when `to_stdout`
/// goes to one.
fn table_text(
    events: &[crate::trace::events::Event],
    format: ExportFormat,
    table: ExportTable,
    to_stdout: bool,
) -> Result<String> {
    let mut t = tables(events);
    if to_stdout && std::io::IsTerminal::is_terminal(&std::io::stdout()) {
        escape_for_terminal(&mut t);
    }
    Ok(match (format, table) {
        (ExportFormat::Json, _) => serde_json::to_string_pretty(&t)? + "\n",
        (ExportFormat::Csv, ExportTable::Steps) => steps_csv(&t),
        (ExportFormat::Csv, ExportTable::StepMap) => step_map_csv(&t),
        (ExportFormat::Csv, ExportTable::Edits) => edits_csv(&t),
        // Tokens is CSV's default table; the figure formats do not come here.
        (_, _) => tokens_csv(&t),
    })
}

/// `text` to `--out` (whole or not at all), else to stdout.
fn write_out(out: Option<&Path>, text: &str) -> Result<()> {
    match out {
        Some(p) => crate::cli::output::write_atomically(p, |w| {
            use std::io::Write;
            w.write_all(text.as_bytes()).with_context(|| format!("{}: cannot write", p.display()))
        }),
        None => {
            use std::io::Write;
            std::io::stdout().write_all(text.as_bytes()).context("stdout: cannot write")
        }
    }
}
