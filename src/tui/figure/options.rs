//! What `export --format svg|png` lets a figure's author choose: its width, how many blocks
//! share a row, which steps are coloured, and the PNG's resolution. Each is a type that holds
//! only values the layout can draw, parsed from its flag with a one-line error.

use std::num::NonZeroUsize;
use std::str::FromStr;

/// The figure's width in points. Text keeps its size (8 pt tokens) whatever the width: a
/// wider figure holds more blocks a row, it does not scale up.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Width(f64);

impl Width {
    /// One column of a two-column paper (3.33 in).
    pub const ONE_COLUMN: Width = Width(240.0);
    /// The narrowest figure that still holds a block number, a whole cell of the longest
    /// token drawn uncut and the legend's step scale.
    pub const MIN: f64 = 160.0;
    /// 20 in: wider than any page or poster column.
    pub const MAX: f64 = 1440.0;

    pub fn new(points: f64) -> Result<Width, String> {
        if !(Self::MIN..=Self::MAX).contains(&points) {
            return Err(format!(
                "{points} is not a figure width: give points from {} to {} (240: one column of \
                 a two-column paper, 504: both columns)",
                Self::MIN,
                Self::MAX
            ));
        }
        Ok(Width(points))
    }

    pub fn points(self) -> f64 {
        self.0
    }
}

impl Default for Width {
    fn default() -> Width {
        Width::ONE_COLUMN
    }
}

impl FromStr for Width {
    type Err = String;
    fn from_str(s: &str) -> Result<Width, String> {
        let pt = s.trim().trim_end_matches("pt");
        let v: f64 = pt.parse().map_err(|_| format!("{s:?} is not a number of points"))?;
        Width::new(v)
    }
}

/// Blocks a row, when the author fixes it (`--blocks-per-row`); otherwise as many as fit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlocksPerRow(pub NonZeroUsize);

impl FromStr for BlocksPerRow {
    type Err = String;
    fn from_str(s: &str) -> Result<BlocksPerRow, String> {
        match s.trim().parse::<usize>() {
            Ok(n) => NonZeroUsize::new(n)
                .map(BlocksPerRow)
                .ok_or_else(|| "0 blocks a row: give 1 or more".to_string()),
            Err(_) => Err(format!("{s:?} is not a number of blocks")),
        }
    }
}

/// The steps within a block (1-based, inclusive, as the legend numbers them) whose cells are
/// coloured; cells set at other steps are drawn as context: their text in grey on white.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StepRange {
    first: NonZeroUsize,
    /// `None`: to the last step.
    last: Option<NonZeroUsize>,
}

impl StepRange {
    /// Every step.
    pub const ALL: StepRange = StepRange { first: NonZeroUsize::MIN, last: None };

    pub fn new(first: usize, last: Option<usize>) -> Result<StepRange, String> {
        let Some(f) = NonZeroUsize::new(first) else {
            return Err("steps count from 1".into());
        };
        let last = match last {
            Some(l) if l < first => {
                return Err(format!("{first}..{l} is empty: A..B needs A <= B"))
            }
            Some(l) => NonZeroUsize::new(l),
            None => None,
        };
        Ok(StepRange { first: f, last })
    }

    /// Whether 0-based step `step` is coloured.
    pub fn contains(&self, step: usize) -> bool {
        let n = step + 1;
        n >= self.first.get() && self.last.is_none_or(|l| n <= l.get())
    }

    pub fn is_all(&self) -> bool {
        *self == Self::ALL
    }

    /// The 0-based steps of a run whose blocks take up to `span` steps that are coloured.
    pub fn steps(&self, span: usize) -> std::ops::Range<usize> {
        let end = self.last.map_or(span, |l| l.get().min(span));
        (self.first.get() - 1).min(end)..end
    }
}

impl Default for StepRange {
    fn default() -> StepRange {
        StepRange::ALL
    }
}

impl std::fmt::Display for StepRange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.last {
            Some(l) if l == self.first => write!(f, "{l}"),
            Some(l) => write!(f, "{}..{l}", self.first),
            None => write!(f, "{}..", self.first),
        }
    }
}

impl FromStr for StepRange {
    type Err = String;
    /// `A..B`, `A..` (to the last step), `..B` (from the first) or `A` (that step alone).
    fn from_str(s: &str) -> Result<StepRange, String> {
        let num = |t: &str| -> Result<usize, String> {
            t.trim()
                .parse()
                .map_err(|_| format!("{s:?} is not a step range: give A..B, A.., ..B or A"))
        };
        match s.split_once("..") {
            Some((a, b)) => {
                let first = if a.trim().is_empty() { 1 } else { num(a)? };
                let last = if b.trim().is_empty() { None } else { Some(num(b)?) };
                StepRange::new(first, last)
            }
            None => {
                let n = num(s)?;
                StepRange::new(n, Some(n))
            }
        }
    }
}

/// The PNG's resolution, in pixels per inch of the figure's printed size: its pixel width is
/// the width in points times dpi/72.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Dpi(f64);

impl Dpi {
    /// Print quality: journals ask 300 dpi for figures with text.
    pub const PRINT: Dpi = Dpi(300.0);
    pub const MIN: f64 = 36.0;
    pub const MAX: f64 = 2400.0;

    pub fn new(dpi: f64) -> Result<Dpi, String> {
        if !(Self::MIN..=Self::MAX).contains(&dpi) {
            return Err(format!("{dpi} dpi: give {} to {} (300: print)", Self::MIN, Self::MAX));
        }
        Ok(Dpi(dpi))
    }

    pub fn get(self) -> f64 {
        self.0
    }

    /// Pixels a length of `points` covers.
    pub fn pixels(self, points: f64) -> f64 {
        points * self.0 / 72.0
    }
}

impl Default for Dpi {
    fn default() -> Dpi {
        Dpi::PRINT
    }
}

impl FromStr for Dpi {
    type Err = String;
    fn from_str(s: &str) -> Result<Dpi, String> {
        let v: f64 =
            s.trim().parse().map_err(|_| format!("{s:?} is not a number of dots per inch"))?;
        Dpi::new(v)
    }
}

/// How the step map is laid out.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Options {
    pub width: Width,
    pub blocks_per_row: Option<BlocksPerRow>,
    pub steps: StepRange,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn widths_are_points_in_a_sane_range() {
        assert_eq!("504".parse::<Width>().unwrap().points(), 504.0);
        assert_eq!("240pt".parse::<Width>().unwrap(), Width::ONE_COLUMN);
        for bad in ["0", "-240", "100", "5000", "NaN", "wide"] {
            let e = bad.parse::<Width>().unwrap_err();
            assert!(!e.contains('\n'), "{e}");
        }
    }

    #[test]
    fn blocks_per_row_is_at_least_one() {
        assert_eq!("3".parse::<BlocksPerRow>().unwrap().0.get(), 3);
        assert!("0".parse::<BlocksPerRow>().unwrap_err().contains("1 or more"));
        assert!("-1".parse::<BlocksPerRow>().is_err());
    }

    #[test]
    fn step_ranges_parse_every_spelling_and_refuse_empty_ones() {
        let r = |s: &str| s.parse::<StepRange>();
        assert_eq!(r("2..3").unwrap(), StepRange::new(2, Some(3)).unwrap());
        assert_eq!(r("2..").unwrap().steps(5), 1..5);
        assert_eq!(r("..2").unwrap().steps(5), 0..2);
        assert_eq!(r("3").unwrap().steps(5), 2..3);
        assert_eq!(r("2..9").unwrap().steps(4), 1..4, "cut to the run's steps");
        assert!(r("1..").unwrap().is_all());
        assert!(r("3..2").unwrap_err().contains("empty"));
        assert!(r("0..2").unwrap_err().contains("from 1"));
        assert!(r("a..b").is_err() && r("").is_err());
        let two = r("2..3").unwrap();
        assert!(!two.contains(0) && two.contains(1) && two.contains(2) && !two.contains(3));
        assert_eq!(two.to_string(), "2..3");
        assert_eq!(r("4").unwrap().to_string(), "4");
    }

    #[test]
    fn dpi_gives_pixels_per_point() {
        assert_eq!(Dpi::PRINT.pixels(240.0), 1000.0);
        assert!("0".parse::<Dpi>().is_err() && "9999".parse::<Dpi>().is_err());
    }
}
