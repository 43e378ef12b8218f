//! Where the step map's cells go: each cell as wide as its token's text, blocks side by side
//! in aligned columns, as many a row as fit the figure's width (or as many as asked), a block
//! wider than a row wrapped over several lines. Pure geometry in points; no drawing.

use std::num::NonZeroUsize;

/// Token text: 8 pt DejaVu Sans Mono (bundled, and named first in the SVG), whose advance is
/// 1233/2048 em. A wide character (CJK) takes two columns, as unicode-width measures it; the
/// CJK font's 1 em glyph fits in them.
pub const FONT: f64 = 8.0;
pub const ADVANCE: f64 = FONT * 1233.0 / 2048.0;
/// Space between a cell's edge and its text.
pub const PAD: f64 = 1.6;
/// The narrowest cell: two columns, so that a one-character token's confidence bar still
/// reads as a length.
pub const MIN_COLS: usize = 2;
/// The most columns a cell shows (12 CJK characters); a longer token is cut with `…`, its full
/// text in the tooltip. Real tokens are rarely past 16 columns; a long run of spaces or
/// dashes would otherwise stretch its whole block column across the figure.
pub const MAX_COLS: usize = 24;
pub const CELL_H: f64 = 16.0;
pub const CELL_GAP: f64 = 1.0;
/// Between the lines of a wrapped block, and between rows.
pub const LINE_GAP: f64 = 2.0;
pub const ROW_GAP: f64 = 4.0;
/// Block numbers: 6 pt Noto Sans, whose digits are 0.572 em.
pub const LABEL_FONT: f64 = 6.0;
const LABEL_DIGIT: f64 = 0.572 * LABEL_FONT;
/// Between a block's number and its first cell.
const LABEL_GAP: f64 = 2.5;
/// Between a block's last cell and the next block's number.
const BLOCK_GAP: f64 = 5.0;

/// A cell's width for text `cols` columns wide.
pub fn cell_w(cols: usize) -> f64 {
    cols.max(MIN_COLS) as f64 * ADVANCE + 2.0 * PAD
}

/// The most columns a cell may show when a block's line holds `line` points.
pub fn max_cols(line: f64) -> usize {
    (((line - 2.0 * PAD) / ADVANCE).floor().max(0.0) as usize).clamp(MIN_COLS, MAX_COLS)
}

/// Room for block numbers up to `last`, right-aligned before each block.
pub fn label_w(last: usize) -> f64 {
    last.to_string().len() as f64 * LABEL_DIGIT
}

/// The widest line a block may take in a grid `room` points wide with numbers `label_w` wide.
pub fn line_room(room: f64, label_w: f64) -> f64 {
    room - label_w - LABEL_GAP
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Rect {
    pub x: f64,
    pub y: f64,
    pub w: f64,
    pub h: f64,
}

/// One block, placed: where its number's right edge and first line are, the outline of each of
/// its lines, and its cells in position order.
#[derive(Clone, Debug, PartialEq)]
pub struct Placed {
    pub label: (f64, f64),
    pub lines: Vec<Rect>,
    pub cells: Vec<Rect>,
    pub row: usize,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Packed {
    pub blocks: Vec<Placed>,
    pub per_row: usize,
    pub height: f64,
}

/// `--blocks-per-row N` asked for more than the width holds.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[error("{per_row} blocks a row need {need:.0} pt, over the {room:.0} pt the figure's width leaves: give fewer blocks a row or a wider --width")]
pub struct TooWide {
    pub per_row: usize,
    pub need: f64,
    pub room: f64,
}

/// Places blocks whose cells are `blocks[i]` points wide in a grid `room` points wide, the
/// numbers `label_w` wide. By default rows fill like lines of text: each takes the blocks that
/// fit, in order. With `per_row`, every row takes that many, lined up in columns each as wide
/// as its widest block, or the width is refused. A block wider than the grid wraps, alone on
/// its row.
pub fn pack(
    blocks: &[Vec<f64>],
    room: f64,
    label_w: f64,
    per_row: Option<NonZeroUsize>,
) -> Result<Packed, TooWide> {
    let widths: Vec<f64> = blocks.iter().map(|c| span(c)).collect();
    let slot = label_w + LABEL_GAP;
    let rows = match per_row {
        Some(n) => columns(&widths, n.get(), slot, room)?,
        None => flow(&widths, slot, room),
    };
    let mut placed = Vec::with_capacity(blocks.len());
    let mut y = 0.0;
    for (row, members) in rows.iter().enumerate() {
        let mut lines = 1;
        for &(i, x) in members {
            let block = place(&blocks[i], (x + slot, y), room - x - slot, row);
            lines = lines.max(block.lines.len());
            placed.push(block);
        }
        y += lines as f64 * (CELL_H + LINE_GAP) - LINE_GAP + ROW_GAP;
    }
    let most = rows.iter().map(Vec::len).max().unwrap_or(1);
    Ok(Packed { blocks: placed, per_row: most, height: (y - ROW_GAP).max(0.0) })
}

/// A row: its blocks by index, each with the x of its number's slot.
type Row = Vec<(usize, f64)>;

/// Rows filled in order with the blocks that fit.
fn flow(widths: &[f64], slot: f64, room: f64) -> Vec<Row> {
    let mut rows: Vec<Row> = Vec::new();
    let mut x = 0.0;
    for (i, w) in widths.iter().enumerate() {
        match rows.last_mut() {
            Some(row) if x + slot + w <= room + 1e-9 => row.push((i, x)),
            _ => {
                rows.push(vec![(i, 0.0)]);
                x = 0.0;
            }
        }
        x += slot + w + BLOCK_GAP;
    }
    rows
}

/// Rows of `per_row` blocks in aligned columns, if they fit `room`.
fn columns(widths: &[f64], per_row: usize, slot: f64, room: f64) -> Result<Vec<Row>, TooWide> {
    let need = row_width(widths, per_row, slot);
    if per_row > 1 && need > room + 1e-9 {
        return Err(TooWide { per_row, need, room });
    }
    let mut x = 0.0;
    let column_x: Vec<f64> = column_widths(widths, per_row)
        .iter()
        .map(|w| {
            let at = x;
            x += slot + w + BLOCK_GAP;
            at
        })
        .collect();
    let rows = (0..widths.len()).collect::<Vec<_>>();
    Ok(rows
        .chunks(per_row)
        .map(|r| r.iter().map(|&i| (i, column_x[i % per_row])).collect())
        .collect())
}

/// Width of cells side by side.
fn span(cells: &[f64]) -> f64 {
    cells.iter().sum::<f64>() + cells.len().saturating_sub(1) as f64 * CELL_GAP
}

/// Each block column's width: its widest block's.
fn column_widths(widths: &[f64], per_row: usize) -> Vec<f64> {
    let mut cols = vec![0.0f64; per_row.min(widths.len()).max(1)];
    for (i, w) in widths.iter().enumerate() {
        let c = i % per_row;
        cols[c] = cols[c].max(*w);
    }
    cols
}

/// A row of `per_row` aligned block columns, numbers included.
fn row_width(widths: &[f64], per_row: usize, slot: f64) -> f64 {
    let cols = column_widths(widths, per_row);
    cols.iter().map(|w| slot + w).sum::<f64>() + (cols.len() - 1) as f64 * BLOCK_GAP
}

/// One block's cells from `origin` (its first cell's corner), wrapped at `line` points.
fn place(cells: &[f64], origin: (f64, f64), line: f64, row: usize) -> Placed {
    let (x0, y0) = origin;
    let mut rects = Vec::with_capacity(cells.len());
    let mut lines: Vec<Rect> = Vec::new();
    let (mut x, mut y) = (x0, y0);
    for &w in cells {
        if x > x0 && x - x0 + w > line + 1e-9 {
            lines.push(Rect { x: x0, y, w: x - CELL_GAP - x0, h: CELL_H });
            x = x0;
            y += CELL_H + LINE_GAP;
        }
        rects.push(Rect { x, y, w, h: CELL_H });
        x += w + CELL_GAP;
    }
    lines.push(Rect { x: x0, y, w: (x - CELL_GAP - x0).max(0.0), h: CELL_H });
    Placed { label: (x0 - LABEL_GAP, y0), lines, cells: rects, row }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn blocks(n: usize, cells: &[f64]) -> Vec<Vec<f64>> {
        vec![cells.to_vec(); n]
    }

    #[test]
    fn cells_are_as_wide_as_their_text_with_a_floor_and_a_cap() {
        assert_eq!(cell_w(1), cell_w(MIN_COLS), "one column still gets a readable bar");
        assert!(cell_w(10) > cell_w(5));
        assert!((cell_w(10) - cell_w(5) - 5.0 * ADVANCE).abs() < 1e-9);
        assert_eq!(max_cols(1000.0), MAX_COLS);
        assert_eq!(max_cols(10.0 * ADVANCE + 2.0 * PAD), 10, "a narrow line caps lower");
    }

    #[test]
    fn as_many_blocks_a_row_as_fit_and_no_more() {
        let b = blocks(10, &[20.0, 20.0, 20.0, 20.0]);
        let lw = label_w(10);
        let one = span(&b[0]) + lw + LABEL_GAP;
        let room = 3.0 * one + 2.0 * BLOCK_GAP;
        let p = pack(&b, room, lw, None).unwrap();
        assert_eq!(p.per_row, 3);
        assert_eq!(pack(&b, room - 0.1, lw, None).unwrap().per_row, 2);

        for block in &p.blocks {
            for c in &block.cells {
                assert!(c.x + c.w <= room + 1e-9, "{c:?} inside {room}");
            }
        }
        assert_eq!(p.blocks.iter().map(|b| b.row).max(), Some(3), "10 blocks, 3 a row: 4 rows");
        // Rows fill in order: a narrow block joins the row a wide one left room in.
        let mixed = vec![vec![100.0], vec![100.0], vec![10.0], vec![100.0], vec![100.0]];
        let p = pack(&mixed, 2.0 * (100.0 + lw + LABEL_GAP) + BLOCK_GAP, lw, None).unwrap();
        assert_eq!(p.blocks.iter().map(|b| b.row).collect::<Vec<_>>(), [0, 0, 1, 1, 2]);
    }

    #[test]
    fn blocks_per_row_is_honoured_or_refused_when_it_cannot_fit() {
        let b = blocks(6, &[20.0, 20.0]);
        let p = pack(&b, 400.0, 5.0, NonZeroUsize::new(2)).unwrap();
        assert_eq!(p.per_row, 2);
        assert_eq!(p.blocks[2].row, 1);
        let e = pack(&b, 100.0, 5.0, NonZeroUsize::new(4)).unwrap_err();
        assert_eq!(e.per_row, 4);
        assert!(e.need > 100.0);
        // One a row always fits: a block wider than the row wraps.
        assert!(pack(&b, 30.0, 5.0, NonZeroUsize::new(1)).is_ok());
    }

    #[test]
    fn columns_line_up_and_take_their_widest_block() {
        let b = vec![vec![10.0], vec![30.0], vec![50.0], vec![10.0]];
        let p = pack(&b, 1000.0, 5.0, NonZeroUsize::new(2)).unwrap();
        assert_eq!(p.blocks[0].cells[0].x, p.blocks[2].cells[0].x);
        assert_eq!(p.blocks[1].cells[0].x, p.blocks[3].cells[0].x);
        // The second column starts after the first column's widest block (50), not its first.
        assert!(p.blocks[1].cells[0].x > p.blocks[0].cells[0].x + 50.0);
    }

    #[test]
    fn a_block_wider_than_the_row_wraps_onto_lines_it_outlines() {
        let b = blocks(2, &[30.0; 8]);
        let p = pack(&b, 100.0, 5.0, None).unwrap();
        assert_eq!(p.per_row, 1);
        let first = &p.blocks[0];
        assert!(first.lines.len() > 1);
        assert_eq!(first.cells.len(), 8);
        for c in &first.cells {
            assert!(c.x + c.w <= 100.0 + 1e-9);
        }
        // The next block starts below every line of the first.
        let last_line = first.lines.last().unwrap();
        assert!(p.blocks[1].cells[0].y > last_line.y + CELL_H);
        assert_eq!(p.blocks[1].label.1, p.blocks[1].cells[0].y, "numbered on its first line");
    }

    #[test]
    fn every_block_gets_a_number_slot_before_it() {
        let b = blocks(4, &[10.0, 10.0]);
        let lw = label_w(99);
        let p = pack(&b, 1000.0, lw, NonZeroUsize::new(4)).unwrap();
        for block in &p.blocks {
            let first = block.cells[0];
            assert!(block.label.0 < first.x && block.label.0 - lw >= -1e-9);
        }
        assert_eq!(lw, 2.0 * LABEL_DIGIT);
    }
}
