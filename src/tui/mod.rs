//! The live TUI. The engine thread sends events over a channel; they go into the store; the
//! screen is a function of (store, cursor, view state), drawn at most `FPS` times a second and
//! only when something changed. Keys and mouse come from any `Stream` of crossterm events, and
//! the loop is generic over ratatui's `Backend`, so tests drive it on a `TestBackend`. One loop
//! ([`run`]) runs both screens, the single view ([`App`], drawn by [`render`]) and compare
//! ([`compare::CompareApp`], drawn by [`compare::render`]), through [`Screen`].

pub mod app;
pub mod cast;
pub mod compare;
pub mod cursor;
pub mod fields;
pub mod figure;
pub mod gif;
pub mod goto;
pub mod grid;
pub mod help;
pub mod inspector;
pub mod keys;
pub mod layout;
pub mod record;
pub mod stats;
pub mod status;
pub mod steps;
pub mod terminal;
#[cfg(test)]
mod testing;
pub mod text;
pub mod theme;
pub mod timeline;

use std::task::Poll;
use std::time::{Duration, Instant};

use anyhow::Result;
use futures::{Stream, StreamExt};
use ratatui::backend::Backend;
use ratatui::buffer::Buffer;
use ratatui::layout::{Alignment, Rect};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Paragraph, Widget};
use ratatui::{Frame, Terminal};
use tokio::sync::mpsc::UnboundedReceiver;

pub use app::{App, EngineCmd};

use crate::glyph;
use crate::trace::events::Event;

/// The frame cap: redraws never come closer together than this.
pub const FPS: f64 = 60.0;

/// Draws the whole screen for the app's current state.
pub fn draw(f: &mut Frame, app: &App) {
    let area = f.area();
    render(app, area, f.buffer_mut());
}

/// The screen as a pure function of the app, into any buffer (the benchmark uses it directly).
pub fn render(app: &App, area: Rect, buf: &mut Buffer) {
    match (layout::areas(area), app.view()) {
        (None, _) => too_small(app, area, buf),
        (Some(_), None) => {
            centred(app.theme, area, buf, "waiting for the engine's first event…".into())
        }
        (Some(a), Some(v)) => {
            status::title(&v, a.title, buf);
            grid::render(&v, a.grid, buf);
            if app.steps_panel {
                steps::render(&v, a.text, buf);
            } else {
                text::render(&v, a.text, buf);
            }
            inspector::render(&v, a.inspector, buf);
            stats::render(&v, a.stats, buf);
            timeline::render(&v, a.timeline, buf);
            status::footer(app, a.footer, buf);
        }
    }
    if app.help {
        help::render(app.theme, app.is_live(), area, buf);
    }
}

fn too_small(app: &App, area: Rect, buf: &mut Buffer) {
    let msg = format!(
        "terminal too small: {}×{}; unmask needs at least {}×{} (q quits)",
        area.width,
        area.height,
        layout::MIN_WIDTH,
        layout::MIN_HEIGHT
    );
    centred(app.theme, area, buf, msg);
}

fn centred(t: &theme::Theme, area: Rect, buf: &mut Buffer, msg: String) {
    // The rows the wrapped message takes (one more for what word wrapping leaves at line
    // ends), centred: starting at the middle row cut it off in a window of a few rows.
    let rows = (glyph::width(&msg) as u16).div_ceil(area.width.max(1)).saturating_add(1);
    let rows = rows.min(area.height);
    let y = area.y + (area.height - rows) / 2;
    let line = Line::from(Span::styled(msg, t.warn()));
    Paragraph::new(line)
        .alignment(Alignment::Center)
        .wrap(ratatui::widgets::Wrap { trim: true })
        .render(Rect { y, height: area.height - (y - area.y), ..area }, buf);
}

/// Makes the next draw write every cell, on a blank screen: after a resize or a suspension
/// (`crate::tui::terminal::suspend`) what is on screen is not what was drawn last. (Not
/// `Terminal::clear`: it asks the terminal for the cursor position, whose reply our own input
/// thread would read first.)
pub fn forget_screen<B: Backend>(terminal: &mut Terminal<B>) -> Result<(), B::Error> {
    terminal.backend_mut().clear_region(ratatui::backend::ClearType::All)?;
    // After a draw the buffer drawn next is empty and the other holds the last frame: this
    // empties that one too, so the next frame differs from "the last" wherever it has ink.
    terminal.swap_buffers();
    Ok(())
}

/// A screen the loop ([`run`]) can run: the single view ([`App`]) and compare
/// ([`compare::CompareApp`]). Each is pure state; the loop owns the terminal, the engines'
/// channels, the input and the clock, and tells the state what came.
pub trait Screen {
    /// What the screen asks of its engines (compare asks nothing of them).
    type Cmd;
    /// The loop starts at `now` (playback measures time from there).
    fn start(&mut self, now: Instant);
    /// Whether the screen is done: the loop ends before its next draw.
    fn quit(&self) -> bool;
    /// One event from engine `engine` (its index in the loop's `events`).
    fn ingest(&mut self, engine: usize, ev: Event) -> Vec<Self::Cmd>;
    /// Engine `engine`'s channel closed.
    fn engine_gone(&mut self, engine: usize);
    /// A key, mouse action or resize.
    fn on_input(&mut self, ev: crossterm::event::Event, now: Instant) -> Vec<Self::Cmd>;
    /// A warning raised away from the screen ([`crate::notice`]); true if the screen shows it.
    fn notice(&mut self, text: &str) -> bool;
    /// When playback next needs a [`Screen::tick`], if it is playing; never sooner than
    /// `frame` after the last.
    fn next_tick(&self, now: Instant, frame: Duration) -> Option<Instant>;
    /// Advances playback to `now`; true if the screen changed.
    fn tick(&mut self, now: Instant) -> bool;
    /// The terminal's size, just before each draw.
    fn set_size(&mut self, size: Rect);
    /// The whole screen, a pure function of the state.
    fn render(&self, area: Rect, buf: &mut Buffer);
}

/// The single view: one engine, steered with [`EngineCmd`]s (none for a replay).
impl Screen for App {
    type Cmd = EngineCmd;
    fn start(&mut self, now: Instant) {
        self.sync_clock(now);
    }
    fn quit(&self) -> bool {
        self.quit
    }
    fn ingest(&mut self, _engine: usize, ev: Event) -> Vec<EngineCmd> {
        App::ingest(self, ev)
    }
    fn engine_gone(&mut self, _engine: usize) {
        App::engine_gone(self);
    }
    fn on_input(&mut self, ev: crossterm::event::Event, now: Instant) -> Vec<EngineCmd> {
        App::on_input(self, ev, now)
    }
    fn notice(&mut self, text: &str) -> bool {
        App::notice(self, text);
        true
    }
    fn next_tick(&self, now: Instant, frame: Duration) -> Option<Instant> {
        App::next_tick(self, now, frame)
    }
    fn tick(&mut self, now: Instant) -> bool {
        App::tick(self, now)
    }
    fn set_size(&mut self, size: Rect) {
        self.size = size;
    }
    fn render(&self, area: Rect, buf: &mut Buffer) {
        render(self, area, buf);
    }
}

/// Compare: engines A (0) and B (1), never steered; notices wait for the terminal's return.
impl Screen for compare::CompareApp {
    type Cmd = std::convert::Infallible;
    fn start(&mut self, _now: Instant) {}
    fn quit(&self) -> bool {
        self.quit
    }
    fn ingest(&mut self, engine: usize, ev: Event) -> Vec<Self::Cmd> {
        compare::CompareApp::ingest(self, engine, ev);
        Vec::new()
    }
    fn engine_gone(&mut self, _engine: usize) {}
    fn on_input(&mut self, ev: crossterm::event::Event, now: Instant) -> Vec<Self::Cmd> {
        compare::CompareApp::on_input(self, ev, now);
        Vec::new()
    }
    fn notice(&mut self, _text: &str) -> bool {
        false
    }
    fn next_tick(&self, _now: Instant, frame: Duration) -> Option<Instant> {
        compare::CompareApp::next_tick(self, frame)
    }
    fn tick(&mut self, now: Instant) -> bool {
        compare::CompareApp::tick(self, now)
    }
    fn set_size(&mut self, size: Rect) {
        self.size = size;
    }
    fn render(&self, area: Rect, buf: &mut Buffer) {
        compare::render::render(self, area, buf);
    }
}

/// The engines' channels, one a screen's engine; `None` for one that is gone, or that there
/// never was (a replay).
pub type Engines<const N: usize> = [Option<UnboundedReceiver<Event>>; N];

/// Waits for the next event of any engine, with its index (`None`: that channel closed), or
/// forever once there is no engine.
async fn next_event<const N: usize>(events: &mut Engines<N>) -> (usize, Option<Event>) {
    std::future::poll_fn(|cx| {
        for (i, rx) in events.iter_mut().enumerate() {
            if let Some(Poll::Ready(ev)) = rx.as_mut().map(|rx| rx.poll_recv(cx)) {
                return Poll::Ready((i, ev));
            }
        }
        Poll::Pending
    })
    .await
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(t) => tokio::time::sleep_until(t.into()).await,
        None => std::future::pending().await,
    }
}

/// Runs a screen until it quits or the input ends: the single view with its one engine
/// (`[None]` for a replay), compare with its two. A draw only when something changed, at most
/// [`FPS`] a second; a key is handled the moment it comes; `steer` takes what the screen asks
/// of its engines.
pub async fn run<B, S, V, const N: usize>(
    terminal: &mut Terminal<B>,
    screen: &mut V,
    mut events: Engines<N>,
    mut input: S,
    steer: &mut dyn FnMut(V::Cmd),
) -> Result<()>
where
    B: Backend,
    B::Error: Send + Sync + 'static,
    S: Stream<Item = std::io::Result<crossterm::event::Event>> + Unpin,
    V: Screen,
{
    let frame = Duration::from_secs_f64(1.0 / FPS);
    let mut last_draw: Option<Instant> = None;
    let mut dirty = true;
    let mut notices_seen = 0;
    screen.start(Instant::now());
    while !screen.quit() {
        // Warnings the engine or the model raised while the screen is ours (crate::notice)
        for text in crate::notice::since(notices_seen) {
            dirty |= screen.notice(&text);
            notices_seen += 1;
        }
        let now = Instant::now();
        if dirty && last_draw.is_none_or(|t| now >= t + frame) {
            let size = terminal.size()?;
            screen.set_size(Rect::new(0, 0, size.width, size.height));
            terminal.draw(|f| screen.render(f.area(), f.buffer_mut()))?;
            (last_draw, dirty) = (Some(now), false);
            continue;
        }
        let draw_at = dirty.then(|| last_draw.map_or(now, |t| t + frame));
        let wake = [draw_at, screen.next_tick(now, frame)].into_iter().flatten().min();
        tokio::select! {
            (engine, ev) = next_event(&mut events) => match ev {
                Some(ev) => {
                    let mut cmds = screen.ingest(engine, ev);
                    // Take everything queued, of every engine: one redraw shows the newest state.
                    for (engine, rx) in events.iter_mut().enumerate() {
                        while let Some(ev) = rx.as_mut().and_then(|rx| rx.try_recv().ok()) {
                            cmds.extend(screen.ingest(engine, ev));
                        }
                    }
                    cmds.into_iter().for_each(&mut *steer);
                    dirty = true;
                }
                None => {
                    events[engine] = None;
                    screen.engine_gone(engine);
                }
            },
            key = input.next() => match key {
                Some(Ok(ev)) => {
                    if matches!(ev, crossterm::event::Event::Resize(..)) {
                        forget_screen(terminal)?;
                    }
                    for cmd in screen.on_input(ev, Instant::now()) {
                        steer(cmd);
                    }
                    dirty = true;
                }
                Some(Err(e)) => return Err(e.into()),
                None => break,
            },
            _ = sleep_until(wake) => dirty |= screen.tick(Instant::now()),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::synth::{self, Synth};
    use crate::tui::testing::snapshot_text;
    use crossterm::event::{Event as TermEvent, KeyCode, KeyEvent, KeyModifiers};
    use futures::channel::mpsc::unbounded;
    use ratatui::backend::TestBackend;

    fn key(c: KeyCode) -> std::io::Result<TermEvent> {
        Ok(TermEvent::Key(KeyEvent::new(c, KeyModifiers::NONE)))
    }

    fn screen(app: &App, w: u16, h: u16) -> String {
        let mut term = Terminal::new(TestBackend::new(w, h)).unwrap();
        term.draw(|f| draw(f, app)).unwrap();
        snapshot_text(term.backend().buffer())
    }

    fn finished_app() -> App {
        let mut app = App::replay(synth::trace(&Synth::small()), "small.jsonl".into(), None);
        app.on_key(KeyEvent::new(KeyCode::End, KeyModifiers::NONE));
        app
    }

    #[test]
    fn full_screen_wide() {
        insta::assert_snapshot!(screen(&finished_app(), 120, 36));
    }

    #[test]
    fn full_screen_narrow() {
        insta::assert_snapshot!(screen(&finished_app(), 80, 30));
    }

    /// The engine ran ahead and finished; the view, at 8 steps/s, is one second into it.
    #[test]
    fn full_screen_mid_pace() {
        let mut app = App::live().with_pace(cursor::Pace::PerSecond(8.0));
        for e in synth::trace(&Synth::small()) {
            app.ingest(e);
        }
        let t0 = Instant::now();
        app.sync_clock(t0);
        assert!(app.tick(t0 + Duration::from_secs(1)));
        assert_eq!((app.cursor.mode, app.view().unwrap().at), (cursor::Mode::Playing, Some(8)));
        let s = screen(&app, 120, 36);
        assert!(s.contains("finished: ") && s.contains("▶ 9/26 · pace 8/s"), "{s}");
        insta::assert_snapshot!(s);
    }

    /// The editing trace at block 2's post-step, at the 80x24 screen and a wide one, and
    /// without colour: every panel shows the edits (grid `✎`, inspector history, timeline,
    /// stats, steps); a step back and forward again draws the same screen.
    #[test]
    fn full_screen_with_edits_at_80x24_and_wide() {
        let mut app = App::replay(synth::trace(&Synth::small_edits()), "edits.jsonl".into(), None);
        app.on_key(KeyEvent::new(KeyCode::Home, KeyModifiers::NONE));
        for _ in 0..7 {
            app.on_key(KeyEvent::new(KeyCode::Right, KeyModifiers::NONE));
        }
        let small = screen(&app, 80, 24);
        assert!(small.contains("✎") && small.contains("post-edit"), "{small}");
        app.on_key(KeyEvent::new(KeyCode::Left, KeyModifiers::NONE));
        app.on_key(KeyEvent::new(KeyCode::Right, KeyModifiers::NONE));
        assert_eq!(screen(&app, 80, 24), small);
        let wide = screen(&app, 140, 40);
        assert!(wide.contains("history ░") && wide.contains("edits/step 2"), "{wide}");
        app.on_key(KeyEvent::new(KeyCode::Char('L'), KeyModifiers::NONE));
        let steps = screen(&app, 140, 40);
        assert!(steps.contains(r#"[] ~10 "\t"→"," ~"#), "{steps}");
        app.on_key(KeyEvent::new(KeyCode::Char('L'), KeyModifiers::NONE));
        app.theme = theme::pick(theme::ThemeName::Dark, theme::Depth::Mono);
        let mono = screen(&app, 80, 24);
        assert!(mono.contains("⁵✎"), "{mono}");
        insta::assert_snapshot!(format!("{small}\n{wide}\n{mono}"));
    }

    #[test]
    fn too_small_says_so() {
        let s = screen(&finished_app(), 50, 15);
        assert!(s.contains("terminal too small: 50×15"), "{s}");
        assert!(!s.contains("Blocks"));
        // a window of a few rows still shows the whole message, the way out included
        let s = screen(&finished_app(), 20, 5);
        assert!(s.contains("(q") && s.contains("quits)"), "{s}");
    }

    #[test]
    fn resize_redraws_for_the_new_size() {
        let app = finished_app();
        let mut term = Terminal::new(TestBackend::new(120, 36)).unwrap();
        term.draw(|f| draw(f, &app)).unwrap();
        term.backend_mut().resize(50, 15);
        term.draw(|f| draw(f, &app)).unwrap();
        assert!(snapshot_text(term.backend().buffer()).contains("too small"));
        term.backend_mut().resize(80, 30);
        term.draw(|f| draw(f, &app)).unwrap();
        assert_eq!(snapshot_text(term.backend().buffer()), screen(&app, 80, 30));
    }

    #[test]
    fn help_lists_keys_over_the_screen() {
        let mut app = finished_app();
        app.help = true;
        let s = screen(&app, 120, 36);
        assert!(s.contains("unmask · keys") && s.contains("pause / resume the view"), "{s}");
    }

    #[test]
    fn waiting_before_the_first_event() {
        let s = screen(&App::live(), 80, 24);
        assert!(s.contains("waiting for the engine"), "{s}");
    }

    /// The live path and the replay path give the same screens for the same events.
    #[test]
    fn live_and_replay_draw_the_same_screens() {
        let events = synth::trace(&Synth::small());
        let mut live = App::live();
        for e in events.clone() {
            live.ingest(e);
        }
        let mut replay = App::replay(events, "x".into(), None);
        replay.on_key(KeyEvent::new(KeyCode::End, KeyModifiers::NONE));
        // The title says live or replay, the footer lists the keys that work in each, and at
        // the end the timeline's badge says live or the end of the trace.
        let body = |s: String| {
            let lines: Vec<&str> = s.lines().collect();
            lines[1..lines.len() - 1]
                .join("\n")
                .replace("■ END of trace", "        ● LIVE")
                .replace(" ⏸ PAUSED · 4 before the end", "⏸ PAUSED · 4 behind the head")
        };
        assert_eq!(body(screen(&live, 120, 36)), body(screen(&replay, 120, 36)));
        for a in [&mut live, &mut replay] {
            a.on_key(KeyEvent::new(KeyCode::Char('['), KeyModifiers::NONE));
            a.on_key(KeyEvent::new(KeyCode::Left, KeyModifiers::NONE));
        }
        assert_eq!(body(screen(&live, 120, 36)), body(screen(&replay, 120, 36)));
    }

    #[tokio::test]
    async fn the_loop_ingests_events_obeys_keys_and_quits() {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        for e in synth::trace(&Synth::small()) {
            tx.send(e).unwrap();
        }
        let (keys, input) = unbounded();
        let mut term = Terminal::new(TestBackend::new(120, 36)).unwrap();
        let mut app = App::live();
        let mut sent = Vec::new();
        let mut steer = |c: EngineCmd| sent.push(c);
        let typing = async {
            // Keys come after the events are in, as a person's would.
            tokio::time::sleep(Duration::from_millis(100)).await;
            for k in [
                KeyCode::Char(' '),
                KeyCode::Left,
                KeyCode::Char('m'),
                KeyCode::Char('p'),
                KeyCode::Char('q'),
            ] {
                keys.unbounded_send(key(k)).unwrap();
            }
        };
        let looped = tokio::time::timeout(
            Duration::from_secs(10),
            run(&mut term, &mut app, [Some(rx)], input, &mut steer),
        );
        let (res, ()) = tokio::join!(looped, typing);
        res.expect("the loop quits on q").unwrap();
        assert!(app.quit);
        assert_eq!(app.cursor.mode, cursor::Mode::Paused);
        // The decode had finished: neither m nor p reach the engine.
        assert!(sent.is_empty(), "{sent:?}");
        let s = snapshot_text(term.backend().buffer());
        assert!(s.contains("Blocks"), "{s}");
    }

    #[tokio::test]
    async fn the_loop_ends_when_input_ends() {
        let (_keys, input) = unbounded::<std::io::Result<TermEvent>>();
        drop(_keys);
        let mut term = Terminal::new(TestBackend::new(80, 24)).unwrap();
        let mut app = App::live();
        tokio::time::timeout(
            Duration::from_secs(5),
            run(&mut term, &mut app, [None], input, &mut |_| {}),
        )
        .await
        .expect("ends")
        .unwrap();
    }

    /// Compare runs through the same loop: both engines' events go to their sides, keys act,
    /// an engine that is done changes nothing, and q quits.
    #[tokio::test]
    async fn the_loop_runs_compare_over_both_engines() {
        let (ta, ra) = tokio::sync::mpsc::unbounded_channel();
        let (tb, rb) = tokio::sync::mpsc::unbounded_channel();
        synth::trace(&Synth::small()).into_iter().for_each(|e| ta.send(e).unwrap());
        synth::trace(&Synth { steps: 2, ..Synth::small() })
            .into_iter()
            .for_each(|e| tb.send(e).unwrap());
        drop(ta);
        let (keys, input) = unbounded();
        let mut term = Terminal::new(TestBackend::new(120, 36)).unwrap();
        let mut app = compare::CompareApp::live();
        let typing = async {
            tokio::time::sleep(Duration::from_millis(100)).await;
            for k in [KeyCode::Char(' '), KeyCode::Home, KeyCode::Char('a'), KeyCode::Char('q')] {
                keys.unbounded_send(key(k)).unwrap();
            }
        };
        let mut steer = |never| match never {};
        let looped = tokio::time::timeout(
            Duration::from_secs(10),
            run(&mut term, &mut app, [Some(ra), Some(rb)], input, &mut steer),
        );
        let (res, ()) = tokio::join!(looped, typing);
        res.expect("the loop quits on q").unwrap();
        drop(tb);
        assert!(app.quit && app.comparison().is_some(), "both sides finished");
        assert_eq!((app.mode, app.align), (cursor::Mode::Paused, compare::Align::Block));
        let s = snapshot_text(term.backend().buffer());
        // (the last frame came before the last keys: q quits without another draw)
        assert!(s.contains("unmask compare") && s.matches("ended: length").count() == 2, "{s}");
    }

    #[tokio::test]
    async fn the_loop_plays_a_replay_forward_with_time() {
        let (keys, input) = unbounded();
        let mut term = Terminal::new(TestBackend::new(120, 36)).unwrap();
        let mut app = App::replay(synth::trace(&Synth::small()), "x".into(), None);
        // 1000 steps/s: the 26 steps play in well under a second.
        app.cursor.pace = cursor::Pace::PerSecond(1000.0);
        let mut steer = |_| {};
        let task = run(&mut term, &mut app, [None], input, &mut steer);
        let quit_later = async {
            tokio::time::sleep(Duration::from_millis(400)).await;
            keys.unbounded_send(key(KeyCode::Char('q'))).unwrap();
        };
        let (res, ()) = tokio::join!(task, quit_later);
        res.unwrap();
        assert_eq!(app.cursor.mode, cursor::Mode::Live, "playback reached the head");
    }
}
