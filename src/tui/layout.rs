//! Where each panel goes, as a pure function of the terminal's size (mouse hit tests use it
//! too). Wide terminals put the grid beside the text; narrow ones stack them.

use ratatui::layout::{Constraint, Layout, Rect};

/// Below this the panels cannot show anything useful; the screen says so instead.
pub const MIN_WIDTH: u16 = 60;
pub const MIN_HEIGHT: u16 = 20;
/// From this width on, the grid and the text sit side by side.
const WIDE: u16 = 110;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Areas {
    pub title: Rect,
    pub grid: Rect,
    pub text: Rect,
    pub inspector: Rect,
    pub stats: Rect,
    pub timeline: Rect,
    pub footer: Rect,
}

pub fn areas(size: Rect) -> Option<Areas> {
    if size.width < MIN_WIDTH || size.height < MIN_HEIGHT {
        return None;
    }
    let [title, middle, timeline, footer] = Layout::vertical([
        Constraint::Length(1),
        Constraint::Min(0),
        Constraint::Length(4),
        Constraint::Length(1),
    ])
    .areas(size);
    Some(if size.width >= WIDE {
        wide(title, middle, timeline, footer)
    } else {
        narrow(title, middle, timeline, footer)
    })
}

fn wide(title: Rect, middle: Rect, timeline: Rect, footer: Rect) -> Areas {
    let [upper, stats] =
        Layout::vertical([Constraint::Min(0), Constraint::Length(7)]).areas(middle);
    let [grid, right] =
        Layout::horizontal([Constraint::Percentage(55), Constraint::Percentage(45)]).areas(upper);
    let [text, inspector] =
        Layout::vertical([Constraint::Min(5), Constraint::Length(inspector_height(right))])
            .areas(right);
    Areas { title, grid, text, inspector, stats, timeline, footer }
}

/// Stacked: inspector and stats below (at least 7 rows, 30 % of the height), the grid and the
/// text sharing the rest 55:45, so that at 80x24 the text still shows three lines (40:25:35
/// gave it two).
fn narrow(title: Rect, middle: Rect, timeline: Rect, footer: Rect) -> Areas {
    let bottom_h = (middle.height * 3 / 10).max(7);
    let [upper, bottom] =
        Layout::vertical([Constraint::Min(0), Constraint::Length(bottom_h)]).areas(middle);
    let [grid, text] =
        Layout::vertical([Constraint::Percentage(55), Constraint::Percentage(45)]).areas(upper);
    let [inspector, stats] =
        Layout::horizontal([Constraint::Percentage(50), Constraint::Percentage(50)]).areas(bottom);
    Areas { title, grid, text, inspector, stats, timeline, footer }
}

/// The inspector needs about a dozen lines for a trajectory of a few steps; it takes up to
/// half the column.
fn inspector_height(column: Rect) -> u16 {
    (column.height / 2).clamp(8, 16)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn inside(a: Rect, outer: Rect) -> bool {
        a.x >= outer.x
            && a.y >= outer.y
            && a.right() <= outer.right()
            && a.bottom() <= outer.bottom()
    }

    #[test]
    fn too_small_has_no_layout() {
        assert!(areas(Rect::new(0, 0, MIN_WIDTH - 1, 40)).is_none());
        assert!(areas(Rect::new(0, 0, 120, MIN_HEIGHT - 1)).is_none());
        assert!(areas(Rect::new(0, 0, MIN_WIDTH, MIN_HEIGHT)).is_some());
    }

    #[test]
    fn panels_fit_and_do_not_overlap_at_any_size() {
        for (w, h) in [(60, 20), (80, 24), (109, 30), (110, 30), (120, 40), (200, 60), (300, 100)] {
            let size = Rect::new(0, 0, w, h);
            let a = areas(size).unwrap();
            let all = [a.title, a.grid, a.text, a.inspector, a.stats, a.timeline, a.footer];
            for (i, x) in all.iter().enumerate() {
                assert!(inside(*x, size), "{w}x{h}: panel {i} outside");
                assert!(x.width > 0 && x.height > 0, "{w}x{h}: panel {i} empty");
                for y in &all[i + 1..] {
                    assert!(!x.intersects(*y), "{w}x{h}: panels overlap");
                }
            }
        }
    }

    /// At 80x24 every panel keeps room to say something: the text three lines, the grid
    /// four blocks, the inspector five.
    #[test]
    fn the_smallest_common_terminal_gives_the_text_three_lines() {
        let a = areas(Rect::new(0, 0, 80, 24)).unwrap();
        assert!(a.text.height - 2 >= 3, "{:?}", a.text);
        assert!(a.grid.height - 2 >= 4, "{:?}", a.grid);
        assert!(a.inspector.height - 2 >= 5, "{:?}", a.inspector);
    }

    #[test]
    fn wide_puts_grid_beside_text() {
        let a = areas(Rect::new(0, 0, 120, 40)).unwrap();
        assert_eq!(a.grid.y, a.text.y);
        assert!(a.grid.right() <= a.text.x);
        let n = areas(Rect::new(0, 0, 80, 30)).unwrap();
        assert!(n.grid.bottom() <= n.text.y);
    }
}
