//! The inspector: everything known about one cell at the step shown, and its trajectory, the
//! model's best candidate and its confidence at every step while the cell was still masked,
//! then its commit and every edit (token editing) up to the step shown; an edited cell also
//! has its history on one line, `history ░ → "A" step 3 .41 → "B" step 7 .92`.

use ratatui::buffer::Buffer;
use ratatui::layout::Rect;
use ratatui::style::Style;
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Widget};

use super::app::View;
use super::fields::{self, Field};
use super::theme::Theme;
use crate::format::fixed;
use crate::glyph::{self, Mode};
use crate::sampler::Ranked;
use crate::trace::detok::Piece;
use crate::trace::events::{MoeInfo, Route};
use crate::trace::store::{CellState, TrajPoint};

/// A token as the inspector quotes it: spaces kept (the quotes show them), everything else
/// that would not show made visible.
fn quoted(text: &str) -> String {
    let e = glyph::escape(text, Mode::Prose);
    format!("\"{}\"", e.replace('\n', "↵"))
}

/// A token on its own: its text quoted, or, when it is not whole characters, its bytes as hex
/// unquoted (`<FC>`), so that it never reads as a token whose text is "<FC>".
fn label(run: &crate::trace::store::Run, token: u32) -> String {
    if run.is_raw(token) {
        run.token_label(token).into_owned()
    } else {
        quoted(run.piece(token))
    }
}

/// Code points that had to be drawn as stand-ins, so that the user can tell `␇` from a bell.
fn hidden_codepoints(text: &str) -> Option<String> {
    let odd: Vec<String> = text
        .chars()
        .filter(|&c| c.is_control() || matches!(c, '\u{ad}' | '\u{200b}'..='\u{200f}' | '\u{2060}'..='\u{2064}' | '\u{feff}'))
        .take(6)
        .map(|c| format!("U+{:04X}", c as u32))
        .collect();
    (!odd.is_empty()).then(|| odd.join(" "))
}

/// The panel's border, its titles fitted to `width` columns (the border's own two and a
/// space each side left out): fields go whole, never a figure cut.
fn frame<'a>(v: &View, width: usize) -> Block<'a> {
    let t = v.theme;
    let b = v.run.block_length();
    let room = width.saturating_sub(2);
    let mut title = vec![Span::styled(" Inspector ", t.title())];
    if let Some(pos) = v.focus {
        let dim = |s: String| vec![Span::styled(s, t.dim())];
        let fields = vec![
            Field::new(dim(format!("pos {pos}"))),
            Field::new(dim(format!("block {}", pos / b)))
                .or(2, dim(format!("b{}", pos / b)))
                .drop_at(4),
            Field::new(dim(format!("cell {}/{b}", pos % b + 1)))
                .or(1, dim(format!("{}/{b}", pos % b + 1)))
                .drop_at(3),
        ];
        let l = fields::line(fields, " · ", room.saturating_sub(12));
        title.extend(l.spans);
        title.push(Span::raw(" "));
    }
    let why = match dropped_only(v) {
        _ if v.app.selected.is_some() => fields::cut_words(
            Line::from(Span::styled(" selected · Esc follows the newest commit ", t.faint())),
            room,
        ),
        // The step shown committed only cells past the output (struck through in the grid):
        // the inspector stays on the newest commit that is output, and says why.
        Some(k) => {
            let s = |s: String| vec![Span::styled(s, t.faint())];
            let fields = vec![
                Field::new(s(format!(
                    "the newest output commit: step {}'s commits were all dropped (struck through)",
                    k + 1
                )))
                .or(
                    3,
                    s(format!("newest output commit: step {}'s commits were all dropped", k + 1)),
                )
                .or(4, s(format!("newest output commit: step {} only dropped", k + 1)))
                .or(5, s(format!("step {}: all dropped", k + 1))),
                Field::new(s("↑↓ Tab or click selects".into()))
                    .or(1, s("↑↓ Tab selects".into()))
                    .drop_at(2),
            ];
            let mut l = fields::line(fields, " · ", room.saturating_sub(2));
            l.spans.insert(0, Span::raw(" "));
            l.spans.push(Span::raw(" "));
            l
        }
        None => {
            // A post-edit step commits nothing: the default cell is its first edit.
            let edits_only = v.at.and_then(|k| v.run.step(k)).is_some_and(|s| s.committed == 0);
            let what = if edits_only { "edit" } else { "commit" };
            fields::cut_words(
                Line::from(Span::styled(
                    format!(" the newest {what} · ↑↓ Tab or click selects "),
                    t.faint(),
                )),
                room,
            )
        }
    };
    Block::bordered()
        .border_style(t.border())
        .title(Line::from(title))
        .title_bottom(why.right_aligned())
}

/// The step shown, when every cell it committed is dropped (past `max_new_tokens` or after
/// the EOS): the default focus is then an earlier step's cell (`newest_output_commit`).
fn dropped_only(v: &View) -> Option<usize> {
    let k = v.at?;
    v.run.step(k)?.first_commit.filter(|&p| p >= v.run.output_end(v.at)).map(|_| k)
}

pub fn render(v: &View, area: Rect, buf: &mut Buffer) {
    let block = frame(v, area.width as usize);
    let inner = block.inner(area);
    block.render(area, buf);
    let lines = match v.focus {
        Some(pos) => cell_lines(v, pos, inner.width as usize, inner.height as usize),
        None => vec![Line::from(Span::styled(
            "no cell yet: ↑↓/j/k/Tab or a click selects one",
            v.theme.dim(),
        ))],
    };
    // Whatever is still too wide is cut between words and marked, never inside a figure.
    for (i, line) in lines.into_iter().take(inner.height as usize).enumerate() {
        buf.set_line(
            inner.x,
            inner.y + i as u16,
            &fields::cut_words(line, inner.width as usize),
            inner.width,
        );
    }
}

/// `E2 89 88`: bytes as hex.
fn hex_bytes(b: &[u8]) -> String {
    b.iter().map(|b| format!("{b:02X}")).collect::<Vec<_>>().join(" ")
}

fn kv<'a>(v: &View, k: &'a str, val: String) -> [Span<'a>; 2] {
    [Span::styled(k, v.theme.label()), Span::styled(val, v.theme.value())]
}

fn cell_lines<'a>(v: &View, pos: usize, width: usize, height: usize) -> Vec<Line<'a>> {
    let t = v.theme;
    let run = v.run;
    let span = run.step_span();
    // A masked cell's candidate is what the step drew: the most probable token when greedy,
    // a sample (not always the most probable) otherwise.
    let greedy = run.settings_for(pos / run.block_length()).0.sampling.is_greedy();
    let mut out = Vec::new();
    let token_line = |token: u32, extra: Vec<Span<'a>>| {
        let text = run.piece(token);
        // The token gives way (cut, with `…`) before its id does.
        let id = token.to_string();
        let q = label(run, token);
        let q = glyph::fit(&q, width.saturating_sub(6 + 5 + id.len()).max(3)).0.into_owned();
        let mut l: Vec<Span> = kv(v, "token ", q).into();
        l.extend(kv(v, "  id ", id));
        l.extend(extra);
        let mut lines = vec![Line::from(l)];
        if let Some(cp) = hidden_codepoints(text) {
            lines.push(Line::from(vec![
                Span::styled("      ", t.label()),
                Span::styled(cp, t.dim()),
            ]));
        }
        // A token that splits a character: its raw bytes, and what the cell shows for them.
        let shown = run.cell_piece(pos, v.at);
        let plain = |p: &Piece| {
            matches!(p, Piece::Text(t) if t.valid() == Some(text)) && !run.is_raw(token)
        };
        if shown.as_ref().is_some_and(|p| !plain(p)) {
            let mut l: Vec<Span> = kv(v, "bytes ", hex_bytes(run.token_bytes(token))).into();
            let cell = match shown {
                Some(Piece::Text(t)) if t.is_empty() => "completed by a later cell".to_string(),
                // Bytes that are no character where they stand: the grid's hex, said so.
                Some(Piece::Text(t)) if t.valid().is_none() => {
                    let rest = t.render(quoted);
                    format!("{rest}  (invalid UTF-8)")
                }
                Some(Piece::Text(t)) => quoted(&t.display()),
                _ => "waiting on a masked neighbour".to_string(),
            };
            l.extend(kv(v, "  text ", cell));
            lines.push(Line::from(l));
        }
        lines
    };
    match run.cell(pos, v.at) {
        CellState::Prompt { token } => {
            out.extend(token_line(token, vec![]));
            out.push(Line::from(Span::styled("prompt: never masked, never decoded", t.dim())));
            return out;
        }
        CellState::Decoded(d) => {
            out.extend(token_line(d.token, vec![]));
            // 1-based, as the timeline and the steps list count (the trace's `step` is 0-based).
            // Narrow, the words shorten and the fields go before a figure would be cut.
            let dim = |s: String| vec![Span::styled(s, t.dim())];
            let block = pos / run.block_length();
            let set = if d.edited() { "edited at " } else { "decoded at " };
            let fields = vec![
                Field::new(vec![Span::styled(set, t.label())]).drop_at(3),
                Field::new(vec![Span::styled(
                    format!(" step {} ", d.step + 1),
                    t.cell_style(d.step, span),
                )]),
                Field::new(dim(format!(" of block {block}")))
                    .or(2, dim(format!(" block {block}")))
                    .or(5, dim(format!(" b{block}")))
                    .drop_at(7),
                Field::new(dim(format!(" · decode step {}", d.at + 1)))
                    .or(1, dim(format!(" · overall {}", d.at + 1)))
                    .or(4, dim(format!(" · #{}", d.at + 1)))
                    .drop_at(6),
            ];
            out.push(fields::line(fields, "", width));
            let mut fields = vec![
                Field::new(kv(v, "conf ", fixed(d.conf.into(), 3)).into()),
                Field::new(
                    kv(v, "entropy ", format!("{} nats", fixed(d.entropy.into(), 3))).into(),
                )
                .or(1, kv(v, "entropy ", fixed(d.entropy.into(), 3)).into())
                .drop_at(3),
            ];
            if let Some(m) = margin(run.top(pos, d.at)) {
                fields.push(
                    Field::new(kv(v, "margin ", fixed(m.into(), 3)).into())
                        .or(2, kv(v, "Δ ", fixed(m.into(), 3)).into())
                        .drop_at(4),
                );
            }
            out.push(fields::line(fields, "  ", width));
            if d.edited() {
                // Two lines at most: the trajectory below lists every point anyway.
                let room = height.saturating_sub(out.len()).clamp(1, 2);
                out.extend(history_lines(v, pos, d.at, width, room));
            }
            if pos >= run.output_end(v.at) {
                out.push(Line::from(Span::styled(
                    "dropped: after the EOS or beyond max_new_tokens",
                    t.warn(),
                )));
            }
            // The route of the pass that set the token held (its commit, or its newest edit).
            let routes = run.routes_at(pos, d.at);
            if let (Some(routes), Some(moe)) = (routes, run.header.model.moe.as_ref()) {
                // What is left after the strip's two lines and a three-line trajectory.
                let id_lines = height.saturating_sub(out.len() + 2 + 3).max(1);
                out.extend(routing_lines(v, &routes, moe, width, id_lines));
            }
        }
        CellState::Masked { cand: None } => {
            out.push(Line::from(Span::styled(
                format!("{} masked: its block has not started at this step", glyph::MASK),
                t.dim(),
            )));
            return out;
        }
        CellState::Masked { cand: Some(c) } => {
            out.push(Line::from(Span::styled(
                format!("{} masked", glyph::MASK),
                Style::default().fg(t.mask_active_fg),
            )));
            let conf = fixed(c.conf.into(), 3);
            let q = label(run, c.token);
            let q = glyph::fit(&q, width.saturating_sub(6 + 7 + conf.len()).max(3)).0.into_owned();
            let pick = if greedy { "best  " } else { "drawn " };
            let mut fields =
                vec![Field::new(kv(v, pick, q).into()), Field::new(kv(v, "conf ", conf).into())];
            let newest = v.at.and_then(|k| run.trajectory(pos, k).last().map(|p| p.at));
            if let Some(m) = newest.and_then(|at| margin(run.top(pos, at))) {
                fields.push(
                    Field::new(kv(v, "margin ", fixed(m.into(), 3)).into())
                        .or(1, kv(v, "Δ ", fixed(m.into(), 3)).into())
                        .drop_at(2),
                );
            }
            out.push(fields::line(fields, "  ", width));
        }
    }
    let Some(k) = v.at else { return out };
    let traj = run.trajectory(pos, k);
    let room = height.saturating_sub(out.len() + 1);
    let ranked = traj.iter().map(|p| run.top(pos, p.at).len()).max().unwrap_or(0);
    if ranked > 0 {
        out.push(Line::from(Span::styled(
            format!("trajectory: top {ranked} per step · Δ = p1 − p2"),
            t.faint(),
        )));
    } else {
        let what = if greedy {
            "trajectory: best candidate per step while masked"
        } else {
            "trajectory: drawn candidate per step while masked"
        };
        // With edits the points after the commit are named, in words that fit a narrow panel.
        let what = match traj.iter().any(|p| p.edited) {
            true => what.replace(" per step", "") + ", ✓ commit, ✎ edits",
            false => what.to_string(),
        };
        // Too short a panel for the `… N earlier` line: the heading says what is left out.
        let hidden = traj.len().saturating_sub(room.max(1));
        let what = match hidden {
            h if h > 0 && room < 3 => {
                format!("trajectory: newest {} of {} shown", room.max(1), traj.len())
            }
            _ => what,
        };
        out.push(Line::from(Span::styled(what, t.faint())));
    }
    out.extend(trajectory(v, pos, &traj, width, room));
    out
}

/// `history ░ → " cat" step 2 .41 → " dog" step 5 .91`: every token the cell held up to step
/// index `k`, oldest first, each with the step (1-based, in its hue) that set it and its
/// confidence; the one it holds now in the text colour. Wrapped between tokens, never inside
/// one's figures, in at most `max_lines` lines: a longer history keeps its commit and its
/// newest tokens, `→ …7` standing for the seven between (the trajectory lists them all).
fn history_lines<'a>(
    v: &View,
    pos: usize,
    k: usize,
    width: usize,
    max_lines: usize,
) -> Vec<Line<'a>> {
    let t = v.theme;
    let span = v.run.step_span();
    let history = v.run.history(pos, k);
    let groups: Vec<Vec<Span<'a>>> = history
        .iter()
        .enumerate()
        .map(|(i, h)| {
            let now = i + 1 == history.len();
            vec![
                Span::styled(" → ", t.faint()),
                Span::styled(label_of(v, h.token), if now { t.text() } else { t.dim() }),
                Span::styled(
                    format!(" step {}", h.step + 1),
                    Style::default().fg(t.step_text_color(h.step, span)),
                ),
                Span::styled(format!(" {}", short_p(h.conf)), t.dim()),
            ]
        })
        .collect();
    let all = flow_history(t, groups.clone(), width);
    if all.len() <= max_lines.max(1) || groups.len() < 3 {
        return all;
    }
    // The commit, the elision, then as many of the newest as fit; too narrow for that, the
    // newest alone after the elision (the token held is what must show).
    let n = groups.len();
    let tries = (1..n - 1).rev().map(|newest| (true, newest)).chain([(false, 1)]);
    let mut lines = all;
    for (commit, newest) in tries {
        let skipped = n - newest - usize::from(commit);
        let mut kept: Vec<Vec<Span<'a>>> = Vec::new();
        if commit {
            kept.push(groups[0].clone());
        }
        kept.push(vec![Span::styled(format!(" → …{skipped}"), t.faint())]);
        kept.extend(groups[n - newest..].iter().cloned());
        lines = flow_history(t, kept, width);
        if lines.len() <= max_lines.max(1) {
            break;
        }
    }
    lines
}

/// The history's groups flowed into lines of `width` columns after its label.
fn flow_history<'a>(t: &Theme, groups: Vec<Vec<Span<'a>>>, width: usize) -> Vec<Line<'a>> {
    let label = "history ";
    let mut lines: Vec<Vec<Span<'a>>> =
        vec![vec![Span::styled(label, t.label()), Span::styled(glyph::MASK, t.faint())]];
    let mut used = label.len() + 1;
    for group in groups {
        let w: usize = group.iter().map(Span::width).sum();
        if used + w > width && used > label.len() + 1 {
            lines.push(vec![Span::raw(" ".repeat(label.len()))]);
            used = label.len();
        }
        used += w;
        lines.last_mut().expect("never empty").extend(group);
    }
    lines.into_iter().map(Line::from).collect()
}

/// A token as the history quotes it, cut to a dozen columns (the trajectory has it whole).
fn label_of(v: &View, token: u32) -> String {
    glyph::fit(&label(v.run, token), 12).0.into_owned()
}

/// `--routing`: the committed token's route through the sparse layers, as it was in the pass
/// that committed it. A strip with one column per layer, the top expert's weight as the
/// column's height (how concentrated the routing is, readable without colour), then the top
/// expert of every layer, `per line` to a line after the first layer's number, in at most
/// `max_lines` lines.
fn routing_lines<'a>(
    v: &View,
    routes: &[Route],
    moe: &MoeInfo,
    width: usize,
    max_lines: usize,
) -> Vec<Line<'a>> {
    const LEVELS: [char; 8] = ['▁', '▂', '▃', '▄', '▅', '▆', '▇', '█'];
    let t = v.theme;
    let label = "route ";
    let mut out = vec![Line::from(vec![
        Span::styled(label, t.label()),
        Span::styled(
            format!("top-1 weight by layer · {} of {}", moe.top_k, moe.experts),
            t.faint(),
        ),
    ])];
    let top = |r: &Route| r.weights.first().copied().unwrap_or(0.0);
    let strip: String = routes
        .iter()
        .map(|r| LEVELS[((top(r).clamp(0.0, 1.0) * 8.0).ceil() as usize).clamp(1, 8) - 1])
        .collect();
    let (strip, _) = glyph::fit(&strip, width.saturating_sub(label.len()));
    out.push(Line::from(vec![
        Span::raw(" ".repeat(label.len())),
        Span::styled(strip.to_string(), t.value()),
    ]));
    // `L12 ` then each layer's top expert, right-aligned to the widest id.
    let id_w = (moe.experts.max(1) - 1).to_string().len() + 1;
    let layer_w = format!("L{} ", moe.sparse_layers.last().copied().unwrap_or(0)).len();
    let per_line = (width.saturating_sub(layer_w) / id_w).max(1);
    let chunks: Vec<&[Route]> = routes.chunks(per_line).collect();
    for (i, chunk) in chunks.iter().enumerate().take(max_lines) {
        let first = moe.sparse_layers.get(i * per_line).copied().unwrap_or(0);
        let mut l = vec![Span::styled(format!("{:<layer_w$}", format!("L{first}")), t.faint())];
        for r in *chunk {
            let e = r.experts.first().map_or("-".to_string(), u32::to_string);
            l.push(Span::styled(format!("{e:>id_w$}"), t.value()));
        }
        if i + 1 == max_lines && chunks.len() > max_lines {
            l.push(Span::styled(" …", t.faint()));
        }
        out.push(Line::from(l));
    }
    out
}

/// p1 - p2 of a `--candidates` list (p1 alone when nothing else could be drawn); `None`
/// without a list.
fn margin(top: &[Ranked]) -> Option<f32> {
    let p1 = top.first()?.p;
    Some(p1 - top.get(1).map_or(0.0, |r| r.p))
}

/// `0.41` as `.41`: a candidate list is tight on room.
fn short_p(p: f32) -> String {
    let s = format!("{p:.2}");
    match s.strip_prefix('0') {
        Some(rest) => rest.to_string(),
        None => s,
    }
}

/// A trajectory line's candidates: the margin, then as many `"text" .41` as fit in `width`
/// columns, the token the step drew (or committed) in the text style.
fn ranked_spans<'a>(v: &View, top: &[Ranked], chosen: u32, width: usize) -> Vec<Span<'a>> {
    let t = v.theme;
    let m = margin(top).unwrap_or(0.0);
    let mut out = vec![Span::styled(format!("Δ{} ", short_p(m)), t.value())];
    let mut left = width.saturating_sub(6);
    for r in top {
        let p = format!(" {} ", short_p(r.p));
        // At least a quote, a character and a quote, then its probability.
        if left < 3 + p.len() {
            break;
        }
        let q = label(v.run, r.token);
        let (text, tw) = glyph::fit(&q, (left - p.len()).min(10));
        left -= tw + p.len();
        let style = if r.token == chosen { t.text() } else { t.dim() };
        out.push(Span::styled(text.to_string(), style));
        out.push(Span::styled(p, t.faint()));
    }
    out
}

/// One line per step, newest last; if they do not all fit, the oldest give way.
fn trajectory<'a>(
    v: &View,
    pos: usize,
    traj: &[TrajPoint],
    width: usize,
    room: usize,
) -> Vec<Line<'a>> {
    let t = v.theme;
    let span = v.run.step_span();
    // When they do not all fit, the newest win; a note says how many gave way if there is
    // room for it and a point or two besides.
    let room = room.max(1);
    let skip = if traj.len() <= room {
        0
    } else if room >= 3 {
        traj.len() - room + 1
    } else {
        traj.len() - room
    };
    let noted = skip > 0 && room >= 3;
    let text_w = 12;
    let bar_w = width.saturating_sub(4 + 2 + text_w + 7).clamp(1, 24);
    let final_token = traj.last().filter(|p| p.committed || p.edited).map(|p| p.token);
    let mut out = Vec::new();
    if noted {
        out.push(Line::from(Span::styled(format!("  … {skip} earlier"), t.faint())));
    }
    for p in traj.iter().skip(skip) {
        let hue = t.step_text_color(p.step, span);
        let top = v.run.top(pos, p.at);
        if !top.is_empty() {
            let mut l = vec![
                Span::styled(format!("{:>3} ", p.step + 1), Style::default().fg(hue)),
                Span::styled(point_mark(p), Style::default().fg(hue)),
            ];
            l.extend(ranked_spans(v, top, p.token, width.saturating_sub(6)));
            out.push(Line::from(l));
            continue;
        }
        let q = label(v.run, p.token);
        let (text, tw) = glyph::fit(&q, text_w);
        // Padded by display width: a wide character takes two columns.
        let text = format!("{text}{}", " ".repeat(text_w - tw));
        let text_style = if Some(p.token) == final_token { t.text() } else { t.dim() };
        out.push(Line::from(vec![
            Span::styled(format!("{:>3} ", p.step + 1), Style::default().fg(hue)),
            Span::styled(point_mark(p), Style::default().fg(hue)),
            Span::styled(text, text_style),
            Span::styled(format!(" {} ", fixed(p.conf.into(), 2)), t.dim()),
            Span::styled(bar(p.conf, bar_w), Style::default().fg(hue)),
        ]));
    }
    out
}

/// `✓` for the commit, `✎` for an edit, blank while masked.
fn point_mark(p: &TrajPoint) -> &'static str {
    match (p.committed, p.edited) {
        (true, _) => "✓ ",
        (_, true) => "✎ ",
        _ => "  ",
    }
}

/// A horizontal bar of `conf * width` columns in eighths.
fn bar(conf: f32, width: usize) -> String {
    const EIGHTHS: [char; 8] = ['▏', '▎', '▍', '▌', '▋', '▊', '▉', '█'];
    let eighths = (conf.clamp(0.0, 1.0) * (width * 8) as f32).round() as usize;
    let mut s = "█".repeat(eighths / 8);
    if !eighths.is_multiple_of(8) {
        s.push(EIGHTHS[eighths % 8 - 1]);
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::synth::{self, Synth};
    use crate::tui::app::App;
    use crate::tui::testing::{render_panel, snapshot_text};
    use crossterm::event::{KeyCode, KeyEvent, KeyModifiers};

    fn app() -> App {
        let mut app = App::replay(synth::trace(&Synth::small()), "t".into(), None);
        app.on_key(KeyEvent::new(KeyCode::End, KeyModifiers::NONE));
        app
    }

    #[test]
    fn inspector_of_a_token_that_splits_a_character() {
        let mut app = App::replay(synth::split_trace(), "t".into(), None);
        app.on_key(KeyEvent::new(KeyCode::End, KeyModifiers::NONE));
        // Cell 9 holds A4 96, the end of 🤖 (F0 9F A4 96), which it shows whole.
        app.selected = Some(9);
        let text = snapshot_text(&render_panel(&app, 56, 12, render));
        assert!(text.contains("A4 96") && text.contains("🤖"), "{text}");
        insta::assert_snapshot!(text);
    }

    /// Invalid UTF-8 reads as hex in the grid's cell and here alike, never as `�`, and is not
    /// said to be completed by a later cell.
    #[test]
    fn inspector_of_invalid_bytes_agrees_with_the_grid() {
        let events = synth::invalid_split_trace();
        let mut app = App::replay(events, "t".into(), None);
        app.on_key(KeyEvent::new(KeyCode::End, KeyModifiers::NONE));
        let run = app.view().unwrap().run;
        let cells: Vec<String> =
            (5..8).map(|p| run.cell_piece(p, run.head()).unwrap().display()).collect();
        assert_eq!(cells, [" <E4 BD>", "<FC>", "<A5 BD>"]);
        for (pos, want) in [
            (5, r#"text " "<E4 BD>  (invalid UTF-8)"#),
            (6, "text <FC>  (invalid UTF-8)"),
            (7, "text <A5 BD>  (invalid UTF-8)"),
        ] {
            app.selected = Some(pos);
            let text = snapshot_text(&render_panel(&app, 64, 12, render));
            assert!(text.contains(want), "{text}");
            assert!(
                !text.contains('\u{FFFD}') && !text.contains("completed by a later cell"),
                "{text}"
            );
        }
        app.selected = Some(6);
        insta::assert_snapshot!(snapshot_text(&render_panel(&app, 64, 12, render)));
    }

    /// A certain token's entropy comes out as -0.0 (or a hair below zero): shown as 0.000.
    #[test]
    fn no_negative_zero_entropy() {
        let mut events = synth::trace(&Synth::small());
        let pos = events
            .iter_mut()
            .find_map(|e| match e {
                crate::trace::events::Event::Step(s) if !s.committed.is_empty() => {
                    s.committed[0].entropy = -0.0;
                    Some(s.committed[0].pos)
                }
                _ => None,
            })
            .unwrap();
        let mut app = App::replay(events, "t".into(), None);
        app.on_key(KeyEvent::new(KeyCode::End, KeyModifiers::NONE));
        app.selected = Some(pos);
        let text = snapshot_text(&render_panel(&app, 56, 12, render));
        assert!(text.contains("entropy 0.000 nats"), "{text}");
        assert!(!text.contains("-0.0"), "{text}");
    }

    /// `--routing`: a decoded cell shows its route's strip and each layer's top expert, with
    /// room left for the trajectory; a cell without routes shows neither.
    #[test]
    fn inspector_shows_the_route_strip_of_a_routed_token() {
        let moe = synth::sdar_moe_layout();
        let mut app =
            App::replay(synth::with_routes(synth::trace(&Synth::small()), &moe), "t".into(), None);
        app.on_key(KeyEvent::new(KeyCode::End, KeyModifiers::NONE));
        app.selected = Some(13);
        let routes = app.view().unwrap().run.routes(13).unwrap();
        let text = snapshot_text(&render_panel(&app, 58, 16, render));
        assert!(text.contains("top-1 weight by layer · 8 of 128"), "{text}");
        let first = routes[0].experts[0].to_string();
        let line = text.lines().find(|l| l.contains("L0 ")).unwrap_or_else(|| panic!("{text}"));
        assert!(line.split_whitespace().nth(1) == Some(first.as_str()), "{line} / {first}");
        assert!(text.contains("trajectory"), "{text}");
        insta::assert_snapshot!(text);
        app.selected = Some(2); // a prompt cell
        assert!(!snapshot_text(&render_panel(&app, 58, 16, render)).contains("route"));
    }

    #[test]
    fn inspector_of_a_decoded_cell() {
        let mut app = app();
        app.selected = Some(13);
        insta::assert_snapshot!(snapshot_text(&render_panel(&app, 56, 12, render)));
    }

    /// At the end of the synthetic decode the last step committed only dropped cells: the
    /// inspector stays on the newest output commit and says why it is not the step shown's
    /// cell; selecting the dropped cell says it is dropped.
    #[test]
    fn inspector_says_why_it_is_not_on_the_step_shown() {
        let mut app = app();
        let v = app.view().unwrap();
        let k = v.at.unwrap();
        let dropped = v.run.step(k).unwrap().first_commit.unwrap();
        assert!(dropped >= v.run.output_end(v.at));
        let shots: Vec<String> = [100, 63, 40]
            .iter()
            .map(|&w| snapshot_text(&render_panel(&app, w, 12, render)))
            .collect();
        let bottom = |s: &String| s.lines().last().unwrap().to_string();
        assert!(
            bottom(&shots[0]).contains(&format!(
                "the newest output commit: step {}'s commits were all dropped (struck through)",
                k + 1
            )),
            "{}",
            shots[0]
        );
        assert!(
            bottom(&shots[1]).contains(&format!(
                "newest output commit: step {}'s commits were all dropped",
                k + 1
            )),
            "{}",
            shots[1]
        );
        assert!(bottom(&shots[2]).contains(&format!("step {}", k + 1)), "{}", shots[2]);
        app.selected = Some(dropped);
        let s = snapshot_text(&render_panel(&app, 63, 12, render));
        assert!(
            s.contains("dropped: after the EOS or beyond max_new_tokens")
                && s.contains("selected · Esc"),
            "{s}"
        );
        insta::assert_snapshot!(shots[1]);
    }

    #[test]
    fn inspector_of_a_masked_cell() {
        let mut app = app();
        app.on_key(KeyEvent::new(KeyCode::Home, KeyModifiers::NONE));
        app.on_key(KeyEvent::new(KeyCode::Char(']'), KeyModifiers::NONE));
        app.on_key(KeyEvent::new(KeyCode::Right, KeyModifiers::NONE));
        let v = app.view().unwrap();
        let masked =
            (8..12).find(|&p| matches!(v.run.cell(p, v.at), CellState::Masked { .. })).unwrap();
        app.selected = Some(masked);
        insta::assert_snapshot!(snapshot_text(&render_panel(&app, 56, 12, render)));
    }

    /// A sampled decode's masked cell holds the step's draw, which need not be the most
    /// probable token: the inspector says "drawn", not "best".
    #[test]
    fn a_sampled_masked_cell_is_called_drawn() {
        let mut events = synth::trace(&Synth::small());
        if let crate::trace::events::Event::Header(h) = &mut events[0] {
            h.settings.sampling.temperature = 0.7;
        }
        let mut app = App::replay(events, "t".into(), None);
        for k in [KeyCode::Home, KeyCode::Char(']'), KeyCode::Right] {
            app.on_key(KeyEvent::new(k, KeyModifiers::NONE));
        }
        let v = app.view().unwrap();
        app.selected = (8..12).find(|&p| matches!(v.run.cell(p, v.at), CellState::Masked { .. }));
        let text = snapshot_text(&render_panel(&app, 56, 12, render));
        assert!(
            text.contains("drawn ")
                && text.contains("drawn candidate per step")
                && !text.contains("best"),
            "{text}"
        );
    }

    #[test]
    fn inspector_of_a_prompt_cell_and_a_control_character() {
        let mut app = app();
        app.selected = Some(2);
        let prompt = snapshot_text(&render_panel(&app, 56, 8, render));
        assert!(prompt.contains("\" sat\"") && prompt.contains("prompt"), "{prompt}");
        // The vocabulary's bell sits at some decoded position.
        let id = synth::VOCAB.iter().position(|&t| t == "\u{7}").unwrap() as u32;
        let v = app.view().unwrap();
        let bell = (6..32)
            .find(|&p| matches!(v.run.cell(p, v.at), CellState::Decoded(d) if d.token == id))
            .unwrap();
        app.selected = Some(bell);
        let s = snapshot_text(&render_panel(&app, 56, 12, render));
        assert!(s.contains("\"␇\"") && s.contains("U+0007"), "{s}");
    }

    #[test]
    fn inspector_shows_candidates_and_margins_at_every_step() {
        let mut app =
            App::replay(synth::with_candidates(synth::trace(&Synth::small()), 3), "t".into(), None);
        app.on_key(KeyEvent::new(KeyCode::End, KeyModifiers::NONE));
        app.selected = Some(13);
        let text = snapshot_text(&render_panel(&app, 56, 12, render));
        let v = app.view().unwrap();
        let CellState::Decoded(d) = v.run.cell(13, v.at) else { panic!("cell 13 is decoded") };
        let top = v.run.top(13, d.at);
        assert_eq!(top.len(), 3);
        let want = format!("margin {:.3}", top[0].p - top[1].p);
        assert!(text.contains(&want) && text.contains("top 3 per step"), "{want}\n{text}");
        insta::assert_snapshot!(text);
    }

    /// Words of a screen that carry a figure, the panel's border and quotes aside.
    fn figures(s: &str) -> Vec<String> {
        s.split(|c: char| c.is_whitespace() || "│┌┐└┘─\"".contains(c))
            .filter(|w| w.chars().any(|c| c.is_ascii_digit()))
            .map(str::to_string)
            .collect()
    }

    /// `decoded at  step 4  of block 132 · decode step 5` read as decode step 5 when it was
    /// 514: at any width every figure is whole; words shorten and fields go instead.
    #[test]
    fn no_figure_is_ever_cut_in_the_inspector() {
        let mut app = App::replay(
            synth::with_candidates(synth::trace(&Synth { new_tokens: 520, ..Synth::small() }), 3),
            "t".into(),
            None,
        );
        app.on_key(KeyEvent::new(KeyCode::End, KeyModifiers::NONE));
        app.selected = Some(520);
        let wide = snapshot_text(&render_panel(&app, 200, 12, render));
        assert!(
            wide.contains("of block 130 · decode step")
                && wide.contains("pos 520 · block 130 · cell 1/4"),
            "{wide}"
        );
        let mut whole = figures(&wide);
        let at = wide
            .split("decode step ")
            .nth(1)
            .and_then(|s| s.split_whitespace().next())
            .unwrap()
            .to_string();
        whole.extend([format!("#{at}"), "b130".into(), "1/4".into(), "3".into()]);
        for w in 24..80 {
            let s = snapshot_text(&render_panel(&app, w, 12, render));
            for f in figures(&s)
                .into_iter()
                .filter(|f| !f.starts_with('.') && !f.contains('…') && !f.starts_with('Δ'))
            {
                assert!(whole.contains(&f), "{w} columns: {f:?} is cut\n{s}");
            }
        }
        insta::assert_snapshot!(snapshot_text(&render_panel(&app, 30, 12, render)));
    }

    /// The editing trace at step index `k`, cell `pos` selected.
    fn edits_app(k: usize, pos: usize) -> App {
        let mut app = App::replay(synth::trace(&Synth::small_edits()), "t".into(), None);
        app.on_key(KeyEvent::new(KeyCode::Home, KeyModifiers::NONE));
        for _ in 0..k {
            app.on_key(KeyEvent::new(KeyCode::Right, KeyModifiers::NONE));
        }
        app.selected = Some(pos);
        app
    }

    /// Position 11 was committed at step 1, edited at step 4 and again at block 2's post-step
    /// (step 5): the inspector gives its whole history up to the step shown, and the
    /// trajectory ends on the commit and the edits; a step back, one edit fewer.
    #[test]
    fn inspector_of_an_edited_cell_gives_its_history() {
        let app = edits_app(7, 11);
        let text = snapshot_text(&render_panel(&app, 64, 14, render));
        assert!(
            text.contains(r#"history ░ → " dream" step 1 .38 → " fish" step 4 .87"#)
                && text.contains(r#"         → " and" step 5 .85"#)
                && text.contains("edited at  step 5")
                && text.contains("✓ \" dream\"")
                && text.contains("✎ \" and\""),
            "{text}"
        );
        let back = edits_app(6, 11);
        let before = snapshot_text(&render_panel(&back, 64, 14, render));
        assert!(
            before.contains(r#"history ░ → " dream" step 1 .38 → " fish" step 4 .87"#),
            "{before}"
        );
        assert!(!before.contains(r#"" and""#), "{before}");
        // Before its first edit the cell reads as never edited.
        let plain = snapshot_text(&render_panel(&edits_app(5, 11), 64, 14, render));
        assert!(plain.contains("decoded at") && !plain.contains("history"), "{plain}");
        // Narrow: the history wraps between tokens, in two lines at most: the commit, the
        // newest, and how many between them gave way (the trajectory has them).
        let narrow = snapshot_text(&render_panel(&app, 40, 16, render));
        assert!(narrow.contains(r#"history ░ → " dream" step 1 .38 → …1"#), "{narrow}");
        assert!(narrow.contains(r#"         → " and" step 5 .85"#), "{narrow}");
        insta::assert_snapshot!(format!("{text}\n{before}\n{narrow}"));
    }

    /// At a post-step the inspector follows the step's first edit (it committed nothing).
    #[test]
    fn a_post_step_shows_its_first_edit() {
        let mut app = edits_app(7, 0);
        app.selected = None;
        let v = app.view().unwrap();
        assert_eq!(v.focus, Some(10));
    }

    #[test]
    fn bars_scale_with_confidence() {
        assert_eq!(bar(1.0, 4), "████");
        assert_eq!(bar(0.5, 4), "██");
        assert_eq!(bar(0.0, 4), "");
        assert_eq!(bar(0.53, 4).chars().count(), 3);
    }
}
