//! `unmask export`: a trace's per-token table, per-step table, step map and edits, as CSV or
//! JSON, or the step map drawn as a figure, SVG or PNG.

use std::path::Path;

use anyhow::{Context, Result};

use crate::cli::{ExportFormat, ExportTable, FigureArgs};
use crate::trace::export::{
    edits_csv, escape_for_terminal, step_map_csv, steps_csv, tables, tokens_csv,
};

pub fn run(
    trace: &Path,
    format: ExportFormat,
    table: ExportTable,
    out: Option<&Path>,
    figure: &FigureArgs,
) -> Result<()> {
    // `--out -` is stdout, as no --out is.
    let out = out.filter(|p| !crate::cli::output::is_stdout(p));
    if let Some(p) = out {
        crate::cli::output::check_outputs(&[("--out", p)], &[("trace", trace)])?;
    } else if format == ExportFormat::Png && std::io::IsTerminal::is_terminal(&std::io::stdout()) {
        anyhow::bail!(
            "--format png writes an image: give --out FILE (or redirect stdout to a file)"
        );
    }
    let read = crate::trace::file::read_path(trace)?;
    let bytes = match format {
        ExportFormat::Svg | ExportFormat::Png => draw(&read.events, format, figure)
            .with_context(|| format!("{}: cannot draw the step map", trace.display()))?,
        _ => table_text(&read.events, format, table, out.is_none())?.into_bytes(),
    };
    write_out(out, &bytes)?;
    // The good part is exported; say where the trace ended, and exit so that a script knows.
    crate::cli::PartialTrace::check(read.stopped, "exported the events before it")
}

/// The step map as an SVG document, or that drawn as a PNG.
fn draw(
    events: &[crate::trace::events::Event],
    format: ExportFormat,
    figure: &FigureArgs,
) -> Result<Vec<u8>> {
    use crate::tui::figure;
    let svg = figure::step_map_svg(events, &figure.options())?;
    Ok(match format {
        ExportFormat::Png => figure::png::svg_to_png(&svg, figure.dpi.unwrap_or_default())?,
        _ => svg.into_bytes(),
    })
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

/// `bytes` to `--out` (whole or not at all), else to stdout.
fn write_out(out: Option<&Path>, bytes: &[u8]) -> Result<()> {
    use std::io::Write;
    match out {
        Some(p) => crate::cli::output::write_atomically(p, |w| {
            w.write_all(bytes).with_context(|| format!("{}: cannot write", p.display()))
        }),
        None => std::io::stdout().write_all(bytes).context("stdout: cannot write"),
    }
}
