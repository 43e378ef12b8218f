//! Panics turned into errors where a failure must be reported rather than crash the program:
//! the decode loop (a panic in the engine thread would otherwise close the event channel
//! silently, and headless commands would exit 0) and third-party code that panics on bad input
//! (the tokenizer's regex engine).
//!
//! std offers only `catch_unwind`, which still runs the global panic hook first: without help
//! the default hook prints the panic (several lines, in the middle of a TUI screen). So one
//! hook, installed once and wrapping whatever hook was there, stays quiet on a thread that is
//! inside [`catch`] and keeps the message and location for the error instead.

use std::cell::{Cell, RefCell};
use std::panic::{self, AssertUnwindSafe};
use std::sync::Once;

thread_local! {
    /// Depth of [`catch`] calls on this thread.
    static CATCHING: Cell<usize> = const { Cell::new(0) };
    /// The message of the last panic caught on this thread.
    static CAUGHT: RefCell<Option<String>> = const { RefCell::new(None) };
}

static HOOK: Once = Once::new();

/// Whether a panic on this thread right now would be caught by [`catch`]; other panic hooks
/// (the terminal's) leave such a panic alone.
pub fn catching() -> bool {
    CATCHING.with(|c| c.get() > 0)
}

/// Installs the quiet hook in front of the current one. Idempotent; [`catch`] calls it too.
pub fn install() {
    HOOK.call_once(|| {
        let previous = panic::take_hook();
        panic::set_hook(Box::new(move |info| {
            if catching() {
                let msg = match (
                    info.payload().downcast_ref::<&str>(),
                    info.payload().downcast_ref::<String>(),
                ) {
                    (Some(s), _) => s.to_string(),
                    (_, Some(s)) => s.clone(),
                    _ => "unknown panic".to_string(),
                };
                let at = info
                    .location()
                    .map(|l| format!(" at {}:{}", l.file(), l.line()))
                    .unwrap_or_default();
                CAUGHT.with(|c| *c.borrow_mut() = Some(format!("{msg}{at}")));
            } else {
                previous(info);
            }
        }));
    });
}

/// Runs `f`; a panic inside it becomes `Err` with the panic's message and location (one line).
/// `f` must leave nothing half-updated that the caller goes on using after an `Err`.
pub fn catch<T>(f: impl FnOnce() -> T) -> Result<T, String> {
    install();
    CATCHING.with(|c| c.set(c.get() + 1));
    let r = panic::catch_unwind(AssertUnwindSafe(f));
    CATCHING.with(|c| c.set(c.get() - 1));
    r.map_err(|_| {
        let msg = CAUGHT.with(|c| c.borrow_mut().take()).unwrap_or_else(|| "unknown panic".into());
        format!("internal error (panic): {}", msg.replace('\n', " "))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panic_becomes_an_error_with_its_message_and_place() {
        let e = catch(|| -> u32 { panic!("boom {}", 7) }).unwrap_err();
        assert!(e.starts_with("internal error (panic): boom 7 at src/panics.rs:"), "{e}");
        assert!(!catching());
        assert_eq!(catch(|| 5), Ok(5));
    }

    #[test]
    fn nested_catches_each_report_their_own_panic() {
        let outer = catch(|| {
            let inner = catch(|| -> () { panic!("inner") });
            assert!(inner.unwrap_err().contains("inner"));
            assert!(catching());
            panic!("outer");
        });
        assert!(outer.unwrap_err().contains("outer"));
    }
}
