//! `unmask` with no subcommand: the live TUI over a decode running on this machine.

use std::io::IsTerminal;

use anyhow::{bail, Result};

use crate::cli::session::Session;
use crate::cli::{DecodeArgs, LookArgs};
use crate::engine::settings::DecodeSettings;
use crate::engine::{Control, Request};
use crate::tui::{self, App, EngineCmd};

/// The TUI needs a terminal; a pipe or a file gets a pointer to `unmask trace` instead of
/// escape codes.
pub fn require_terminal() -> Result<()> {
    if !std::io::stdout().is_terminal() {
        bail!("stdout is not a terminal; the TUI needs one (use `unmask trace` to write the step events to a file or pipe)");
    }
    Ok(())
}

pub fn run(args: &DecodeArgs, look: &LookArgs) -> Result<()> {
    // Everything that can be wrong with the flags is said before the terminal is needed (and
    // long before it is taken), in the same words as `trace`.
    let pace = look.pace()?;
    let session = {
        let _note = Loading::say(args);
        Session::open(args)?
    };
    require_terminal()?;
    let (engine, base, rx) = session.spawn();
    engine.submit(with_settings(&base, base.settings.clone()));
    let mut steer = |cmd: EngineCmd| match cmd {
        EngineCmd::Pause => engine.send(Control::Pause),
        EngineCmd::Resume => engine.send(Control::Resume),
        EngineCmd::Settings(s) => engine.send(Control::Settings(s)),
        // Replaces the decode under way and any restart not yet started (R R runs one).
        EngineCmd::Restart(s) => engine.submit(with_settings(&base, s)),
    };
    let mut app = App::live().with_pace(pace);
    app.theme = look.theme();
    serve(&mut app, Some(rx), &mut steer)?;
    // `engine` drops after the screen is restored: it cancels the decode and joins the thread.
    // A decode that stopped on an error fails the run, as it fails `trace`, once the screen
    // that showed it is gone.
    match app.decode_error() {
        Some(err) => bail!("decode failed: {err}"),
        None => Ok(()),
    }
}

/// "loading …" on a terminal's stderr while a checkpoint loads (seconds for a real one, in
/// which the screen would otherwise stay as the shell left it), wiped when loading ends.
struct Loading(bool);

impl Loading {
    fn say(args: &DecodeArgs) -> Loading {
        // (the embedded model loads at once)
        let Some(model) = args
            .model
            .as_deref()
            .filter(|_| std::io::stderr().is_terminal() && std::io::stdout().is_terminal())
        else {
            return Loading(false);
        };
        eprint!("unmask: loading {}…", crate::glyph::escape_line(&model.display().to_string()));
        Loading(true)
    }
}

impl Drop for Loading {
    fn drop(&mut self) {
        if self.0 {
            eprint!("\r\x1b[2K");
        }
    }
}

/// The same request with other settings; block length and length stay (they shape the run).
fn with_settings(base: &Request, s: DecodeSettings) -> Request {
    Request { settings: s.keeping_layout_of(&base.settings), ..base.clone() }
}

/// Takes over the terminal, runs the UI loop, and gives the terminal back however it ends.
pub fn serve(
    app: &mut App,
    events: Option<tokio::sync::mpsc::UnboundedReceiver<crate::trace::events::Event>>,
    steer: &mut dyn FnMut(EngineCmd),
) -> Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread().enable_time().build()?;
    let mut guard = crate::tui::terminal::Guard::enter()?;
    // Debug builds only: lets the end-to-end test check that a panic restores the terminal.
    #[cfg(debug_assertions)]
    if std::env::var_os("UNMASK_E2E_PANIC").is_some() {
        guard.terminal.draw(|f| tui::draw(f, app))?;
        panic!("UNMASK_E2E_PANIC: a panic on the UI thread, as asked");
    }
    let (_signals, input) = crate::tui::terminal::input()?;
    let result = rt.block_on(tui::run(&mut guard.terminal, app, [events], input, steer));
    drop(guard);
    result
}
