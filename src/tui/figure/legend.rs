//! The legend: an entry for every fill and mark the figure draws (the step colours numbered
//! from 1, the prompt, cells outside `--step-range`, masked cells, the edit mark) and the confidence
//! key, flowed into lines of the figure's width.

use std::fmt::Write;
use std::ops::Range;

use super::{
    bar, edit_mark, hex, ink_on, num, sans_w, text, Fill, Paint, StepRange, INK, SMALL, WHITE,
};
use crate::tui::theme::Theme;

/// A swatch's height, and a legend line's.
const SWATCH: f64 = 9.0;
const LINE_H: f64 = 12.0;
/// Extra height of a step scale whose numbers sit below its swatches (too narrow to hold them).
const BELOW: f64 = 7.0;
const ENTRY_GAP: f64 = 9.0;
/// Numbers in swatches and on the confidence key.
const DIGITS: f64 = 6.0;
const KEY_BAR: f64 = 16.0;
const KEY_CONFS: [f32; 3] = [0.25, 0.5, 1.0];

/// What the figure drew, which the legend names.
#[derive(Clone, Debug, PartialEq)]
pub struct Legend {
    /// The coloured steps, 0-based.
    pub steps: Range<usize>,
    /// The steps a block takes at most (the colour ramp spans them).
    pub span: usize,
    pub prompt: bool,
    /// Cells set at a step outside the range.
    pub context: bool,
    pub masked: bool,
    pub edited: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Entry {
    Steps,
    Prompt,
    Context,
    Masked,
    Edited,
    Confidence,
}

/// An entry at `(x, y)` from the legend's top left corner.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Placed {
    pub entry: Entry,
    pub x: f64,
    pub y: f64,
}

/// The entries placed in lines `room` points wide, and the lines' height.
#[derive(Clone, Debug, PartialEq)]
pub struct Laid {
    room: f64,
    pub placed: Vec<Placed>,
    pub height: f64,
}

impl Legend {
    pub fn entries(&self) -> Vec<Entry> {
        let mut out = vec![Entry::Steps];
        let named = [
            (self.prompt, Entry::Prompt),
            (self.context, Entry::Context),
            (self.masked, Entry::Masked),
            (self.edited, Entry::Edited),
        ];
        out.extend(named.iter().filter(|(on, _)| *on).map(|&(_, e)| e));
        out.push(Entry::Confidence);
        out
    }

    /// A step swatch's width: roomy for few steps, narrower for many, the scale within `room`.
    fn swatch_w(&self, room: f64) -> f64 {
        let n = self.steps.len().max(1) as f64;
        ((room - heading_w("step")) / n).clamp(3.0, 12.0)
    }

    /// Whether the step numbers go below the swatches.
    fn numbers_below(&self, room: f64) -> bool {
        self.swatch_w(room) < 7.0
    }

    fn width(&self, e: Entry, room: f64) -> f64 {
        match e {
            Entry::Steps => heading_w("step") + self.steps.len() as f64 * self.swatch_w(room),
            Entry::Confidence => {
                heading_w("confidence")
                    + KEY_CONFS.iter().map(|c| key_w(&c.to_string())).sum::<f64>()
            }
            e => SWATCH + 2.5 + sans_w(label(e), SMALL),
        }
    }

    /// The entries flowed into lines `room` points wide.
    pub fn layout(&self, room: f64) -> Laid {
        let mut placed = Vec::new();
        let (mut x, mut y, mut line_h) = (0.0, 0.0, LINE_H);
        for e in self.entries() {
            let w = self.width(e, room);
            if x > 0.0 && x + w > room {
                (x, y, line_h) = (0.0, y + line_h, LINE_H);
            }
            if e == Entry::Steps && self.numbers_below(room) {
                line_h = LINE_H + BELOW;
            }
            placed.push(Placed { entry: e, x, y });
            x += w + ENTRY_GAP;
        }
        Laid { room, placed, height: y + line_h }
    }

    pub fn draw(&self, s: &mut String, laid: &Laid, (ox, oy): (f64, f64), theme: &Theme) {
        for p in &laid.placed {
            let at = (ox + p.x, oy + p.y);
            match p.entry {
                Entry::Steps => self.draw_steps(s, at, laid.room, theme),
                Entry::Confidence => draw_key(s, at),
                e => draw_swatch(s, at, e, self.edited_paint(theme)),
            }
        }
        s.push('\n');
    }

    /// How an edited cell of the first coloured step looks.
    fn edited_paint(&self, theme: &Theme) -> Paint {
        let fill = Fill::Decoded { step: self.steps.start, conf: 1.0, edits: 1 };
        Paint::of(&fill, theme, self.span, &StepRange::ALL)
    }

    fn draw_steps(&self, s: &mut String, (x, y): (f64, f64), room: f64, theme: &Theme) {
        text(s, (x, y + 7.0), SMALL, INK, "", "step");
        let w = self.swatch_w(room);
        let named = named_steps(self.steps.clone());
        for (i, step) in self.steps.clone().enumerate() {
            let bg = theme.cell_rgb(step, self.span).0;
            let fg = ink_on(bg, theme);
            let sx = x + heading_w("step") + i as f64 * w;
            let _ = write!(
                s,
                r#"<rect x="{}" y="{}" width="{}" height="{SWATCH}" fill="{}"/>"#,
                num(sx),
                num(y),
                num(w),
                hex(bg)
            );
            if named.contains(&step) {
                let (ty, ink) =
                    if self.numbers_below(room) { (y + 16.0, INK) } else { (y + 7.0, fg) };
                let n = (step + 1).to_string();
                text(s, (sx + w / 2.0, ty), DIGITS, ink, r#" text-anchor="middle""#, &n);
            }
        }
    }
}

fn label(e: Entry) -> &'static str {
    match e {
        Entry::Prompt => "prompt",
        Entry::Context => "other steps",
        Entry::Masked => "masked",
        Entry::Edited => "edited",
        Entry::Steps => "step",
        Entry::Confidence => "confidence",
    }
}

/// A heading (`step`, `confidence`) and the space after it.
fn heading_w(h: &str) -> f64 {
    sans_w(h, SMALL) + 4.0
}

/// One bar of the confidence key with its number.
fn key_w(n: &str) -> f64 {
    KEY_BAR + 2.0 + sans_w(n, DIGITS) + 5.0
}

/// A swatch as a cell of that kind is painted (an edited one in the first coloured step's
/// hue, as such a cell looks), and its label.
fn draw_swatch(s: &mut String, (x, y): (f64, f64), e: Entry, edited: Paint) {
    let paint = match e {
        Entry::Context => Paint::CONTEXT,
        Entry::Masked => Paint::MASKED,
        Entry::Edited => edited,
        _ => Paint::PROMPT,
    };
    let _ = write!(
        s,
        r#"<rect x="{}" y="{}" width="{SWATCH}" height="{SWATCH}" fill="{}"{} class="legend-{}"/>"#,
        num(x),
        num(y),
        hex(paint.fill),
        paint.outline_attrs(),
        label(e).replace(' ', "-")
    );
    if e == Entry::Edited {
        edit_mark(s, x + SWATCH, y, paint.ink);
    }
    text(s, (x + SWATCH + 2.5, y + 7.0), SMALL, INK, "", label(e));
}

/// `confidence` and three bars, a quarter, half and wholly filled, as a light cell draws them.
fn draw_key(s: &mut String, (x, y): (f64, f64)) {
    text(s, (x, y + 7.0), SMALL, INK, "", "confidence");
    let light = Paint { fill: WHITE, ink: INK, outline: None, marks: true };
    let mut kx = x + heading_w("confidence");
    for conf in KEY_CONFS {
        bar(s, (kx, y + 4.0), KEY_BAR, conf, light.bar());
        let n = conf.to_string();
        text(s, (kx + KEY_BAR + 2.0, y + 7.0), DIGITS, INK, "", &n);
        kx += key_w(&n);
    }
}

/// Which steps (0-based) of `steps` the scale numbers: all up to 16, else about eight, the
/// first and the last among them.
pub fn named_steps(steps: Range<usize>) -> Vec<usize> {
    let n = steps.len();
    if n <= 16 {
        return steps.collect();
    }
    let k = 8;
    let mut out: Vec<usize> = (0..k).map(|i| steps.start + i * (n - 1) / (k - 1)).collect();
    out.dedup();
    out
}
