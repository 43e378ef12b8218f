//! Colours. A cell's hue says at which step of its block it was decoded; a separate mark says
//! how confident the model was (a bar glyph, never a faded hue: fading a perceptual ramp
//! towards the background would make a step look like its neighbour).
//!
//! The step palette is viridis (van der Walt & Smith): perceptually uniform, ordered by
//! lightness and readable with the common colour-vision deficiencies, sampled evenly at as many
//! points as the run has steps. A theme is drawn at one colour depth: 24-bit, xterm's 256
//! colours when the terminal does not announce truecolor, or none at all (`NO_COLOR`,
//! `--mono`), where every decoded cell carries its step number instead.

use std::sync::{LazyLock, Mutex};

use ratatui::style::{Color, Modifier, Style};

/// A colour as 8-bit sRGB channels.
pub type Rgb = (u8, u8, u8);

/// How many colours the terminal can show.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Depth {
    TrueColor,
    /// xterm's 256-colour palette (its 6×6×6 cube and grey ramp).
    Ansi256,
    /// No colour: attributes (bold, underline, reverse) and marks only.
    Mono,
}

impl Depth {
    /// The depth a terminal asks for: `NO_COLOR` (https://no-color.org: set and not empty)
    /// or `--mono` turn colour off; `COLORTERM=truecolor|24bit` announces 24-bit colour;
    /// anything else gets the 256-colour palette, which every modern terminal has.
    pub fn detect(mono: bool, no_color: Option<&str>, colorterm: Option<&str>) -> Depth {
        if mono || no_color.is_some_and(|v| !v.is_empty()) {
            return Depth::Mono;
        }
        match colorterm.map(str::to_ascii_lowercase).as_deref() {
            Some("truecolor" | "24bit") => Depth::TrueColor,
            _ => Depth::Ansi256,
        }
    }

    /// `detect` over this process's environment.
    pub fn from_env(mono: bool) -> Depth {
        let var = |k| std::env::var(k).ok();
        Depth::detect(mono, var("NO_COLOR").as_deref(), var("COLORTERM").as_deref())
    }
}

/// A theme's colours before they are fitted to a depth.
pub struct Palette {
    /// The step ramp's anchors, first step to last.
    pub ramp: &'static [Rgb],
    /// The terminal background the theme is made for: step hues used as text are made to
    /// read on it.
    pub background: Rgb,
    pub text: Rgb,
    /// Text on a dark cell and on a light one.
    pub on_dark: Rgb,
    pub on_light: Rgb,
    pub dim: Rgb,
    pub faint: Rgb,
    pub accent: Rgb,
    pub warn: Rgb,
    pub error: Rgb,
    pub border: Rgb,
    pub prompt_fg: Rgb,
    pub prompt_bg: Rgb,
    pub mask_fg: Rgb,
    pub mask_active_fg: Rgb,
    pub active_row_bg: Rgb,
}

/// Viridis at 0, 0.1, ..., 1 (matplotlib's table).
const VIRIDIS: &[Rgb] = &[
    (0x44, 0x01, 0x54),
    (0x48, 0x24, 0x75),
    (0x41, 0x44, 0x87),
    (0x35, 0x5f, 0x8d),
    (0x2a, 0x78, 0x8e),
    (0x21, 0x91, 0x8c),
    (0x22, 0xa8, 0x84),
    (0x44, 0xbf, 0x70),
    (0x7a, 0xd1, 0x51),
    (0xbd, 0xdf, 0x26),
    (0xfd, 0xe7, 0x25),
];

/// On a dark background: viridis without its darkest tenth, which would vanish into it.
pub const DARK_PALETTE: Palette = Palette {
    ramp: VIRIDIS.split_at(1).1,
    background: (0x10, 0x12, 0x16),
    text: (0xd8, 0xdc, 0xe4),
    on_dark: (0xf0, 0xf2, 0xf5),
    on_light: (0x10, 0x12, 0x16),
    dim: (0x8a, 0x90, 0x9c),
    faint: (0x50, 0x55, 0x60),
    accent: (0x7a, 0xc7, 0xff),
    warn: (0xf2, 0xc8, 0x4b),
    error: (0xff, 0x6b, 0x6b),
    border: (0x44, 0x4a, 0x56),
    prompt_fg: (0x9a, 0xa0, 0xaa),
    prompt_bg: (0x26, 0x29, 0x31),
    mask_fg: (0x44, 0x4a, 0x56),
    mask_active_fg: (0x7a, 0x82, 0x90),
    active_row_bg: (0x22, 0x27, 0x33),
};

/// On a white background: viridis without its lightest tenth (yellow on white), dark text,
/// and greys dark enough to read.
pub const LIGHT_PALETTE: Palette = Palette {
    ramp: VIRIDIS.split_at(10).0,
    background: (0xff, 0xff, 0xff),
    text: (0x1a, 0x1c, 0x22),
    on_dark: (0xf8, 0xf8, 0xf8),
    on_light: (0x10, 0x12, 0x16),
    dim: (0x55, 0x5b, 0x66),
    faint: (0x80, 0x86, 0x90),
    accent: (0x0b, 0x5c, 0xad),
    warn: (0x9a, 0x5b, 0x00),
    error: (0xb4, 0x1c, 0x1c),
    border: (0xa8, 0xae, 0xb8),
    prompt_fg: (0x4a, 0x50, 0x5a),
    prompt_bg: (0xe4, 0xe7, 0xec),
    mask_fg: (0xa8, 0xae, 0xb8),
    mask_active_fg: (0x5a, 0x60, 0x6c),
    active_row_bg: (0xee, 0xf2, 0xf8),
};

/// `--theme`: which background the colours are made for.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum ThemeName {
    #[default]
    Dark,
    Light,
}

pub struct Theme {
    pub depth: Depth,
    /// The step ramp's anchors, first step to last.
    pub ramp: &'static [Rgb],
    background: Rgb,
    /// The terminal's own text colour the theme is made for (`text` before it is fitted).
    foreground: Rgb,
    on_dark: Rgb,
    on_light: Rgb,
    pub text: Color,
    pub dim: Color,
    pub faint: Color,
    pub accent: Color,
    pub warn: Color,
    pub error: Color,
    pub border: Color,
    pub prompt_fg: Color,
    pub prompt_bg: Color,
    pub mask_fg: Color,
    pub mask_active_fg: Color,
    /// Row background of the block being decoded.
    pub active_row_bg: Color,
    /// The edit glyph's chip (token editing): the error hue, which no step's viridis hue is
    /// near, with text that reads on it.
    edit_bg: Color,
    edit_fg: Color,
    /// At 256 colours, each step count's palette indexes (see `xterm256_steps`), made once.
    steps256: Mutex<Vec<(usize, Vec<u8>)>>,
}

/// The default: dark, 24-bit.
pub static DARK: LazyLock<Theme> = LazyLock::new(|| Theme::new(&DARK_PALETTE, Depth::TrueColor));
static THEMES: LazyLock<Vec<Theme>> = LazyLock::new(|| {
    let depths = [Depth::TrueColor, Depth::Ansi256, Depth::Mono];
    [&DARK_PALETTE, &LIGHT_PALETTE]
        .into_iter()
        .flat_map(|p| depths.map(|d| Theme::new(p, d)))
        .collect()
});

/// The theme for a background and a colour depth (made once per process).
pub fn pick(name: ThemeName, depth: Depth) -> &'static Theme {
    let d = match depth {
        Depth::TrueColor => 0,
        Depth::Ansi256 => 1,
        Depth::Mono => 2,
    };
    &THEMES[name as usize * 3 + d]
}

/// `a` moved toward `b` by `t` (0: `a`, 1: `b`).
pub fn lerp(a: Rgb, b: Rgb, t: f32) -> Rgb {
    let t = t.clamp(0.0, 1.0);
    let f = |x: u8, y: u8| (x as f32 + (y as f32 - x as f32) * t).round() as u8;
    (f(a.0, b.0), f(a.1, b.1), f(a.2, b.2))
}

/// The nearest colour of xterm's 256-colour palette: the 6×6×6 cube or the 24-step grey ramp
/// (the 16 system colours are left out: terminals redefine them).
pub fn xterm256(c: Rgb) -> u8 {
    const LEVELS: [u8; 6] = [0, 95, 135, 175, 215, 255];
    let level =
        |x: u8| (0..6).min_by_key(|&i| (LEVELS[i] as i32 - x as i32).abs()).expect("six levels");
    let (r, g, b) = (level(c.0), level(c.1), level(c.2));
    let cube = (LEVELS[r], LEVELS[g], LEVELS[b]);
    let avg = (c.0 as u32 + c.1 as u32 + c.2 as u32) / 3;
    let grey_i = ((avg.saturating_sub(8) + 5) / 10).min(23) as u8;
    let grey = 8 + 10 * grey_i;
    let d = |a: Rgb| {
        let f = |x: u8, y: u8| (x as i32 - y as i32).pow(2);
        f(a.0, c.0) + f(a.1, c.1) + f(a.2, c.2)
    };
    if d((grey, grey, grey)) < d(cube) {
        232 + grey_i
    } else {
        16 + 36 * r as u8 + 6 * g as u8 + b as u8
    }
}

/// CIE L*a*b* of an sRGB colour (D65): L* is the lightness a person sees.
fn lab(c: Rgb) -> [f32; 3] {
    let lin = |x: u8| {
        let v = x as f32 / 255.0;
        if v <= 0.04045 {
            v / 12.92
        } else {
            ((v + 0.055) / 1.055).powf(2.4)
        }
    };
    let (r, g, b) = (lin(c.0), lin(c.1), lin(c.2));
    let x = (0.4124 * r + 0.3576 * g + 0.1805 * b) / 0.95047;
    let y = 0.2126 * r + 0.7152 * g + 0.0722 * b;
    let z = (0.0193 * r + 0.1192 * g + 0.9505 * b) / 1.08883;
    let f = |t: f32| if t > 0.008856 { t.cbrt() } else { 7.787 * t + 16.0 / 116.0 };
    [116.0 * f(y) - 16.0, 500.0 * (f(x) - f(y)), 200.0 * (f(y) - f(z))]
}

/// The colours of a run's steps, first to last, as indexes of xterm's 6×6×6 cube that are all
/// different and as light as the steps are in order: mapping each step to its nearest colour
/// alone puts neighbouring viridis samples on one colour (at 16 steps, steps 2–5 all on 60),
/// so the steps are mapped together, each as near its colour as the others allow (least total
/// squared distance, a dynamic programme over the cube), every step strictly lighter (L*) than
/// the one before, and none grey. Where that cannot be had (more steps than the cube has rungs of lightness
/// along the ramp), each step gets its nearest colour.
pub fn xterm256_steps(colours: &[Rgb]) -> Vec<u8> {
    const LEVELS: [u8; 6] = [0, 95, 135, 175, 215, 255];
    // The cube's colours, less its greys (r = g = b): a grey step would read as no step at all.
    let cube: Vec<(u8, Rgb, f32)> = (0..216u16)
        .map(|i| {
            (
                16 + i as u8,
                (LEVELS[(i / 36) as usize], LEVELS[(i / 6 % 6) as usize], LEVELS[(i % 6) as usize]),
            )
        })
        .filter(|&(_, c)| !(c.0 == c.1 && c.1 == c.2))
        .map(|(i, c)| (i, c, lab(c)[0]))
        .collect();
    let dist = |a: Rgb, b: Rgb| {
        let f = |x: u8, y: u8| (x as i64 - y as i64).pow(2);
        f(a.0, b.0) + f(a.1, b.1) + f(a.2, b.2)
    };
    // cost[j]: the least total distance of steps 0..=i with step i on cube colour j; back[i][j]:
    // step i - 1's colour on that path.
    let mut cost: Vec<Option<i64>> = match colours.first() {
        Some(&c0) => cube.iter().map(|e| Some(dist(e.1, c0))).collect(),
        None => return Vec::new(),
    };
    let mut back: Vec<Vec<usize>> = Vec::with_capacity(colours.len());
    for &c in &colours[1..] {
        let mut next = vec![None; cube.len()];
        let mut from = vec![0; cube.len()];
        for (j, e) in cube.iter().enumerate() {
            let best = (0..cube.len())
                .filter(|&p| cube[p].2 + 1.0 < e.2)
                .filter_map(|p| cost[p].map(|k| (k, p)))
                .min();
            if let Some((k, p)) = best {
                next[j] = Some(k + dist(e.1, c));
                from[j] = p;
            }
        }
        back.push(from);
        cost = next;
    }
    let Some((_, mut j)) = cost.iter().enumerate().filter_map(|(j, k)| k.map(|k| (k, j))).min()
    else {
        return colours.iter().map(|&c| xterm256(c)).collect();
    };
    let mut out = vec![cube[j].0];
    for from in back.iter().rev() {
        j = from[j];
        out.push(cube[j].0);
    }
    out.reverse();
    out
}

/// `c` as the depth can show it.
fn fit(c: Rgb, depth: Depth) -> Color {
    match depth {
        Depth::TrueColor => Color::Rgb(c.0, c.1, c.2),
        Depth::Ansi256 => Color::Indexed(xterm256(c)),
        Depth::Mono => Color::Reset,
    }
}

/// Perceived brightness in 0..1, to pick a readable text colour on a coloured cell.
/// WCAG 2's contrast ratio of two colours (relative luminance of linearised sRGB).
pub fn contrast(a: Rgb, b: Rgb) -> f32 {
    let lum = |c: Rgb| {
        let lin = |x: u8| {
            let v = x as f32 / 255.0;
            if v <= 0.04045 {
                v / 12.92
            } else {
                ((v + 0.055) / 1.055).powf(2.4)
            }
        };
        0.2126 * lin(c.0) + 0.7152 * lin(c.1) + 0.0722 * lin(c.2)
    };
    let (x, y) = (lum(a), lum(b));
    (x.max(y) + 0.05) / (x.min(y) + 0.05)
}

fn luma(c: Rgb) -> f32 {
    (0.299 * c.0 as f32 + 0.587 * c.1 as f32 + 0.114 * c.2 as f32) / 255.0
}

/// Superscript digits: the step mark of a cell when there is no colour.
const SUPERSCRIPT: [char; 10] = ['⁰', '¹', '²', '³', '⁴', '⁵', '⁶', '⁷', '⁸', '⁹'];

/// `n` in superscript digits (`12` → `¹²`): one column per digit, visibly not token text.
pub fn superscript(n: usize) -> String {
    n.to_string().chars().map(|d| SUPERSCRIPT[d as usize - '0' as usize]).collect()
}

/// A confidence as one bar glyph, `▁` (under 1/8) to `█` (certain).
pub fn conf_mark(conf: f32) -> char {
    const BARS: [char; 8] = ['▁', '▂', '▃', '▄', '▅', '▆', '▇', '█'];
    let i = (conf.clamp(0.0, 1.0) * 8.0).ceil() as usize;
    BARS[i.clamp(1, 8) - 1]
}

impl Theme {
    pub fn new(p: &Palette, depth: Depth) -> Theme {
        let c = |rgb| fit(rgb, depth);
        Theme {
            depth,
            ramp: p.ramp,
            background: p.background,
            foreground: p.text,
            on_dark: p.on_dark,
            on_light: p.on_light,
            text: c(p.text),
            dim: c(p.dim),
            faint: c(p.faint),
            accent: c(p.accent),
            warn: c(p.warn),
            error: c(p.error),
            border: c(p.border),
            prompt_fg: c(p.prompt_fg),
            prompt_bg: c(p.prompt_bg),
            mask_fg: c(p.mask_fg),
            mask_active_fg: c(p.mask_active_fg),
            active_row_bg: c(p.active_row_bg),
            edit_bg: c(p.error),
            edit_fg: c(if luma(p.error) > 0.5 { p.on_light } else { p.on_dark }),
            steps256: Mutex::new(Vec::new()),
        }
    }

    /// The text and background colours of the terminal the theme is made for: what a cell
    /// coloured `Color::Reset` shows in a picture of the screen (the GIF of a recording).
    pub fn screen_rgb(&self) -> (Rgb, Rgb) {
        (self.foreground, self.background)
    }

    /// No colour at all: cells carry their step number instead.
    pub fn mono(&self) -> bool {
        self.depth == Depth::Mono
    }

    /// The hue of step `step` (0-based) in a run whose blocks take up to `span` steps.
    pub fn step_rgb(&self, step: usize, span: usize) -> Rgb {
        let n = self.ramp.len() - 1;
        let t = if span <= 1 { 0.0 } else { step.min(span - 1) as f32 / (span - 1) as f32 };
        let x = t * n as f32;
        let i = (x.floor() as usize).min(n - 1);
        lerp(self.ramp[i], self.ramp[i + 1], x - i as f32)
    }

    /// Step `step`'s hue as the depth shows it: at 256 colours, one colour per step of the run,
    /// all different (`xterm256_steps`), not each step's nearest.
    pub fn step_color(&self, step: usize, span: usize) -> Color {
        if self.depth != Depth::Ansi256 {
            return fit(self.step_rgb(step, span), self.depth);
        }
        let span = span.max(1);
        let step = step.min(span - 1);
        let mut memo = self.steps256.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((_, ix)) = memo.iter().find(|(n, _)| *n == span) {
            return Color::Indexed(ix[step]);
        }
        let ix = xterm256_steps(&(0..span).map(|s| self.step_rgb(s, span)).collect::<Vec<_>>());
        let c = Color::Indexed(ix[step]);
        memo.push((span, ix));
        c
    }

    /// A decoded grid cell: filled with its step's hue, text in black or white, whichever
    /// reads on it. Confidence is not in the fill (see `conf_mark`).
    pub fn cell_style(&self, step: usize, span: usize) -> Style {
        let (_, fg) = self.cell_rgb(step, span);
        Style::default().bg(self.step_color(step, span)).fg(fit(fg, self.depth))
    }

    /// A decoded cell's fill and text colour before they are fitted to a depth (the SVG
    /// figure draws with them too).
    pub fn cell_rgb(&self, step: usize, span: usize) -> (Rgb, Rgb) {
        let bg = self.step_rgb(step, span);
        (bg, if luma(bg) > 0.5 { self.on_light } else { self.on_dark })
    }

    /// The text colours of filled cells: the dark one for light fills, the light one for dark.
    pub fn inks(&self) -> (Rgb, Rgb) {
        (self.on_light, self.on_dark)
    }

    /// Step `step`'s hue as a text colour: mixed toward white (on a dark background) or black
    /// (on a light one) until it has WCAG's 4.5:1 contrast with the background. Viridis' dark
    /// purples read 1.8:1 on black and its yellows 1.5:1 on white, and most tokens of a decode
    /// are committed at the first step.
    pub fn step_text_rgb(&self, step: usize, span: usize) -> Rgb {
        let hue = self.step_rgb(step, span);
        let toward = if luma(self.background) < 0.5 { (0xff, 0xff, 0xff) } else { (0, 0, 0) };
        (0..=20)
            .map(|i| lerp(hue, toward, i as f32 / 20.0))
            .find(|&c| contrast(c, self.background) >= 4.5)
            .unwrap_or(toward)
    }

    pub fn step_text_color(&self, step: usize, span: usize) -> Color {
        fit(self.step_text_rgb(step, span), self.depth)
    }

    /// A decoded token in prose: its step's hue, made readable, as the text colour; a
    /// low-confidence token is italic rather than faded.
    pub fn prose_style(&self, step: usize, span: usize, conf: f32) -> Style {
        let s = Style::default().fg(self.step_text_color(step, span));
        if conf < 0.5 {
            s.add_modifier(Modifier::ITALIC)
        } else {
            s
        }
    }

    /// Cells committed by the step under the cursor stand out.
    pub fn fresh(&self, s: Style) -> Style {
        s.add_modifier(Modifier::BOLD | Modifier::UNDERLINED)
    }

    /// The `✎` of a cell whose token a later step replaced: a chip of its own colour on any
    /// step's hue; bold, so that it stands out without colour too (the glyph says it there).
    pub fn edit_mark(&self) -> Style {
        Style::default().bg(self.edit_bg).fg(self.edit_fg).add_modifier(Modifier::BOLD)
    }

    pub fn prompt(&self) -> Style {
        Style::default().fg(self.prompt_fg).bg(self.prompt_bg)
    }

    pub fn title(&self) -> Style {
        Style::default().fg(self.accent).add_modifier(Modifier::BOLD)
    }

    pub fn dim(&self) -> Style {
        Style::default().fg(self.dim)
    }

    pub fn faint(&self) -> Style {
        Style::default().fg(self.faint)
    }

    pub fn text(&self) -> Style {
        Style::default().fg(self.text)
    }

    pub fn label(&self) -> Style {
        Style::default().fg(self.dim)
    }

    pub fn value(&self) -> Style {
        Style::default().fg(self.text).add_modifier(Modifier::BOLD)
    }

    pub fn warn(&self) -> Style {
        Style::default().fg(self.warn)
    }

    pub fn border(&self) -> Style {
        Style::default().fg(self.border)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Tokens in prose are coloured by their step and must read on the theme's background:
    /// at least 4.5:1 (WCAG AA) at every step, the hues that already do left as they are.
    #[test]
    fn step_hues_as_text_read_on_the_background() {
        for name in [ThemeName::Dark, ThemeName::Light] {
            let t = pick(name, Depth::TrueColor);
            for span in 1..=16 {
                for step in 0..span {
                    let c = t.step_text_rgb(step, span);
                    assert!(contrast(c, t.background) >= 4.5, "{name:?} step {step}/{span}: {c:?}");
                }
            }
        }
        let dark = pick(ThemeName::Dark, Depth::TrueColor);
        assert_eq!(
            dark.step_text_rgb(3, 4),
            dark.step_rgb(3, 4),
            "viridis' yellow reads on black as it is"
        );
        assert_ne!(dark.step_text_rgb(0, 4), dark.step_rgb(0, 4), "its purple does not");
        assert!((contrast((0, 0, 0), (255, 255, 255)) - 21.0).abs() < 1e-3);
    }

    /// CIE76 ΔE between two sRGB colours: how different two fills look.
    fn delta_e(a: Rgb, b: Rgb) -> f32 {
        let (p, q) = (lab(a), lab(b));
        ((p[0] - q[0]).powi(2) + (p[1] - q[1]).powi(2) + (p[2] - q[2]).powi(2)).sqrt()
    }

    #[test]
    fn ramp_ends_are_the_first_and_last_anchor() {
        let t = &*DARK;
        assert_eq!(t.step_rgb(0, 4), t.ramp[0]);
        assert_eq!(t.step_rgb(3, 4), *t.ramp.last().unwrap());
        assert_eq!(t.step_rgb(0, 1), t.ramp[0]);
    }

    #[test]
    fn steps_are_ordered_and_separated_up_to_sixteen() {
        // Neighbouring steps differ visibly even at 16 steps (ΔE > 5, where 2.3 is a just
        // noticeable difference), and lightness rises with the step in both themes, so the
        // order reads without hue vision.
        for name in [ThemeName::Dark, ThemeName::Light] {
            let t = pick(name, Depth::TrueColor);
            for span in [2, 4, 8, 16] {
                let c: Vec<Rgb> = (0..span).map(|s| t.step_rgb(s, span)).collect();
                for w in c.windows(2) {
                    assert!(delta_e(w[0], w[1]) > 5.0, "{name:?} span {span}: {w:?} too close");
                    assert!(
                        luma(w[1]) > luma(w[0]),
                        "{name:?} span {span}: not ordered by lightness"
                    );
                }
            }
        }
    }

    /// The cube colour of an index of xterm's palette (16..=231).
    fn cube_rgb(i: u8) -> Rgb {
        const LEVELS: [u8; 6] = [0, 95, 135, 175, 215, 255];
        let i = (i - 16) as usize;
        (LEVELS[i / 36], LEVELS[i / 6 % 6], LEVELS[i % 6])
    }

    /// Each step's nearest cube colour alone put 16 viridis steps on 11 colours (steps 2–5 of
    /// the dark theme all on 60, 6–8 on 30): mapped together, every step of up to 16 (and far
    /// more) gets its own cube colour, lighter than the step before, and 4 steps keep the
    /// nearest colours they always had.
    #[test]
    fn steps_at_256_colours_are_distinct_and_ordered() {
        for name in [ThemeName::Dark, ThemeName::Light] {
            let t = pick(name, Depth::TrueColor);
            for span in 1..=24 {
                let rgb: Vec<Rgb> = (0..span).map(|s| t.step_rgb(s, span)).collect();
                let ix = xterm256_steps(&rgb);
                assert_eq!(ix.len(), span);
                assert!(
                    ix.iter().all(|&i| (16..=231).contains(&i)),
                    "{name:?} {span}: {ix:?} leaves the cube"
                );
                assert!(
                    ix.iter().map(|&i| cube_rgb(i)).all(|c| !(c.0 == c.1 && c.1 == c.2)),
                    "{name:?} {span}: a grey step {ix:?}"
                );
                for (s, w) in ix.windows(2).enumerate() {
                    let (a, b) = (cube_rgb(w[0]), cube_rgb(w[1]));
                    assert!(
                        lab(b)[0] > lab(a)[0],
                        "{name:?} {span}: step {} not lighter than step {s}: {ix:?}",
                        s + 1
                    );
                    assert!(
                        delta_e(a, b) > 10.0,
                        "{name:?} {span}: steps {s} and {} look alike: {ix:?}",
                        s + 1
                    );
                }
                if span <= 4 {
                    assert_eq!(
                        ix,
                        rgb.iter().map(|&c| xterm256(c)).collect::<Vec<_>>(),
                        "{name:?} {span}"
                    );
                }
            }
        }
        let dark = pick(ThemeName::Dark, Depth::TrueColor);
        let nearest: Vec<u8> = (0..16).map(|s| xterm256(dark.step_rgb(s, 16))).collect();
        assert_eq!(&nearest[1..5], &[60; 4], "the old mapping: steps 2–5 on one colour");
        assert!(xterm256_steps(&[]).is_empty());
    }

    #[test]
    fn the_256_colour_fallback_keeps_sixteen_steps_apart_and_in_order() {
        for name in [ThemeName::Dark, ThemeName::Light] {
            let t = pick(name, Depth::Ansi256);
            let fills: Vec<Color> = (0..16).map(|s| t.cell_style(s, 16).bg.unwrap()).collect();
            assert!(fills.iter().all(|c| matches!(c, Color::Indexed(i) if *i >= 16)), "{fills:?}");
            let distinct: std::collections::BTreeSet<_> =
                fills.iter().map(|c| format!("{c:?}")).collect();
            assert_eq!(distinct.len(), 16, "{name:?}: {fills:?}");
            let ix = xterm256_steps(&(0..16).map(|s| t.step_rgb(s, 16)).collect::<Vec<_>>());
            assert_eq!(fills, ix.into_iter().map(Color::Indexed).collect::<Vec<_>>());
            // The legend, the timeline and the steps list take the same colours.
            assert_eq!(t.step_color(7, 16), fills[7]);
        }
    }

    #[test]
    fn xterm256_maps_cube_corners_and_greys_exactly() {
        assert_eq!(xterm256((0, 0, 0)), 16);
        assert_eq!(xterm256((255, 255, 255)), 231);
        assert_eq!(xterm256((255, 0, 0)), 196);
        assert_eq!(xterm256((0x80, 0x80, 0x80)), 244);
        assert_eq!(xterm256((95, 135, 175)), 16 + 36 + 12 + 3);
    }

    #[test]
    fn mono_has_no_colour_and_depth_follows_the_environment() {
        let t = pick(ThemeName::Dark, Depth::Mono);
        assert!(t.mono());
        assert_eq!(t.cell_style(2, 4).bg, Some(Color::Reset));
        assert_eq!(t.text, Color::Reset);
        assert_eq!(Depth::detect(false, Some("1"), Some("truecolor")), Depth::Mono);
        assert_eq!(
            Depth::detect(false, Some(""), Some("truecolor")),
            Depth::TrueColor,
            "an empty NO_COLOR is unset"
        );
        assert_eq!(Depth::detect(true, None, Some("24bit")), Depth::Mono);
        assert_eq!(Depth::detect(false, None, Some("24bit")), Depth::TrueColor);
        assert_eq!(Depth::detect(false, None, None), Depth::Ansi256);
        assert_eq!(Depth::detect(false, None, Some("yes")), Depth::Ansi256);
    }

    #[test]
    fn marks_spell_steps_and_confidences() {
        assert_eq!(superscript(1), "¹");
        assert_eq!(superscript(16), "¹⁶");
        assert_eq!(conf_mark(1.0), '█');
        assert_eq!(conf_mark(0.5), '▄');
        assert_eq!(conf_mark(0.01), '▁');
        assert_eq!(conf_mark(0.0), '▁');
    }

    #[test]
    fn cell_text_reads_on_every_fill() {
        for name in [ThemeName::Dark, ThemeName::Light] {
            let t = pick(name, Depth::TrueColor);
            for s in 0..8 {
                let st = t.cell_style(s, 8);
                let (Some(Color::Rgb(a, b, c)), Some(Color::Rgb(x, y, z))) = (st.bg, st.fg) else {
                    panic!()
                };
                assert!((luma((a, b, c)) - luma((x, y, z))).abs() > 0.4, "{name:?} step {s}");
            }
        }
    }
}
