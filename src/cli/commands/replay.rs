//! `unmask replay FILE`: the TUI over a recorded trace, no model needed.

use std::path::Path;

use anyhow::Result;

use crate::cli::LookArgs;
use crate::trace::file as trace;
use crate::tui::App;

pub fn run(path: &Path, look: &LookArgs) -> Result<()> {
    let pace = look.pace()?;
    let t = trace::read_path(path)?;
    super::tui::require_terminal()?;
    let mut app = App::replay(t.events, path.display().to_string(), t.stopped).with_pace(pace);
    app.theme = look.theme();
    super::tui::serve(&mut app, None, &mut |_| {})
}
