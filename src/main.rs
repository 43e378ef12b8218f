use std::process::ExitCode;

use unmask::cli::commands::record::Recording;
use unmask::cli::{Cli, Command};

fn main() -> ExitCode {
    unmask::panics::install();
    let cli = match Cli::parse_checked(std::env::args_os()) {
        Ok(c) => c,
        Err(e) => return clap_exit(e),
    };
    // Checked before anything runs (only the TUI and replay take --pace; the others refuse it).
    if let Err(e) = cli.look.pace() {
        return fail(&format!("{e:#}"));
    }
    if let Err(e) = unmask::signals::install() {
        return fail(&format!("cannot handle signals: {e}"));
    }
    let result = match &cli.command {
        Some(Command::Trace { decode, out }) => {
            unmask::cli::commands::trace::run(decode, out.as_deref())
        }
        Some(Command::Compare { decode, a, b, headless: true, json }) => {
            unmask::cli::commands::compare::headless(&a.apply(decode), &b.apply(decode), *json)
        }
        Some(Command::Compare { decode, a, b, headless: false, .. }) => {
            cli.look.pace().and_then(|pace| {
                unmask::cli::commands::compare::tui(
                    &a.apply(decode),
                    &b.apply(decode),
                    cli.look.theme(),
                    pace,
                )
            })
        }
        Some(Command::Export { trace, format, table, out, figure }) => {
            unmask::cli::commands::export::run(trace, *format, *table, out.as_deref(), figure)
        }
        Some(Command::Replay { file, cast, gif, pacing }) => {
            match Recording::new(cast.as_deref(), gif.as_deref()) {
                None => unmask::cli::commands::replay::run(file, &cli.look),
                Some(to) => unmask::cli::commands::record::from_trace(file, to, pacing, &cli.look),
            }
        }
        Some(Command::Record { decode, cast, gif, trace, pacing }) => {
            match Recording::new(cast.as_deref(), gif.as_deref()) {
                Some(to) => unmask::cli::commands::record::run(
                    decode,
                    to,
                    trace.as_deref(),
                    pacing,
                    &cli.look,
                ),
                None => Err(anyhow::anyhow!(
                    "record writes a cast or a GIF: give --cast FILE or --gif FILE"
                )),
            }
        }
        Some(Command::Steps(args)) => unmask::cli::commands::steps::run(args),
        Some(Command::Bench(args)) => unmask::cli::commands::bench::run(args),
        Some(Command::Models { all, json }) => unmask::cli::commands::models::run(*all, *json),
        Some(Command::Completions { shell }) => unmask::cli::commands::meta::completions(*shell),
        Some(Command::Man { dir }) => unmask::cli::commands::meta::man(dir.as_deref()),
        Some(Command::CheckDevice(args)) => unmask::cli::commands::check_device::run(args),
        None => unmask::cli::commands::tui::run(&cli.decode, &cli.look),
    };
    if let Some(sig) = unmask::signals::caught() {
        // The command wound down early and kept what it had; say so, and exit as killed.
        let why = result.err().map(|e| format!(" ({e:#})")).unwrap_or_default();
        eprintln!("unmask: interrupted by {}{why}", unmask::signals::name(sig));
        return ExitCode::from(unmask::signals::exit_status(sig));
    }
    match result {
        Ok(()) => ExitCode::SUCCESS,
        // The reader went away (`unmask trace | head -1`): what it wanted was written, so this
        // ends quietly with exit 0, the way a finished listing does.
        Err(e) if broken_pipe(&e) => ExitCode::SUCCESS,
        // The output is written, from a trace cut short: a warning, and a status that says so.
        Err(e) if e.downcast_ref::<unmask::cli::PartialTrace>().is_some() => {
            eprintln!("unmask: warning: {}", unmask::glyph::escape_line(&format!("{e:#}")));
            ExitCode::from(unmask::cli::PartialTrace::EXIT)
        }
        Err(e) => fail(&format!("{e:#}")),
    }
}

/// Whether the error comes from writing into a pipe whose reader has closed it (Rust ignores
/// SIGPIPE, so the write fails with EPIPE instead of the process being killed).
fn broken_pipe(e: &anyhow::Error) -> bool {
    use std::io::ErrorKind::BrokenPipe;
    e.chain().any(|c| {
        c.downcast_ref::<std::io::Error>().is_some_and(|io| io.kind() == BrokenPipe)
            || c.downcast_ref::<serde_json::Error>()
                .is_some_and(|j| j.io_error_kind() == Some(BrokenPipe))
    })
}

/// Every error is one line on stderr: the chain of contexts, outermost first. Values from
/// files and flags are echoed in it, so control characters are shown, never sent raw (an ESC
/// could drive the terminal; a newline would break the one line).
fn fail(msg: &str) -> ExitCode {
    eprintln!("unmask: error: {}", unmask::glyph::escape_line(msg));
    ExitCode::FAILURE
}

/// Help and version print as clap renders them (a write that fails is an error, as for the
/// data commands: `--help > /dev/full` exited 0; a closed pipe, `--help | head -1`, ends
/// quietly); usage errors shrink to one line that keeps the list of accepted values.
fn clap_exit(e: clap::Error) -> ExitCode {
    use clap::error::ErrorKind;
    if matches!(
        e.kind(),
        ErrorKind::DisplayHelp
            | ErrorKind::DisplayVersion
            | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
    ) {
        return match e.print().and_then(|()| std::io::Write::flush(&mut std::io::stdout())) {
            Ok(()) => ExitCode::SUCCESS,
            Err(io) if io.kind() == std::io::ErrorKind::BrokenPipe => ExitCode::SUCCESS,
            Err(io) => fail(&format!("stdout: cannot write: {io}")),
        };
    }
    // The value refused is echoed: its control characters shown, as `fail` shows them, before
    // clap's rendering would drop an ESC and a newline would cut the line short.
    let mut e = e;
    use clap::error::{ContextKind, ContextValue};
    if let Some(ContextValue::String(v)) = e.get(ContextKind::InvalidValue) {
        let shown = unmask::glyph::escape_line(v).into_owned();
        e.insert(ContextKind::InvalidValue, ContextValue::String(shown));
    }
    let text = e.render().to_string();
    let mut lines = text.lines().map(str::trim).filter(|l| !l.is_empty());
    let mut first =
        lines.next().unwrap_or("invalid arguments").trim_start_matches("error: ").to_string();
    if first.ends_with(':') {
        // "the argument '[TRACE]' cannot be used with:" lists the other arguments below.
        let listed: Vec<&str> = lines.clone().take_while(|l| !l.starts_with("Usage:")).collect();
        first = format!("{first} {}", listed.join(", "));
    }
    // clap's tip for a misspelt flag or value, which the one line would otherwise drop
    let tip =
        [ContextKind::SuggestedArg, ContextKind::SuggestedValue].into_iter().find_map(|k| match e
            .get(k)
        {
            Some(ContextValue::String(s)) => Some(format!("; did you mean {s}?")),
            Some(ContextValue::Strings(v)) if !v.is_empty() => {
                Some(format!("; did you mean {}?", v.join(" or ")))
            }
            _ => None,
        });
    let values = lines.find(|l| l.starts_with("[possible values:"));
    let values = values.map(|v| {
        let flag = match e.get(ContextKind::InvalidArg) {
            Some(ContextValue::String(a)) => a.split_whitespace().next().unwrap_or("").to_string(),
            _ => String::new(),
        };
        match unmask::cli::value_aliases(&flag) {
            Some(aliases) => format!(" {} (short names: {aliases})", v),
            None => format!(" {v}"),
        }
    });
    fail(&format!("{first}{}{} (see --help)", tip.unwrap_or_default(), values.unwrap_or_default()))
}
