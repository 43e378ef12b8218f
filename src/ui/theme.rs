//! Colours. A cell's hue says at which step of its block it was decoded; its intensity says
//! how confident the model was. The step palette is an ordered ramp (early = cool, late =
//! warm), sampled evenly at as many points as the run has steps, so that 2, 4 or 8 steps all get
//! well separated hues and the order reads at a glance.

use ratatui::style::{Color, Modifier, Style};

type Rgb = (u8, u8, u8);

pub struct Theme {
    /// The step ramp's anchors, first step to last.
    pub ramp: &'static [Rgb],
    /// The background the panels are assumed to sit on; low confidence fades towards it.
    pub base: Rgb,
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
}

/// The default dark theme.
pub const DARK: Theme = Theme {
    ramp: &[
        (0x3b, 0x7d, 0xf0),
        (0x22, 0xc3, 0xe6),
        (0x2e, 0xc4, 0x8a),
        (0x8c, 0xd1, 0x3c),
        (0xf5, 0xd0, 0x3b),
        (0xf7, 0x93, 0x2f),
        (0xef, 0x4f, 0x4f),
        (0xe0, 0x4f, 0xa8),
        (0xa8, 0x6b, 0xf5),
    ],
    base: (0x16, 0x18, 0x1f),
    text: Color::Rgb(0xd8, 0xdc, 0xe4),
    dim: Color::Rgb(0x8a, 0x90, 0x9c),
    faint: Color::Rgb(0x50, 0x55, 0x60),
    accent: Color::Rgb(0x7a, 0xc7, 0xff),
    warn: Color::Rgb(0xf2, 0xc8, 0x4b),
    error: Color::Rgb(0xff, 0x6b, 0x6b),
    border: Color::Rgb(0x44, 0x4a, 0x56),
    prompt_fg: Color::Rgb(0x9a, 0xa0, 0xaa),
    prompt_bg: Color::Rgb(0x26, 0x29, 0x31),
    mask_fg: Color::Rgb(0x44, 0x4a, 0x56),
    mask_active_fg: Color::Rgb(0x7a, 0x82, 0x90),
    active_row_bg: Color::Rgb(0x22, 0x27, 0x33),
};

fn lerp(a: Rgb, b: Rgb, t: f32) -> Rgb {
    let t = t.clamp(0.0, 1.0);
    let f = |x: u8, y: u8| (x as f32 + (y as f32 - x as f32) * t).round() as u8;
    (f(a.0, b.0), f(a.1, b.1), f(a.2, b.2))
}

fn rgb(c: Rgb) -> Color {
    Color::Rgb(c.0, c.1, c.2)
}

/// Perceived brightness in 0..1, to pick a readable text colour on a coloured cell.
fn luma(c: Rgb) -> f32 {
    (0.299 * c.0 as f32 + 0.587 * c.1 as f32 + 0.114 * c.2 as f32) / 255.0
}

/// How strongly a confidence shows: never fully faded, so a low-confidence cell keeps its hue.
fn intensity(conf: f32) -> f32 {
    0.3 + 0.7 * conf.clamp(0.0, 1.0)
}

impl Theme {
    /// The hue of step `step` in a run whose blocks take up to `span` steps.
    pub fn step_rgb(&self, step: usize, span: usize) -> Rgb {
        let n = self.ramp.len() - 1;
        let t = if span <= 1 { 0.0 } else { step.min(span - 1) as f32 / (span - 1) as f32 };
        let x = t * n as f32;
        let i = (x.floor() as usize).min(n - 1);
        lerp(self.ramp[i], self.ramp[i + 1], x - i as f32)
    }

    pub fn step_color(&self, step: usize, span: usize) -> Color {
        rgb(self.step_rgb(step, span))
    }

    /// A decoded grid cell: filled with its step's hue at its confidence's intensity.
    pub fn cell_style(&self, step: usize, span: usize, conf: f32) -> Style {
        let bg = lerp(self.base, self.step_rgb(step, span), intensity(conf));
        let fg = if luma(bg) > 0.5 { (0x10, 0x12, 0x16) } else { (0xf0, 0xf2, 0xf5) };
        Style::default().bg(rgb(bg)).fg(rgb(fg))
    }

    /// A decoded token in prose: its step's hue as the text colour, faded by low confidence.
    pub fn prose_style(&self, step: usize, span: usize, conf: f32) -> Style {
        let dim = (0x70, 0x74, 0x7c);
        Style::default().fg(rgb(lerp(dim, self.step_rgb(step, span), intensity(conf))))
    }

    /// Cells committed by the step under the cursor stand out.
    pub fn fresh(&self, s: Style) -> Style {
        s.add_modifier(Modifier::BOLD | Modifier::UNDERLINED)
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

    fn dist(a: Rgb, b: Rgb) -> f32 {
        let d = |x: u8, y: u8| (x as f32 - y as f32).powi(2);
        (d(a.0, b.0) + d(a.1, b.1) + d(a.2, b.2)).sqrt()
    }

    #[test]
    fn ramp_ends_are_the_first_and_last_anchor() {
        let t = &DARK;
        assert_eq!(t.step_rgb(0, 4), t.ramp[0]);
        assert_eq!(t.step_rgb(3, 4), *t.ramp.last().unwrap());
        assert_eq!(t.step_rgb(0, 1), t.ramp[0]);
    }

    #[test]
    fn steps_are_well_separated_for_common_step_counts() {
        // Up to 8 steps every pair differs clearly; at 16 neighbours still differ visibly.
        for (span, want) in [(2, 60.0), (3, 60.0), (4, 60.0), (6, 60.0), (8, 60.0), (16, 30.0)] {
            let c: Vec<Rgb> = (0..span).map(|s| DARK.step_rgb(s, span)).collect();
            let min = (0..span)
                .flat_map(|i| (i + 1..span).map(move |j| (i, j)))
                .filter(|&(i, j)| span <= 8 || j == i + 1)
                .map(|(i, j)| dist(c[i], c[j]))
                .fold(f32::MAX, f32::min);
            assert!(min > want, "span {span}: steps only {min} apart");
        }
    }

    #[test]
    fn low_confidence_fades_but_keeps_readable_text() {
        let hi = DARK.cell_style(1, 4, 1.0);
        let lo = DARK.cell_style(1, 4, 0.1);
        assert_ne!(hi.bg, lo.bg);
        let Some(Color::Rgb(r, g, b)) = lo.bg else { panic!() };
        assert!(luma((r, g, b)) < luma(DARK.step_rgb(1, 4)));
        assert_ne!(hi.fg, hi.bg);
    }
}
