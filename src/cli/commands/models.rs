//! `unmask models`: the checkpoints of the local Hugging Face cache that `--model ORG/NAME`
//! loads, as a table or JSON Lines.

use std::io::Write;

use anyhow::{Context, Result};

use crate::model::hub::{self, Cached};

pub fn run(all: bool, json: bool) -> Result<()> {
    let Some(root) = hub::cache_dir(|k| std::env::var(k).ok()) else {
        anyhow::bail!("no Hugging Face cache: set HF_HUB_CACHE or HF_HOME (or HOME)");
    };
    if !root.is_dir() {
        eprintln!(
            "unmask: no Hugging Face cache at {} (HF_HUB_CACHE or HF_HOME set another)",
            root.display()
        );
        return Ok(());
    }
    let rows = hub::cached(&root)?;
    let mut out = std::io::stdout().lock();
    let text = if json { json_lines(&rows, all) } else { table(&rows, all, &root) };
    out.write_all(text.as_bytes()).context("stdout: cannot write")?;
    out.flush().context("stdout: cannot write")
}

/// The table: loadable rows (and with `all` the others, with why), then a count of the rest.
pub fn table(rows: &[Cached], all: bool, root: &std::path::Path) -> String {
    let shown: Vec<&Cached> = rows.iter().filter(|r| all || r.verdict.is_ok()).collect();
    let hidden = rows.len() - shown.len();
    let mut lines = vec![["MODEL", "REVISION", "FAMILY", "PARAMS", "SIZE", ""].map(String::from)];
    for r in &shown {
        lines.push(match &r.verdict {
            Ok(l) => [
                r.id.clone(),
                r.revision.clone(),
                l.model_type.clone(),
                params(l.params),
                size(l.bytes),
                String::new(),
            ],
            Err(why) => [
                r.id.clone(),
                r.revision.clone(),
                "-".into(),
                "-".into(),
                "-".into(),
                format!("cannot load: {why}"),
            ],
        });
    }
    let widths: Vec<usize> = (0..6)
        .map(|c| lines.iter().map(|l| crate::glyph::width(&l[c])).max().unwrap_or(0))
        .collect();
    let mut s = String::new();
    if shown.is_empty() {
        s.push_str(&format!("no checkpoint unmask can load in {}\n", root.display()));
    } else {
        for l in &lines {
            let cells: Vec<String> = l
                .iter()
                .zip(&widths)
                .map(|(t, w)| format!("{t}{}", " ".repeat(w - crate::glyph::width(t))))
                .collect();
            s.push_str(cells.join("  ").trim_end());
            s.push('\n');
        }
    }
    if hidden > 0 {
        s.push_str(&format!(
            "({} in the cache that unmask cannot load: --all lists them and why)\n",
            crate::format::count(hidden, "other snapshot")
        ));
    }
    s
}

pub fn json_lines(rows: &[Cached], all: bool) -> String {
    rows.iter()
        .filter(|r| all || r.verdict.is_ok())
        .map(|r| {
            let mut v = serde_json::json!({
                "model": r.id,
                "revision": r.revision,
                "path": r.snapshot.display().to_string(),
            });
            match &r.verdict {
                Ok(l) => {
                    v["model_type"] = l.model_type.clone().into();
                    v["params"] = l.params.into();
                    v["bytes"] = l.bytes.into();
                }
                Err(why) => v["error"] = why.clone().into(),
            }
            format!("{v}\n")
        })
        .collect()
}

/// `1.7B`, `30.5B`, `0.6M`.
fn params(n: usize) -> String {
    let n = n as f64;
    if n >= 1e9 {
        format!("{}B", crate::format::fixed(n / 1e9, 1))
    } else {
        format!("{}M", crate::format::fixed(n / 1e6, 1))
    }
}

/// `4.06 GB`, `5.1 MB`, `12 kB`.
fn size(b: u64) -> String {
    let b = b as f64;
    match b {
        b if b >= 1e9 => format!("{} GB", crate::format::fixed(b / 1e9, 2)),
        b if b >= 1e6 => format!("{} MB", crate::format::fixed(b / 1e6, 1)),
        b => format!("{} kB", crate::format::fixed(b / 1e3, 0)),
    }
}
