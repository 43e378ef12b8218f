use std::process::ExitCode;

use clap::Parser;
use unmask::cli::{Cli, Command};

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match &cli.command {
        Some(Command::Trace { decode, out }) => unmask::commands::trace::run(decode, out.as_deref()),
        Some(Command::Replay { file }) => unmask::commands::replay::run(file),
        None => unmask::commands::tui::run(&cli.decode),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // One line: the chain of contexts, outermost first.
            eprintln!("unmask: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
