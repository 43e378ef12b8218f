//! Recording a decode: the TUI's own screens, rendered frame by frame into memory (never the
//! real terminal), with recording time set by the pacing rather than the clock, so the same
//! events always give the same file (a cast's timestamp aside). One loop ([`play`]) makes the
//! screens and their times; each output takes them: an asciicast ([`CastScreens`]), an
//! animated GIF ([`crate::tui::gif::GifScreens`]), or both at once.

use std::cell::RefCell;
use std::io::Write;
use std::rc::Rc;

use anyhow::{bail, Result};
use crossterm::event::{KeyCode, KeyEvent, KeyModifiers};
use ratatui::backend::CrosstermBackend;
use ratatui::buffer::Buffer;
use ratatui::layout::Rect;
use ratatui::{Terminal, TerminalOptions, Viewport};

use crate::trace::events::Event;
use crate::tui::cast::{CastHeader, CastWriter};
use crate::tui::{self, App};

/// Clear the screen, home the cursor, hide it: the first frame starts from a known screen,
/// because ratatui only writes the cells that differ from its (blank) previous buffer.
const START: &str = "\x1b[0m\x1b[2J\x1b[H\x1b[?25l";
/// After the last frame: the cursor comes back, so the player's terminal is left usable.
const END: &str = "\x1b[0m\x1b[?25h";
/// Seconds the final screen stays up before the cast ends.
pub const HOLD: f64 = 2.0;

/// A frame a minute at the slowest, a thousand a second at the fastest.
const MIN_FPS: f64 = 1.0 / 60.0;
const MAX_FPS: f64 = 1000.0;
/// An hour a step at the slowest.
const MAX_STEP_DELAY: f64 = 3600.0;

#[derive(Clone)]
pub struct Pacing {
    /// Most frames per second of cast time.
    pub fps: f64,
    /// Cast seconds per denoising step.
    pub step_delay: f64,
    pub width: u16,
    pub height: u16,
    /// How the screens are drawn: `--theme`, and mono under `--mono` or NO_COLOR (whose step
    /// marks carry what colour would).
    pub theme: &'static crate::tui::theme::Theme,
}

impl Pacing {
    pub fn validate(&self) -> Result<()> {
        // Bounded so that every timestamp of a cast is an ordinary number (1e308 seconds a step
        // wrote `null`s, which no player reads).
        if !(MIN_FPS..=MAX_FPS).contains(&self.fps) {
            bail!("--fps must be within 1/60 to {MAX_FPS} (a frame a minute to {MAX_FPS} a second), not {:?}", self.fps);
        }
        if !(0.0..=MAX_STEP_DELAY).contains(&self.step_delay) {
            bail!(
                "--step-delay must be within 0 to {MAX_STEP_DELAY} seconds, not {:?}",
                self.step_delay
            );
        }
        use crate::limits::{MAX_CAST_HEIGHT, MAX_CAST_WIDTH};
        // Under the TUI's minimum every frame would say "terminal too small".
        use crate::tui::layout::{MIN_HEIGHT, MIN_WIDTH};
        if !(MIN_WIDTH..=MAX_CAST_WIDTH).contains(&self.width) {
            bail!("--width must be within {MIN_WIDTH} to {MAX_CAST_WIDTH}, the TUI's smallest to largest (got {})", self.width);
        }
        if !(MIN_HEIGHT..=MAX_CAST_HEIGHT).contains(&self.height) {
            bail!("--height must be within {MIN_HEIGHT} to {MAX_CAST_HEIGHT}, the TUI's smallest to largest (got {})", self.height);
        }
        Ok(())
    }
}

/// The default cast title: the settings summary and the prompt.
pub fn default_title(events: &[Event]) -> String {
    match events.first() {
        Some(Event::Header(h)) => {
            format!("unmask · {} · {:?}", h.settings.summary(), h.shown_prompt())
        }
        _ => "unmask".into(),
    }
}

/// The app a recording ends on: the whole trace, cursor at the end. Tests rebuild it to
/// check a cast's last screen.
/// `label` names the trace the screens show (`None`: a live decode, recorded by `record`).
pub fn final_app(
    events: Vec<Event>,
    label: Option<String>,
    stopped: Option<String>,
    p: &Pacing,
) -> App {
    let mut app = cast_app(events, label, stopped, p);
    app.on_key(KeyEvent::new(KeyCode::End, KeyModifiers::NONE));
    app
}

/// The app a recording draws: a replay of `events` at the cast's size and in its theme.
fn cast_app(events: Vec<Event>, label: Option<String>, stopped: Option<String>, p: &Pacing) -> App {
    let live = label.is_none();
    let mut app = App::replay(events, label.unwrap_or_default(), stopped);
    // A live decode recorded is no replay of a trace: the header says so.
    app.recorded_live = live;
    app.size = Rect::new(0, 0, p.width, p.height);
    app.cast = true;
    app.theme = p.theme;
    app
}

/// Where a recording's screens go, in order of time: the cast writer, the GIF writer.
pub trait Screens {
    /// `screen` shows from `t` seconds of recording time on (times never go back).
    fn frame(&mut self, t: f64, screen: &Buffer) -> Result<()>;
    /// The recording ends at `t`, the last screen held until then.
    fn end(&mut self, t: f64) -> Result<()>;
}

/// Memory the backend writes into and the recorder drains (ratatui's own accessor for the
/// backend's writer is unstable, so the two share the buffer).
#[derive(Clone, Default)]
struct Shared(Rc<RefCell<Vec<u8>>>);

impl Write for Shared {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.borrow_mut().extend_from_slice(b);
        Ok(b.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A ratatui terminal whose output goes to memory: each draw's escape codes, taken out whole.
struct Frames {
    term: Terminal<CrosstermBackend<Shared>>,
    out: Shared,
}

impl Frames {
    fn new(width: u16, height: u16) -> Result<Self> {
        let viewport = Viewport::Fixed(Rect::new(0, 0, width, height));
        let out = Shared::default();
        let term = Terminal::with_options(
            CrosstermBackend::new(out.clone()),
            TerminalOptions { viewport },
        )?;
        Ok(Frames { term, out })
    }

    /// The escape codes that turn the screen drawn before into `screen` (ratatui's diff).
    fn frame(&mut self, screen: &Buffer) -> Result<String> {
        self.term.draw(|f| f.buffer_mut().clone_from(screen))?;
        let bytes = std::mem::take(&mut *self.out.0.borrow_mut());
        Ok(String::from_utf8(bytes)?)
    }
}

/// Writes a recording's screens as an asciicast: each screen the terminal output that draws it
/// over the one before.
pub struct CastScreens<W: Write> {
    cast: CastWriter<W>,
    frames: Frames,
    started: bool,
}

impl<W: Write> CastScreens<W> {
    /// Writes the header at once: a cast of `p`'s size, titled `title`.
    pub fn new(out: W, label: &str, p: &Pacing, title: &str) -> Result<Self> {
        let cast = CastWriter::new(out, label, &CastHeader::new(p.width, p.height, title))?;
        Ok(CastScreens { cast, frames: Frames::new(p.width, p.height)?, started: false })
    }

    pub fn finish(self) -> Result<W> {
        self.cast.finish()
    }
}

impl<W: Write> Screens for CastScreens<W> {
    fn frame(&mut self, t: f64, screen: &Buffer) -> Result<()> {
        let clear = if self.started { "" } else { START };
        self.started = true;
        self.cast.output(t, &format!("{clear}{}", self.frames.frame(screen)?))
    }

    fn end(&mut self, t: f64) -> Result<()> {
        self.cast.output(t, END)
    }
}

/// Writes the cast of `events` to `out`: one frame per step, at most `fps` a second (steps
/// that fall within one frame interval are coalesced), the final screen, then a hold.
pub fn record<W: Write>(
    events: Vec<Event>,
    app_label: Option<String>,
    stopped: Option<String>,
    p: &Pacing,
    title: &str,
    out: W,
    out_label: &str,
) -> Result<W> {
    record_until(events, app_label, stopped, p, title, out, out_label, &|| false)
}

/// [`record`], asking `stop` before each frame (see [`play`]).
#[allow(clippy::too_many_arguments)]
pub fn record_until<W: Write>(
    events: Vec<Event>,
    app_label: Option<String>,
    stopped: Option<String>,
    p: &Pacing,
    title: &str,
    out: W,
    out_label: &str,
    stop: &dyn Fn() -> bool,
) -> Result<W> {
    p.validate()?;
    let mut cast = CastScreens::new(out, out_label, p, title)?;
    play(events, app_label, stopped, p, &mut [&mut cast], stop)?;
    cast.finish()
}

/// Plays the screens of `events` into every one of `to`, each with its time: one per step, at
/// most `fps` a second (steps that fall within one frame interval are coalesced), the final
/// screen, then the end, [`HOLD`] seconds later. `stop` is asked before each screen: once it
/// says yes (a signal came while rendering), the recording ends on the screens already
/// played, the last of them held for [`HOLD`] seconds, so that every output is still whole.
pub fn play(
    events: Vec<Event>,
    app_label: Option<String>,
    stopped: Option<String>,
    p: &Pacing,
    to: &mut [&mut dyn Screens],
    stop: &dyn Fn() -> bool,
) -> Result<()> {
    p.validate()?;
    let mut app = cast_app(events, app_label, stopped, p);
    let area = Rect::new(0, 0, p.width, p.height);
    let mut screen = Buffer::empty(area);
    let mut show = |t: f64, app: &App| {
        screen.reset();
        tui::render(app, area, &mut screen);
        to.iter_mut().try_for_each(|o| o.frame(t, &screen))
    };
    let interval = 1.0 / p.fps;
    let mut last: Option<f64> = None;
    let head = app.store.run().and_then(|r| r.head());
    for k in 0..=head.unwrap_or(0) {
        if stop() {
            let t = last.unwrap_or(0.0) + HOLD;
            return to.iter_mut().try_for_each(|o| o.end(t));
        }
        let mut tk = k as f64 * p.step_delay;
        if let Some(l) = last.filter(|l| tk - l < interval - 1e-9) {
            // Sooner than a frame after the last one: skipped, except the last step, which
            // waits for the next frame slot.
            if Some(k) < head {
                continue;
            }
            tk = l + interval;
        }
        if let Some(run) = app.store.run() {
            app.cursor.goto(run, k);
        }
        show(tk, &app)?;
        last = Some(tk);
    }
    // The end: the cursor at the live head, as `End` leaves it (the title says finished).
    let t_end = last.unwrap_or(0.0) + p.step_delay.max(interval);
    app.on_key(KeyEvent::new(KeyCode::End, KeyModifiers::NONE));
    show(t_end, &app)?;
    to.iter_mut().try_for_each(|o| o.end(t_end + HOLD))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::synth::{self, Synth};

    fn pacing(width: u16, height: u16) -> Pacing {
        Pacing { fps: 1000.0, step_delay: 0.01, width, height, theme: &crate::tui::theme::DARK }
    }

    /// Every screen of a cast, as a terminal shows it after each frame.
    fn screens(cast: &[u8], p: &Pacing) -> Vec<String> {
        let (_, events) = crate::tui::cast::parse(std::str::from_utf8(cast).unwrap()).unwrap();
        let mut term = vt100::Parser::new(p.height, p.width, 0);
        events
            .iter()
            .map(|(_, _, data)| {
                term.process(data.as_bytes());
                term.screen().contents()
            })
            .collect()
    }

    #[test]
    fn a_cast_shows_no_key_hints_and_no_paused_state() {
        let p = pacing(120, 36);
        let cast = record(
            synth::trace(&Synth::small()),
            Some("t".into()),
            None,
            &p,
            "t",
            Vec::new(),
            "mem",
        )
        .unwrap();
        let shown = screens(&cast, &p);
        assert!(shown.len() > 10, "{} frames", shown.len());
        for s in &shown {
            for lie in ["PAUSED", "behind", "? help", "space pause", "LIVE", "PLAYING"] {
                assert!(!s.contains(lie), "a cast frame shows {lie:?}:\n{s}");
            }
        }
        assert!(shown[0].contains("overall 1/26"), "{}", shown[0]);
    }

    /// A signal while rendering: the cast ends on the frames rendered so far, still whole
    /// (it parses, its times grow, its last event shows the cursor again).
    #[test]
    fn a_stopped_recording_is_a_whole_cast_of_the_frames_so_far() {
        let p = pacing(120, 36);
        let full = record(
            synth::trace(&Synth::small()),
            Some("t".into()),
            None,
            &p,
            "t",
            Vec::new(),
            "mem",
        )
        .unwrap();
        let asked = std::cell::Cell::new(0);
        let stop = || {
            asked.set(asked.get() + 1);
            asked.get() > 5
        };
        let cut = record_until(
            synth::trace(&Synth::small()),
            Some("t".into()),
            None,
            &p,
            "t",
            Vec::new(),
            "mem",
            &stop,
        )
        .unwrap();
        let (_, all) = crate::tui::cast::parse(std::str::from_utf8(&full).unwrap()).unwrap();
        let (_, part) = crate::tui::cast::parse(std::str::from_utf8(&cut).unwrap()).unwrap();
        assert_eq!(part.len(), 6, "five frames and the end");
        assert!(all.len() > part.len());
        assert_eq!(part[..5], all[..5], "the same frames, up to the stop");
        assert_eq!(part[5].2, END);
        assert_eq!(part[5].0, part[4].0 + HOLD);
        assert_eq!(screens(&cut, &p)[4], screens(&full, &p)[4]);
    }

    #[test]
    fn sizes_under_the_tui_s_minimum_are_refused() {
        let e = pacing(59, 40).validate().unwrap_err().to_string();
        assert_eq!(e, "--width must be within 60 to 1000, the TUI's smallest to largest (got 59)");
        let e = pacing(120, 19).validate().unwrap_err().to_string();
        assert!(e.starts_with("--height must be within 20 to "), "{e}");
        pacing(60, 20).validate().unwrap();
    }
}
