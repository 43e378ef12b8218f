//! SIGTERM, SIGHUP, SIGINT and SIGQUIT: the terminal is restored and recordings are finished
//! before the process exits with the conventional status, 128 + the signal's number.
//!
//! A signal handler itself may do almost nothing (no locks, no allocation), so signal-hook's
//! iterator hands each signal to an ordinary thread, which does the work:
//! - if some part of the program subscribed ([`subscribe`]: the TUI's input loop, a headless
//!   decode that writes a trace), the first signal is recorded ([`caught`]) and the subscribers
//!   are told, so they wind down the normal way (the TUI's guard restores the terminal, a
//!   decode is cancelled and its finish event written, a cast is rendered from what was
//!   decoded); `main` then exits with 128 + the signal. Should that take longer than [`GRACE`]
//!   (a wedged loop), or a second signal arrive, the thread restores the terminal and exits.
//! - with no subscriber (loading a checkpoint, `bench`), nothing needs finishing: the terminal
//!   is restored (a no-op unless the TUI is up) and the process exits at once.
//!
//! In raw mode the terminal sends no SIGINT for Ctrl-C: it arrives as a key and quits the TUI
//! like `q` (exit 0). These signals come from `kill`, a closed terminal (SIGHUP) or a shell.
use std::sync::atomic::{AtomicI32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, Once};
use std::time::Duration;

use signal_hook::consts::{SIGHUP, SIGINT, SIGQUIT, SIGTERM};

/// How long the program may take to wind down after a signal before it is cut short.
pub const GRACE: Duration = Duration::from_secs(3);

/// The first signal received, 0 before any.
static CAUGHT: AtomicI32 = AtomicI32::new(0);
static NEXT_ID: AtomicU64 = AtomicU64::new(0);
type Notify = Box<dyn Fn(i32) + Send>;
static SUBSCRIBERS: Mutex<Vec<(u64, Notify)>> = Mutex::new(Vec::new());
static INSTALL: Once = Once::new();
/// How many [`finishing`] calls are under way: the grace period waits for them.
static FINISHING: AtomicUsize = AtomicUsize::new(0);

/// The signal that interrupted the run, if one did.
pub fn caught() -> Option<i32> {
    match CAUGHT.load(Ordering::SeqCst) {
        0 => None,
        s => Some(s),
    }
}

/// The signal's name, for messages.
pub fn name(sig: i32) -> String {
    match sig {
        SIGTERM => "SIGTERM".into(),
        SIGHUP => "SIGHUP".into(),
        SIGINT => "SIGINT".into(),
        SIGQUIT => "SIGQUIT".into(),
        s => format!("signal {s}"),
    }
}

/// The exit status for a run ended by `sig`: 128 + its number, as shells report it.
pub fn exit_status(sig: i32) -> u8 {
    u8::try_from(128 + sig).unwrap_or(255)
}

/// Starts handling the four signals. Idempotent; fails only if the handlers cannot be set.
pub fn install() -> std::io::Result<()> {
    let mut result = Ok(());
    INSTALL.call_once(|| {
        result = signal_hook::iterator::Signals::new([SIGTERM, SIGHUP, SIGINT, SIGQUIT]).and_then(
            |mut signals| {
                std::thread::Builder::new().name("unmask-signals".into()).spawn(move || {
                    for sig in signals.forever() {
                        on_signal(sig);
                    }
                })?;
                Ok(())
            },
        );
    });
    result
}

fn on_signal(sig: i32) {
    let first = CAUGHT.compare_exchange(0, sig, Ordering::SeqCst, Ordering::SeqCst).is_ok();
    let subscribers = SUBSCRIBERS.lock().unwrap_or_else(|e| e.into_inner());
    if !first || subscribers.is_empty() {
        drop(subscribers);
        cut_short(caught().unwrap_or(sig), "");
    }
    for (_, notify) in subscribers.iter() {
        notify(sig);
    }
    drop(subscribers);
    std::thread::spawn(move || {
        std::thread::sleep(GRACE);
        if FINISHING.load(Ordering::SeqCst) > 0 {
            while FINISHING.load(Ordering::SeqCst) > 0 {
                std::thread::sleep(Duration::from_millis(50));
            }
            // The recording is written: `main` exits on its own, with its own message, unless
            // it is wedged after that.
            std::thread::sleep(GRACE);
        }
        cut_short(sig, &format!(" (did not finish within {} s)", GRACE.as_secs()));
    });
}

/// Restores the terminal, deletes unfinished temporary outputs and exits.
fn cut_short(sig: i32, why: &str) -> ! {
    crate::tui::terminal::restore();
    crate::cli::output::remove_unfinished();
    eprintln!("unmask: interrupted by {}{why}", name(sig));
    std::process::exit(exit_status(sig).into())
}

/// Runs `f`, work that finishes a recording after its decode (rendering a cast): the grace
/// period after a signal waits for it, however long it takes (a second signal still ends
/// the process at once). A signal that comes during `f` with nothing subscribed still ends
/// the process at once: to be told of it instead, subscribe around `f` (`record` does, and
/// stops rendering at the next frame).
pub fn finishing<T>(f: impl FnOnce() -> T) -> T {
    struct Done;
    impl Drop for Done {
        fn drop(&mut self) {
            FINISHING.fetch_sub(1, Ordering::SeqCst);
        }
    }
    FINISHING.fetch_add(1, Ordering::SeqCst);
    let _done = Done;
    f()
}

/// Calls `notify` with the signal when one arrives, until the returned guard drops.
#[must_use = "the subscription ends when this guard drops"]
pub fn subscribe(notify: impl Fn(i32) + Send + 'static) -> Subscription {
    let id = NEXT_ID.fetch_add(1, Ordering::SeqCst);
    SUBSCRIBERS.lock().unwrap_or_else(|e| e.into_inner()).push((id, Box::new(notify)));
    Subscription(id)
}

pub struct Subscription(u64);

impl Drop for Subscription {
    fn drop(&mut self) {
        SUBSCRIBERS.lock().unwrap_or_else(|e| e.into_inner()).retain(|(id, _)| *id != self.0);
    }
}

/// A future that resolves when a signal arrives (at once if one already has), with the
/// subscription that makes it so. For the TUI's input: the stream ends, the loop returns.
pub fn arrival() -> (Subscription, impl std::future::Future<Output = ()> + Send + Unpin) {
    let (tx, rx) = futures::channel::oneshot::channel::<()>();
    let tx = Mutex::new(Some(tx));
    let sub = subscribe(move |_| {
        if let Some(tx) = tx.lock().unwrap_or_else(|e| e.into_inner()).take() {
            let _ = tx.send(());
        }
    });
    let already = caught().is_some();
    let fut = Box::pin(async move {
        if !already {
            let _ = rx.await;
        }
    });
    (sub, fut)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_and_names_are_the_shell_conventions() {
        assert_eq!(exit_status(SIGINT), 130);
        assert_eq!(exit_status(SIGTERM), 143);
        assert_eq!(exit_status(SIGHUP), 129);
        assert_eq!(exit_status(SIGQUIT), 131);
        assert_eq!(name(SIGHUP), "SIGHUP");
    }

    #[test]
    fn a_subscription_ends_when_its_guard_drops() {
        let before = SUBSCRIBERS.lock().unwrap().len();
        let sub = subscribe(|_| {});
        assert_eq!(SUBSCRIBERS.lock().unwrap().len(), before + 1);
        drop(sub);
        assert_eq!(SUBSCRIBERS.lock().unwrap().len(), before);
    }
}
