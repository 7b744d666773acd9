//! Which task of an env a group trains on (`[orchestrator.train.env.curriculum]`): uniform, or
//! prime-rl's difficulty pools — each task weighted by the pool its latest group-mean reward falls
//! in. Each pool (and the tasks never drawn) is a set over task indices that can pick its k-th
//! member in O(log n), so a draw is two uniform choices however large the dataset, and the sets
//! depend only on each task's latest mean: that map is the whole state checkpoints carry, and a
//! restored curriculum draws exactly what the original would have.

use std::collections::BTreeMap;

use rl_configs::{CurriculumConfig, DifficultyPool, SplitMix64};
use serde_json::{Value, json};

use crate::error::{Error, Result};

/// An env's task sampler.
#[derive(Debug, Clone, PartialEq)]
pub enum Curriculum {
    /// Every task equally likely.
    Uniform {
        /// Tasks in the `train` split.
        size: u64,
    },
    /// Difficulty pools.
    Pools(Pools),
}

/// Difficulty-pool state: `sets[p]` holds the tasks of pool `p`; the last set holds the tasks
/// never drawn.
#[derive(Debug, Clone, PartialEq)]
pub struct Pools {
    pools: Vec<DifficultyPool>,
    unseen_weight: f64,
    sets: Vec<IndexSet>,
    /// Latest group-mean reward of every task drawn so far.
    means: BTreeMap<u64, f64>,
}

/// A set of task indices in `0..n` (a Fenwick tree of membership counts).
#[derive(Debug, Clone, PartialEq)]
struct IndexSet {
    tree: Vec<u32>,
    len: u64,
}

impl IndexSet {
    fn new(n: u64, full: bool) -> Self {
        let mut s = IndexSet { tree: vec![0; n as usize + 1], len: 0 };
        if full {
            for i in 0..n {
                s.add(i, 1);
            }
        }
        s
    }

    fn add(&mut self, index: u64, delta: i32) {
        let mut i = index as usize + 1;
        while i < self.tree.len() {
            self.tree[i] = self.tree[i].wrapping_add_signed(delta);
            i += i & i.wrapping_neg();
        }
        self.len = self.len.wrapping_add_signed(i64::from(delta));
    }

    /// The `k`-th smallest member (`k < len`).
    fn select(&self, mut k: u64) -> u64 {
        let mut pos = 0usize;
        let mut step = (self.tree.len()).next_power_of_two();
        while step > 0 {
            let next = pos + step;
            if next < self.tree.len() && u64::from(self.tree[next]) <= k {
                pos = next;
                k -= u64::from(self.tree[next]);
            }
            step /= 2;
        }
        pos as u64
    }
}

impl Curriculum {
    /// The sampler `cfg` asks for over `size` tasks.
    pub fn new(cfg: &CurriculumConfig, size: u64) -> Self {
        match cfg {
            CurriculumConfig::Uniform {} => Curriculum::Uniform { size },
            CurriculumConfig::DifficultyPool { pools, unseen_weight } => {
                let mut sets: Vec<IndexSet> = pools.iter().map(|_| IndexSet::new(size, false)).collect();
                sets.push(IndexSet::new(size, true));
                Curriculum::Pools(Pools {
                    pools: pools.clone(),
                    unseen_weight: *unseen_weight,
                    sets,
                    means: BTreeMap::new(),
                })
            }
        }
    }

    /// Draws a task index.
    pub fn draw(&self, rng: &mut SplitMix64) -> u64 {
        match self {
            Curriculum::Uniform { size } => rng.next_u64() % (*size).max(1),
            Curriculum::Pools(p) => p.draw(rng),
        }
    }

    /// Records the mean reward of a group of task `index`.
    pub fn observe(&mut self, index: u64, mean_reward: f64) {
        if let Curriculum::Pools(p) = self {
            p.observe(index, mean_reward);
        }
    }

    /// The state to checkpoint (`None`: stateless).
    pub fn state(&self) -> Option<Value> {
        match self {
            Curriculum::Uniform { .. } => None,
            Curriculum::Pools(p) => Some(json!(p.means)),
        }
    }

    /// Restores checkpointed state.
    pub fn restore(&mut self, state: &Value) -> Result<()> {
        if let Curriculum::Pools(p) = self {
            let means: BTreeMap<u64, f64> = serde_json::from_value(state.clone())
                .map_err(|e| Error::Config(format!("curriculum state is not a map of task means: {e}")))?;
            for (index, mean) in means {
                p.observe(index, mean);
            }
        }
        Ok(())
    }

    /// `curriculum/<env>/pool/<name>`: tasks per pool (and never drawn: `unseen`).
    pub fn metrics(&self, env: &str) -> BTreeMap<String, Value> {
        let Curriculum::Pools(p) = self else { return BTreeMap::new() };
        let names = p.pools.iter().map(|q| q.name.as_str()).chain(["unseen"]);
        names.zip(&p.sets).map(|(n, s)| (format!("curriculum/{env}/pool/{n}"), json!(s.len))).collect()
    }
}

impl Pools {
    fn weight(&self, bucket: usize) -> f64 {
        self.pools.get(bucket).map_or(self.unseen_weight, |p| p.weight)
    }

    fn draw(&self, rng: &mut SplitMix64) -> u64 {
        let weights: Vec<f64> = (0..self.sets.len()).map(|b| self.sets[b].len as f64 * self.weight(b)).collect();
        let total: f64 = weights.iter().sum();
        if total <= 0.0 {
            // Every task sits in a zero-weight pool: fall back to uniform rather than stall the run.
            let size = self.sets[0].tree.len() as u64 - 1;
            return rng.next_u64() % size.max(1);
        }
        let mut u = rng.uniform() * total;
        // The last weighted set also takes what rounding leaves of `u`.
        let last = weights.iter().rposition(|w| *w > 0.0).unwrap_or(0);
        let chosen = (0..self.sets.len())
            .find(|&b| {
                let hit = weights[b] > 0.0 && u < weights[b];
                u -= weights[b];
                hit
            })
            .unwrap_or(last);
        let set = &self.sets[chosen];
        set.select(rng.next_u64() % set.len)
    }

    fn pool_of(&self, mean: f64) -> usize {
        self.pools.iter().position(|p| mean <= p.threshold).unwrap_or(self.pools.len() - 1)
    }

    fn observe(&mut self, index: u64, mean: f64) {
        if index >= self.sets[0].tree.len() as u64 - 1 {
            return;
        }
        let from = self.means.get(&index).map_or(self.pools.len(), |m| self.pool_of(*m));
        let to = self.pool_of(mean);
        self.means.insert(index, mean);
        if from != to {
            self.sets[from].add(index, -1);
            self.sets[to].add(index, 1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pools() -> CurriculumConfig {
        let pool =
            |name: &str, threshold: f64, weight: f64| DifficultyPool { name: name.to_owned(), threshold, weight };
        CurriculumConfig::DifficultyPool {
            pools: vec![pool("hard", 0.25, 0.0), pool("normal", 0.75, 1.0), pool("easy", 1.0, 0.0)],
            unseen_weight: 1.0,
        }
    }

    #[test]
    fn tasks_move_between_pools_by_their_latest_mean_and_zero_weight_pools_are_not_drawn() {
        let mut c = Curriculum::new(&pools(), 10);
        for i in 0..10 {
            c.observe(
                i,
                if i < 3 {
                    0.1
                } else if i < 8 {
                    1.0
                } else {
                    0.5
                },
            );
        }
        let m = c.metrics("rt");
        let size = |pool: &str| m[&format!("curriculum/rt/pool/{pool}")].as_u64().unwrap();
        assert_eq!([size("hard"), size("normal"), size("easy"), size("unseen")], [3, 2, 5, 0]);
        let mut rng = SplitMix64::new(1);
        for _ in 0..200 {
            assert!([8, 9].contains(&c.draw(&mut rng)), "only the normal pool has weight");
        }
        c.observe(8, 0.9);
        c.observe(9, 0.0);
        c.observe(0, 0.6);
        for _ in 0..50 {
            assert_eq!(c.draw(&mut rng), 0, "task 0 moved to normal, 8 and 9 left it");
        }
    }

    #[test]
    fn weights_follow_the_pools_and_state_round_trips() {
        let pool =
            |name: &str, threshold: f64, weight: f64| DifficultyPool { name: name.to_owned(), threshold, weight };
        let cfg = CurriculumConfig::DifficultyPool {
            pools: vec![pool("hard", 0.5, 1.0), pool("easy", 1.0, 3.0)],
            unseen_weight: 1.0,
        };
        let mut c = Curriculum::new(&cfg, 2);
        c.observe(0, 0.2);
        c.observe(1, 0.9);
        let mut rng = SplitMix64::new(3);
        let easy = (0..4000).filter(|_| c.draw(&mut rng) == 1).count() as f64 / 4000.0;
        assert!((easy - 0.75).abs() < 0.03, "weight 3 vs 1, got {easy}");
        let mut restored = Curriculum::new(&cfg, 2);
        restored.restore(&c.state().unwrap()).unwrap();
        assert_eq!(restored, c);
        let (mut a, mut b) = (SplitMix64::new(5), SplitMix64::new(5));
        assert!((0..100).all(|_| c.draw(&mut a) == restored.draw(&mut b)), "a restored curriculum draws the same");
        assert_eq!(Curriculum::new(&CurriculumConfig::Uniform {}, 5).state(), None);
    }

    #[test]
    fn all_weight_zero_falls_back_to_uniform() {
        let mut c = Curriculum::new(&pools(), 4);
        for i in 0..4 {
            c.observe(i, 1.0);
        }
        let mut rng = SplitMix64::new(9);
        assert!((0..20).map(|_| c.draw(&mut rng)).all(|i| i < 4));
    }
}
