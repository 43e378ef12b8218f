//! The help overlay (`?`): every key, grouped. The table here is the one source of the key
//! list; the footer's hints and the README borrow from it.
//!
//! A window too small for the full descriptions gets shorter ones, chosen line by line (the
//! longest that fits its column), as fields.rs shortens a line; one too small even for the
//! shortest leaves out whole lines, least important first, and says so on the frame. A
//! description is cut with `…` only where a single line is left that still does not fit.

use ratatui::buffer::Buffer;
use ratatui::layout::Rect;
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Clear, Widget};

use super::theme::Theme;
use crate::glyph;

/// One line of the help: the keys, what they do (the fullest spelling first, then shorter
/// ones), and how much it matters: a window too small for every line leaves out the lowest
/// `keep` first (ties: the later line).
pub struct Key {
    pub keys: &'static str,
    pub what: &'static [&'static str],
    pub keep: u8,
}

pub const fn key(keys: &'static str, keep: u8, what: &'static [&'static str]) -> Key {
    Key { keys, what, keep }
}

/// `(group, keys)`.
pub type KeyTable = [(&'static str, &'static [Key])];

/// The keys every screen has (the last group, untitled, of each table).
pub const GENERAL: &[Key] = &[
    key("?", 10, &["this help (any key closes it)", "this help"]),
    key("q Ctrl-C", 10, &["quit"]),
    key("Ctrl-Z", 3, &["suspend (fg resumes)", "suspend"]),
];

/// Stepping, as the TUI and compare both have it.
pub const STEP: Key =
    key("← → h l", 9, &["one step back / forward", "step back / forward", "step back/fwd"]);
pub const BLOCK: Key =
    key("[ ]", 7, &["one block back / forward", "block back / forward", "block back/fwd"]);

const VIEW: (&str, &[Key]) = (
    "view",
    &[
        key(
            "space",
            9,
            &[
                "pause / resume the view (the engine keeps decoding)",
                "pause / resume the view",
                "pause / play",
            ],
        ),
        STEP,
        BLOCK,
        key(
            "Home End",
            6,
            &[
                "first step / live head (End also re-follows)",
                "first step / live head",
                "first / live",
            ],
        ),
        key(
            "g",
            7,
            &["go to a step (12) or a block (b7)", "go to step 12 / block b7", "go to a step"],
        ),
        key(
            "click",
            2,
            &[
                "on the timeline's bar: go to that step",
                "timeline bar: go to step",
                "timeline: seek",
            ],
        ),
        key("r", 4, &["replay from the start", "replay"]),
        key(
            "+ -",
            5,
            &["pace: steps per second the view plays", "pace: steps per second", "pace (steps/s)"],
        ),
    ],
);

const CELLS: (&str, &[Key]) = (
    "cells",
    &[
        key(
            "↑ ↓ k j",
            7,
            &["select the cell a block up / down", "the cell a block up / down", "cell up / down"],
        ),
        key(
            "Tab S-Tab",
            6,
            &["select the next / previous cell", "next / previous cell", "next/prev cell"],
        ),
        key("click", 2, &["select a cell (grid or text)", "select a cell"]),
        key(
            "Esc",
            4,
            &["follow the newest commit again", "follow the newest commit", "follow commits"],
        ),
        key(
            "c",
            5,
            &["show candidates in masked cells", "candidates in masked cells", "candidates"],
        ),
        key("PgUp PgDn", 3, &["scroll the text (wheel too)", "scroll the text", "scroll text"]),
        key(
            "L",
            5,
            &["the Steps list in place of the text", "Steps list in place of text", "Steps list"],
        ),
    ],
);

const ENGINE: (&str, &[Key]) = (
    "engine (live runs)",
    &[
        key(
            "p",
            6,
            &[
                "pause / resume the engine itself",
                "pause / resume the engine",
                "pause / resume engine",
                "pause engine",
            ],
        ),
        key("m", 5, &["next unmasking strategy", "next strategy"]),
        key(
            "t T",
            5,
            &[
                "lower / raise the threshold",
                "lower / raise threshold",
                "threshold down / up",
                "threshold -/+",
            ],
        ),
        key("s S", 5, &["fewer / more steps per block", "fewer / more steps", "steps -/+"]),
        key(
            "",
            1,
            &["changes apply from the next block", "from the next block", "from next block"],
        ),
        key(
            "R",
            6,
            &[
                "restart the decode with the new settings",
                "restart with the new settings",
                "restart with new settings",
                "restart the decode",
                "restart",
            ],
        ),
    ],
);

/// The live TUI's keys.
pub const KEYS: &KeyTable = &[VIEW, CELLS, ENGINE, ("", GENERAL)];

/// A replay's: no engine to steer.
pub const REPLAY_KEYS: &KeyTable = &[VIEW, CELLS, ("", GENERAL)];

/// A line of the overlay before it is laid out.
#[derive(Clone, Copy)]
enum Row<'t> {
    Title(&'static str),
    Key(&'t Key),
    Blank,
}

/// Columns before a key line's keys, and between its keys and what they do.
const INDENT: usize = 2;
const KEY_GAP: usize = 2;
const COLUMN_GAP: usize = 3;

/// The groups' rows, without the key lines `shown` leaves out (a group left empty goes, its
/// title too).
fn groups<'t>(table: &'t KeyTable, shown: &[bool]) -> Vec<Vec<Row<'t>>> {
    let mut shown = shown.iter();
    let mut out = Vec::new();
    for (title, keys) in table {
        let rows: Vec<Row> =
            keys.iter().filter(|_| *shown.next().unwrap_or(&true)).map(Row::Key).collect();
        if !rows.is_empty() {
            out.push(
                (!title.is_empty()).then_some(Row::Title(title)).into_iter().chain(rows).collect(),
            );
        }
    }
    out
}

/// The groups in columns of at most `height` lines, a blank line between groups, a group
/// never split: one column where they all fit, more on a short screen (80x24 cut the list).
fn columns<'t>(groups: Vec<Vec<Row<'t>>>, height: usize) -> Vec<Column<'t>> {
    let mut cols: Vec<Vec<Row>> = vec![Vec::new()];
    for g in groups {
        let col = cols.last_mut().expect("never empty");
        let gap = usize::from(!col.is_empty());
        if !col.is_empty() && col.len() + gap + g.len() > height {
            cols.push(g);
        } else {
            if gap == 1 {
                col.push(Row::Blank);
            }
            col.extend(g);
        }
    }
    cols.into_iter().map(Column::new).collect()
}

/// One column of the overlay: its keys are padded to its widest.
struct Column<'t> {
    rows: Vec<Row<'t>>,
    key_w: usize,
}

impl<'t> Column<'t> {
    fn new(rows: Vec<Row<'t>>) -> Self {
        let key_w = rows
            .iter()
            .filter_map(|r| if let Row::Key(k) = r { Some(glyph::width(k.keys)) } else { None })
            .max();
        Column { rows, key_w: key_w.unwrap_or(0) }
    }

    fn prefix(&self) -> usize {
        INDENT + self.key_w + KEY_GAP
    }

    /// The form `k` takes in a column `room` wide: its longest description that fits, else its
    /// shortest.
    fn form(&self, k: &Key, room: usize) -> usize {
        k.what
            .iter()
            .position(|w| self.prefix() + glyph::width(w) <= room)
            .unwrap_or(k.what.len().saturating_sub(1))
    }

    fn what(&self, k: &Key, room: usize) -> &'static str {
        k.what.get(self.form(k, room)).copied().unwrap_or("")
    }

    /// The column's width with each key line's description chosen by `what`.
    fn width_with(&self, what: impl Fn(&Key) -> &'static str) -> usize {
        let row = |r: &Row| match r {
            Row::Title(s) => glyph::width(s),
            Row::Key(k) => self.prefix() + glyph::width(what(k)),
            Row::Blank => 0,
        };
        self.rows.iter().map(row).max().unwrap_or(0)
    }

    fn narrowest(&self) -> usize {
        self.width_with(|k| k.what.last().copied().unwrap_or(""))
    }

    /// How far its key lines are shortened in `room` columns: the sum over them of the square
    /// of the form each takes (0 the fullest), so that a line taken from its shortest form
    /// counts more than one brought to its fullest.
    fn shortened(&self, room: usize) -> usize {
        self.rows
            .iter()
            .map(|r| if let Row::Key(k) = r { self.form(k, room).pow(2) } else { 0 })
            .sum()
    }

    /// The widths at which one of its lines takes a longer form.
    fn steps(&self) -> impl Iterator<Item = usize> + '_ {
        let keys =
            self.rows.iter().filter_map(|r| if let Row::Key(k) = r { Some(k) } else { None });
        keys.flat_map(move |k| k.what.iter().map(move |w| self.prefix() + glyph::width(w)))
    }

    fn line<'a>(&self, t: &Theme, row: &Row, room: usize) -> Line<'a> {
        match row {
            Row::Title(s) => Line::from(Span::styled(s.to_string(), t.title())),
            Row::Key(k) => {
                let pad = self.key_w - glyph::width(k.keys) + KEY_GAP;
                let keys = format!("{:INDENT$}{}{:pad$}", "", k.keys, "");
                Line::from(vec![
                    Span::styled(keys, t.value()),
                    Span::styled(self.what(k, room), t.dim()),
                ])
            }
            Row::Blank => Line::default(),
        }
    }
}

/// What the overlay shows: its columns, each one's width, and how many key lines it left out.
struct Layout<'t> {
    cols: Vec<Column<'t>>,
    widths: Vec<usize>,
    left_out: usize,
}

/// The key lines in columns within `width` x `height`: every line if their shortest
/// descriptions fit, else without the least important lines (down to one, which may be cut);
/// the columns share the width so that each line keeps the longest description it can.
fn layout(table: &KeyTable, width: usize, height: usize) -> Layout<'_> {
    let keep: Vec<u8> = table.iter().flat_map(|(_, keys)| keys.iter().map(|k| k.keep)).collect();
    let mut order: Vec<usize> = (0..keep.len()).collect();
    order.sort_by_key(|&i| (keep[i], std::cmp::Reverse(i)));
    let mut shown = vec![true; keep.len()];
    let mut left_out = 0;
    let cols = loop {
        let cols = columns(groups(table, &shown), height);
        let gaps = COLUMN_GAP * cols.len().saturating_sub(1);
        let fits = cols.iter().map(Column::narrowest).sum::<usize>() + gaps <= width
            && cols.iter().all(|c| c.rows.len() <= height);
        if fits || left_out + 1 >= keep.len() {
            break cols;
        }
        shown[order[left_out]] = false;
        left_out += 1;
    };
    let widths = share(&cols, width.saturating_sub(COLUMN_GAP * cols.len().saturating_sub(1)));
    Layout { cols, widths, left_out }
}

/// Draws the overlay centred over `area` (the whole screen): a live run's keys, or a replay's
/// (`live` false), which has no engine to steer.
pub fn render(t: &Theme, live: bool, area: Rect, buf: &mut Buffer) {
    render_table(t, if live { KEYS } else { REPLAY_KEYS }, area, buf)
}

/// The overlay for any key table (compare mode has its own).
pub fn render_table(t: &Theme, table: &KeyTable, area: Rect, buf: &mut Buffer) {
    // The frame and a blank column each side, the right one given up before a key line.
    let height = area.height.saturating_sub(2).max(1) as usize;
    let within = |frame: usize| layout(table, (area.width as usize).saturating_sub(frame), height);
    let l = match within(4) {
        l if l.left_out == 0 => l,
        l => std::cmp::min_by_key(l, within(3), |l| l.left_out),
    };
    let content_w = l.widths.iter().sum::<usize>() + COLUMN_GAP * l.widths.len().saturating_sub(1);
    let w = (content_w + 4).min(area.width as usize) as u16;
    let h = (l.cols.iter().map(|c| c.rows.len()).max().unwrap_or(0) as u16 + 2).min(area.height);
    let popup = Rect {
        x: area.x + (area.width - w) / 2,
        y: area.y + (area.height - h) / 2,
        width: w,
        height: h,
    };
    Clear.render(popup, buf);
    let closes = " any key closes ";
    let mut block = Block::bordered()
        .border_style(t.border())
        .title(Line::from(Span::styled(" unmask · keys ", t.title())));
    let mut bottom = 2;
    if l.left_out > 0 {
        let note =
            [format!(" {} more in a larger window ", l.left_out), format!(" {} more ", l.left_out)]
                .into_iter()
                .find(|n| glyph::width(n) + 2 <= w as usize);
        if let Some(note) = note {
            bottom += glyph::width(&note);
            block = block.title_bottom(Line::from(Span::styled(note, t.warn())).left_aligned());
        }
    }
    if bottom + glyph::width(closes) <= w as usize {
        block = block.title_bottom(Line::from(Span::styled(closes, t.faint())).right_aligned());
    }
    let inner = block.inner(popup);
    block.render(popup, buf);
    let mut x = inner.x + 1;
    for (col, &room) in l.cols.iter().zip(&l.widths) {
        for (i, row) in col.rows.iter().take(inner.height as usize).enumerate() {
            // Cut (with `…`) only where a lone line does not fit even in its shortest form.
            let line = super::fields::cut_words(col.line(t, row, room), room);
            buf.set_line(x, inner.y + i as u16, &line, room as u16);
        }
        x = x.saturating_add((room + COLUMN_GAP) as u16);
    }
}

/// Each column's width within `total`: from the least its shortest lines need, the room left
/// goes a step at a time (a width at which some line of a column takes a longer form) where
/// it undoes the most shortening ([`Column::shortened`]) per column given. (Shares fixed in advance left room unused: an
/// even share beside a narrow column while a wide one was cut; a share one column short of a
/// longer form while the next column's lines were cut.)
fn share(cols: &[Column], total: usize) -> Vec<usize> {
    let mut widths: Vec<usize> = cols.iter().map(Column::narrowest).collect();
    let mut left = total.saturating_sub(widths.iter().sum());
    loop {
        // (shortening undone, columns it costs, column, its new width)
        let mut best: Option<(usize, usize, usize, usize)> = None;
        for (i, c) in cols.iter().enumerate() {
            let now = c.shortened(widths[i]);
            for to in c.steps().filter(|&to| to > widths[i] && to - widths[i] <= left) {
                let (gain, cost) = (now - c.shortened(to), to - widths[i]);
                if gain > 0 && best.is_none_or(|(g, c, ..)| gain * c > g * cost) {
                    best = Some((gain, cost, i, to));
                }
            }
        }
        let Some((_, cost, i, to)) = best else { break };
        widths[i] = to;
        left -= cost;
    }
    widths
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tui::testing::snapshot_text;
    use crate::tui::theme::DARK;
    use ratatui::backend::TestBackend;
    use ratatui::Terminal;

    fn screen(table: &KeyTable, w: u16, h: u16) -> String {
        let mut term = Terminal::new(TestBackend::new(w, h)).unwrap();
        term.draw(|f| render_table(&DARK, table, f.area(), f.buffer_mut())).unwrap();
        snapshot_text(term.backend().buffer())
    }

    /// Whether `text` shows `k` whole, in whichever of its forms (`last`: only its shortest):
    /// the keys, blanks, then the description up to a blank or the frame.
    fn shows(text: &str, k: &Key, last: bool) -> bool {
        let forms = if last { &k.what[k.what.len() - 1..] } else { k.what };
        text.lines().any(|line| {
            forms.iter().any(|what| {
                line.match_indices(&format!(" {what}")).any(|(at, m)| {
                    let after = line[at + m.len()..].chars().next();
                    let before = line[..at].trim_end();
                    matches!(after, None | Some(' ' | '│'))
                        && (before.ends_with(&format!(" {}", k.keys)) || k.keys.is_empty())
                })
            })
        })
    }

    fn every_key(table: &KeyTable) -> impl Iterator<Item = &Key> {
        table.iter().flat_map(|(_, keys)| keys.iter())
    }

    /// At 80x24 the keys take two columns; none is left out (the last groups were cut) and no
    /// description is cut: each takes the longest spelling its column has room for (most
    /// ended in `…`).
    #[test]
    fn a_short_screen_shows_every_key_in_columns() {
        let text = screen(KEYS, 80, 24);
        for k in every_key(KEYS) {
            assert!(text.contains(k.keys), "{} missing:\n{text}", k.keys);
        }
        assert!(
            !text.contains(glyph::ELLIPSIS) && !text.contains("more in a larger window"),
            "{text}"
        );
        insta::assert_snapshot!(text);
    }

    /// The TUI's smallest screen still lists every key, each with its shortest description.
    #[test]
    fn the_smallest_screen_shows_every_key() {
        let text = screen(KEYS, 60, 20);
        for k in every_key(KEYS) {
            assert!(shows(&text, k, true), "{} missing:\n{text}", k.keys);
        }
        assert!(
            !text.contains(glyph::ELLIPSIS) && !text.contains("more in a larger window"),
            "{text}"
        );
        insta::assert_snapshot!(text);
    }

    /// Every key line whole, none cut, at the sizes people use.
    #[test]
    fn no_description_is_cut_at_common_sizes() {
        for (table, sizes) in [
            (KEYS, &[(60, 20), (80, 24), (100, 30), (120, 40), (200, 60)][..]),
            (crate::tui::compare::KEYS, &[(80, 22), (100, 30)]),
        ] {
            for &(w, h) in sizes {
                let text = screen(table, w, h);
                assert!(
                    !text.contains(glyph::ELLIPSIS) && !text.contains("more in a"),
                    "{w}x{h}:\n{text}"
                );
                for k in every_key(table) {
                    assert!(shows(&text, k, false), "{w}x{h}: {}:\n{text}", k.keys);
                }
            }
        }
    }

    /// Below the smallest screen (the help stays open over "terminal too small"), whole lines
    /// go, least important first, and the frame says how many; no word is cut.
    #[test]
    fn a_window_too_small_leaves_out_whole_lines_and_says_so() {
        for (w, h) in [(50, 15), (40, 12), (59, 19)] {
            let text = screen(KEYS, w, h);
            let shown = every_key(KEYS).filter(|k| shows(&text, k, false)).count();
            let left_out = every_key(KEYS).count() - shown;
            assert!(
                left_out > 0 && text.contains(&format!(" {left_out} more in a larger window ")),
                "{w}x{h}:\n{text}"
            );
            assert!(!text.contains(glyph::ELLIPSIS), "{w}x{h}:\n{text}");
            assert!(
                shows(&text, &GENERAL[0], false) && shows(&text, &GENERAL[1], false),
                "{w}x{h}:\n{text}"
            );
            let note = every_key(KEYS).find(|k| k.keys.is_empty()).unwrap();
            assert!(!shows(&text, note, false), "the least important go first:\n{text}");
        }
        // However small, nothing panics.
        for w in 0..30 {
            for h in 0..12 {
                render(
                    &DARK,
                    true,
                    Rect::new(0, 0, w, h),
                    &mut Buffer::empty(Rect::new(0, 0, w, h)),
                );
            }
        }
    }

    /// Compare's own keys at its smallest screen.
    #[test]
    fn compare_help_at_its_smallest_screen() {
        let text = screen(crate::tui::compare::KEYS, 80, 22);
        assert!(text.contains("lock-step by step index / aligned by block"), "{text}");
        insta::assert_snapshot!(text);
    }

    /// At 100x30 (the live TUI's two columns) the second column is narrow: the first takes
    /// the room it leaves, and `+ -`'s line shows whole (it was cut beside unused room).
    #[test]
    fn the_help_uses_the_room_a_narrow_column_leaves() {
        let mut term = Terminal::new(TestBackend::new(100, 30)).unwrap();
        term.draw(|f| render(&DARK, true, f.area(), f.buffer_mut())).unwrap();
        let text = snapshot_text(term.backend().buffer());
        assert!(text.contains("pace: steps per second the view plays"), "{text}");
        assert!(text.contains("the Steps list in place of the text"), "{text}");
    }

    #[test]
    fn help_overlay() {
        let mut term = Terminal::new(TestBackend::new(80, 36)).unwrap();
        term.draw(|f| render(&DARK, true, f.area(), f.buffer_mut())).unwrap();
        insta::assert_snapshot!(snapshot_text(term.backend().buffer()));
    }

    /// A replay has no engine: its help leaves the engine's keys out (they only warn there).
    #[test]
    fn a_replay_lists_no_engine_keys() {
        let mut term = Terminal::new(TestBackend::new(80, 24)).unwrap();
        term.draw(|f| render(&DARK, false, f.area(), f.buffer_mut())).unwrap();
        let text = snapshot_text(term.backend().buffer());
        assert!(!text.contains("engine (live runs)") && !text.contains("restart"), "{text}");
        assert!(text.contains("follow the newest commit") && text.contains("quit"), "{text}");
        assert!(!text.contains(glyph::ELLIPSIS), "{text}");
    }

    #[test]
    fn every_key_the_app_handles_is_listed() {
        let listed: String =
            KEYS.iter().flat_map(|(_, k)| k.iter().map(|k| format!(" {} ", k.keys))).collect();
        for k in [
            "space", "h", "l", "[", "]", "Home", "End", "g", "r", "+", "-", "j", "k", "Tab", "Esc",
            "c", "p", "m", "t", "T", "s", "S", "R", "?", "q", "Ctrl-C", "Ctrl-Z", "PgUp",
        ] {
            assert!(listed.contains(&format!(" {k} ")), "help does not list {k}");
        }
    }
}
