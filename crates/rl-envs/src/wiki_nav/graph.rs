//! The wiki-nav article graph: titles, texts and out-links generated from a seed, shortest paths,
//! and the start/target pairs of the train and test splits (disjoint, so the test split's pairs
//! are held out from training).

use std::collections::VecDeque;

use crate::rng::Rng;
use crate::splits::Splits;

const ADJECTIVES: &[&str] = &[
    "Amber", "Silent", "Copper", "Northern", "Hidden", "Golden", "Crimson", "Ancient", "Frozen", "Emerald", "Hollow",
    "Iron", "Misty", "Quiet", "Silver", "Sunken", "Wild", "Azure",
];
const NOUNS: &[&str] = &[
    "River", "Harbor", "Valley", "Forest", "Bridge", "Castle", "Desert", "Island", "Lantern", "Meadow", "Mountain",
    "Orchard", "Tower", "Village", "Canyon", "Garden", "Library", "Market",
];
const FACTS: &[&str] = &[
    "is known for its old stone walls",
    "appears on many early maps",
    "was a stop for travelling merchants",
    "hosts a festival every spring",
    "is described in several folk songs",
    "has a small museum",
    "was rebuilt after a great storm",
    "lies at the end of a long road",
];

/// The most articles a graph can have (one per distinct title).
pub(crate) const MAX_ARTICLES: usize = ADJECTIVES.len() * NOUNS.len();

/// The article graph: titles, texts and out-links.
#[derive(Debug, Clone)]
pub struct Graph {
    /// Article titles.
    pub titles: Vec<String>,
    texts: Vec<String>,
    /// Out-links of each article (indices).
    pub links: Vec<Vec<usize>>,
}

impl Graph {
    /// A graph of `n` articles with `degree` out-links each: a ring (so every article is reachable)
    /// plus random links.
    pub fn generate(seed: u64, n: usize, degree: usize) -> Self {
        let mut rng = Rng::new(seed, "wiki-nav/graph");
        let mut names: Vec<String> =
            ADJECTIVES.iter().flat_map(|a| NOUNS.iter().map(move |b| format!("{a} {b}"))).collect();
        rng.shuffle(&mut names);
        names.truncate(n);
        let texts = names.iter().map(|t| format!("{t} {}. It {}.", rng.choose(FACTS), rng.choose(FACTS))).collect();
        let mut links = Vec::with_capacity(n);
        for i in 0..n {
            let mut out = vec![(i + 1) % n];
            while out.len() < degree.min(n - 1) {
                let j = rng.range(0, n as u64 - 1) as usize;
                if j != i && !out.contains(&j) {
                    out.push(j);
                }
            }
            rng.shuffle(&mut out);
            links.push(out);
        }
        Graph { titles: names, texts, links }
    }

    /// Index of a title (exact match, surrounding whitespace ignored).
    pub fn find(&self, title: &str) -> Option<usize> {
        self.titles.iter().position(|t| t == title.trim())
    }

    /// Shortest number of clicks from `a` to every article (`usize::MAX` when unreachable).
    pub fn distances_from(&self, a: usize) -> Vec<usize> {
        let mut dist = vec![usize::MAX; self.titles.len()];
        dist[a] = 0;
        let mut queue = VecDeque::from([a]);
        while let Some(u) = queue.pop_front() {
            for &v in &self.links[u] {
                if dist[v] == usize::MAX {
                    dist[v] = dist[u] + 1;
                    queue.push_back(v);
                }
            }
        }
        dist
    }

    /// A shortest path of titles from `a` to `b` (both included).
    pub fn shortest_path(&self, a: usize, b: usize) -> Vec<String> {
        self.path(a, b).into_iter().map(|i| self.titles[i].clone()).collect()
    }

    /// A shortest path of articles from `a` to `b` (both included; every article is reachable).
    pub(crate) fn path(&self, a: usize, b: usize) -> Vec<usize> {
        let mut prev = vec![usize::MAX; self.titles.len()];
        let mut queue = VecDeque::from([a]);
        prev[a] = a;
        while let Some(u) = queue.pop_front() {
            for &v in &self.links[u] {
                if prev[v] == usize::MAX {
                    prev[v] = u;
                    queue.push_back(v);
                }
            }
        }
        let mut path = vec![b];
        while *path.last().expect("non-empty") != a {
            path.push(prev[*path.last().expect("non-empty")]);
        }
        path.reverse();
        path
    }

    /// What the model sees of an article: its links in the graph's order, or with `shuffle`
    /// (an episode's start and the moves made so far) in an order drawn from it, so the same page
    /// lists its links in another order each time an episode shows it.
    pub fn observation(&self, i: usize, target: usize, shuffle: Option<(usize, u32)>) -> String {
        let mut links: Vec<&str> = self.links[i].iter().map(|&j| self.titles[j].as_str()).collect();
        if let Some((start, moves)) = shuffle {
            let salt = ((start as u64) << 40) ^ ((target as u64) << 20) ^ u64::from(moves);
            Rng::new(salt, "wiki-nav/link-order").shuffle(&mut links);
        }
        format!(
            "You are at: {}\n{}\nLinks: {}\nTarget: {}",
            self.titles[i],
            self.texts[i],
            links.join(", "),
            self.titles[target]
        )
    }
}

/// Start/target pairs `min..=max` clicks apart: the distinct pairs, shuffled by `seed`; the first
/// fifth of them are held out (never a training pair, whatever `test_n`: an SFT validation set
/// and an RL eval of the same graph hold out the same pairs), and the test split is the first
/// `test_n` of those; the train split draws `train_n` times from the other four fifths and, when
/// `train_max > max`, from every pair `max + 1..=train_max` clicks apart too (the held-out pairs
/// stay those of `min..=max`, so a longer training range moves none of them into training).
pub(crate) fn split_pairs(
    graph: &Graph,
    seed: u64,
    train_n: u64,
    test_n: u64,
    (min, max): (usize, usize),
    train_max: usize,
) -> Splits<(usize, usize)> {
    let within = |lo: usize, hi: usize| -> Vec<(usize, usize)> {
        (0..graph.titles.len())
            .flat_map(|a| {
                let d = graph.distances_from(a);
                (0..graph.titles.len()).filter(move |&b| d[b] >= lo && d[b] <= hi).map(move |b| (a, b))
            })
            .collect()
    };
    let mut all = within(min, max);
    Rng::new(seed, "wiki-nav/held-out").shuffle(&mut all);
    let held_out = all.len() / 5;
    let test = all[..held_out.min(test_n as usize)].to_vec();
    let mut rest = all[held_out..].to_vec();
    if train_max > max {
        rest.extend(within(max + 1, train_max));
    }
    let mut rng = Rng::new(seed, "wiki-nav/train");
    let train = if rest.is_empty() { Vec::new() } else { (0..train_n).map(|_| *rng.choose(&rest)).collect() };
    Splits { train, test }
}
