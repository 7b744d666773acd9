//! Groups of SFT data: which example fills each slot of a step (a group drawn by the groups'
//! shares, then the group's own seeded order), and shares re-weighed by each group's held-out
//! loss, so a skill the model lags on gets more of the data (`data.groups`, `data.balance`).

use rl_model::SplitMix64;
use rl_run::{RunDir, SftRow};

use crate::error::{Error, Result};
use crate::sft_rows::{SftExample, kept};

/// One group of training examples and its held-out examples (empty without balancing).
#[derive(Debug, Clone, Default)]
pub struct SftGroup {
    /// Its name in metrics (`group/<name>/share`).
    pub name: String,
    /// Training examples.
    pub train: Vec<SftExample>,
    /// Held-out examples whose loss sets the group's share.
    pub val: Vec<SftExample>,
}

/// Shares in proportion to `lag^power` (a group's held-out loss, or the share of its replies
/// missed), mixed with the uniform so each is at least `min_share` (`min_share * n < 1`):
/// `min_share + (1 - n min_share) lag^power / sum`. Lags that are not finite and positive count
/// as the largest finite one (a group the model cannot yet do at all is one to train), and equal
/// shares come back when none is.
pub fn shares_from_lags(lags: &[f64], power: f64, min_share: f64) -> Vec<f64> {
    let n = lags.len();
    if n == 0 {
        return Vec::new();
    }
    let largest = lags.iter().copied().filter(|l| l.is_finite() && *l > 0.0).fold(f64::NAN, f64::max);
    if largest.is_nan() {
        return vec![1.0 / n as f64; n];
    }
    // Relative to the largest, so large powers cannot overflow.
    let weights: Vec<f64> =
        lags.iter().map(|&l| if l.is_finite() && l > 0.0 { (l / largest).powf(power) } else { 1.0 }).collect();
    let total: f64 = weights.iter().sum();
    let free = 1.0 - min_share * n as f64;
    weights.iter().map(|w| min_share + free * w / total).collect()
}

/// The group of the `i`-th example slot of the run: a seeded uniform draw against the shares'
/// running sums (the last group takes what rounding leaves).
pub(crate) fn draw_group(i: usize, seed: u64, shares: &[f64]) -> usize {
    let mut rng = SplitMix64::new(seed ^ (i as u64).wrapping_mul(0xd1b5_4a32_d192_ed03) ^ 0x5851_f42d_4c95_7f2d);
    let u = (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
    let mut sum = 0.0;
    for (g, s) in shares.iter().enumerate() {
        sum += s;
        if u < sum {
            return g;
        }
    }
    shares.len() - 1
}

/// Fills a run's example slots. One group: its seeded order. Several: a group drawn by the
/// shares, then the slot's place in that group's own order (a permutation of the group per `len`
/// slots, so no example repeats within a group's epoch). Each group's permutation is built once
/// per epoch, not once per slot (a shuffle of the whole group per example made a step's picks
/// grow with the dataset).
#[derive(Debug)]
pub(crate) struct Picker<'a> {
    groups: &'a [SftGroup],
    seed: u64,
    /// Per group: the epoch whose permutation is kept, and that permutation.
    orders: Vec<Option<(u64, Vec<usize>)>>,
}

impl<'a> Picker<'a> {
    pub(crate) fn new(groups: &'a [SftGroup], seed: u64) -> Self {
        Picker { groups, seed, orders: vec![None; groups.len()] }
    }

    /// The example of the run's `i`-th slot.
    pub(crate) fn pick(&mut self, shares: &[f64], i: usize) -> &'a SftExample {
        let (g, seed) = match self.groups {
            [_] => (0, self.seed),
            _ => {
                let g = draw_group(i, self.seed, shares);
                (g, self.seed.wrapping_add(g as u64 + 1))
            }
        };
        let group = &self.groups[g].train;
        let epoch = (i / group.len()) as u64;
        let kept = &mut self.orders[g];
        if kept.as_ref().is_none_or(|(e, _)| *e != epoch) {
            *kept = Some((epoch, permutation(epoch, group.len(), seed)));
        }
        let perm = &kept.as_ref().expect("just set").1;
        &group[perm[i % group.len()]]
    }
}

/// `batch_rows`: the examples from slot `next` on that fill at most `rows` rows of `seq_len`
/// tokens, packed one after the other as `pack` packs them (a shared prompt only makes them
/// shorter), at least one; `next` moves past them.
pub(crate) fn take_rows(
    picker: &mut Picker<'_>,
    shares: &[f64],
    next: &mut usize,
    rows: usize,
    seq_len: usize,
) -> Vec<SftExample> {
    let mut batch: Vec<SftExample> = Vec::new();
    let (mut used, mut fill) = (0usize, 0usize);
    // Examples too short to train take no room; the bound keeps a set of nothing but those finite.
    while batch.len() < rows * seq_len {
        let ex = picker.pick(shares, *next);
        let n = kept(ex, seq_len);
        if n >= 2 {
            let (after_used, after_fill) =
                if used == 0 || fill + n > seq_len { (used + 1, n) } else { (used, fill + n) };
            if after_used > rows && !batch.is_empty() {
                break;
            }
            (used, fill) = (after_used, after_fill);
        }
        batch.push(ex.clone());
        *next += 1;
    }
    batch
}

/// Where a resumed `batch_rows` run's step `step` starts: the examples its earlier steps took,
/// from the run's metrics (the last row of each step).
pub(crate) fn resumed_cursor(run: &RunDir, step: u64) -> Result<usize> {
    if step <= 1 {
        return Ok(0);
    }
    let rows: Vec<SftRow> = rl_run::read_jsonl(&run.metrics()).map_err(|e| {
        Error::Unsupported(format!("resuming a batch_rows run needs its metrics (examples a step): {e}"))
    })?;
    let mut taken = vec![None; step as usize - 1];
    for r in rows.iter().filter(|r| (1..step).contains(&r.step)) {
        taken[r.step as usize - 1] = Some(r.samples);
    }
    taken.iter().enumerate().try_fold(0usize, |sum, (i, n)| match n {
        Some(Some(n)) => Ok(sum + *n as usize),
        _ => Err(Error::Unsupported(format!(
            "resuming a batch_rows run needs each earlier step's example count; step {} has none in {}",
            i + 1,
            run.metrics().display()
        ))),
    })
}

/// The seeded permutation of `0..n` for `epoch`.
fn permutation(epoch: u64, n: usize, seed: u64) -> Vec<usize> {
    let mut perm: Vec<usize> = (0..n).collect();
    let mut rng = SplitMix64::new(seed ^ epoch.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ 0xa076_1d64_78bd_642f);
    for k in (1..n).rev() {
        perm.swap(k, (rng.next_u64() % (k as u64 + 1)) as usize);
    }
    perm
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    proptest! {
        #[test]
        fn shares_sum_to_one_keep_the_floor_and_follow_the_losses(
            losses in proptest::collection::vec(0.01f64..5.0, 2..6),
            power in 0.5f64..4.0,
            floor in 0.0f64..0.16,
        ) {
            let shares = shares_from_lags(&losses, power, floor);
            prop_assert!((shares.iter().sum::<f64>() - 1.0).abs() < 1e-9);
            prop_assert!(shares.iter().all(|s| *s >= floor - 1e-12));
            for a in 0..losses.len() {
                for b in 0..losses.len() {
                    if losses[a] > losses[b] * 1.001 {
                        prop_assert!(shares[a] > shares[b], "{losses:?} -> {shares:?}");
                    }
                }
            }
        }
    }

    proptest! {
        /// `batch_rows`: a step's examples pack into at most its rows, the next example would not
        /// have fit, and consecutive steps take consecutive slots.
        #[test]
        fn a_steps_examples_fill_at_most_its_rows(
            lens in proptest::collection::vec(1usize..40, 1..30),
            rows in 1usize..4,
            seq_len in 8usize..48,
        ) {
            // Distinct first tokens per example, so no prompt is shared and `pack` packs as counted.
            let train: Vec<SftExample> = lens
                .iter()
                .enumerate()
                .map(|(i, n)| SftExample { ids: (0..*n).map(|t| (i * 100 + t) as u32).collect(), mask: vec![true; *n] })
                .collect();
            let groups = [SftGroup { name: String::from("all"), train, val: Vec::new() }];
            let mut picker = Picker::new(&groups, 7);
            let mut next = 0;
            for _ in 0..3 {
                let start = next;
                let batch = take_rows(&mut picker, &[1.0], &mut next, rows, seq_len);
                prop_assert!(!batch.is_empty());
                prop_assert_eq!(next - start, batch.len());
                prop_assert!(crate::sft_rows::pack(&batch, seq_len).len() <= rows);
                let mut more = batch.clone();
                more.push(picker.pick(&[1.0], next).clone());
                // (An example met again in a later epoch shares its whole prompt with itself: packed
                // shorter than counted.)
                let repeats = more.iter().any(|e| more.iter().filter(|f| f.ids == e.ids).count() > 1);
                if kept(more.last().unwrap(), seq_len) >= 2 && !repeats {
                    prop_assert!(crate::sft_rows::pack(&more, seq_len).len() > rows, "the next example would have fit");
                }
            }
        }
    }

    #[test]
    fn equal_losses_share_equally_and_a_lagging_group_gets_more() {
        assert_eq!(shares_from_lags(&[0.8, 0.8], 2.0, 0.1), vec![0.5, 0.5]);
        let s = shares_from_lags(&[1.0, 0.5], 2.0, 0.1);
        // Weights 1 and 0.25: 0.1 + 0.8 * 0.8 and 0.1 + 0.8 * 0.2.
        assert!((s[0] - 0.74).abs() < 1e-12 && (s[1] - 0.26).abs() < 1e-12, "{s:?}");
        // A group with no finite loss counts as the worst one.
        assert_eq!(shares_from_lags(&[f64::NAN, 1.0], 2.0, 0.0), vec![0.5, 0.5]);
        assert_eq!(shares_from_lags(&[f64::INFINITY, f64::NAN], 3.0, 0.2), vec![0.5, 0.5]);
    }

    #[test]
    fn draws_follow_the_shares_and_repeat_for_a_seed() {
        let shares = [0.7, 0.2, 0.1];
        let n = 20_000;
        let mut counts = [0usize; 3];
        for i in 0..n {
            counts[draw_group(i, 3, &shares)] += 1;
        }
        for (c, s) in counts.iter().zip(shares) {
            assert!((*c as f64 / n as f64 - s).abs() < 0.015, "{counts:?}");
        }
        let again: Vec<usize> = (0..100).map(|i| draw_group(i, 3, &shares)).collect();
        assert_eq!(again, (0..100).map(|i| draw_group(i, 3, &shares)).collect::<Vec<_>>());
        assert_ne!(again, (0..100).map(|i| draw_group(i, 4, &shares)).collect::<Vec<_>>());
        assert!((0..1000).all(|i| draw_group(i, 9, &[0.0, 1.0]) == 1));
    }

    #[test]
    fn slots_come_from_the_drawn_group_without_repeats_in_its_epoch() {
        let group = |name: &str, first_id: u32, n: u32| SftGroup {
            name: name.to_owned(),
            train: (first_id..first_id + n).map(|id| SftExample { ids: vec![id], mask: vec![true] }).collect(),
            val: Vec::new(),
        };
        let groups = [group("a", 0, 50), group("b", 1000, 50)];
        let mut picker = Picker::new(&groups, 7);
        assert!((0..200).all(|i| picker.pick(&[0.0, 1.0], i).ids[0] >= 1000), "a share of 1 takes every slot");
        let mut seen = std::collections::BTreeSet::new();
        let mut picker = Picker::new(&groups, 7);
        let from_a: Vec<u32> = (0..50).map(|i| picker.pick(&[0.5, 0.5], i).ids[0]).filter(|id| *id < 1000).collect();
        assert!(from_a.len() > 10 && from_a.iter().all(|id| seen.insert(*id)), "{from_a:?}");
        // One group is the plain seeded order, as before groups existed: each epoch a permutation
        // (the same one at every slot of the epoch, however the slots are visited).
        let one = [group("all", 0, 50)];
        let mut picker = Picker::new(&one, 7);
        let slots: Vec<u32> = (0..120).map(|i| picker.pick(&[1.0], i).ids[0]).collect();
        for (i, id) in slots.iter().enumerate() {
            assert_eq!(*id as usize, permutation((i / 50) as u64, 50, 7)[i % 50]);
        }
        assert_ne!(slots[..50], slots[50..100], "each epoch has its own order");
        let mut sorted = slots[..50].to_vec();
        sorted.sort_unstable();
        assert!(sorted.iter().enumerate().all(|(k, id)| *id as usize == k), "an epoch visits every example once");
        let mut back = Picker::new(&one, 7);
        assert!(
            (0..120).rev().all(|i| back.pick(&[1.0], i).ids[0] == slots[i]),
            "the order does not depend on the visits"
        );
    }
}
