//! Numbers and counts as people read them; every place that prints one goes through here, so
//! no screen or table says `-0.000` or `1 steps`.

/// `x` with `decimals` digits after the point, never `-0.000`: a value that rounds to zero
/// prints as zero, whatever its sign (Rust's `{:.3}` keeps the sign of `-0.0001`).
pub fn fixed(x: f64, decimals: usize) -> String {
    let s = format!("{x:.decimals$}");
    match s.strip_prefix('-') {
        Some(rest) if rest.chars().all(|c| c == '0' || c == '.') => rest.to_string(),
        _ => s,
    }
}

/// `1 step`, `2 steps`, `0 steps`: the noun's plural is its `-s` form, which covers every noun
/// unmask counts (token, step, block, forward, cell, position).
pub fn count(n: usize, noun: &str) -> String {
    if n == 1 {
        format!("1 {noun}")
    } else {
        format!("{n} {noun}s")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_negative_zero() {
        assert_eq!(fixed(-0.0001, 3), "0.000");
        assert_eq!(fixed(-0.0, 2), "0.00");
        assert_eq!(fixed(-0.0006, 3), "-0.001");
        assert_eq!(fixed(0.85, 2), "0.85");
        assert_eq!(fixed(-1.5, 1), "-1.5");
        assert_eq!(fixed(f64::NAN, 2), "NaN");
    }

    #[test]
    fn counts() {
        assert_eq!(count(1, "token"), "1 token");
        assert_eq!(count(0, "step"), "0 steps");
        assert_eq!(count(26, "block"), "26 blocks");
    }
}
