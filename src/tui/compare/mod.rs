//! Compare mode: two decodes of one prompt side by side, A on the left and B on the right, each
//! a full [`App`] drawn with the TUI's own panels in half the width. One cursor moves both:
//! in lock-step by global step index, or aligned by block (block n, step s on both sides).
//! Cells where the two committed different tokens at the same position are marked `≠`, cells
//! where they committed the same token at different steps of its block `≈` (a glyph, so the
//! marks read without colour too). With token editing both judge the tokens held at the steps
//! shown and the steps that set them; each grid marks its edited cells `✎` as the TUI does.
//!
//! This module is the state and what every key does to it. Pure: no terminal, no drawing;
//! [`render`] draws it, and the TUI's loop ([`crate::tui::run`]) runs it, as it runs the
//! single view.

pub mod render;

use std::time::{Duration, Instant};

use crossterm::event::{Event as TermEvent, KeyCode, KeyEvent, KeyEventKind, KeyModifiers};
use ratatui::layout::Rect;

use super::app::App;
use super::cursor::Mode;
use super::help::{self, key, KeyTable};
use super::theme::{Theme, DARK};
use crate::trace::compare::{compare, Comparison};
use crate::trace::events::Event;
use crate::trace::store::{CellState, Run};

pub const MIN_WIDTH: u16 = 80;
pub const MIN_HEIGHT: u16 = 22;

/// Below the smallest screen only "too small (q quits)" is drawn, and keys but q wait.
fn too_small(area: Rect) -> bool {
    area.width < MIN_WIDTH || area.height < MIN_HEIGHT
}
/// Playback speed of `space` when no pace was given (`--pace 0`, the snapshot tests), in steps
/// per second.
const SPEED: f64 = 20.0;

pub const KEYS: &KeyTable = &[
    (
        "compare",
        &[
            key("space", 9, &["pause / play both sides", "pause / play"]),
            help::STEP,
            help::BLOCK,
            key("Home End", 6, &["first step / both heads", "first / heads"]),
            key(
                "a",
                7,
                &[
                    "lock-step by step index / aligned by block",
                    "align by step index / by block",
                    "align step / block",
                ],
            ),
            key(
                "L",
                5,
                &[
                    "each side's Steps list in place of its text",
                    "Steps lists in place of text",
                    "Steps lists / text",
                ],
            ),
        ],
    ),
    ("", help::GENERAL),
];

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Align {
    /// Both sides at the same global step index (each capped at its own head).
    Step,
    /// Both sides in the same block, at the same step within it.
    Block,
}

pub struct CompareApp {
    pub sides: [App; 2],
    /// Each side's events, for `compare::compare` once both have finished.
    events: [Vec<Event>; 2],
    comparison: Option<Comparison>,
    pub align: Align,
    /// Live: both sides follow their heads. Paused/Playing: at `k` or `(block, step)`.
    pub mode: Mode,
    k: usize,
    block: usize,
    step: usize,
    carry: f64,
    last_tick: Option<Instant>,
    /// Steps per second of playing (`--pace`, `space`).
    speed: f64,
    pub help: bool,
    pub quit: bool,
    pub theme: &'static Theme,
    /// The terminal's size at the last draw or resize: below the smallest, keys but q wait.
    pub size: Rect,
}

impl CompareApp {
    /// Two live decodes, filled by [`CompareApp::ingest`].
    pub fn live() -> Self {
        CompareApp::from_apps([App::live(), App::live()])
    }

    /// Two live decodes played from their first step at `pace`, as the single view plays one,
    /// until they catch up with the heads; then both follow them. `Pace::Unlimited`: at the
    /// heads from the start.
    pub fn paced(pace: crate::tui::cursor::Pace, now: Instant) -> Self {
        let mut app = CompareApp::live();
        if let crate::tui::cursor::Pace::PerSecond(speed) = pace {
            (app.mode, app.speed, app.last_tick) = (Mode::Playing, speed, Some(now));
        }
        app
    }

    /// Two recorded decodes (the snapshot tests' fixed pair).
    pub fn replay(a: Vec<Event>, b: Vec<Event>) -> Self {
        let mut app = CompareApp::live();
        for (side, events) in [a, b].into_iter().enumerate() {
            events.into_iter().for_each(|e| app.ingest(side, e));
        }
        app
    }

    fn from_apps(sides: [App; 2]) -> Self {
        CompareApp {
            sides,
            events: [Vec::new(), Vec::new()],
            comparison: None,
            align: Align::Step,
            mode: Mode::Live,
            k: 0,
            block: 0,
            step: 0,
            carry: 0.0,
            last_tick: None,
            speed: SPEED,
            help: false,
            quit: false,
            theme: &DARK,
            size: Rect::new(0, 0, 120, 40),
        }
    }

    /// One event of side `side` (0: A, 1: B).
    pub fn ingest(&mut self, side: usize, ev: Event) {
        self.events[side].push(ev.clone());
        // Compare mode cannot steer the engines: whatever the side app asks is moot.
        let _ = self.sides[side].ingest(ev);
        let finished = |s: &App| s.store.run().is_some_and(|r| r.finish.is_some());
        if self.comparison.is_none() && self.sides.iter().all(finished) {
            self.comparison = Some(compare(&self.events[0], &self.events[1]));
        }
        self.sync();
    }

    pub fn comparison(&self) -> Option<&Comparison> {
        self.comparison.as_ref()
    }

    fn runs(&self) -> impl Iterator<Item = &Run> {
        self.sides.iter().filter_map(|s| s.store.run())
    }

    fn max_head(&self) -> usize {
        self.runs().filter_map(Run::head).max().unwrap_or(0)
    }

    fn first_block(&self) -> usize {
        self.runs().map(|r| r.header.first_block).min().unwrap_or(0)
    }

    fn last_block(&self) -> usize {
        self.runs().map(|r| r.active_block(r.head())).max().unwrap_or(0)
    }

    /// The most steps either side took (so far) on `block`.
    fn block_len(&self, block: usize) -> usize {
        self.runs().map(|r| r.block_steps(block).len()).max().unwrap_or(0)
    }

    /// Puts each side's cursor where the shared position says.
    fn sync(&mut self) {
        let (mode, align, k, block, step) = (self.mode, self.align, self.k, self.block, self.step);
        for side in &mut self.sides {
            let Some(run) = side.store.run() else { continue };
            match (mode, align) {
                (Mode::Live, _) => side.cursor.end(),
                (_, Align::Step) => side.cursor.goto(run, k),
                (_, Align::Block) => side.cursor.goto(run, step_in_block(run, block, step)),
            }
        }
    }

    /// The shared position as both alignments read it, taken from what is shown now.
    fn hold(&mut self) {
        if self.mode == Mode::Live {
            self.k = self.max_head();
            // The side that went furthest says where "the end" is, block-wise.
            let furthest =
                self.runs().max_by_key(|r| r.head()).and_then(|r| r.step(r.head()?).cloned());
            if let Some(s) = furthest {
                (self.block, self.step) = (s.block, s.step);
            }
        }
        self.mode = Mode::Paused;
        self.carry = 0.0;
    }

    fn position(&self) -> (usize, usize, usize) {
        (self.k, self.block, self.step)
    }

    /// One step on; false at the end.
    fn forward(&mut self) -> bool {
        let before = self.position();
        match self.align {
            Align::Step => self.k = (self.k + 1).min(self.max_head()),
            Align::Block if self.step + 1 < self.block_len(self.block) => self.step += 1,
            Align::Block if self.block < self.last_block() => {
                (self.block, self.step) = (self.block + 1, 0)
            }
            Align::Block => {}
        }
        self.position() != before
    }

    fn back(&mut self) {
        match self.align {
            Align::Step => self.k = self.k.saturating_sub(1),
            Align::Block if self.step > 0 => self.step -= 1,
            Align::Block if self.block > self.first_block() => {
                self.block -= 1;
                self.step = self.block_len(self.block).saturating_sub(1);
            }
            Align::Block => {}
        }
    }

    /// Every step index at which a block starts, on either side.
    fn block_starts(&self) -> Vec<usize> {
        let mut v: Vec<usize> = self
            .runs()
            .flat_map(|r| r.blocks().iter().map(|b| b.first_step).collect::<Vec<_>>())
            .collect();
        v.sort_unstable();
        v
    }

    fn block_forward(&mut self) {
        match self.align {
            Align::Step => {
                let next = self.block_starts().into_iter().find(|&s| s > self.k);
                self.k = next.unwrap_or(self.max_head());
            }
            Align::Block if self.block < self.last_block() => {
                (self.block, self.step) = (self.block + 1, 0)
            }
            Align::Block => self.step = self.block_len(self.block).saturating_sub(1),
        }
    }

    fn block_back(&mut self) {
        match self.align {
            Align::Step => {
                self.k = self.block_starts().into_iter().rfind(|&s| s < self.k).unwrap_or(0)
            }
            Align::Block if self.step > 0 => self.step = 0,
            Align::Block if self.block > self.first_block() => {
                (self.block, self.step) = (self.block - 1, 0)
            }
            Align::Block => {}
        }
    }

    /// `a`: switch alignment, keeping side A where it is.
    fn toggle_align(&mut self) {
        let at = self.sides[0].view().and_then(|v| v.run.step(v.at?).cloned().map(|s| (v.at, s)));
        self.align = match self.align {
            Align::Step => Align::Block,
            Align::Block => Align::Step,
        };
        if let Some((Some(k), s)) = at {
            (self.k, self.block, self.step) = (k, s.block, s.step);
        }
    }

    fn toggle_play(&mut self) {
        match self.mode {
            Mode::Live | Mode::Playing => self.hold(),
            Mode::Paused => {
                // Play on if there is anywhere to go; at the end, follow the heads.
                let saved = self.position();
                let moved = self.forward();
                (self.k, self.block, self.step) = saved;
                self.mode = if moved { Mode::Playing } else { Mode::Live };
            }
        }
    }

    pub fn on_input(&mut self, ev: TermEvent, now: Instant) {
        match ev {
            TermEvent::Key(k) if k.kind != KeyEventKind::Release => self.on_key(k),
            TermEvent::Resize(w, h) => self.size = Rect::new(0, 0, w, h),
            _ => {}
        }
        if self.mode == Mode::Playing && self.last_tick.is_none() {
            self.last_tick = Some(now);
        }
    }

    pub fn on_key(&mut self, k: KeyEvent) {
        let ctrl = k.modifiers.contains(KeyModifiers::CONTROL);
        if ctrl && k.code == KeyCode::Char('c') {
            self.quit = true;
            return;
        }
        // Only "too small (q quits)" is drawn: any other key would act unseen.
        if too_small(self.size) {
            self.quit |= k.code == KeyCode::Char('q');
            return;
        }
        // Any key closes the help, q too (as the help says).
        if std::mem::take(&mut self.help) {
            return;
        }
        if k.code == KeyCode::Char('q') {
            self.quit = true;
            return;
        }
        let moves = matches!(
            k.code,
            KeyCode::Left | KeyCode::Right | KeyCode::Char('h' | 'l' | '[' | ']') | KeyCode::Home
        );
        if moves {
            self.hold();
        }
        match k.code {
            KeyCode::Char('?') => self.help = true,
            KeyCode::Char(' ') => self.toggle_play(),
            KeyCode::Char('a') => self.toggle_align(),
            KeyCode::Char('L') => {
                self.sides.iter_mut().for_each(|s| s.steps_panel = !s.steps_panel)
            }
            KeyCode::Left | KeyCode::Char('h') => self.back(),
            KeyCode::Right | KeyCode::Char('l') => {
                self.forward();
            }
            KeyCode::Char('[') => self.block_back(),
            KeyCode::Char(']') => self.block_forward(),
            KeyCode::Home => (self.k, self.block, self.step) = (0, self.first_block(), 0),
            KeyCode::End => self.mode = Mode::Live,
            _ => {}
        }
        if self.mode != Mode::Playing {
            self.last_tick = None;
        }
        self.sync();
    }

    /// Advances playback; true if the screen changed: a step on, or the end reached (both
    /// sides then follow their heads, and the title says LIVE).
    pub fn tick(&mut self, now: Instant) -> bool {
        let (Mode::Playing, Some(last)) = (self.mode, self.last_tick) else { return false };
        self.last_tick = Some(now);
        if self.runs().all(|r| r.head().is_none()) {
            // Nothing decoded yet: playing waits for the first step rather than catch up with
            // no head and turn to following.
            return false;
        }
        self.carry += now.saturating_duration_since(last).as_secs_f64() * self.speed;
        let mut changed = false;
        while self.carry >= 1.0 {
            self.carry -= 1.0;
            changed = true;
            if !self.forward() {
                (self.mode, self.last_tick) = (Mode::Live, None);
                break;
            }
        }
        self.sync();
        changed
    }

    pub fn next_tick(&self, frame: Duration) -> Option<Instant> {
        let last = self.last_tick.filter(|_| self.mode == Mode::Playing)?;
        Some(last + Duration::from_secs_f64(1.0 / self.speed).max(frame))
    }

    /// Every position where both sides, as shown, have committed a cell of the output, and
    /// the two differ: in the token, or only in the step of its block that decoded it.
    pub fn marks(&self) -> Vec<(usize, Mark)> {
        let [Some(a), Some(b)] = [self.sides[0].view(), self.sides[1].view()] else {
            return Vec::new();
        };
        let end = [
            a.run.shown_end(a.at),
            b.run.shown_end(b.at),
            a.run.output_end(a.at),
            b.run.output_end(b.at),
        ];
        (a.run.prompt_len()..end.into_iter().min().unwrap_or(0))
            .filter_map(|p| match (a.run.cell(p, a.at), b.run.cell(p, b.at)) {
                (CellState::Decoded(x), CellState::Decoded(y)) if x.token != y.token => {
                    Some((p, Mark::OtherToken))
                }
                (CellState::Decoded(x), CellState::Decoded(y)) if x.step != y.step => {
                    Some((p, Mark::OtherStep))
                }
                _ => None,
            })
            .collect()
    }

    /// Output cells each side, as shown, holds an edited token in (token editing: replaced
    /// after its commit), or `None` when neither side's run has edits.
    pub fn edited(&self) -> Option<[usize; 2]> {
        let views = [self.sides[0].view(), self.sides[1].view()];
        if !views.iter().flatten().any(|v| v.run.has_edits()) {
            return None;
        }
        Some(views.map(|v| {
            v.map_or(0, |v| {
                let end = v.run.shown_end(v.at).min(v.run.output_end(v.at));
                (v.run.prompt_len()..end)
                    .filter(|&p| matches!(v.run.cell(p, v.at), CellState::Decoded(d) if d.edited()))
                    .count()
            })
        }))
    }

    /// Positions where both sides, as shown, have committed different tokens.
    pub fn differing(&self) -> Vec<usize> {
        self.marks().into_iter().filter(|m| m.1 == Mark::OtherToken).map(|m| m.0).collect()
    }
}

/// How a cell differs between the two sides.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mark {
    /// The same token, decoded at another step of its block.
    OtherStep,
    /// Another token.
    OtherToken,
}

impl Mark {
    /// Drawn before the cell (or over its first column when cells abut).
    pub fn glyph(self) -> &'static str {
        match self {
            Mark::OtherStep => "≈",
            Mark::OtherToken => "≠",
        }
    }
}

/// The step index of `block`'s step `step` on one side (its last step there if it took
/// fewer; its head if it never got to that block).
fn step_in_block(run: &Run, block: usize, step: usize) -> usize {
    let r = run.block_steps(block);
    if r.is_empty() {
        let past = block < run.active_block(run.head());
        return if past { 0 } else { run.head().unwrap_or(0) };
    }
    r.start + step.min(r.len() - 1)
}

#[cfg(test)]
mod tests {
    //! What the keys do to the state; the fixed pair and `screen` serve `render`'s tests too.
    use super::*;
    use crate::tui::testing::snapshot_text;
    use ratatui::buffer::Buffer;
    use std::path::Path;

    /// The fixed pair: sequential (A) against low_confidence_dynamic at 0.5 (B), one prompt.
    pub(super) fn pair() -> CompareApp {
        let read = |name: &str| {
            let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/traces").join(name);
            crate::trace::file::read_file(&p).unwrap().events
        };
        CompareApp::replay(read("compare-a.jsonl"), read("compare-b.jsonl"))
    }

    pub(super) fn screen(app: &CompareApp, w: u16, h: u16) -> String {
        let mut buf = Buffer::empty(Rect::new(0, 0, w, h));
        render::render(app, buf.area, &mut buf);
        snapshot_text(&buf)
    }

    pub(super) fn press(app: &mut CompareApp, c: KeyCode) {
        app.on_key(KeyEvent::new(c, KeyModifiers::NONE));
    }

    pub(super) fn at(app: &CompareApp) -> [Option<usize>; 2] {
        [0, 1].map(|i| app.sides[i].view().and_then(|v| v.at))
    }

    pub(super) fn heads(app: &CompareApp) -> [usize; 2] {
        [0, 1].map(|i| app.sides[i].store.run().and_then(Run::head).unwrap())
    }

    #[test]
    fn lock_step_caps_each_side_at_its_own_head() {
        let mut app = pair();
        let [ha, hb] = heads(&app);
        assert!(ha != hb, "{ha} {hb}");
        press(&mut app, KeyCode::Home);
        for _ in 0..ha.max(hb) + 3 {
            press(&mut app, KeyCode::Right);
        }
        assert_eq!(at(&app), [Some(ha), Some(hb)]);
        press(&mut app, KeyCode::Left);
        assert_eq!(at(&app), [Some(ha.min(ha.max(hb) - 1)), Some(hb.min(ha.max(hb) - 1))]);
    }

    #[test]
    fn aligned_by_block_puts_both_sides_in_the_same_block() {
        let mut app = pair();
        press(&mut app, KeyCode::Home);
        press(&mut app, KeyCode::Char('a'));
        assert_eq!(app.align, Align::Block);
        for _ in 0..3 {
            press(&mut app, KeyCode::Char(']'));
            let blocks = [0, 1].map(|i| {
                let v = app.sides[i].view().unwrap();
                v.run.step(v.at.unwrap()).unwrap().block
            });
            assert_eq!(blocks[0], blocks[1], "{blocks:?}");
        }
        assert!(screen(&app, 120, 36).contains("aligned by block"));
        press(&mut app, KeyCode::Char('a'));
        assert_eq!(app.align, Align::Step);
    }

    #[test]
    fn differences_are_found_where_tokens_differ() {
        let app = pair();
        let d = app.differing();
        let [a, b] = [0, 1].map(|i| app.sides[i].store.run().unwrap());
        for &p in &d {
            assert_ne!(a.cell(p, a.head()), b.cell(p, b.head()));
        }
        let c = app.comparison().unwrap();
        if let Some(i) = c.first_divergence {
            assert_eq!(d.first(), Some(&(a.prompt_len() + i)));
        }
    }

    /// Live with a pace, both sides play from their first step at it (waiting while nothing
    /// is decoded), and follow the heads once they catch up; no pace: at the heads at once.
    #[test]
    fn a_paced_compare_plays_from_the_first_step_then_follows() {
        use crate::tui::cursor::Pace;
        let read = |name: &str| {
            let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/traces").join(name);
            crate::trace::file::read_file(&p).unwrap().events
        };
        let (a, b) = (read("compare-a.jsonl"), read("compare-b.jsonl"));
        let t0 = Instant::now();
        let ms = |n| t0 + Duration::from_millis(n);
        let mut app = CompareApp::paced(Pace::PerSecond(10.0), t0);
        assert_eq!(app.mode, Mode::Playing);
        assert!(!app.tick(ms(500)), "nothing decoded yet: it waits");
        assert_eq!(app.mode, Mode::Playing);
        for (side, events) in [a.clone(), b.clone()].into_iter().enumerate() {
            events.into_iter().for_each(|e| app.ingest(side, e));
        }
        assert!(app.tick(ms(600)), "a tenth of a second at 10 steps/s: one step");
        assert_eq!(at(&app), [Some(1), Some(1)]);
        assert_eq!(app.next_tick(Duration::ZERO), Some(ms(700)));
        app.tick(ms(60_000));
        assert_eq!(app.mode, Mode::Live, "caught up: it follows the heads");
        assert_eq!(at(&app), heads(&app).map(Some));
        let mut fast = CompareApp::paced(Pace::Unlimited, t0);
        assert_eq!(fast.mode, Mode::Live);
        a.into_iter().for_each(|e| fast.ingest(0, e));
        assert_eq!(fast.next_tick(Duration::ZERO), None);
    }

    /// Playing into the end turns to following the heads: that tick changes the title.
    #[test]
    fn the_tick_that_reaches_the_end_changes_the_screen() {
        let mut app = pair();
        press(&mut app, KeyCode::Home);
        for _ in 0..app.max_head() - 1 {
            press(&mut app, KeyCode::Right);
        }
        let t0 = Instant::now();
        app.on_input(TermEvent::Key(KeyEvent::new(KeyCode::Char(' '), KeyModifiers::NONE)), t0);
        assert!(app.tick(t0 + Duration::from_millis(50)), "the last step");
        assert_eq!(app.mode, Mode::Playing);
        assert!(app.tick(t0 + Duration::from_millis(100)), "the end reached");
        assert_eq!(app.mode, Mode::Live);
        assert!(!app.tick(t0 + Duration::from_millis(150)));
    }

    #[test]
    fn space_plays_to_the_end_and_keys_quit() {
        let mut app = pair();
        press(&mut app, KeyCode::Home);
        let t0 = Instant::now();
        app.on_input(TermEvent::Key(KeyEvent::new(KeyCode::Char(' '), KeyModifiers::NONE)), t0);
        assert_eq!(app.mode, Mode::Playing);
        assert!(app.tick(t0 + Duration::from_millis(120)));
        assert_eq!(at(&app)[0], Some(2), "20 steps/s");
        app.tick(t0 + Duration::from_secs(60));
        assert_eq!(app.mode, Mode::Live);
        press(&mut app, KeyCode::Char('?'));
        assert!(screen(&app, 120, 36).contains("aligned by block"), "help lists the keys");
        press(&mut app, KeyCode::Char('x'));
        assert!(!app.help);
        press(&mut app, KeyCode::Char('q'));
        assert!(app.quit);
    }

    /// As the live screen: below 80x22 only q quits; `?` or space acted unseen.
    #[test]
    fn keys_on_a_screen_too_small_do_nothing_but_quit() {
        let mut app = pair();
        let now = Instant::now();
        let key = |c| TermEvent::Key(KeyEvent::new(KeyCode::Char(c), KeyModifiers::NONE));
        app.on_input(TermEvent::Resize(79, 22), now);
        for c in ['?', ' ', 'a', 'L'] {
            app.on_input(key(c), now);
        }
        assert!(
            !app.help && app.mode == Mode::Live && app.align == Align::Step,
            "a key acted unseen"
        );
        app.on_input(TermEvent::Resize(80, 22), now);
        app.on_input(key('?'), now);
        assert!(app.help);
        app.on_input(TermEvent::Resize(60, 20), now);
        app.on_input(key('q'), now);
        assert!(app.quit);
    }
}
