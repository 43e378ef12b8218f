//! Lines of figures that never show a wrong number. A line that does not fit its width is
//! shortened the way a person would: shorter spellings first (`forwards` → `fwd`), then whole
//! fields, least important first; text that still has to be cut is cut between words and ends
//! in `…`. A number is never cut (`7/258` read as `7/2` is a wrong value, not a short one).

use ratatui::style::Style;
use ratatui::text::{Line, Span};

use crate::glyph::{self, ELLIPSIS};

/// One field of a line: its fullest spelling, then shorter ones, each used once the line's
/// need reaches its rank; at `drop` the field goes. Lower ranks give way first, across fields.
pub struct Field<'a> {
    forms: Vec<(u8, Vec<Span<'a>>)>,
    drop: Option<u8>,
}

impl<'a> Field<'a> {
    pub fn new(spans: Vec<Span<'a>>) -> Self {
        Field { forms: vec![(0, spans)], drop: None }
    }

    /// A shorter spelling, taken at `rank`.
    pub fn or(mut self, rank: u8, spans: Vec<Span<'a>>) -> Self {
        self.forms.push((rank, spans));
        self
    }

    /// The field goes at `rank` (a field without one stays to the end).
    pub fn drop_at(mut self, rank: u8) -> Self {
        self.drop = Some(rank);
        self
    }
}

fn width(spans: &[Span]) -> usize {
    spans.iter().map(Span::width).sum()
}

/// The form each field keeps (`None`: dropped) so that the fields, `sep` columns apart, fit in
/// `width`: the reductions of every field are made in order of rank until the line fits.
/// Returns the chosen spans and whether it had to drop fields beyond their ranks (then the
/// line is still too wide, or was cut: the caller ends it with `…`).
pub fn choose<'a>(
    fields: Vec<Field<'a>>,
    sep: usize,
    width_max: usize,
) -> (Vec<Option<Vec<Span<'a>>>>, bool) {
    let plan = plan(&fields, sep, width_max, 0);
    take(fields, plan)
}

/// What [`choose`] decides: each field's form, whether the line was cut, the highest rank of
/// the reductions kept. Every reduction of rank `floor` or lower is made whether or not the
/// line needs it (lines that must shorten alike: [`rank_needed`]).
struct Plan {
    at: Vec<Option<usize>>,
    cut: bool,
    rank: u8,
}

fn plan(fields: &[Field], sep: usize, width_max: usize, floor: u8) -> Plan {
    let mut at: Vec<Option<usize>> = vec![Some(0); fields.len()];
    let total = |at: &[Option<usize>]| {
        let present: Vec<usize> = at
            .iter()
            .enumerate()
            .filter_map(|(i, f)| f.map(|f| width(&fields[i].forms[f].1)))
            .collect();
        present.iter().sum::<usize>() + sep * present.len().saturating_sub(1)
    };
    // Every reduction: (rank, field, Some(form) or None to drop), in rank order; a field's own
    // reductions come in the order it lists them.
    let mut steps: Vec<(u8, usize, Option<usize>)> = Vec::new();
    for (i, f) in fields.iter().enumerate() {
        steps.extend(f.forms.iter().enumerate().skip(1).map(|(j, (rank, _))| (*rank, i, Some(j))));
        if let Some(rank) = f.drop {
            steps.push((rank, i, None));
        }
    }
    steps.sort_by_key(|s| s.0);
    let mut made: Vec<(u8, usize, Option<usize>)> = Vec::new();
    for (rank, i, to) in steps {
        if rank > floor && total(&at) <= width_max {
            break;
        }
        if at[i].is_some() {
            made.push((rank, i, at[i]));
            at[i] = to;
        }
    }
    // A later reduction may have made room for an earlier one to be undone (not one the floor
    // asks for).
    let mut kept = 0;
    for (rank, i, before) in made.into_iter().rev() {
        let now = at[i];
        if rank > floor {
            at[i] = before;
        }
        if total(&at) > width_max {
            at[i] = now;
        }
        if at[i] == now {
            kept = kept.max(rank);
        }
    }
    // Still too wide: the last fields go, and the caller marks the cut.
    let mut cut = false;
    let too_wide = total(&at) > width_max;
    while too_wide && total(&at) + 2 > width_max {
        let Some(last) = at.iter().rposition(Option::is_some) else { break };
        at[last] = None;
        cut = true;
    }
    Plan { at, cut, rank: kept }
}

fn take<'a>(fields: Vec<Field<'a>>, plan: Plan) -> (Vec<Option<Vec<Span<'a>>>>, bool) {
    let chosen = fields
        .into_iter()
        .zip(plan.at)
        .map(|(mut f, a)| a.map(|a| std::mem::take(&mut f.forms[a].1)))
        .collect();
    (chosen, plan.cut)
}

/// The highest rank of the reductions [`line`] makes to fit `fields` in `width` (0: none):
/// lines shown as a set (compare's A and B) are drawn with the set's highest, so that they
/// shorten alike ([`line_from`]).
pub fn rank_needed(fields: &[Field], sep: &str, width: usize) -> u8 {
    plan(fields, glyph::width(sep), width, 0).rank
}

/// The fields that fit in `width`, joined by `sep`; `…` where fields had to go beyond their
/// ranks.
pub fn line<'a>(fields: Vec<Field<'a>>, sep: &'a str, width: usize) -> Line<'a> {
    line_from(fields, sep, width, 0)
}

/// [`line`] with every reduction up to rank `floor` made whether the line needs it or not.
pub fn line_from<'a>(fields: Vec<Field<'a>>, sep: &'a str, width: usize, floor: u8) -> Line<'a> {
    let plan = plan(&fields, glyph::width(sep), width, floor);
    let (chosen, cut) = take(fields, plan);
    let mut spans = Vec::new();
    for f in chosen.into_iter().flatten() {
        if !spans.is_empty() {
            spans.push(Span::raw(sep));
        }
        spans.extend(f);
    }
    if cut {
        let style = spans.last().map_or(Style::default(), |s| s.style);
        if !spans.is_empty() {
            spans.push(Span::raw(" "));
        }
        spans.push(Span::styled(ELLIPSIS, style));
    }
    cut_words(Line::from(spans), width)
}

/// `line` cut to `width` columns between words, ending in `…` if anything was cut: a number
/// goes whole or not at all. A first word wider than the line is cut by grapheme, with `…`.
pub fn cut_words(line: Line<'_>, width: usize) -> Line<'_> {
    if line.width() <= width {
        return line;
    }
    if width == 0 {
        return Line::default();
    }
    let room = width - 1;
    let style = line.style;
    let alignment = line.alignment;
    let mut out: Vec<Span> = Vec::new();
    // The spans kept and the length of the last kept span at the last word boundary.
    let mut best: Option<(usize, usize)> = None;
    let mut used = 0;
    'spans: for (si, span) in line.spans.iter().enumerate() {
        let mut kept = String::new();
        for (g, gw) in glyph::graphemes(&span.content) {
            if used + gw > room {
                out.push(Span::styled(kept, span.style));
                break 'spans;
            }
            if g.chars().all(char::is_whitespace) {
                // Boundary before this space: the text up to here.
                best = Some((si, kept.len()));
            }
            kept.push_str(g);
            used += gw;
        }
        out.push(Span::styled(kept, span.style));
    }
    let cut_at = best.map(|(si, len)| {
        let mut o: Vec<Span> = out[..si].to_vec();
        let mut last = out[si].clone();
        last.content = last.content[..len].to_string().into();
        o.push(last);
        o
    });
    let mut spans = match cut_at {
        Some(o) if o.iter().any(|s| !s.content.trim().is_empty()) => o,
        // One word wider than the line: cut by grapheme.
        _ => out,
    };
    // No trailing blanks before the mark.
    while let Some(last) = spans.last_mut() {
        let trimmed = last.content.trim_end().to_string();
        if trimmed.is_empty() {
            spans.pop();
        } else {
            last.content = trimmed.into();
            break;
        }
    }
    let mark_style = spans.last().map_or(Style::default(), |s| s.style);
    spans.push(Span::styled(ELLIPSIS, mark_style));
    let mut l = Line::from(spans).style(style);
    l.alignment = alignment;
    l
}

/// A label and its figure as one field: `label` in the label style, `value` in the value one.
pub fn kv<'a>(
    label: Style,
    value: Style,
    k: impl Into<String>,
    v: impl Into<String>,
) -> Vec<Span<'a>> {
    vec![Span::styled(k.into(), label), Span::styled(v.into(), value)]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(l: &Line) -> String {
        l.spans.iter().map(|s| s.content.as_ref()).collect()
    }

    fn raw(s: &str) -> Vec<Span<'_>> {
        vec![Span::raw(s)]
    }

    #[test]
    fn words_are_cut_whole_and_marked() {
        let l = Line::from(vec![
            Span::raw("overall "),
            Span::raw("7/258"),
            Span::raw("  forwards 9/77"),
        ]);
        assert_eq!(text(&cut_words(l.clone(), 14)), "overall…");
        assert_eq!(text(&cut_words(l.clone(), 13)), "overall…");
        assert_eq!(text(&cut_words(l.clone(), 15)), "overall 7/258…");
        assert_eq!(text(&cut_words(l.clone(), 100)), "overall 7/258  forwards 9/77");
        assert_eq!(text(&cut_words(Line::from("abcdefgh"), 4)), "abc…");
    }

    #[test]
    fn shorter_spellings_then_whole_fields_give_way_by_rank() {
        let fields = || {
            vec![
                Field::new(raw("block 3 (3/65)")).or(5, raw("block 3")),
                Field::new(raw("step 1/4")),
                Field::new(raw("overall 7/258")).or(3, raw("#7/258")),
                Field::new(raw("forwards 7/258")).or(1, raw("fwd 7/258")).drop_at(4),
            ]
        };
        let at = |w| text(&line(fields(), "  ", w));
        assert_eq!(at(100), "block 3 (3/65)  step 1/4  overall 7/258  forwards 7/258");
        assert_eq!(at(51), "block 3 (3/65)  step 1/4  overall 7/258  fwd 7/258");
        assert_eq!(at(45), "block 3 (3/65)  step 1/4  #7/258  fwd 7/258");
        assert_eq!(at(32), "block 3 (3/65)  step 1/4  #7/258");
        assert_eq!(at(25), "block 3  step 1/4  #7/258");
        // Beyond every rank: fields go from the end, marked.
        assert_eq!(at(20), "block 3  step 1/4 …");
    }

    /// Lines that shorten alike: the widest need sets the floor, the other line makes the
    /// same reductions though it would fit without them.
    #[test]
    fn a_floor_makes_every_reduction_up_to_its_rank() {
        let fields = |n: &'static str| {
            vec![
                Field::new(raw(n)),
                Field::new(raw("overall 7/258")).or(3, raw("#7/258")),
                Field::new(raw("forwards 7/258")).or(1, raw("fwd 7/258")).drop_at(4),
            ]
        };
        let (long, short) = (fields("a long name"), fields("a"));
        assert_eq!(rank_needed(&long, "  ", 34), 3);
        assert_eq!(rank_needed(&short, "  ", 34), 0);
        assert_eq!(rank_needed(&fields("a"), "  ", 100), 0);
        assert_eq!(text(&line_from(long, "  ", 34, 3)), "a long name  #7/258  fwd 7/258");
        assert_eq!(text(&line_from(short, "  ", 34, 3)), "a  #7/258  fwd 7/258");
        assert_eq!(text(&line(fields("a"), "  ", 34)), "a  overall 7/258  forwards 7/258");
    }
}
