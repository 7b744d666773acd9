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
    /// Python's `j2len` and `newj2len` dicts as dense rows: entry `j + 1` is the length of the
    /// match ending at `a[i]`, `b[j]` (entry 0 stands for `j = -1` and stays 0). A dict per `i`
    /// was most of the reward's time in RL runs (hashing every index).
    prev: Vec<usize>,
    cur: Vec<usize>,
    /// The entries of `prev` / `cur` that are set, to clear them without sweeping the row.
    prev_set: Vec<usize>,
    cur_set: Vec<usize>,
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
        let row = vec![0; n + 1];
        Matcher { a, b, b2j, prev: row.clone(), cur: row, prev_set: Vec::new(), cur_set: Vec::new() }
    }

    /// Python's `find_longest_match` (there is no junk set, so only the non-junk extension applies).
    fn longest_match(&mut self, alo: usize, ahi: usize, blo: usize, bhi: usize) -> (usize, usize, usize) {
        let (mut besti, mut bestj, mut bestsize) = (alo, blo, 0usize);
        for i in alo..ahi {
            if let Some(js) = self.b2j.get(&self.a[i]) {
                for &j in js {
                    if j < blo {
                        continue;
                    }
                    if j >= bhi {
                        break;
                    }
                    let k = self.prev[j] + 1;
                    self.cur[j + 1] = k;
                    self.cur_set.push(j + 1);
                    if k > bestsize {
                        besti = i + 1 - k;
                        bestj = j + 1 - k;
                        bestsize = k;
                    }
                }
            }
            // `j2len = newj2len`: clear the old row, then swap.
            for &e in &self.prev_set {
                self.prev[e] = 0;
            }
            self.prev_set.clear();
            std::mem::swap(&mut self.prev, &mut self.cur);
            std::mem::swap(&mut self.prev_set, &mut self.cur_set);
        }
        for &e in &self.prev_set {
            self.prev[e] = 0;
        }
        self.prev_set.clear();
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

    fn matching_blocks(&mut self) -> Vec<(usize, usize, usize)> {
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
    use std::collections::HashMap;

    use proptest::prelude::*;

    use super::ratio;

    /// Python's `find_longest_match` line for line, with a fresh dict per element of `a`: the
    /// reference the dense rows of [`super::Matcher`] must agree with.
    fn reference_ratio(a: &str, b: &str) -> f64 {
        let (a, b): (Vec<char>, Vec<char>) = (a.chars().collect(), b.chars().collect());
        if a.len() + b.len() == 0 {
            return 1.0;
        }
        let mut b2j: HashMap<char, Vec<usize>> = HashMap::new();
        for (i, c) in b.iter().enumerate() {
            b2j.entry(*c).or_default().push(i);
        }
        if b.len() >= 200 {
            let ntest = b.len() / 100 + 1;
            b2j.retain(|_, idxs| idxs.len() <= ntest);
        }
        let longest = |alo: usize, ahi: usize, blo: usize, bhi: usize| {
            let (mut besti, mut bestj, mut bestsize) = (alo, blo, 0usize);
            let mut j2len: HashMap<usize, usize> = HashMap::new();
            for (i, c) in a.iter().enumerate().take(ahi).skip(alo) {
                let mut new_j2len = HashMap::new();
                for &j in b2j.get(c).map(Vec::as_slice).unwrap_or_default() {
                    if j < blo {
                        continue;
                    }
                    if j >= bhi {
                        break;
                    }
                    let k = j.checked_sub(1).and_then(|p| j2len.get(&p)).copied().unwrap_or(0) + 1;
                    new_j2len.insert(j, k);
                    if k > bestsize {
                        (besti, bestj, bestsize) = (i + 1 - k, j + 1 - k, k);
                    }
                }
                j2len = new_j2len;
            }
            while besti > alo && bestj > blo && a[besti - 1] == b[bestj - 1] {
                (besti, bestj, bestsize) = (besti - 1, bestj - 1, bestsize + 1);
            }
            while besti + bestsize < ahi && bestj + bestsize < bhi && a[besti + bestsize] == b[bestj + bestsize] {
                bestsize += 1;
            }
            (besti, bestj, bestsize)
        };
        let (mut queue, mut matched) = (vec![(0, a.len(), 0, b.len())], 0);
        while let Some((alo, ahi, blo, bhi)) = queue.pop() {
            let (i, j, k) = longest(alo, ahi, blo, bhi);
            if k > 0 {
                matched += k;
                if alo < i && blo < j {
                    queue.push((alo, i, blo, j));
                }
                if i + k < ahi && j + k < bhi {
                    queue.push((i + k, ahi, j + k, bhi));
                }
            }
        }
        2.0 * matched as f64 / (a.len() + b.len()) as f64
    }

    proptest! {
        /// Small alphabets make long repeated matches and ties; lengths reach past autojunk's 200.
        #[test]
        fn dense_rows_agree_with_the_dict_algorithm(
            a in "[abc\n é]{0,260}",
            b in "[abc\n é]{0,260}",
        ) {
            prop_assert_eq!(ratio(&a, &b), reference_ratio(&a, &b));
        }
    }

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
