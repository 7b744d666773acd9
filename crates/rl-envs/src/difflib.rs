//! A faithful port of Python's `difflib.SequenceMatcher(None, a, b).ratio()`: Ratcliff–Obershelp
//! longest matching blocks, including the `autojunk` heuristic (for `b` of 200+ elements, elements
//! occurring more than `len(b) // 100 + 1` times are ignored as match seeds).

use std::collections::HashMap;

/// `SequenceMatcher(None, a, b).ratio()` over Unicode scalar values.
pub fn ratio(a: &str, b: &str) -> f64 {
    let a: Vec<char> = a.chars().collect();
    let b: Vec<char> = b.chars().collect();
    let total = a.len() + b.len();
    if total == 0 {
        return 1.0;
    }
    let matches: usize = Matcher::new(&a, &b).matching_blocks().iter().map(|m| m.2).sum();
    2.0 * matches as f64 / total as f64
}

struct Matcher<'a> {
    a: &'a [char],
    b: &'a [char],
    /// For each element of `b`, its indices (popular elements removed).
    b2j: HashMap<char, Vec<usize>>,
}

impl<'a> Matcher<'a> {
    fn new(a: &'a [char], b: &'a [char]) -> Self {
        let mut b2j: HashMap<char, Vec<usize>> = HashMap::new();
        for (i, c) in b.iter().enumerate() {
            b2j.entry(*c).or_default().push(i);
        }
        let n = b.len();
        if n >= 200 {
            let ntest = n / 100 + 1;
            b2j.retain(|_, idxs| idxs.len() <= ntest);
        }
        Matcher { a, b, b2j }
    }

    /// Python's `find_longest_match` (there is no junk set, so only the non-junk extension applies).
    fn longest_match(&self, alo: usize, ahi: usize, blo: usize, bhi: usize) -> (usize, usize, usize) {
        let (mut besti, mut bestj, mut bestsize) = (alo, blo, 0usize);
        let mut j2len: HashMap<usize, usize> = HashMap::new();
        for i in alo..ahi {
            let mut new_j2len: HashMap<usize, usize> = HashMap::new();
            if let Some(js) = self.b2j.get(&self.a[i]) {
                for &j in js {
                    if j < blo {
                        continue;
                    }
                    if j >= bhi {
                        break;
                    }
                    let k = j.checked_sub(1).and_then(|p| j2len.get(&p)).copied().unwrap_or(0) + 1;
                    new_j2len.insert(j, k);
                    if k > bestsize {
                        besti = i + 1 - k;
                        bestj = j + 1 - k;
                        bestsize = k;
                    }
                }
            }
            j2len = new_j2len;
        }
        while besti > alo && bestj > blo && self.a[besti - 1] == self.b[bestj - 1] {
            besti -= 1;
            bestj -= 1;
            bestsize += 1;
        }
        while besti + bestsize < ahi && bestj + bestsize < bhi && self.a[besti + bestsize] == self.b[bestj + bestsize] {
            bestsize += 1;
        }
        (besti, bestj, bestsize)
    }

    fn matching_blocks(&self) -> Vec<(usize, usize, usize)> {
        let mut queue = vec![(0, self.a.len(), 0, self.b.len())];
        let mut blocks = Vec::new();
        while let Some((alo, ahi, blo, bhi)) = queue.pop() {
            let (i, j, k) = self.longest_match(alo, ahi, blo, bhi);
            if k > 0 {
                blocks.push((i, j, k));
                if alo < i && blo < j {
                    queue.push((alo, i, blo, j));
                }
                if i + k < ahi && j + k < bhi {
                    queue.push((i + k, ahi, j + k, bhi));
                }
            }
        }
        blocks.sort_unstable();
        blocks
    }
}

#[cfg(test)]
mod tests {
    use super::ratio;

    /// Values printed by CPython 3.11: `difflib.SequenceMatcher(None, a, b).ratio()`.
    #[test]
    fn matches_python_difflib() {
        let cases: &[(&str, &str, f64)] = &[
            ("abc", "abc", 1.0),
            ("hello world", "dlrow olleh", 0.18181818181818182),
            ("", "", 1.0),
            ("abc", "", 0.0),
            ("tac a si siht", "this is a cat", 0.38461538461538464),
            ("elppa", "apple", 0.4),
            ("abcd", "bcda", 0.75),
            ("kitten", "sitting", 0.6153846153846154),
            ("<x>", "x", 0.5),
        ];
        for (a, b, want) in cases {
            assert_eq!(ratio(a, b), *want, "ratio({a:?}, {b:?})");
        }
    }

    /// With 200+ elements in `b`, autojunk ignores popular elements as match seeds (CPython gives 0.0).
    #[test]
    fn autojunk_applies_to_long_sequences() {
        let a = "ab".repeat(150);
        let b = format!("{}{}", "ba".repeat(120), "c".repeat(20));
        assert_eq!(ratio(&a, &b), 0.0);
        let a = "the quick brown fox jumps over the lazy dog ".repeat(6);
        let b: String = a.chars().rev().collect();
        assert_eq!(ratio(&a, &b), 0.0);
    }
}
