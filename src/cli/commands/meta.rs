//! `unmask completions SHELL` and `unmask man`: the command line described for a shell and for
//! man, both from the definition `--help` prints (defaults included), so none can drift.

use std::io::Write;
use std::path::Path;

use anyhow::{Context, Result};

use crate::cli::output::write_atomically;
use crate::cli::Cli;

/// The completion script of `shell` on stdout.
pub fn completions(shell: clap_complete::Shell) -> Result<()> {
    let mut cmd = Cli::checked_command();
    // Into memory first: clap_complete panics on a write that fails (`| head`).
    let mut script = Vec::new();
    clap_complete::generate(shell, &mut cmd, "unmask", &mut script);
    let mut out = std::io::stdout().lock();
    out.write_all(&script).and_then(|()| out.flush()).context("stdout: cannot write")
}

/// The top page on stdout, or with `dir` every command's page written there.
pub fn man(dir: Option<&Path>) -> Result<()> {
    let mut cmd = Cli::checked_command();
    cmd.build();
    match dir {
        None => {
            let mut out = std::io::stdout().lock();
            clap_mangen::Man::new(cmd).render(&mut out).context("stdout: cannot write")?;
            out.flush().context("stdout: cannot write")
        }
        Some(dir) => {
            if !dir.is_dir() {
                anyhow::bail!("--dir {}: not a folder", dir.display());
            }
            pages(&cmd, dir)
        }
    }
}

/// A page for `cmd` (`unmask.1`) and one per visible subcommand, named as clap names them once
/// built (`unmask-trace.1`), each written whole or not at all. clap_mangen's own
/// `generate_to` would also write the hidden ones.
fn pages(cmd: &clap::Command, dir: &Path) -> Result<()> {
    let name = cmd.get_display_name().unwrap_or_else(|| cmd.get_name());
    let path = dir.join(format!("{name}.1"));
    let page = clap_mangen::Man::new(cmd.clone());
    write_atomically(&path, |w| page.render(w).with_context(|| format!("{}", path.display())))?;
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set() && s.get_name() != "help") {
        pages(sub, dir)?;
    }
    Ok(())
}
