//! Helpers for the panels' tests: draw one panel on a `TestBackend`, read the screen as text.

use ratatui::backend::TestBackend;
use ratatui::buffer::Buffer;
use ratatui::layout::Rect;
use ratatui::Terminal;

use super::app::{App, View};

/// Draws one panel filling a `w`×`h` terminal and returns what is on screen.
pub fn render_panel(app: &App, w: u16, h: u16, panel: fn(&View, Rect, &mut Buffer)) -> Buffer {
    let mut term = Terminal::new(TestBackend::new(w, h)).expect("test backend");
    term.draw(|f| {
        let v = app.view().expect("a run");
        panel(&v, f.area(), f.buffer_mut())
    })
    .expect("draw");
    term.backend().buffer().clone()
}

/// The screen's text, one line per row, trailing blanks trimmed; cells hidden under a wide
/// character are skipped, as a terminal would show them.
pub fn snapshot_text(buf: &Buffer) -> String {
    let w = buf.area.width as usize;
    let mut out = String::new();
    for row in buf.content.chunks(w) {
        let mut line = String::new();
        let mut skip = 0;
        for c in row {
            if skip > 0 {
                skip -= 1;
                continue;
            }
            line.push_str(c.symbol());
            skip = super::glyph::width(c.symbol()).saturating_sub(1);
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}
