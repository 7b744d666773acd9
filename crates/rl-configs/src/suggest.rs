//! "Did you mean" suggestions for unknown keys.

/// The candidate closest to `word` by edit distance, if it is close enough to be a plausible typo.
pub(crate) fn closest<'a>(word: &str, candidates: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
    let len = word.chars().count();
    let limit = if len <= 3 { 1 } else { (len / 3).max(2) };
    candidates
        .into_iter()
        .map(|c| (edit_distance(word, c), c))
        .filter(|(d, _)| *d <= limit)
        .min_by_key(|(d, _)| *d)
        .map(|(_, c)| c)
}

/// Levenshtein distance over chars, counting `-` and `_` as equal.
pub(crate) fn edit_distance(a: &str, b: &str) -> usize {
    let norm = |c: char| if c == '-' { '_' } else { c };
    let a: Vec<char> = a.chars().map(norm).collect();
    let b: Vec<char> = b.chars().map(norm).collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.iter().enumerate() {
        let mut cur = vec![i + 1; b.len() + 1];
        for (j, cb) in b.iter().enumerate() {
            let cost = usize::from(ca != cb);
            cur[j + 1] = (prev[j] + cost).min(prev[j + 1] + 1).min(cur[j] + 1);
        }
        prev = cur;
    }
    prev[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn suggests_near_misses_only() {
        let keys = ["sampling", "env", "group_size"];
        assert_eq!(closest("smapling", keys), Some("sampling"));
        assert_eq!(closest("group-size", keys), Some("group_size"));
        assert_eq!(closest("completely_different", keys), None);
    }
}
