//! The help overlay (`?`): every key, grouped. The table here is the one source of the key
//! list; the footer's hints and the README borrow from it.

use ratatui::buffer::Buffer;
use ratatui::layout::Rect;
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Clear, Widget};

use super::theme::Theme;

/// `(group, [(keys, what)])`.
pub type KeyTable = [(&'static str, &'static [(&'static str, &'static str)])];

pub const KEYS: &KeyTable = &[
    (
        "view",
        &[
            ("space", "pause / resume the view (the engine keeps decoding)"),
            ("← → h l", "one step back / forward"),
            ("[ ]", "one block back / forward"),
            ("Home End", "first step / live head (End also re-follows)"),
            ("g", "go to a step (12) or a block (b7)"),
            ("click", "on the timeline's bar: go to that step"),
            ("r", "replay from the start"),
            ("+ -", "pace: steps per second the view plays"),
        ],
    ),
    (
        "cells",
        &[
            ("↑ ↓ k j", "select the cell a block up / down"),
            ("Tab S-Tab", "select the next / previous cell"),
            ("click", "select a cell (grid or text)"),
            ("Esc", "follow the newest commit again"),
            ("c", "show candidates in masked cells"),
            ("PgUp PgDn", "scroll the text (wheel too)"),
            ("L", "the Steps list in place of the text"),
        ],
    ),
    (
        "engine (live runs)",
        &[
            ("p", "pause / resume the engine itself"),
            ("m", "next unmasking strategy"),
            ("t T", "lower / raise the threshold"),
            ("s S", "fewer / more steps per block"),
            ("", "changes apply from the next block"),
            ("R", "restart the decode with the new settings"),
        ],
    ),
    ("", &[("?", "this help (any key closes it)"), ("q Ctrl-C", "quit"), ("Ctrl-Z", "suspend (fg resumes)")]),
];

const KEY_W: usize = 11;

fn lines<'a>(t: &Theme, table: &KeyTable) -> Vec<Line<'a>> {
    let mut out = Vec::new();
    for (group, keys) in table {
        if !group.is_empty() {
            out.push(Line::from(Span::styled(group.to_string(), t.title())));
        }
        for (k, what) in keys.iter() {
            out.push(Line::from(vec![
                Span::styled(format!("  {k:<KEY_W$} "), t.value()),
                Span::styled(what.to_string(), t.dim()),
            ]));
        }
        out.push(Line::default());
    }
    out.pop();
    out
}

/// Draws the overlay centred over `area` (the whole screen).
pub fn render(t: &Theme, area: Rect, buf: &mut Buffer) {
    render_table(t, KEYS, area, buf)
}

/// The overlay for any key table (compare mode has its own).
pub fn render_table(t: &Theme, table: &KeyTable, area: Rect, buf: &mut Buffer) {
    let content = lines(t, table);
    let w = (content.iter().map(Line::width).max().unwrap_or(0) as u16 + 4).min(area.width);
    let h = (content.len() as u16 + 2).min(area.height);
    let popup = Rect { x: area.x + (area.width - w) / 2, y: area.y + (area.height - h) / 2, width: w, height: h };
    Clear.render(popup, buf);
    let block = Block::bordered()
        .border_style(t.border())
        .title(Line::from(Span::styled(" unmask · keys ", t.title())))
        .title_bottom(Line::from(Span::styled(" any key closes ", t.faint())).right_aligned());
    let inner = block.inner(popup);
    block.render(popup, buf);
    for (i, line) in content.iter().take(inner.height as usize).enumerate() {
        buf.set_line(inner.x + 1, inner.y + i as u16, line, inner.width.saturating_sub(1));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ui::testing::snapshot_text;
    use crate::ui::theme::DARK;
    use ratatui::backend::TestBackend;
    use ratatui::Terminal;

    #[test]
    fn help_overlay() {
        let mut term = Terminal::new(TestBackend::new(80, 36)).unwrap();
        term.draw(|f| render(&DARK, f.area(), f.buffer_mut())).unwrap();
        insta::assert_snapshot!(snapshot_text(term.backend().buffer()));
    }

    #[test]
    fn every_key_the_app_handles_is_listed() {
        let listed: String = KEYS.iter().flat_map(|(_, k)| k.iter().map(|(k, _)| format!(" {k} "))).collect();
        for k in ["space", "h", "l", "[", "]", "Home", "End", "g", "r", "+", "-", "j", "k", "Tab", "Esc", "c", "p", "m", "t", "T", "s", "S", "R", "?", "q", "Ctrl-C", "Ctrl-Z", "PgUp"] {
            assert!(listed.contains(&format!(" {k} ")), "help does not list {k}");
        }
    }
}
