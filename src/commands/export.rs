//! `unmask export`: a trace's per-token table, per-step table and step map, as CSV or JSON.

use std::path::Path;

use anyhow::{Context, Result};

use crate::cli::{ExportFormat, ExportTable};
use crate::export::{escape_for_terminal, step_map_csv, steps_csv, tables, tokens_csv};

pub fn run(trace: &Path, format: ExportFormat, table: ExportTable, out: Option<&Path>) -> Result<()> {
    if let Some(p) = out {
        crate::output::refuse_clashes(&[("--out", p)], &[("trace", trace)])?;
    }
    let read = crate::trace::read_file(trace)?;
    if let Some(why) = &read.stopped {
        // The good part is still exported; say where the trace ended.
        eprintln!("unmask: warning: {}; exporting the events before it", crate::ui::glyph::escape_line(why));
    }
    let mut t = tables(&read.events);
    if out.is_none() && std::io::IsTerminal::is_terminal(&std::io::stdout()) {
        escape_for_terminal(&mut t);
    }
    let text = match (format, table) {
        (ExportFormat::Json, _) => serde_json::to_string_pretty(&t)? + "\n",
        (ExportFormat::Csv, ExportTable::Tokens) => tokens_csv(&t),
        (ExportFormat::Csv, ExportTable::Steps) => steps_csv(&t),
        (ExportFormat::Csv, ExportTable::StepMap) => step_map_csv(&t),
    };
    match out {
        Some(p) => crate::output::write_atomically(p, |w| {
            use std::io::Write;
            w.write_all(text.as_bytes()).with_context(|| format!("{}: cannot write", p.display()))
        }),
        None => {
            use std::io::Write;
            std::io::stdout().write_all(text.as_bytes()).context("stdout: cannot write")
        }
    }
}
