//! Recording a decode as an animated GIF: the screens of a recording ([`crate::tui::record`])
//! drawn as pixels ([`raster`], in the bundled font, [`unifont`]) and written frame by frame.
//!
//! Encoded with the `gif` crate (image-rs), not gifski: a terminal screen is flat colour, a few
//! dozen of them, so each frame's palette is exactly the colours it holds (no quantising, no
//! dithering: the theme's colours come out as they are), and a frame holds only the rectangle
//! that changed since the one before, its unchanged pixels transparent, which LZW packs to
//! almost nothing. gifski is made for video: it quantises every frame with libimagequant
//! (lossy, dithered: colours near the theme's, not the theme's) and is AGPL/GPL-licensed where
//! unmask is MIT/Apache.

pub mod raster;
pub mod unifont;

use std::collections::HashMap;
use std::io::Write;

use anyhow::{Context, Result};
use ratatui::buffer::Buffer;

use crate::tui::record::Screens;
use crate::tui::theme::{Rgb, Theme};
use raster::{Area, Look, Raster, Scale};

/// The shortest delay between frames, in hundredths of a second (a GIF's unit): browsers show
/// a frame of 0 or 1 as 10, so screens closer together are coalesced, the later one shown.
const MIN_DELAY: u64 = 2;

/// Hundredths of a second at `t` seconds of recording time.
fn centis(t: f64) -> u64 {
    (t * 100.0).round().max(0.0) as u64
}

/// What the GIF shows so far: nothing, or the pixels of its last frame, made but held back
/// until it is known how long it lasts (the next screen that differs, or the end).
enum Shown {
    Nothing,
    Held { pixels: Vec<Rgb>, frame: ::gif::Frame<'static>, delay: u64 },
}

/// Writes a recording's screens as an animated GIF that loops, its title in a comment.
pub struct GifScreens<W: Write> {
    enc: ::gif::Encoder<W>,
    label: String,
    raster: Raster,
    shown: Shown,
    /// When the screen drawn on `raster`, not yet made a frame, is shown from (hundredths).
    pending: Option<u64>,
}

impl<W: Write> GifScreens<W> {
    /// A GIF of screens of `cols` × `rows` cells in `theme`, each cell 8×16 pixels × `scale`.
    pub fn new(
        out: W,
        label: &str,
        (theme, scale): (&Theme, Scale),
        (cols, rows): (u16, u16),
        title: &str,
    ) -> Result<Self> {
        let font = unifont::Font::bundled()?;
        let raster = Raster::new(font, Look::of(theme), scale, cols, rows);
        let size = |n: usize, what: &str| {
            u16::try_from(n)
                .with_context(|| format!("{label}: a GIF {n} pixels {what} is over 65535"))
        };
        let (w, h) = (size(raster.width(), "wide")?, size(raster.height(), "tall")?);
        let cannot = || format!("{label}: cannot write");
        let mut enc = ::gif::Encoder::new(out, w, h, &[]).with_context(cannot)?;
        enc.set_repeat(::gif::Repeat::Infinite).with_context(cannot)?;
        if !title.is_empty() {
            enc.write_raw_extension(::gif::Extension::Comment.into(), &[title.as_bytes()])
                .with_context(cannot)?;
        }
        Ok(GifScreens {
            enc,
            label: label.to_string(),
            raster,
            shown: Shown::Nothing,
            pending: None,
        })
    }

    /// The raster's screen as a frame lasting `delay` hundredths: only what changed since the
    /// frame before; a screen that changed nothing lengthens that frame instead.
    fn cut(&mut self, delay: u64) -> Result<()> {
        let redrawn = self.raster.take_redrawn();
        let (now, width) = (self.raster.pixels(), self.raster.width());
        let frame = match &self.shown {
            Shown::Nothing => {
                let all = Area { x: 0, y: 0, width, height: self.raster.height() };
                Some(frame_of(now, None, width, all))
            }
            Shown::Held { pixels, .. } => redrawn
                .and_then(|r| changed_area(now, pixels, width, r))
                .map(|area| frame_of(now, Some(pixels), width, area)),
        };
        match (frame, &mut self.shown) {
            (Some(frame), _) => {
                let pixels = now.to_vec();
                let was = std::mem::replace(&mut self.shown, Shown::Held { pixels, frame, delay });
                self.write(was)
            }
            (None, Shown::Held { delay: d, .. }) => {
                *d += delay;
                Ok(())
            }
            (None, Shown::Nothing) => Ok(()),
        }
    }

    /// Writes a held frame, with as many empty frames after it as a delay over a GIF's
    /// longest (655.35 s) takes.
    fn write(&mut self, shown: Shown) -> Result<()> {
        let Shown::Held { mut frame, delay, .. } = shown else { return Ok(()) };
        let mut left = delay;
        loop {
            frame.delay = left.min(u16::MAX as u64) as u16;
            left -= frame.delay as u64;
            self.enc
                .write_frame(&frame)
                .with_context(|| format!("{}: cannot write", self.label))?;
            if left == 0 {
                return Ok(());
            }
            frame = ::gif::Frame::from_palette_pixels(1, 1, [0], [0, 0, 0], Some(0));
        }
    }

    /// Finishes the file (its trailer) and hands back the writer.
    pub fn finish(self) -> Result<W> {
        let label = self.label;
        let mut out = self.enc.into_inner().with_context(|| format!("{label}: cannot write"))?;
        out.flush().with_context(|| format!("{label}: cannot write"))?;
        Ok(out)
    }
}

impl<W: Write> Screens for GifScreens<W> {
    fn frame(&mut self, t: f64, screen: &Buffer) -> Result<()> {
        let at = centis(t);
        match self.pending {
            // Too soon after the screen before: this one takes its place.
            Some(p) if at < p + MIN_DELAY => {}
            Some(p) => {
                self.cut(at - p)?;
                self.pending = Some(at);
            }
            None => self.pending = Some(at),
        }
        self.raster.draw(screen);
        Ok(())
    }

    fn end(&mut self, t: f64) -> Result<()> {
        let at = centis(t);
        // A recording stopped before its first screen still shows one: the empty terminal.
        let from = match (self.pending.take(), &self.shown) {
            (Some(p), _) => Some(p),
            (None, Shown::Nothing) => Some(at.saturating_sub(centis(crate::tui::record::HOLD))),
            (None, _) => None,
        };
        if let Some(p) = from {
            self.cut(at.saturating_sub(p).max(MIN_DELAY))?;
        }
        let last = std::mem::replace(&mut self.shown, Shown::Nothing);
        self.write(last)
    }
}

/// The smallest area within `redrawn` whose pixels differ from `before`; `None` when none
/// differs.
fn changed_area(now: &[Rgb], before: &[Rgb], width: usize, redrawn: Area) -> Option<Area> {
    let (mut left, mut right, mut top, mut bottom) = (usize::MAX, 0, usize::MAX, 0);
    for y in redrawn.y..redrawn.y + redrawn.height {
        let at = y * width + redrawn.x;
        let (a, b) = (&now[at..at + redrawn.width], &before[at..at + redrawn.width]);
        let Some(first) = a.iter().zip(b).position(|(p, q)| p != q) else { continue };
        let last = a.iter().zip(b).rposition(|(p, q)| p != q).unwrap_or(first);
        (left, right) = (left.min(first), right.max(last));
        (top, bottom) = (top.min(y), y);
    }
    (top != usize::MAX).then(|| Area {
        x: redrawn.x + left,
        y: top,
        width: right - left + 1,
        height: bottom - top + 1,
    })
}

/// The frame that paints `area` of `now` over `before`: the pixels that changed in a palette
/// of exactly their colours, those that did not transparent (index 0; none with no picture
/// before). A screen of more than 255 colours in one area (no theme has a tenth of that) is
/// quantised instead (NeuQuant, the gif crate's).
fn frame_of(
    now: &[Rgb],
    before: Option<&[Rgb]>,
    width: usize,
    area: Area,
) -> ::gif::Frame<'static> {
    const CLEAR: u8 = 0;
    let mut index: HashMap<Rgb, u8> = HashMap::new();
    let mut palette: Vec<u8> = vec![0, 0, 0];
    let mut pixels = Vec::with_capacity(area.width * area.height);
    let mut clear = false;
    // The colour of the pixel before, unless it was left transparent.
    let mut run: Option<(Rgb, u8)> = None;
    for y in area.y..area.y + area.height {
        for i in y * width + area.x..y * width + area.x + area.width {
            let c = now[i];
            let ix = match run {
                // A run of one colour goes on over the pixels of that colour that did not
                // change (fewer, longer runs are what LZW packs best).
                Some((rc, ri)) if rc == c => ri,
                _ if before.is_some_and(|b| b[i] == c) => CLEAR,
                _ => match index.get(&c) {
                    Some(&ix) => ix,
                    None if palette.len() < 256 * 3 => {
                        let ix = (palette.len() / 3) as u8;
                        index.insert(c, ix);
                        palette.extend([c.0, c.1, c.2]);
                        ix
                    }
                    None => return quantised(now, width, area),
                },
            };
            clear |= ix == CLEAR;
            run = if ix == CLEAR { None } else { Some((c, ix)) };
            pixels.push(ix);
        }
    }
    let (w, h) = (area.width as u16, area.height as u16);
    let mut frame =
        ::gif::Frame::from_palette_pixels(w, h, pixels, palette, clear.then_some(CLEAR));
    (frame.left, frame.top) = (area.x as u16, area.y as u16);
    frame
}

/// `area` of `now`, whole and opaque, quantised to 256 colours.
fn quantised(now: &[Rgb], width: usize, area: Area) -> ::gif::Frame<'static> {
    let mut rgba = Vec::with_capacity(area.width * area.height * 4);
    for y in area.y..area.y + area.height {
        for &(r, g, b) in &now[y * width + area.x..y * width + area.x + area.width] {
            rgba.extend([r, g, b, 0xff]);
        }
    }
    let mut frame =
        ::gif::Frame::from_rgba_speed(area.width as u16, area.height as u16, &mut rgba, 10);
    (frame.left, frame.top) = (area.x as u16, area.y as u16);
    frame
}

#[cfg(test)]
mod tests {
    use ratatui::layout::Rect;
    use ratatui::style::{Color, Style};

    use super::*;
    use crate::tui::theme::{pick, Depth, ThemeName};

    /// Every frame of a GIF as the viewer shows it (frames drawn over the ones before) and how
    /// long, in hundredths.
    fn play(gif: &[u8]) -> Vec<(u16, Vec<Rgb>)> {
        let mut opts = ::gif::DecodeOptions::new();
        opts.set_color_output(::gif::ColorOutput::RGBA);
        let mut d = opts.read_info(gif).unwrap();
        let width = d.width() as usize;
        let mut canvas = vec![(0, 0, 0); width * d.height() as usize];
        let mut out = Vec::new();
        while let Some(f) = d.read_next_frame().unwrap() {
            for (k, px) in f.buffer.chunks(4).enumerate() {
                let (x, y) =
                    (f.left as usize + k % f.width as usize, f.top as usize + k / f.width as usize);
                if px[3] != 0 {
                    canvas[y * width + x] = (px[0], px[1], px[2]);
                }
            }
            out.push((f.delay, canvas.clone()));
        }
        out
    }

    fn screen(text: &str, fg: Color) -> Buffer {
        let mut b = Buffer::empty(Rect::new(0, 0, 6, 2));
        b.set_string(0, 0, text, Style::default().fg(fg));
        b
    }

    fn gif(screens: &[(f64, Buffer)], end: f64) -> Vec<u8> {
        let theme = pick(ThemeName::Dark, Depth::TrueColor);
        let mut g = GifScreens::new(Vec::new(), "mem", (theme, Scale::One), (6, 2), "t").unwrap();
        for (t, s) in screens {
            g.frame(*t, s).unwrap();
        }
        g.end(end).unwrap();
        g.finish().unwrap()
    }

    fn drawn(s: &Buffer) -> Vec<Rgb> {
        let theme = pick(ThemeName::Dark, Depth::TrueColor);
        let mut r =
            Raster::new(unifont::Font::bundled().unwrap(), Look::of(theme), Scale::One, 6, 2);
        r.draw(s);
        r.pixels().to_vec()
    }

    #[test]
    fn frames_last_until_the_next_screen_and_the_last_until_the_end() {
        let (a, b) = (screen("ab", Color::Red), screen("ac", Color::Red));
        let shown = play(&gif(&[(0.0, a.clone()), (0.5, b.clone())], 2.5));
        assert_eq!(shown.len(), 2);
        assert_eq!((shown[0].0, shown[1].0), (50, 200));
        assert_eq!(shown[0].1, drawn(&a));
        assert_eq!(shown[1].1, drawn(&b));
    }

    /// Screens closer than a GIF shows (2/100 s): the later one takes the earlier's place; a
    /// screen that changes nothing lengthens the frame before.
    #[test]
    fn screens_too_close_are_coalesced_and_unchanged_ones_lengthen_the_frame() {
        let (a, b, c) =
            (screen("ab", Color::Red), screen("ac", Color::Red), screen("ad", Color::Blue));
        let shown =
            play(&gif(&[(0.0, a.clone()), (0.5, b), (0.51, c.clone()), (1.0, c.clone())], 3.0));
        assert_eq!(shown.iter().map(|f| f.0).collect::<Vec<_>>(), [50, 250]);
        assert_eq!(shown[1].1, drawn(&c));
    }

    #[test]
    fn a_wait_longer_than_a_gif_frame_takes_empty_frames_after_it() {
        let a = screen("ab", Color::Red);
        let shown = play(&gif(&[(0.0, a.clone())], 700.0));
        assert_eq!(shown.iter().map(|f| f.0 as u64).sum::<u64>(), 70_000);
        assert_eq!(shown[0].0, u16::MAX);
        assert!(shown.iter().all(|f| f.1 == drawn(&a)));
    }

    #[test]
    fn a_recording_stopped_before_its_first_screen_is_the_empty_terminal() {
        let shown = play(&gif(&[], crate::tui::record::HOLD));
        assert_eq!(shown.len(), 1);
        let (_, back) = pick(ThemeName::Dark, Depth::TrueColor).screen_rgb();
        assert!(shown[0].1.iter().all(|&c| c == back));
    }

    /// A frame is the changed rectangle only, in exactly its colours, and what did not change
    /// inside it transparent, except where a run of its colour goes on.
    #[test]
    fn a_frame_is_the_changed_rectangle_in_exact_colours() {
        let (a, b) = (drawn(&screen("ab", Color::Red)), drawn(&screen("ac", Color::Rgb(1, 2, 3))));
        let w = 6 * raster::CELL_W;
        let all = Area { x: 0, y: 0, width: w, height: a.len() / w };
        let area = changed_area(&b, &a, w, all).unwrap();
        assert!(area.x + area.width <= 2 * raster::CELL_W, "{area:?}");
        assert!(area.y + area.height <= raster::CELL_H, "{area:?}");
        assert_eq!(changed_area(&a, &a, w, all), None);
        let f = frame_of(&b, Some(&a), w, area);
        assert_eq!((f.left as usize, f.top as usize), (area.x, area.y));
        let palette = f.palette.as_ref().unwrap();
        let colours: Vec<Rgb> = palette.chunks(3).skip(1).map(|c| (c[0], c[1], c[2])).collect();
        assert!(colours.contains(&(1, 2, 3)), "{colours:?}");
        assert_eq!(f.transparent, Some(0));
        for (k, &ix) in f.buffer.iter().enumerate() {
            let i = (area.y + k / area.width) * w + area.x + k % area.width;
            match ix {
                0 => assert_eq!(a[i], b[i], "only unchanged pixels are left"),
                ix => assert_eq!(colours[ix as usize - 1], b[i]),
            }
        }
        let first = frame_of(&a, None, w, all);
        assert_eq!((first.transparent, first.buffer.len()), (None, a.len()), "the first: whole");
    }
}
