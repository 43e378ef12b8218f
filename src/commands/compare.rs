//! `unmask compare`: the same prompt decoded under two settings, compared.

use anyhow::{bail, Result};

use crate::cli::DecodeArgs;
use crate::compare::{compare, table};
use crate::engine::decode;
use crate::events::{Event, FinishReason};
use crate::session::Session;

/// Decodes one side to the end and returns its events.
pub fn decode_side(args: &DecodeArgs, side: &str) -> Result<Vec<Event>> {
    let mut s = Session::open(args)?;
    let mut events = Vec::new();
    let fin = decode(&mut s.denoiser, &s.tokenizer, &s.request, &mut |e| events.push(e), None);
    if fin.reason == FinishReason::Error {
        bail!("decode {side} failed: {}", fin.error.unwrap_or_default());
    }
    Ok(events)
}

pub fn headless(a: &DecodeArgs, b: &DecodeArgs) -> Result<()> {
    let ea = decode_side(a, "A")?;
    let eb = decode_side(b, "B")?;
    let text = |ev: &[Event]| match ev.last() {
        Some(Event::Finish(f)) => f.text.clone(),
        _ => String::new(),
    };
    let (ta, tb) = (text(&ea), text(&eb));
    print!("{}", table(&compare(&ea, &eb), [&ta, &tb]));
    Ok(())
}
