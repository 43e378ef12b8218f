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

/// Each group's lines: its title (if any), then a line a key.
fn groups<'a>(t: &Theme, table: &KeyTable) -> Vec<Vec<Line<'a>>> {
    table
        .iter()
        .map(|(group, keys)| {
            let title = (!group.is_empty()).then(|| Line::from(Span::styled(group.to_string(), t.title())));
            title
                .into_iter()
                .chain(keys.iter().map(|(k, what)| {
                    Line::from(vec![Span::styled(format!("  {k:<KEY_W$} "), t.value()), Span::styled(what.to_string(), t.dim())])
                }))
                .collect()
        })
        .collect()
}

/// The groups in columns of at most `height` lines, a blank line between groups, a group
/// never split: one column where they all fit, more on a short screen (80x24 cut the list).
fn columns<'a>(groups: Vec<Vec<Line<'a>>>, height: usize) -> Vec<Vec<Line<'a>>> {
    let mut cols: Vec<Vec<Line>> = vec![Vec::new()];
    for g in groups {
        let col = cols.last_mut().expect("never empty");
        let gap = usize::from(!col.is_empty());
        if !col.is_empty() && col.len() + gap + g.len() > height {
            cols.push(g);
        } else {
            if gap == 1 {
                col.push(Line::default());
            }
            col.extend(g);
        }
    }
    cols
}

const COLUMN_GAP: u16 = 3;

/// Draws the overlay centred over `area` (the whole screen).
pub fn render(t: &Theme, area: Rect, buf: &mut Buffer) {
    render_table(t, KEYS, area, buf)
}

/// The overlay for any key table (compare mode has its own).
pub fn render_table(t: &Theme, table: &KeyTable, area: Rect, buf: &mut Buffer) {
    let cols = columns(groups(t, table), area.height.saturating_sub(2).max(1) as usize);
    let col_w: Vec<u16> = cols.iter().map(|c| c.iter().map(Line::width).max().unwrap_or(0) as u16).collect();
    let content_w = col_w.iter().sum::<u16>() + COLUMN_GAP * (col_w.len() as u16).saturating_sub(1);
    let w = (content_w + 4).min(area.width);
    let h = (cols.iter().map(Vec::len).max().unwrap_or(0) as u16 + 2).min(area.height);
    let popup = Rect { x: area.x + (area.width - w) / 2, y: area.y + (area.height - h) / 2, width: w, height: h };
    Clear.render(popup, buf);
    let block = Block::bordered()
        .border_style(t.border())
        .title(Line::from(Span::styled(" unmask · keys ", t.title())))
        .title_bottom(Line::from(Span::styled(" any key closes ", t.faint())).right_aligned());
    let inner = block.inner(popup);
    block.render(popup, buf);
    // Columns wider than the window share it: each keeps its natural width if it can, and a
    // description that must give way is cut between words with `…` (the keys stay whole).
    let n = cols.len() as u16;
    let rooms = share(&col_w, inner.width.saturating_sub(1 + COLUMN_GAP * n.saturating_sub(1)));
    let mut x = inner.x + 1;
    for (col, &room) in cols.iter().zip(&rooms) {
        for (i, line) in col.iter().take(inner.height as usize).enumerate() {
            buf.set_line(x, inner.y + i as u16, &super::fields::cut_words(line.clone(), room as usize), room);
        }
        x = x.saturating_add(room + COLUMN_GAP);
    }
}

/// The columns' widths within `total` columns: all their natural widths if they fit; else
/// those narrower than an even share keep theirs and the others split what is left evenly
/// (an even share for every column left room unused beside a narrow one while a wide one
/// was cut).
fn share(natural: &[u16], total: u16) -> Vec<u16> {
    if natural.iter().sum::<u16>() <= total {
        return natural.to_vec();
    }
    let mut rooms: Vec<Option<u16>> = vec![None; natural.len()];
    let mut left = total;
    loop {
        let open: Vec<usize> = (0..natural.len()).filter(|&i| rooms[i].is_none()).collect();
        if open.is_empty() {
            break;
        }
        let even = left / open.len() as u16;
        let fits: Vec<usize> = open.iter().copied().filter(|&i| natural[i] <= even).collect();
        if fits.is_empty() {
            open.iter().for_each(|&i| rooms[i] = Some(even));
            break;
        }
        for i in fits {
            rooms[i] = Some(natural[i]);
            left -= natural[i];
        }
    }
    rooms.into_iter().map(|r| r.unwrap_or(0)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ui::testing::snapshot_text;
    use crate::ui::theme::DARK;
    use ratatui::backend::TestBackend;
    use ratatui::Terminal;

    /// At 80x24 the keys take two columns; none is left out (the last groups were cut).
    #[test]
    fn a_short_screen_shows_every_key_in_columns() {
        let mut term = Terminal::new(TestBackend::new(80, 24)).unwrap();
        term.draw(|f| render(&DARK, f.area(), f.buffer_mut())).unwrap();
        let text = snapshot_text(term.backend().buffer());
        for (_, keys) in KEYS {
            for (k, _) in keys.iter() {
                assert!(text.contains(k), "{k} missing:\n{text}");
            }
        }
        insta::assert_snapshot!(text);
    }

    #[test]
    fn a_narrow_column_leaves_its_room_to_a_wide_one() {
        assert_eq!(share(&[65, 43], 94), vec![51, 43]);
        assert_eq!(share(&[65, 54], 74), vec![37, 37]);
        assert_eq!(share(&[30, 40], 94), vec![30, 40]);
        assert_eq!(share(&[10, 70, 70], 100), vec![10, 45, 45]);
    }

    /// At 100x30 (the live TUI's two columns) the second column is narrow: the first takes
    /// the room it leaves, and `+ -`'s line shows whole (it was cut beside unused room).
    #[test]
    fn the_help_uses_the_room_a_narrow_column_leaves() {
        let mut term = Terminal::new(TestBackend::new(100, 30)).unwrap();
        term.draw(|f| render(&DARK, f.area(), f.buffer_mut())).unwrap();
        let text = snapshot_text(term.backend().buffer());
        assert!(text.contains("pace: steps per second the view plays"), "{text}");
        assert!(text.contains("the Steps list in place of the text"), "{text}");
    }

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
