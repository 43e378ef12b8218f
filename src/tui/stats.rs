//! Stats at the step shown: throughput (per forward, per block, per second), token edits (the
//! step's, the run's, and the post-edit steps: those after a block's last mask), the settings
//! in force for the block shown and since which block, settings waiting to apply, and a chart
//! of tokens committed per step coloured by step, `✎` over a step that edited.

use ratatui::buffer::Buffer;
use ratatui::layout::Rect;
use ratatui::style::Style;
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Widget};

use super::app::View;
use super::fields;
use crate::engine::settings::{DecodeSettings, Schedule, Strategy};
use crate::format::fixed;
use crate::glyph;

fn frame<'a>(v: &View) -> Block<'a> {
    Block::bordered()
        .border_style(v.theme.border())
        .title(Line::from(Span::styled(" Stats ", v.theme.title())))
}

pub fn render(v: &View, area: Rect, buf: &mut Buffer) {
    let block = frame(v);
    let inner = block.inner(area);
    block.render(area, buf);
    let w = inner.width as usize;
    let mut lines = flow(rates(v), w);
    lines.extend(flow(edit_groups(v), w));
    lines.extend(flow(routing_groups(v), w));
    lines.extend(flow(settings_groups(v), w));
    if let Some(p) = v.app.pending() {
        lines.extend(flow(pending_groups(v, p), w));
    }
    let chart_h = (inner.height as usize).saturating_sub(lines.len()).min(4);
    // A group wider than the panel on its own is cut between words and marked, never inside
    // a figure.
    for (i, line) in lines.into_iter().take(inner.height as usize).enumerate() {
        buf.set_line(inner.x, inner.y + i as u16, &fields::cut_words(line, w), inner.width);
    }
    if chart_h > 0 {
        let top = inner.y + inner.height - chart_h as u16;
        chart(v, Rect { y: top, height: chart_h as u16, ..inner }, buf);
    }
}

/// Lays groups of spans (a label and its value) out left to right, starting a new line
/// whenever the next group would not fit, so that a narrow panel wraps instead of cutting.
fn flow<'a>(groups: Vec<Vec<Span<'a>>>, width: usize) -> Vec<Line<'a>> {
    if groups.is_empty() {
        return Vec::new();
    }
    let mut lines: Vec<Vec<Span>> = vec![Vec::new()];
    let mut used = 0;
    // A group's trailing gap may hang past the edge.
    let text_w = |g: &[Span]| {
        g.iter().map(Span::width).sum::<usize>()
            - g.last().map_or(0, |s| s.width() - glyph::width(s.content.trim_end()))
    };
    for mut g in groups {
        // Too wide for a line of its own: the value without its label (`strategy`), which the
        // value names well enough.
        if text_w(&g) > width && g.len() > 2 {
            g.remove(0);
        }
        let gw: usize = g.iter().map(Span::width).sum();
        if used > 0 && used + text_w(&g) > width {
            lines.push(Vec::new());
            used = 0;
        }
        used += gw;
        lines.last_mut().expect("never empty").extend(g);
    }
    for l in &mut lines {
        if let Some(last) = l.last_mut() {
            last.content = last.content.trim_end().to_string().into();
        }
    }
    lines.into_iter().map(Line::from).collect()
}

fn kv<'a>(v: &View, k: &str, val: String) -> Vec<Span<'a>> {
    vec![
        Span::styled(format!("{k} "), v.theme.label()),
        Span::styled(val, v.theme.value()),
        Span::raw("   "),
    ]
}

/// Throughput up to the step shown. Rates use the events' own clock, so a replay shows the
/// figures of the recording.
fn rates<'a>(v: &View) -> Vec<Vec<Span<'a>>> {
    let Some(s) = v.at.and_then(|k| v.run.step(k)) else {
        return vec![vec![Span::styled("waiting for the first step…", v.theme.dim())]];
    };
    let secs = (s.t_ms / 1000.0).max(1e-9);
    let per_block =
        v.at.and_then(|k| v.run.forwards_per_block(k)).map_or("–".into(), |f| format!("{f:.2}"));
    // output tokens: cells decoded past the length or an EOS are dropped, and not counted
    let tokens = v.at.map_or(0, |k| v.run.tokens_out(k)) as f64;
    vec![
        kv(v, "tokens/forward", format!("{:.2}", tokens / s.forward.max(1) as f64)),
        kv(v, "forwards/block", per_block),
        kv(v, "tok/s", format!("{:.1}", tokens / secs)),
        kv(v, "fwd/s", format!("{:.1}", s.forward as f64 / secs)),
        kv(v, "elapsed", format!("{:.2} s", s.t_ms / 1000.0)),
    ]
}

/// Token editing, in a run that has edits: `✎ edits/step 2   run total 5   post-edit steps 1`
/// (up to the step shown; a post-edit step comes after its block's last mask and only edits).
fn edit_groups<'a>(v: &View) -> Vec<Vec<Span<'a>>> {
    let (Some(k), true) = (v.at, v.run.has_edits()) else { return Vec::new() };
    let Some(s) = v.run.step(k) else { return Vec::new() };
    let post = v.run.steps()[..=k].iter().filter(|s| s.post).count();
    let mut first = kv(v, "edits/step", s.edited.to_string());
    first.insert(0, Span::styled(format!("{} ", glyph::EDIT), v.theme.edit_mark()));
    vec![
        first,
        kv(v, "run total", s.edits_total.to_string()),
        kv(v, "post-edit steps", post.to_string()),
    ]
}

/// `--routing`: distinct experts the shown step's pass read per sparse layer (mean, and the
/// fewest to the most over the layers), and the mean over the steps so far.
fn routing_groups<'a>(v: &View) -> Vec<Vec<Span<'a>>> {
    let (Some(k), Some(moe)) = (v.at, v.run.header.model.moe.as_ref()) else { return Vec::new() };
    let Some(e) = v.run.step(k).and_then(|s| s.experts) else { return Vec::new() };
    // The range is a group of its own, so that a narrow panel wraps it instead of cutting it.
    let mut range = kv(v, "experts/layer", format!("{:.1}", e.mean));
    range[2] = Span::raw(" ");
    let mut g = vec![
        range,
        vec![
            Span::styled(format!("({}–{} of {})", e.min, e.max, moe.experts), v.theme.value()),
            Span::raw("   "),
        ],
    ];
    if let Some(mean) = v.run.experts_mean(k) {
        g.push(kv(v, "run mean", format!("{mean:.1}")));
    }
    g
}

/// The settings of the block shown; "since block N" when a change took effect mid-run.
fn settings_groups<'a>(v: &View) -> Vec<Vec<Span<'a>>> {
    let block = v.run.active_block(v.at);
    let (s, from) = v.run.settings_for(block);
    let mut g = knobs(v, s);
    if from > v.run.header.first_block {
        g.push(vec![Span::styled(format!("since block {from}"), v.theme.warn())]);
    }
    g
}

fn knobs<'a>(v: &View, s: &DecodeSettings) -> Vec<Vec<Span<'a>>> {
    let mut g = vec![kv(v, "strategy", s.strategy.name().to_string())];
    if let Some((name, value)) = s.threshold_knob() {
        g.push(kv(v, name, fixed(value.into(), 2)));
    }
    match s.strategy {
        // token editing reads no step budget: its edit threshold and post-mask passes instead
        Strategy::JointThreshold => {
            g.push(kv(v, "edit", fixed(s.edit_threshold.into(), 2)));
            g.push(kv(v, "max post steps", s.max_post_steps.to_string()));
        }
        _ => g.push(kv(
            v,
            "steps",
            match s.capped_steps() {
                Some(n) => format!("{n} ({} asked)", s.steps),
                None => s.steps.to_string(),
            },
        )),
    }
    g.push(kv(v, "block", s.block_length.to_string()));
    if !s.eos_early_stop {
        g.push(kv(v, "after eos", "decodes on".into()));
    }
    let t = &s.sampling;
    let temp = if t.is_greedy() { "0 (greedy)".to_string() } else { format!("{}", t.temperature) };
    g.push(kv(v, "temp", temp));
    if t.top_k > 0 {
        g.push(kv(v, "top-k", t.top_k.to_string()));
    }
    if t.top_p < 1.0 {
        g.push(kv(v, "top-p", format!("{}", t.top_p)));
    }
    g.push(kv(v, "seed", t.seed.to_string()));
    if s.schedule == Schedule::Lmdeploy {
        g.push(kv(v, "schedule", "lmdeploy".into()));
    }
    g
}

fn pending_groups<'a>(v: &View, p: &DecodeSettings) -> Vec<Vec<Span<'a>>> {
    let finished = v.run.finish.is_some();
    let when =
        if finished { "R restarts with it" } else { "from the next block · R restarts now" };
    let thr = p
        .threshold_knob()
        .map_or(String::new(), |(name, value)| format!("{name} {} ", fixed(value.into(), 2)));
    let budget = match p.strategy {
        Strategy::JointThreshold => {
            format!(
                "edit {} max post steps {}",
                fixed(p.edit_threshold.into(), 2),
                p.max_post_steps
            )
        }
        _ => format!("steps {}", p.steps),
    };
    vec![
        vec![
            Span::styled("pending ", v.theme.warn()),
            Span::styled(format!("{} ", p.strategy.name()), v.theme.value()),
        ],
        vec![Span::styled(format!("{thr}{budget}   "), v.theme.value())],
        vec![Span::styled(when, v.theme.dim())],
    ]
}

/// `step 40-88 `: the 1-based steps of the chart's `cols` columns ending at step index `k`,
/// padded to `width`.
fn axis_note(k: usize, cols: usize, width: usize) -> String {
    let last = k + 1;
    let first = last + 1 - cols.clamp(1, last);
    format!("{:<width$}", format!("step {first}-{last} "))
}

/// Tokens committed per step, newest step at the right, one column per step, each bar in the
/// hue of its step; the scale (`max 2`) on the top row, or on one row after the label
/// (`tokens/step max 2`): written over the label, it left the chart unnamed.
fn chart(v: &View, area: Rect, buf: &mut Buffer) {
    const LEVELS: [char; 8] = ['▁', '▂', '▃', '▄', '▅', '▆', '▇', '█'];
    let Some(k) = v.at else { return };
    let label = "tokens/step ";
    let shown = |x0: u16| {
        &v.run.steps()[(k + 1).saturating_sub(area.right().saturating_sub(x0) as usize)..=k]
    };
    let scale = |steps: &[crate::trace::store::StepRec]| {
        steps.iter().map(|s| s.committed).max().unwrap_or(1).max(1)
    };
    buf.set_stringn(area.x, area.bottom() - 1, label, area.width as usize, v.theme.label());
    let mut x0 = area.x + label.len() as u16;
    // The steps after the note are the newest of those before it: the scale holds for them.
    let max = scale(shown(x0));
    if area.height > 1 {
        buf.set_stringn(
            area.x,
            area.y,
            format!("max {max:<w$}", w = label.len() - 4),
            label.len(),
            v.theme.faint(),
        );
        if area.height > 2 {
            // the x axis: which steps the columns are
            let axis = axis_note(k, shown(x0).len(), label.len());
            buf.set_stringn(area.x, area.y + 1, axis.trim_end(), label.len(), v.theme.faint());
        }
    } else {
        // whole or not at all: a cut scale would be a wrong figure
        let note = format!("max {max} ");
        if x0 as usize + note.len() <= area.right() as usize {
            buf.set_string(x0, area.y, &note, v.theme.faint());
            x0 += note.len() as u16;
        }
        // the x axis, where it leaves room for a dozen columns: `step 40-88`, padded to the
        // widest it can be so that the columns it names are the ones drawn
        let widest = axis_note(k, 1, 0).len();
        if (x0 as usize + widest + 12) <= area.right() as usize {
            let cols = (area.right() - x0) as usize - widest;
            buf.set_string(x0, area.y, axis_note(k, cols.min(k + 1), widest), v.theme.faint());
            x0 += widest as u16;
        }
    }
    let steps = shown(x0);
    let span = v.run.step_span();
    let h = area.height as usize;
    for (i, s) in steps.iter().enumerate() {
        let style = Style::default().fg(v.theme.step_color(s.step, span));
        let eighths = (s.committed * h * 8).div_ceil(max);
        for row in 0..h {
            let filled = eighths.saturating_sub(row * 8).min(8);
            if filled == 0 {
                break;
            }
            let y = area.bottom() - 1 - row as u16;
            buf[(x0 + i as u16, y)].set_char(LEVELS[filled - 1]).set_style(style);
        }
        if s.edited > 0 {
            // Just above the bar (a post-edit step has none), or over its top when it is full.
            let row = eighths.div_ceil(8).min(h - 1) as u16;
            buf[(x0 + i as u16, area.bottom() - 1 - row)]
                .set_symbol(glyph::EDIT)
                .set_style(v.theme.edit_mark());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::synth::{self, Synth};
    use crate::tui::app::App;
    use crate::tui::testing::{render_panel, snapshot_text};
    use crossterm::event::{KeyCode, KeyEvent, KeyModifiers};

    #[test]
    fn stats_at_the_head() {
        let mut app = App::replay(synth::trace(&Synth::small()), "t".into(), None);
        app.on_key(KeyEvent::new(KeyCode::End, KeyModifiers::NONE));
        insta::assert_snapshot!(snapshot_text(&render_panel(&app, 110, 7, render)));
    }

    /// `--routing`: the experts a pass read per layer at the step shown, and the run's mean.
    #[test]
    fn stats_with_routing() {
        let events = synth::with_routes(synth::trace(&Synth::small()), &synth::sdar_moe_layout());
        let mut app = App::replay(events, "t".into(), None);
        app.on_key(KeyEvent::new(KeyCode::End, KeyModifiers::NONE));
        let text = snapshot_text(&render_panel(&app, 110, 8, render));
        assert!(
            text.contains("experts/layer") && text.contains("of 128") && text.contains("run mean"),
            "{text}"
        );
        insta::assert_snapshot!(text);
    }

    /// A one-row chart (the 100x30 screen's) keeps its label, the scale after it: the scale
    /// was written over the label (`max 1       ████`), leaving the bars unnamed.
    #[test]
    fn a_one_row_chart_keeps_its_label_and_its_scale() {
        let mut app = App::replay(synth::trace(&Synth::small()), "t".into(), None);
        app.on_key(KeyEvent::new(KeyCode::End, KeyModifiers::NONE));
        let text = snapshot_text(&render_panel(&app, 60, 7, render));
        let last = text.lines().rev().nth(1).unwrap_or_default();
        assert!(last.starts_with("│tokens/step max 1 step 1-26  █"), "{text}");
        insta::assert_snapshot!(text);
        // too narrow for the scale whole: no scale rather than a cut one
        let one_row = |v: &View, area: Rect, buf: &mut Buffer| chart(v, area, buf);
        let text = snapshot_text(&render_panel(&app, 17, 1, one_row));
        assert_eq!(text.trim_end(), "tokens/step █████", "{text}");
        let text = snapshot_text(&render_panel(&app, 20, 1, one_row));
        assert_eq!(text.trim_end(), "tokens/step max 1 ██", "{text}");
        // the x axis names the steps of the columns, where a dozen columns stay for them
        let text = snapshot_text(&render_panel(&app, 42, 1, one_row));
        assert_eq!(text.trim_end(), "tokens/step max 1 step 14-26 █████████████", "{text}");
    }

    /// A run with edits: the step's edits, the run's so far and the post-edit steps so far;
    /// the chart marks the steps that edited with `✎`. A step back counts one edit fewer.
    #[test]
    fn stats_count_edits_and_post_edit_steps() {
        let mut app = App::replay(synth::trace(&Synth::small_edits()), "t".into(), None);
        app.on_key(KeyEvent::new(KeyCode::Home, KeyModifiers::NONE));
        for _ in 0..7 {
            app.on_key(KeyEvent::new(KeyCode::Right, KeyModifiers::NONE));
        }
        let post = snapshot_text(&render_panel(&app, 110, 7, render));
        assert!(post.contains("✎ edits/step 2   run total 4   post-edit steps 2"), "{post}");
        let chart: String = post.lines().rev().skip(1).take(2).collect();
        assert_eq!(chart.matches('✎').count(), 3, "{post}");
        app.on_key(KeyEvent::new(KeyCode::Left, KeyModifiers::NONE));
        let before = snapshot_text(&render_panel(&app, 110, 7, render));
        assert!(before.contains("edits/step 1   run total 2   post-edit steps 1"), "{before}");
        let narrow = snapshot_text(&render_panel(&app, 30, 12, render));
        insta::assert_snapshot!(format!("{post}\n{before}\n{narrow}"));
        // A run without edits has neither the line nor a mark.
        let mut plain = App::replay(synth::trace(&Synth::small()), "t".into(), None);
        plain.on_key(KeyEvent::new(KeyCode::End, KeyModifiers::NONE));
        assert!(!snapshot_text(&render_panel(&plain, 110, 7, render)).contains('✎'));
    }

    #[test]
    fn stats_say_from_which_block_a_change_applied() {
        let mut cfg = Synth::small();
        cfg.change_at = Some((4, 2));
        let mut app = App::replay(synth::trace(&cfg), "t".into(), None);
        app.on_key(KeyEvent::new(KeyCode::End, KeyModifiers::NONE));
        let s = snapshot_text(&render_panel(&app, 110, 7, render));
        assert!(s.contains("since block 4") && s.contains("steps 2"), "{s}");
        // Before the change the original settings show, with no note.
        app.on_key(KeyEvent::new(KeyCode::Home, KeyModifiers::NONE));
        let s = snapshot_text(&render_panel(&app, 110, 7, render));
        assert!(!s.contains("since block") && s.contains("steps 4"), "{s}");
    }

    /// A narrow panel (the stacked layout's half width) wraps its groups; what still does not
    /// fit is cut between words with `…`, never inside a figure.
    #[test]
    fn narrow_stats_never_cut_a_figure() {
        let events = synth::with_routes(synth::trace(&Synth::small()), &synth::sdar_moe_layout());
        let mut app = App::replay(events, "t".into(), None);
        app.on_key(KeyEvent::new(KeyCode::End, KeyModifiers::NONE));
        let text = snapshot_text(&render_panel(&app, 30, 12, render));
        assert!(text.contains("of 128)"), "{text}");
        insta::assert_snapshot!(text);
    }

    #[test]
    fn pending_settings_show_until_applied() {
        let mut app = App::live();
        let mut ev = synth::trace(&Synth::small());
        ev.pop();
        for e in ev {
            app.ingest(e);
        }
        app.on_key(KeyEvent::new(KeyCode::Char('m'), KeyModifiers::NONE));
        let s = snapshot_text(&render_panel(&app, 110, 7, render));
        assert!(s.contains("pending entropy_bounded eb 0.35 steps 4"), "{s}");
        app.on_key(KeyEvent::new(KeyCode::Char('m'), KeyModifiers::NONE));
        let s = snapshot_text(&render_panel(&app, 110, 7, render));
        assert!(
            s.contains("pending joint_threshold threshold 0.85 edit 0.90 max post steps 16"),
            "{s}"
        );
        // on to sequential: a strategy without a threshold shows none (it showed dynamic's)
        app.on_key(KeyEvent::new(KeyCode::Char('m'), KeyModifiers::NONE));
        let s = snapshot_text(&render_panel(&app, 110, 7, render));
        assert!(s.contains("pending sequential steps 4"), "{s}");
    }

    #[test]
    fn a_strategy_without_a_threshold_shows_none() {
        let mut cfg = Synth::small();
        cfg.change_at = None;
        let mut events = synth::trace(&cfg);
        if let crate::trace::events::Event::Header(h) = &mut events[0] {
            h.settings.strategy = crate::engine::settings::Strategy::LowConfidenceStatic;
        }
        let mut app = App::replay(events, "t".into(), None);
        app.on_key(KeyEvent::new(KeyCode::End, KeyModifiers::NONE));
        let s = snapshot_text(&render_panel(&app, 110, 7, render));
        assert!(s.contains("strategy low_confidence_static   steps 4"), "{s}");
    }

    /// Token editing shows its own knobs: the edit threshold and the passes after the last
    /// mask, not a step budget it does not read; and that blocks after an EOS are decoded.
    #[test]
    fn joint_threshold_shows_its_edit_knobs() {
        let mut cfg = Synth::small();
        cfg.change_at = None;
        let mut events = synth::trace(&cfg);
        if let crate::trace::events::Event::Header(h) = &mut events[0] {
            h.settings.strategy = Strategy::JointThreshold;
            h.settings.edit_threshold = 0.5;
            h.settings.max_post_steps = 3;
            h.settings.eos_early_stop = false;
        }
        let mut app = App::replay(events, "t".into(), None);
        app.on_key(KeyEvent::new(KeyCode::End, KeyModifiers::NONE));
        let s = snapshot_text(&render_panel(&app, 140, 7, render));
        assert!(
            s.contains(
                "strategy joint_threshold   threshold 0.85   edit 0.50   max post steps 3   block 4"
            ),
            "{s}"
        );
        assert!(s.contains("after eos decodes on") && !s.contains("steps 4"), "{s}");
    }
}
