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
            skip = crate::glyph::width(c.symbol()).saturating_sub(1);
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

/// The screen's text with its styles: each row's text, then one line per run of equally styled
/// cells that has a colour or a modifier (`  3..9 fg Indexed(67) bg Rgb(..) BOLD`).
pub fn snapshot_styled(buf: &Buffer) -> String {
    use ratatui::style::{Color, Modifier};
    let w = buf.area.width as usize;
    let text = snapshot_text(buf);
    let mut out = String::new();
    for (row, line) in buf.content.chunks(w).zip(text.lines()) {
        out.push_str(line);
        out.push('\n');
        let key = |c: &ratatui::buffer::Cell| (c.fg, c.bg, c.modifier);
        let mut x = 0;
        while x < w {
            let k = key(&row[x]);
            let end = (x..w).find(|&e| key(&row[e]) != k).unwrap_or(w);
            let (fg, bg, m) = k;
            if fg != Color::Reset || bg != Color::Reset || m != Modifier::empty() {
                let mut s = format!("  {x}..{end}");
                if fg != Color::Reset {
                    s += &format!(" fg {fg:?}");
                }
                if bg != Color::Reset {
                    s += &format!(" bg {bg:?}");
                }
                if m != Modifier::empty() {
                    s += &format!(" {m:?}");
                }
                out.push_str(&s);
                out.push('\n');
            }
            x = end;
        }
    }
    out
}
