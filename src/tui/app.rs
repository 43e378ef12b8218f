//! The TUI's state and what every key and mouse action does to it. Pure: no terminal, no
//! engine; actions meant for the engine come back as [`EngineCmd`]s for the caller to send.

use std::cell::RefCell;
use std::time::{Duration, Instant};

use crossterm::event::{
    Event as TermEvent, KeyCode, KeyEvent, KeyEventKind, KeyModifiers, MouseButton, MouseEvent,
    MouseEventKind,
};
use ratatui::layout::{Position, Rect};

use super::cursor::{Cursor, Mode, Pace};
use super::layout::{self, Areas};
use super::theme::{Theme, DARK};
use super::{goto, grid, text, timeline};
use crate::engine::settings::{DecodeSettings, Strategy};
use crate::trace::events::Event;
use crate::trace::store::{Run, Store};

/// Where the events come from.
#[derive(Clone, Debug, PartialEq)]
pub enum Source {
    /// A decode running in this process; the engine can be steered.
    Live { engine_paused: bool, restarting: bool },
    /// A recorded trace; `stopped` says where reading it stopped early, if it did.
    Replay { path: String, stopped: Option<String> },
}

/// What the app asks of the engine.
#[derive(Clone, Debug, PartialEq)]
pub enum EngineCmd {
    Pause,
    Resume,
    /// Use these settings from the next block on.
    Settings(DecodeSettings),
    /// Cancel the decode and start again with these settings.
    Restart(DecodeSettings),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Level {
    Info,
    Warn,
}

/// A one-line note in the footer, until the next key.
#[derive(Clone, Debug, PartialEq)]
pub struct Message {
    pub text: String,
    pub level: Level,
}

pub struct App {
    pub store: Store,
    pub cursor: Cursor,
    pub source: Source,
    /// The cell the user picked for the inspector; `None` follows the newest commit.
    pub selected: Option<usize>,
    /// First grid line shown; `None` keeps the active block in view.
    pub grid_top: Option<usize>,
    /// First text line shown; `None` follows the decode.
    pub text_top: Option<usize>,
    pub help: bool,
    /// Show each masked cell's current candidate instead of the mask glyph.
    pub ghosts: bool,
    /// The Steps panel in place of the text (`L`).
    pub steps_panel: bool,
    /// Settings dialled in with `m`/`t`/`s` and sent to the engine, not yet seen in effect.
    pub desired: Option<DecodeSettings>,
    pub message: Option<Message>,
    pub quit: bool,
    /// The terminal's size at the last draw or resize (mouse hit tests need the layout).
    pub size: Rect,
    pub theme: &'static Theme,
    /// Drawn for a recording (`record`, `replay --cast`): a cast cannot take keys, so it shows
    /// no key hints, and its cursor is placed step by step, so it shows no paused state.
    pub cast: bool,
    /// A live decode drawn from its events by `unmask record`: not a replay of a trace.
    pub recorded_live: bool,
    /// What has been typed at the `g` prompt, while it is open.
    pub goto: Option<String>,
    /// The text view's line starts of settled blocks (see `text`); a memo, not state.
    pub text_cache: RefCell<text::TextCache>,
    generation: usize,
    last_tick: Option<Instant>,
}

/// Everything a panel draws from: the run, the step shown and the focused cell.
pub struct View<'a> {
    pub app: &'a App,
    pub run: &'a Run,
    pub at: Option<usize>,
    /// Selected cell, else the first cell committed by the step shown.
    pub focus: Option<usize>,
    pub theme: &'a Theme,
}

const THRESHOLD_STEP: f32 = 0.05;

/// How the status line's note of a restart asked for begins.
const RESTARTING: &str = "restarting: ";

impl App {
    fn new(store: Store, cursor: Cursor, source: Source) -> Self {
        let generation = store.generation();
        App {
            store,
            cursor,
            source,
            selected: None,
            grid_top: None,
            text_top: None,
            help: false,
            ghosts: false,
            steps_panel: false,
            desired: None,
            message: None,
            quit: false,
            size: Rect::new(0, 0, 120, 40),
            theme: &DARK,
            cast: false,
            recorded_live: false,
            goto: None,
            text_cache: RefCell::default(),
            generation,
            last_tick: None,
        }
    }

    /// A live decode: follows the head as events arrive (see [`App::with_pace`]).
    pub fn live() -> Self {
        App::new(
            Store::new(),
            Cursor::paced(Pace::Unlimited),
            Source::Live { engine_paused: false, restarting: false },
        )
    }

    /// The view walks from the first step at `pace` (and again after a restart) until it
    /// catches up with the head; the engine never waits for it.
    pub fn with_pace(mut self, pace: Pace) -> Self {
        self.cursor = Cursor::paced(pace);
        self
    }

    /// A recorded trace, played from its first step.
    pub fn replay(events: Vec<Event>, path: String, stopped: Option<String>) -> Self {
        let level = Level::Warn;
        let mut app = App::new(
            Store::from_events(events),
            Cursor::playing(),
            Source::Replay { path, stopped: stopped.clone() },
        );
        app.message = stopped.map(|s| Message { text: format!("trace stopped early: {s}"), level });
        app
    }

    pub fn is_live(&self) -> bool {
        matches!(self.source, Source::Live { .. })
    }

    /// The error the latest decode stopped on, if it stopped on one.
    pub fn decode_error(&self) -> Option<&str> {
        let f = self.store.run()?.finish.as_ref()?;
        f.error.as_deref().filter(|_| f.reason == crate::trace::events::FinishReason::Error)
    }

    pub fn engine_paused(&self) -> bool {
        matches!(self.source, Source::Live { engine_paused: true, .. })
    }

    pub fn view(&self) -> Option<View<'_>> {
        let run = self.store.run()?;
        let at = self.cursor.at(run.head());
        let focus = self.selected.or_else(|| at.and_then(|k| newest_output_commit(run, k)));
        Some(View { app: self, run, at, focus, theme: self.theme })
    }

    pub fn areas(&self) -> Option<Areas> {
        layout::areas(self.size)
    }

    /// Takes one event from the engine; returns what the engine must be told because of it.
    pub fn ingest(&mut self, ev: Event) -> Vec<EngineCmd> {
        self.store.push(ev);
        if self.store.generation() == self.generation {
            return Vec::new();
        }
        self.generation = self.store.generation();
        self.on_new_run()
    }

    /// A restart (or the first header): the old positions mean nothing any more.
    fn on_new_run(&mut self) -> Vec<EngineCmd> {
        self.cursor = Cursor::paced(self.cursor.pace);
        self.selected = None;
        self.grid_top = None;
        self.text_top = None;
        self.desired = self
            .desired
            .take()
            .filter(|d| self.store.run().is_some_and(|r| !same_knobs(d, r.latest_settings())));
        let Source::Live { restarting, engine_paused } = &mut self.source else {
            return Vec::new();
        };
        *restarting = false;
        // The note that a restart is coming is done with once it has come.
        if self.message.as_ref().is_some_and(|m| m.text.starts_with(RESTARTING)) {
            self.message = None;
        }
        // A new decode starts unpaused and drops controls sent before it began: a pause the
        // user asked for in the meantime must be said again.
        if *engine_paused {
            vec![EngineCmd::Pause]
        } else {
            Vec::new()
        }
    }

    /// The engine's channel closed. After a finish that is expected; before one the engine
    /// thread died, and the screen should say so rather than look stalled.
    pub fn engine_gone(&mut self) {
        let unfinished = self.store.run().is_none_or(|r| r.finish.is_none());
        if self.is_live() && unfinished {
            self.warn(
                "the engine stopped without finishing the decode (see the message on exit)".into(),
            );
        }
    }

    /// Settings dialled in that the engine has not applied yet.
    pub fn pending(&self) -> Option<&DecodeSettings> {
        let run = self.store.run()?;
        self.desired.as_ref().filter(|d| !same_knobs(d, run.latest_settings()))
    }

    pub fn on_input(&mut self, ev: TermEvent, now: Instant) -> Vec<EngineCmd> {
        let cmds = match ev {
            TermEvent::Key(k) if k.kind != KeyEventKind::Release => self.on_key(k),
            TermEvent::Mouse(m) => {
                self.on_mouse(m);
                Vec::new()
            }
            TermEvent::Resize(w, h) => {
                self.size = Rect::new(0, 0, w, h);
                Vec::new()
            }
            _ => Vec::new(),
        };
        self.sync_clock(now);
        cmds
    }

    /// Playback measures time from when it (re)started, not from whenever it last ran.
    pub fn sync_clock(&mut self, now: Instant) {
        match (self.cursor.mode, self.last_tick) {
            (Mode::Playing, None) => self.last_tick = Some(now),
            (Mode::Playing, Some(_)) => {}
            _ => self.last_tick = None,
        }
    }

    /// Advances playback; true if the view changed.
    pub fn tick(&mut self, now: Instant) -> bool {
        let Some(last) = self.last_tick else {
            self.sync_clock(now);
            return false;
        };
        let head = self.store.run().and_then(Run::head);
        let changed = self.cursor.tick(now.saturating_duration_since(last), head);
        self.last_tick = Some(now);
        self.sync_clock(now);
        changed
    }

    /// When playback next needs a tick, if it is playing.
    pub fn next_tick(&self, now: Instant, at_least: Duration) -> Option<Instant> {
        let wait = self.cursor.next_tick()?.max(at_least);
        Some(self.last_tick.unwrap_or(now) + wait)
    }

    pub fn on_key(&mut self, k: KeyEvent) -> Vec<EngineCmd> {
        let ctrl = k.modifiers.contains(KeyModifiers::CONTROL);
        // Below the smallest screen only "too small (q quits)" is drawn: any other key would
        // act unseen (the help or a `g` prompt found open, the view paused, a restart) once
        // the window is large again.
        if self.areas().is_none() {
            self.quit |= matches!(k.code, KeyCode::Char('q'))
                || (ctrl && matches!(k.code, KeyCode::Char('c')));
            return Vec::new();
        }
        self.message = None;
        if self.goto.is_some() && !ctrl {
            self.goto_key(k.code);
            return Vec::new();
        }
        if ctrl && matches!(k.code, KeyCode::Char('c')) {
            self.quit = true;
            return Vec::new();
        }
        if self.help {
            // Any key closes the help, q too (as the help says); it covers the screen, so
            // acting on the key would be unseen.
            self.help = false;
            return Vec::new();
        }
        if matches!(k.code, KeyCode::Char('q')) {
            self.quit = true;
            return Vec::new();
        }
        // Keys that need no recorded run: they work from the first frame on.
        match k.code {
            KeyCode::Char('?') => {
                self.help = true;
                return Vec::new();
            }
            KeyCode::Char('p') => return self.toggle_engine(),
            KeyCode::Char('L') => {
                self.steps_panel = !self.steps_panel;
                return Vec::new();
            }
            _ => {}
        }
        let Some(run) = self.store.run() else { return Vec::new() };
        match k.code {
            KeyCode::Char(' ') => self.cursor.toggle_pause(run),
            KeyCode::Left | KeyCode::Char('h') => self.cursor.step_back(run),
            KeyCode::Right | KeyCode::Char('l') => self.cursor.step_forward(run),
            KeyCode::Char('[') => self.cursor.block_back(run),
            KeyCode::Char(']') => self.cursor.block_forward(run),
            KeyCode::Home => self.cursor.home(run),
            KeyCode::End => self.go_live(),
            KeyCode::Char('r') => self.cursor.replay(),
            KeyCode::Char('g') => self.goto = Some(String::new()),
            KeyCode::Char('+') | KeyCode::Char('=') => self.speed(true),
            KeyCode::Char('-') | KeyCode::Char('_') => self.speed(false),
            KeyCode::Char('c') => self.ghosts = !self.ghosts,
            KeyCode::Up | KeyCode::Char('k') => self.select_by(-(run.block_length() as isize)),
            KeyCode::Down | KeyCode::Char('j') => self.select_by(run.block_length() as isize),
            KeyCode::Tab => self.select_by(1),
            KeyCode::BackTab => self.select_by(-1),
            KeyCode::Esc => {
                self.selected = None;
                self.grid_top = None;
            }
            KeyCode::PageUp => self.scroll_text(-1),
            KeyCode::PageDown => self.scroll_text(1),
            KeyCode::Char('m') => return self.adjust(|s| s.strategy = s.strategy.next()),
            KeyCode::Char('t') => return self.threshold(-THRESHOLD_STEP),
            KeyCode::Char('T') => return self.threshold(THRESHOLD_STEP),
            KeyCode::Char('s') => return self.steps_by(-1),
            KeyCode::Char('S') => return self.steps_by(1),
            KeyCode::Char('R') => return self.restart(),
            _ => {}
        }
        Vec::new()
    }

    /// A key while the `g` prompt is open: it takes what is typed (Enter says what is wrong
    /// with it, rather than letters vanishing as they are typed); Enter jumps, Esc cancels.
    fn goto_key(&mut self, code: KeyCode) {
        let Some(typed) = self.goto.as_mut() else { return };
        match code {
            // Every key is taken (the footer shows the end of a long entry), and Enter answers
            // for all of it.
            KeyCode::Char(c) if !c.is_control() => typed.push(c),
            KeyCode::Backspace => {
                typed.pop();
            }
            KeyCode::Esc => self.goto = None,
            KeyCode::Enter => {
                let typed = self.goto.take().unwrap_or_default();
                let Some(run) = self.store.run() else { return };
                match goto::go(run, &typed) {
                    Ok(k) => self.seek(k),
                    Err(e) => self.warn(format!("g: {e}")),
                }
            }
            _ => {}
        }
    }

    /// Holds the view at step `k`, with the panels following it.
    fn seek(&mut self, k: usize) {
        let Some(run) = self.store.run() else { return };
        self.cursor.goto(run, k);
        self.grid_top = None;
    }

    /// `End`: back to the live head, with every panel following again.
    fn go_live(&mut self) {
        self.cursor.end();
        self.text_top = None;
        self.grid_top = None;
    }

    fn speed(&mut self, up: bool) {
        if up {
            self.cursor.faster()
        } else {
            self.cursor.slower()
        }
        let pace = match self.cursor.pace {
            Pace::Unlimited => "unlimited (the view jumps to the head)".to_string(),
            p => format!("{p}"),
        };
        self.info(format!("pace {pace}"));
    }

    fn info(&mut self, text: String) {
        self.message = Some(Message { text, level: Level::Info });
    }

    fn warn(&mut self, text: String) {
        self.message = Some(Message { text, level: Level::Warn });
    }

    /// A warning from away from the screen ([`crate::notice`]), printed again on exit.
    pub fn notice(&mut self, text: &str) {
        self.warn(format!("{text} (printed again on exit)"));
    }

    fn no_engine(&mut self) -> Vec<EngineCmd> {
        self.warn("replay: there is no engine to steer (settings keys work in a live run)".into());
        Vec::new()
    }

    fn toggle_engine(&mut self) -> Vec<EngineCmd> {
        if !self.is_live() {
            return self.no_engine();
        }
        let finished = self.store.run().is_some_and(|r| r.finish.is_some());
        let Source::Live { engine_paused, .. } = &mut self.source else { return Vec::new() };
        if finished {
            self.warn("the decode has finished: nothing to pause (R restarts)".into());
            return Vec::new();
        }
        *engine_paused = !*engine_paused;
        let cmd = if *engine_paused { EngineCmd::Pause } else { EngineCmd::Resume };
        let note = if *engine_paused { "engine paused (p resumes)" } else { "engine resumed" };
        self.info(note.into());
        vec![cmd]
    }

    /// Changes one setting of the decode, from the next block on.
    fn adjust(&mut self, change: impl FnOnce(&mut DecodeSettings)) -> Vec<EngineCmd> {
        if !self.is_live() {
            return self.no_engine();
        }
        let Some(run) = self.store.run() else { return Vec::new() };
        let mut s = self.desired.clone().unwrap_or_else(|| run.latest_settings().clone());
        change(&mut s);
        if s.validate().is_err() {
            return Vec::new();
        }
        let finished = run.finish.is_some();
        let summary = knobs(&s);
        self.desired = Some(s.clone());
        if finished {
            self.info(format!("{summary}: the decode has finished, R restarts with it"));
            return Vec::new();
        }
        self.info(format!("{summary}: applies from the next block (R restarts now)"));
        vec![EngineCmd::Settings(s)]
    }

    /// `s`/`S`: one step fewer or more a block, within 1 and one step a position; at a bound
    /// the key says why nothing changed.
    fn steps_by(&mut self, by: isize) -> Vec<EngineCmd> {
        let current = self
            .desired
            .as_ref()
            .or(self.store.run().map(Run::latest_settings))
            .map(|s| (s.steps, s.block_length));
        match current.filter(|_| self.is_live()) {
            Some((1, _)) if by < 0 => self.warn("1 step a block is the fewest".into()),
            Some((n, b)) if by > 0 && n >= b => self.warn(format!(
                "{} a block is the most for blocks of {b}: each step commits at least one position",
                crate::format::count(n, "step")
            )),
            _ => {
                return self.adjust(|s| {
                    s.steps = s.steps.saturating_add_signed(by).clamp(1, s.block_length)
                })
            }
        }
        Vec::new()
    }

    /// `t`/`T`: only the dynamic, joint and entropy-bounded strategies have a threshold to move.
    fn threshold(&mut self, by: f32) -> Vec<EngineCmd> {
        let strategy = self
            .desired
            .as_ref()
            .or(self.store.run().map(Run::latest_settings))
            .map(|s| s.strategy);
        if let Some(s @ (Strategy::Sequential | Strategy::LowConfidenceStatic)) =
            strategy.filter(|_| self.is_live())
        {
            self.warn(format!("{} has no threshold: t/T move those of low_confidence_dynamic, joint_threshold and entropy_bounded (m changes the strategy)", s.name()));
            return Vec::new();
        }
        self.adjust(|s| nudge_threshold(s, by))
    }

    fn restart(&mut self) -> Vec<EngineCmd> {
        if !self.is_live() {
            return self.no_engine();
        }
        let Some(run) = self.store.run() else { return Vec::new() };
        let s = self.desired.clone().unwrap_or_else(|| run.latest_settings().clone());
        let Source::Live { restarting, engine_paused } = &mut self.source else {
            return Vec::new();
        };
        *restarting = true;
        // The new decode runs unpaused.
        *engine_paused = false;
        self.info(format!("{RESTARTING}{}", knobs(&s)));
        vec![EngineCmd::Restart(s)]
    }

    /// Moves the selection by `delta` positions within what the grid shows, and scrolls the
    /// grid just enough to keep it in view.
    fn select_by(&mut self, delta: isize) {
        let Some(v) = self.view() else { return };
        let end = v.run.shown_end(v.at);
        let from = v.focus.unwrap_or(v.run.prompt_len().min(end.saturating_sub(1)));
        let to = from as isize + delta;
        if to < 0 || to as usize >= end {
            return;
        }
        self.selected = Some(to as usize);
        self.reveal(to as usize);
    }

    fn reveal(&mut self, pos: usize) {
        let (Some(v), Some(a)) = (self.view(), self.areas()) else { return };
        self.grid_top = Some(grid::reveal(&v, a.grid, pos));
    }

    /// Scrolls the text view by pages (`dir` -1 up, 1 down); scrolling past the end follows.
    fn scroll_text(&mut self, dir: isize) {
        let (Some(v), Some(a)) = (self.view(), self.areas()) else { return };
        let (top, total, height) = text::scroll_state(&v, a.text);
        let page = height.saturating_sub(1).max(1) as isize;
        // stops at the first line going up (a negative line cast to usize wrapped: a panic)
        let next = (top as isize + dir * page).max(0) as usize;
        self.text_top = if next + height >= total && dir > 0 { None } else { Some(next) };
    }

    fn on_mouse(&mut self, m: MouseEvent) {
        let Some(a) = self.areas() else { return };
        let at = Position::new(m.column, m.row);
        match m.kind {
            MouseEventKind::Down(MouseButton::Left) => {
                let hit = self.view().and_then(|v| {
                    if a.grid.contains(at) {
                        grid::hit(&v, a.grid, at)
                    } else if a.text.contains(at) && !self.steps_panel {
                        text::hit(&v, a.text, at)
                    } else {
                        None
                    }
                });
                if let Some(pos) = hit {
                    self.selected = Some(pos);
                }
                let step = self.view().and_then(|v| timeline::hit(&v, a.timeline, at));
                if let Some(k) = step {
                    self.seek(k);
                }
            }
            MouseEventKind::ScrollUp | MouseEventKind::ScrollDown => {
                let down = m.kind == MouseEventKind::ScrollDown;
                if a.text.contains(at) && !self.steps_panel {
                    self.scroll_text_lines(if down { 3 } else { -3 });
                } else if a.grid.contains(at) {
                    self.scroll_grid(if down { 3 } else { -3 });
                }
            }
            _ => {}
        }
    }

    fn scroll_text_lines(&mut self, n: isize) {
        let (Some(v), Some(a)) = (self.view(), self.areas()) else { return };
        let (top, total, height) = text::scroll_state(&v, a.text);
        let next = (top as isize + n).max(0) as usize;
        self.text_top = if next + height >= total { None } else { Some(next) };
    }

    fn scroll_grid(&mut self, n: isize) {
        let (Some(v), Some(a)) = (self.view(), self.areas()) else { return };
        let (top, total, height) = grid::scroll_state(&v, a.grid);
        let next = (top as isize + n).max(0) as usize;
        self.grid_top = if next + height >= total { None } else { Some(next) };
    }
}

/// Whether two settings agree on everything a key can change.
fn same_knobs(a: &DecodeSettings, b: &DecodeSettings) -> bool {
    DecodeSettings { block_length: b.block_length, max_new_tokens: b.max_new_tokens, ..a.clone() }
        == *b
}

/// The threshold the strategy uses: entropy_bounded has its own.
fn nudge_threshold(s: &mut DecodeSettings, by: f32) {
    let round = |x: f32| (x * 100.0).round() / 100.0;
    if s.strategy == Strategy::EntropyBounded {
        s.eb_threshold = round((s.eb_threshold + by).max(0.0));
    } else {
        s.threshold = round((s.threshold + by).clamp(0.0, 1.0));
    }
}

/// The knobs in one phrase, for messages.
fn knobs(s: &DecodeSettings) -> String {
    let thr = s.threshold_knob().map_or(String::new(), |(name, value)| {
        format!(" {name} {}", crate::format::fixed(value.into(), 2))
    });
    format!("{}{thr}, {}", s.strategy.name(), crate::format::count(s.steps, "step"))
}

/// The inspector's default cell: the first cell committed by the newest step, as of step `k`,
/// that committed part of the output. Cells past the EOS or `max_new_tokens` are decoded but
/// dropped, and a newcomer's first look should not land on one.
fn newest_output_commit(run: &Run, k: usize) -> Option<usize> {
    let end = run.output_end(Some(k));
    (0..=k).rev().find_map(|j| run.step(j)?.first_commit.filter(|&p| p < end))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::synth::{self, Synth};

    fn key(c: char) -> TermEvent {
        TermEvent::Key(KeyEvent::new(KeyCode::Char(c), KeyModifiers::NONE))
    }

    fn code(c: KeyCode) -> TermEvent {
        TermEvent::Key(KeyEvent::new(c, KeyModifiers::NONE))
    }

    fn live_app() -> App {
        let mut app = App::live();
        let mut ev = synth::trace(&Synth::small());
        ev.pop(); // no finish: the decode is still running
        for e in ev {
            app.ingest(e);
        }
        app
    }

    fn press(app: &mut App, ev: TermEvent) -> Vec<EngineCmd> {
        app.on_input(ev, Instant::now())
    }

    /// PgUp past the first line stops there (it wrapped a negative line: a panic in debug
    /// builds); PgDn past the end follows again.
    #[test]
    fn text_pages_stop_at_the_top_and_follow_past_the_end() {
        let long = Synth { new_tokens: 400, ..Synth::small() };
        let mut app = App::replay(synth::trace(&long), "long.jsonl".into(), None);
        press(&mut app, TermEvent::Resize(80, 24));
        press(&mut app, code(KeyCode::End));
        for _ in 0..40 {
            press(&mut app, code(KeyCode::PageUp));
        }
        assert_eq!(app.text_top, Some(0));
        for _ in 0..40 {
            press(&mut app, code(KeyCode::PageDown));
        }
        assert_eq!(app.text_top, None, "following the end again");
    }

    #[test]
    fn the_inspector_follows_the_newest_commit_that_is_output() {
        let mut app = App::replay(synth::trace(&Synth::small()), "small.jsonl".into(), None);
        app.on_input(code(KeyCode::End), Instant::now());
        let v = app.view().unwrap();
        let (run, last) = (v.run, v.at.unwrap());
        let end = run.output_end(Some(last));
        // The synthetic decode's last step commits only past the end of the output.
        let dropped = run.step(last).unwrap().first_commit.unwrap();
        assert!(dropped >= end, "the fixture must end on a dropped commit ({dropped} < {end})");
        let focus = v.focus.unwrap();
        assert!(focus < end, "focus {focus} is dropped (output ends at {end})");
        let newest =
            (0..=last).rev().find_map(|j| run.step(j).unwrap().first_commit.filter(|&p| p < end));
        assert_eq!(Some(focus), newest);
    }

    #[test]
    fn q_and_ctrl_c_quit() {
        let mut app = live_app();
        press(&mut app, key('q'));
        assert!(app.quit);
        let mut app = live_app();
        press(&mut app, TermEvent::Key(KeyEvent::new(KeyCode::Char('c'), KeyModifiers::CONTROL)));
        assert!(app.quit);
    }

    #[test]
    fn space_pauses_the_view_not_the_engine() {
        let mut app = live_app();
        assert!(press(&mut app, key(' ')).is_empty());
        assert_eq!(app.cursor.mode, Mode::Paused);
        assert!(!app.engine_paused());
        assert_eq!(press(&mut app, key('p')), vec![EngineCmd::Pause]);
        assert!(app.engine_paused());
        assert_eq!(press(&mut app, key('p')), vec![EngineCmd::Resume]);
    }

    #[test]
    fn strategy_change_goes_to_the_engine_and_is_pending_until_applied() {
        let mut app = live_app();
        let cmds = press(&mut app, key('m'));
        let [EngineCmd::Settings(s)] = cmds.as_slice() else { panic!("{cmds:?}") };
        assert_eq!(s.strategy, Strategy::EntropyBounded);
        assert_eq!(app.pending().unwrap().strategy, Strategy::EntropyBounded);
        assert!(app.message.as_ref().unwrap().text.contains("next block"));
        // Keys accumulate on the pending settings; steps stay within 1 and the block length,
        // and a key at a bound says so.
        assert_eq!(press(&mut app, key('S')), vec![], "steps are capped at the block length");
        assert_eq!(
            app.message.as_ref().unwrap().text,
            "4 steps a block is the most for blocks of 4: each step commits at least one position"
        );
        let cmds = press(&mut app, key('s'));
        let [EngineCmd::Settings(s)] = cmds.as_slice() else { panic!() };
        assert_eq!((s.strategy, s.steps), (Strategy::EntropyBounded, 3));
        for _ in 0..2 {
            press(&mut app, key('s'));
        }
        assert_eq!(app.pending().unwrap().steps, 1);
        assert_eq!(press(&mut app, key('s')), vec![]);
        assert_eq!(app.message.as_ref().unwrap().text, "1 step a block is the fewest");
    }

    fn sent(cmds: Vec<EngineCmd>) -> DecodeSettings {
        match cmds.as_slice() {
            [EngineCmd::Settings(s)] => s.clone(),
            other => panic!("expected one settings command, got {other:?}"),
        }
    }

    #[test]
    fn threshold_keys_move_the_strategy_s_threshold() {
        let mut app = live_app();
        let s = sent(press(&mut app, key('t')));
        assert_eq!(s.threshold, 0.80);
        press(&mut app, key('m')); // entropy_bounded: T moves eb_threshold instead
        let s = sent(press(&mut app, key('T')));
        assert_eq!((s.threshold, s.eb_threshold), (0.80, 0.40));
    }

    #[test]
    fn threshold_keys_under_a_strategy_without_one_say_so() {
        let mut app = live_app();
        press(&mut app, key('m'));
        press(&mut app, key('m'));
        press(&mut app, key('m')); // entropy_bounded, joint_threshold, then sequential
        assert_eq!(app.pending().unwrap().strategy, Strategy::Sequential);
        for c in ['t', 'T'] {
            assert!(press(&mut app, key(c)).is_empty());
            let m = app.message.clone().unwrap();
            assert_eq!(m.level, Level::Warn);
            assert_eq!(m.text, "sequential has no threshold: t/T move those of low_confidence_dynamic, joint_threshold and entropy_bounded (m changes the strategy)");
        }
        assert_eq!(app.pending().unwrap().threshold, 0.85, "unchanged");
    }

    #[test]
    fn one_step_is_singular() {
        let mut app = live_app();
        for _ in 0..3 {
            press(&mut app, key('s'));
        }
        assert_eq!(app.message.unwrap().text, "low_confidence_dynamic threshold 0.85, 1 step: applies from the next block (R restarts now)");
    }

    #[test]
    fn settings_after_the_finish_wait_for_a_restart() {
        let mut app = App::live();
        for e in synth::trace(&Synth::small()) {
            app.ingest(e);
        }
        assert!(press(&mut app, key('m')).is_empty());
        assert!(app.message.as_ref().unwrap().text.contains("R restarts"));
        let cmds = press(&mut app, key('R'));
        assert!(
            matches!(cmds.as_slice(), [EngineCmd::Restart(s)] if s.strategy == Strategy::EntropyBounded)
        );
    }

    #[test]
    fn restart_sends_the_dialled_settings_and_a_new_header_resets_the_view() {
        let mut app = live_app();
        press(&mut app, key('m'));
        press(&mut app, code(KeyCode::Left));
        let cmds = press(&mut app, key('R'));
        let [EngineCmd::Restart(s)] = cmds.as_slice() else { panic!() };
        assert_eq!(s.strategy, Strategy::EntropyBounded);
        assert!(matches!(app.source, Source::Live { restarting: true, .. }));
        assert!(app.message.as_ref().is_some_and(|m| m.text.starts_with("restarting: ")));
        let mut cfg = Synth::small();
        cfg.seed = 99;
        app.ingest(synth::trace(&cfg).remove(0));
        assert_eq!(app.cursor.mode, Mode::Live);
        assert!(matches!(app.source, Source::Live { restarting: false, .. }));
        assert_eq!(app.message, None, "the restart's note goes once the new decode has begun");
        assert_eq!(app.store.run().unwrap().head(), None);
    }

    #[test]
    fn replay_refuses_engine_keys() {
        let mut app = App::replay(synth::trace(&Synth::small()), "t.jsonl".into(), None);
        for c in ['p', 'm', 't', 'S', 'R'] {
            assert!(press(&mut app, key(c)).is_empty());
            assert_eq!(app.message.as_ref().unwrap().level, Level::Warn);
        }
    }

    #[test]
    fn replay_of_a_truncated_trace_says_where_it_stopped() {
        let app = App::replay(
            synth::trace(&Synth::small()),
            "t.jsonl".into(),
            Some("t.jsonl:9: invalid event".into()),
        );
        assert!(app.message.as_ref().unwrap().text.contains("t.jsonl:9"));
    }

    #[test]
    fn selection_moves_by_cell_and_by_block_within_what_is_shown() {
        let mut app = live_app();
        press(&mut app, code(KeyCode::Home)); // first step: blocks 0 and 1 show (0..8)
        app.selected = Some(5);
        press(&mut app, code(KeyCode::Tab));
        assert_eq!(app.selected, Some(6));
        press(&mut app, code(KeyCode::BackTab));
        press(&mut app, code(KeyCode::BackTab));
        assert_eq!(app.selected, Some(4));
        press(&mut app, key('j'));
        assert_eq!(app.selected, Some(4), "nothing below the active block");
        press(&mut app, key('k'));
        assert_eq!(app.selected, Some(0));
        press(&mut app, key('k'));
        assert_eq!(app.selected, Some(0));
        press(&mut app, code(KeyCode::Esc));
        assert_eq!(app.selected, None);
    }

    #[test]
    fn the_engine_can_be_paused_before_its_first_event() {
        let mut app = App::live();
        assert_eq!(press(&mut app, key('p')), vec![EngineCmd::Pause]);
        assert!(app.engine_paused());
        // The engine may have dropped that pause when its decode began: the header re-asks.
        assert_eq!(app.ingest(synth::trace(&Synth::small()).remove(0)), vec![EngineCmd::Pause]);
        assert!(app.engine_paused());
        assert!(app.ingest(synth::trace(&Synth::small()).remove(1)).is_empty());
    }

    #[test]
    fn a_restart_runs_unpaused() {
        let mut app = live_app();
        press(&mut app, key('p'));
        press(&mut app, key('R'));
        assert!(!app.engine_paused());
        assert!(app.ingest(synth::trace(&Synth::small()).remove(0)).is_empty());
    }

    #[test]
    fn help_closes_on_any_key_without_acting() {
        let mut app = live_app();
        press(&mut app, key('?'));
        assert!(app.help);
        press(&mut app, key(' '));
        assert!(!app.help);
        assert_eq!(app.cursor.mode, Mode::Live);
        // q too closes it and no more (it quit the TUI)
        press(&mut app, key('?'));
        press(&mut app, key('q'));
        assert!(!app.help && !app.quit);
        press(&mut app, key('q'));
        assert!(app.quit);
    }

    /// On the "too small" screen a key other than q does nothing: it acted unseen, and the
    /// help or a `g` prompt was found open (or the view paused) once the window grew.
    #[test]
    fn keys_on_a_screen_too_small_do_nothing_but_quit() {
        let mut app = live_app();
        press(&mut app, TermEvent::Resize(40, 12));
        for c in ['?', 'g', ' ', 'L', 'c', 'm', 'R'] {
            assert!(press(&mut app, key(c)).is_empty(), "{c}");
        }
        assert!(
            !app.help && app.goto.is_none() && !app.steps_panel && !app.ghosts,
            "a key acted unseen"
        );
        assert_eq!(app.cursor.mode, Mode::Live);
        press(&mut app, TermEvent::Resize(100, 30));
        press(&mut app, key('?'));
        assert!(app.help, "keys act again once the screen is large enough");
        press(&mut app, TermEvent::Resize(40, 12));
        press(&mut app, key('q'));
        assert!(app.quit);
    }

    #[test]
    fn resize_updates_the_layout_size() {
        let mut app = live_app();
        press(&mut app, TermEvent::Resize(70, 22));
        assert_eq!(app.size, Rect::new(0, 0, 70, 22));
    }

    #[test]
    fn playback_advances_with_time() {
        let mut app = App::replay(synth::trace(&Synth::small()), "t".into(), None);
        let t0 = Instant::now();
        app.sync_clock(t0);
        assert_eq!(app.view().unwrap().at, Some(0));
        assert!(app.tick(t0 + Duration::from_millis(160)));
        assert_eq!(app.view().unwrap().at, Some(1), "10 steps/s");
        assert!(app.next_tick(t0, Duration::from_millis(16)).is_some());
        press(&mut app, code(KeyCode::End));
        assert_eq!(app.next_tick(t0, Duration::ZERO), None);
    }

    fn typed(app: &mut App, s: &str) {
        for c in s.chars() {
            press(app, key(c));
        }
    }

    #[test]
    fn g_jumps_to_a_typed_step_or_block() {
        let mut app = App::replay(synth::trace(&Synth::small()), "t".into(), None);
        typed(&mut app, "g12q");
        assert!(!app.quit, "the prompt takes the keys");
        assert_eq!(app.goto.as_deref(), Some("12q"), "shown as typed");
        press(&mut app, code(KeyCode::Backspace));
        press(&mut app, code(KeyCode::Enter));
        assert_eq!(
            (app.goto.clone(), app.view().unwrap().at, app.cursor.mode),
            (None, Some(11), Mode::Paused)
        );
        let b = app.store.run().unwrap().blocks()[2].clone();
        typed(&mut app, &format!("gb{}", b.block));
        press(&mut app, code(KeyCode::Enter));
        assert_eq!(app.view().unwrap().at, Some(b.first_step));
        // A wrong entry says so and leaves the view where it was.
        typed(&mut app, "g99");
        press(&mut app, code(KeyCode::Enter));
        let m = app.message.clone().unwrap();
        assert_eq!(
            (m.text.as_str(), m.level),
            ("g: no step 99: the decode has 26 steps", Level::Warn)
        );
        assert_eq!(app.view().unwrap().at, Some(b.first_step));
        // Esc cancels; Backspace edits.
        typed(&mut app, "g34");
        press(&mut app, code(KeyCode::Backspace));
        assert_eq!(app.goto.as_deref(), Some("3"));
        press(&mut app, code(KeyCode::Esc));
        assert_eq!((app.goto.clone(), app.message.clone()), (None, None));
        assert_eq!(app.view().unwrap().at, Some(b.first_step));
        typed(&mut app, "g");
        press(&mut app, code(KeyCode::Enter));
        assert_eq!(
            app.message.as_ref().unwrap().text,
            "g: nothing typed: type a step number (12) or b and a block (b7)"
        );
        // what is typed shows, and Enter says what is wrong with it
        typed(&mut app, "gx1");
        assert_eq!(app.goto.as_deref(), Some("x1"));
        press(&mut app, code(KeyCode::Enter));
        assert!(
            app.message.as_ref().unwrap().text.starts_with("g: \"x1\" is not a step or a block"),
            "{:?}",
            app.message
        );
        // Typing goes on past 12 characters, and Enter answers for all of it.
        let nines = "9".repeat(21);
        typed(&mut app, &format!("g{nines}"));
        assert_eq!(app.goto.as_deref(), Some(nines.as_str()));
        press(&mut app, code(KeyCode::Enter));
        assert_eq!(
            app.message.as_ref().unwrap().text,
            format!("g: no step {nines}: the decode has 26 steps")
        );
    }

    fn click(app: &mut App, column: u16, row: u16) {
        let m = MouseEvent {
            kind: MouseEventKind::Down(MouseButton::Left),
            column,
            row,
            modifiers: KeyModifiers::NONE,
        };
        app.on_input(TermEvent::Mouse(m), Instant::now());
    }

    #[test]
    fn a_click_on_the_timeline_bar_seeks_there() {
        let mut app = App::replay(synth::trace(&Synth::small()), "t".into(), None);
        app.size = Rect::new(0, 0, 120, 36);
        press(&mut app, code(KeyCode::End));
        let t = app.areas().unwrap().timeline;
        // The bar is the second row inside the frame, 118 columns for 26 steps (head 25):
        // step k sits at column k * 117 / 25.
        let (x0, bar) = (t.x + 1, t.y + 2);
        click(&mut app, x0, bar);
        assert_eq!((app.view().unwrap().at, app.cursor.mode), (Some(0), Mode::Paused));
        click(&mut app, x0 + 60, bar);
        assert_eq!(app.view().unwrap().at, Some(13));
        click(&mut app, x0 + 58, bar);
        assert_eq!(
            app.view().unwrap().at,
            Some(12),
            "between steps 12 (col 56) and 13 (col 60): the nearer first"
        );
        click(&mut app, x0 + 117, bar);
        assert_eq!(app.view().unwrap().at, Some(25));
        click(&mut app, x0 + 20, bar - 1);
        assert_eq!(app.view().unwrap().at, Some(25), "the position line is not the bar");
        click(&mut app, t.x, bar);
        assert_eq!(app.view().unwrap().at, Some(25), "nor is the frame");
    }
}
