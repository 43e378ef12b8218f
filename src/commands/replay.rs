//! `unmask replay FILE`: the TUI over a recorded trace, no model needed.

use std::path::Path;

use anyhow::Result;

use crate::trace;
use crate::ui::theme::Theme;
use crate::ui::App;

pub fn run(path: &Path, theme: &'static Theme) -> Result<()> {
    super::tui::require_terminal()?;
    let t = trace::read_file(path)?;
    let mut app = App::replay(t.events, path.display().to_string(), t.stopped);
    app.theme = theme;
    super::tui::serve(&mut app, None, &mut |_| {})
}
