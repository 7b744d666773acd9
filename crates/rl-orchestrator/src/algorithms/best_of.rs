//! Max@k rewards for `grpo` (`best_of = k`, PKPO by Walder & Karkhanis 2025): the objective is the
//! expected best reward of k samples, `E[max(r_1..r_k)]`, estimated from a group of n >= k. Its
//! gradient, estimated over every k-subset S of the group, puts on sample i a weight proportional
//! to the sum of `max(S)` over the subsets holding i; we use the mean, `s_i`, so that weights stay
//! on the rewards' scale (k = 1 gives `s_i = r_i`; a group of equal rewards keeps them, so it still
//! has no advantage once the baseline is subtracted; the mean of the `s_i` is the max@k estimate).
//! With the group sorted ascending (ties in any order: a tied maximum has the same value), sample i
//! is the maximum of `C(i-1, k-1)` of the `C(n-1, k-1)` subsets holding it and sample j > i of
//! `C(j-2, k-2)` of them: `s_i = (C(i-1, k-1) r_i + sum_{j>i} C(j-2, k-2) r_j) / C(n-1, k-1)`.

/// `C(a, b) / C(n, k)` for `b <= k`, as a product of ratios (no factorial overflows: groups of
/// hundreds of samples stay finite). `s_i` divides by `C(n-1, k-1) = C(n, k) k / n` through it.
fn choose_ratio(a: usize, b: usize, n: usize, k: usize) -> f64 {
    if b > a {
        return 0.0;
    }
    // C(a, b) / C(n, k) = [prod_{t<b} (a-t)/(b-t)] / [prod_{t<k} (n-t)/(k-t)].
    let mut ratio = 1.0;
    for t in 0..k {
        ratio *= (k - t) as f64 / (n - t) as f64;
        if t < b {
            ratio *= (a - t) as f64 / (b - t) as f64;
        }
    }
    ratio
}

/// The max@k gradient weight of each reward, in the input order. `k` is clamped to `1..=n` (a group
/// that lost rollouts to errors estimates the best of the samples it has).
pub(crate) fn max_at_k_weights(rewards: &[f64], k: usize) -> Vec<f64> {
    let n = rewards.len();
    let k = k.clamp(1, n.max(1));
    if k == 1 || n == 0 {
        return rewards.to_vec();
    }
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by(|&a, &b| rewards[a].total_cmp(&rewards[b]));
    // 1-based sorted rank i: own weight C(i-1, k-1); as the maximum over a lower-ranked sample,
    // C(i-2, k-2). `later` accumulates the second kind from the top down.
    let per_subset = n as f64 / k as f64;
    let mut out = vec![0.0; n];
    let mut later = 0.0;
    for rank in (1..=n).rev() {
        let idx = order[rank - 1];
        let r = rewards[idx];
        out[idx] = (choose_ratio(rank - 1, k - 1, n, k) * r + later) * per_subset;
        if rank >= 2 {
            later += choose_ratio(rank - 2, k - 2, n, k) * r;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    /// `s_i` by brute force: the mean over every k-subset holding i of the subset's maximum.
    fn brute(rewards: &[f64], k: usize) -> Vec<f64> {
        let n = rewards.len();
        let mut sum = vec![0.0; n];
        let mut count = vec![0.0; n];
        for mask in 0u32..(1 << n) {
            if mask.count_ones() as usize != k {
                continue;
            }
            let members: Vec<usize> = (0..n).filter(|i| mask & (1 << i) != 0).collect();
            let best = members.iter().map(|&i| rewards[i]).fold(f64::NEG_INFINITY, f64::max);
            for i in members {
                sum[i] += best;
                count[i] += 1.0;
            }
        }
        sum.iter().zip(&count).map(|(s, c)| s / c).collect()
    }

    #[test]
    fn best_of_one_is_the_reward_and_equal_rewards_stay_equal() {
        assert_eq!(max_at_k_weights(&[0.2, 1.0, 0.5], 1), vec![0.2, 1.0, 0.5]);
        let w = max_at_k_weights(&[0.3; 6], 4);
        assert!(w.iter().all(|s| (s - 0.3).abs() < 1e-12), "{w:?}");
    }

    #[test]
    fn by_hand_best_of_two() {
        // Pairs of {0, 0.5, 1}: (0, 0.5) -> 0.5, (0, 1) -> 1, (0.5, 1) -> 1; each sample is in two.
        let w = max_at_k_weights(&[1.0, 0.0, 0.5], 2);
        let expect = [1.0, 0.75, 0.75];
        for (a, b) in w.iter().zip(expect) {
            assert!((a - b).abs() < 1e-12, "{w:?}");
        }
    }

    #[test]
    fn k_above_the_group_is_the_whole_group() {
        // k is clamped to the group: one subset, whose maximum every sample gets.
        assert_eq!(max_at_k_weights(&[0.1, 0.7], 5), vec![0.7, 0.7]);
        assert_eq!(max_at_k_weights(&[], 3), Vec::<f64>::new());
    }

    #[test]
    fn large_groups_stay_finite() {
        let rewards: Vec<f64> = (0..256).map(|i| f64::from(i % 7) / 7.0).collect();
        let w = max_at_k_weights(&rewards, 128);
        assert!(w.iter().all(|s| s.is_finite() && *s >= 0.0), "{w:?}");
    }

    proptest! {
        #[test]
        fn matches_the_mean_over_all_subsets(
            rewards in prop::collection::vec(prop_oneof![Just(0.0), Just(1.0), 0.0f64..1.0], 1..10),
            k in 1usize..10,
        ) {
            let k = k.min(rewards.len());
            let fast = max_at_k_weights(&rewards, k);
            let slow = brute(&rewards, k);
            for (a, b) in fast.iter().zip(&slow) {
                prop_assert!((a - b).abs() < 1e-9, "k {} rewards {:?}: {:?} vs {:?}", k, rewards, fast, slow);
            }
        }
    }
}
