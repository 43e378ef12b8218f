//! The real terminal: raw mode, alternate screen and mouse capture on the way in, and all of it
//! undone on every way out (normal return, error, panic). Ctrl-C arrives as a key in raw mode,
//! so quitting by it goes through the same clean path as `q`. Job control works as in any
//! full-screen program: Ctrl-Z (a key in raw mode) or a SIGTSTP from outside gives the terminal
//! back and stops the process; `fg` (SIGCONT) takes the screen again and draws it whole.

use std::io::{self, Stdout, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, Once};
use std::thread::{self, ThreadId};

use crossterm::event::{DisableMouseCapture, EnableMouseCapture};
use crossterm::terminal::{
    disable_raw_mode, enable_raw_mode, EnterAlternateScreen, LeaveAlternateScreen,
};
use crossterm::{cursor, execute};
use ratatui::backend::CrosstermBackend;
use ratatui::Terminal;

/// Whether the terminal is in TUI mode, so that restoring twice is harmless.
static ACTIVE: AtomicBool = AtomicBool::new(false);
/// The thread that owns the screen; panics elsewhere must not tear the screen down under it.
static UI_THREAD: Mutex<Option<ThreadId>> = Mutex::new(None);
/// A panic message from another thread, printed once the screen is restored.
static DEFERRED: Mutex<Option<String>> = Mutex::new(None);
static HOOK: Once = Once::new();

/// Puts the terminal back as it was. Safe to call any number of times, from anywhere.
pub fn restore() {
    if ACTIVE.swap(false, Ordering::SeqCst) {
        leave();
        crate::notice::release();
    }
}

fn leave() {
    let mut out = io::stdout();
    let _ = execute!(out, DisableMouseCapture, LeaveAlternateScreen, cursor::Show);
    let _ = disable_raw_mode();
    let _ = out.flush();
}

fn take() -> io::Result<()> {
    enable_raw_mode()?;
    execute!(io::stdout(), EnterAlternateScreen, EnableMouseCapture, cursor::Hide)
}

/// Serialises suspensions (Ctrl-Z on the UI thread, SIGTSTP on the signal thread).
static SUSPENDING: Mutex<()> = Mutex::new(());

/// Gives the terminal back and stops the process as SIGTSTP's default action would; once it
/// is continued (`fg`), takes the screen again and asks the input stream for a whole redraw.
/// Does nothing to the terminal when the TUI does not own it (the process just stops).
pub fn suspend() {
    let _one = SUSPENDING.lock().unwrap_or_else(|e| e.into_inner());
    let ours = ACTIVE.load(Ordering::SeqCst);
    if ours {
        leave();
    }
    // stops here until SIGCONT (signal-hook raises SIGSTOP, which cannot be caught)
    let stopped = std::time::Instant::now();
    let _ = signal_hook::low_level::emulate_default_handler(signal_hook::consts::SIGTSTP);
    crate::engine::clock::add_stopped(stopped.elapsed());
    if ours && ACTIVE.load(Ordering::SeqCst) {
        if let Err(e) = take() {
            crate::notice::warn(format!(
                "could not take the terminal back after a suspension: {e}"
            ));
        }
        crate::tui::keys::repaint();
    }
}

/// SIGTSTP from outside (`kill -TSTP`, a shell): [`suspend`], on a thread of its own.
fn handle_stop_signals() {
    static STOP: Once = Once::new();
    STOP.call_once(|| {
        let Ok(mut signals) = signal_hook::iterator::Signals::new([signal_hook::consts::SIGTSTP])
        else {
            return;
        };
        let _ = thread::Builder::new().name("unmask-tstp".into()).spawn(move || {
            for _ in signals.forever() {
                suspend();
            }
        });
    });
}

/// Restores the terminal before a panic on the UI thread prints, so that the message lands on
/// the normal screen. A panic on another thread (the engine) is kept and printed on exit.
fn install_panic_hook() {
    HOOK.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            // A panic that crate::panics catches becomes an error: nothing to restore or keep.
            if crate::panics::catching() {
                return previous(info);
            }
            let on_ui = *UI_THREAD.lock().unwrap_or_else(|e| e.into_inner())
                == Some(thread::current().id());
            if on_ui || !ACTIVE.load(Ordering::SeqCst) {
                restore();
                previous(info);
            } else {
                let name = thread::current().name().unwrap_or("a thread").to_string();
                *DEFERRED.lock().unwrap_or_else(|e| e.into_inner()) =
                    Some(format!("{name} panicked: {info}"));
            }
        }));
    });
}

/// The terminal in TUI mode; dropping it restores the terminal.
pub struct Guard {
    pub terminal: Terminal<CrosstermBackend<Stdout>>,
}

impl Guard {
    pub fn enter() -> io::Result<Guard> {
        install_panic_hook();
        handle_stop_signals();
        *UI_THREAD.lock().unwrap_or_else(|e| e.into_inner()) = Some(thread::current().id());
        ACTIVE.store(true, Ordering::SeqCst);
        crate::notice::hold();
        // the same way in as a suspension's way back (`suspend`)
        if let Err(e) = take() {
            restore();
            return Err(e);
        }
        match Terminal::new(CrosstermBackend::new(io::stdout())) {
            Ok(terminal) => Ok(Guard { terminal }),
            Err(e) => {
                restore();
                Err(e)
            }
        }
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        restore();
        if let Some(msg) = DEFERRED.lock().unwrap_or_else(|e| e.into_inner()).take() {
            eprintln!("unmask: {msg}");
        }
    }
}

/// The terminal's input events for a UI loop ([`crate::tui::keys`]: an unfinished escape sequence
/// never swallows later keys), ending when SIGTERM, SIGHUP, SIGINT or SIGQUIT arrives: the
/// loop then returns like on `q`, the [`Guard`] restores the terminal, and `main` exits with
/// 128 + the signal. Keep the subscription as long as the stream.
pub fn input() -> io::Result<(
    crate::signals::Subscription,
    impl futures::Stream<Item = io::Result<crossterm::event::Event>> + Unpin,
)> {
    use futures::StreamExt;
    let (sub, signal) = crate::signals::arrival();
    let stream = crate::tui::keys::stream()?.filter_map(|ev| async move {
        match ev {
            // Ctrl-Z: raw mode sends it as a key, not as SIGTSTP; the redraw comes as a Resize
            Ok(crossterm::event::Event::Key(k)) if is_suspend(&k) => {
                suspend();
                None
            }
            ev => Some(ev),
        }
    });
    Ok((sub, Box::pin(stream.take_until(signal))))
}

fn is_suspend(k: &crossterm::event::KeyEvent) -> bool {
    use crossterm::event::{KeyCode, KeyEventKind, KeyModifiers};
    k.code == KeyCode::Char('z')
        && k.modifiers.contains(KeyModifiers::CONTROL)
        && k.kind != KeyEventKind::Release
}
