//! Groups of SFT data: which example fills each slot of a step (a group drawn by the groups'
//! shares, then the group's own seeded order), and shares re-weighed by each group's held-out
//! loss, so a skill the model lags on gets more of the data (`data.groups`, `data.balance`).

use rl_model::SplitMix64;

use crate::sft_rows::SftExample;

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
