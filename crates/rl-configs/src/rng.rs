//! SplitMix64, the workspace's one seeded generator (dataset generation, model init, sampling,
//! task order): a seed gives the same numbers on every platform and with every version of external
//! crates. It lives here because every crate already depends on this one.

/// SplitMix64. Its whole state is one `u64`, so checkpoints can save and restore it exactly.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SplitMix64(u64);

impl SplitMix64 {
    /// A generator for `seed` (also: a generator restored from a saved [`SplitMix64::state`]).
    pub fn new(seed: u64) -> Self {
        SplitMix64(seed)
    }

    /// The state, for checkpoints.
    pub fn state(&self) -> u64 {
        self.0
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1) with 53 bits.
    pub fn uniform(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_the_reference_sequence_and_restores_from_its_state() {
        // SplitMix64 with seed 0 (Vigna's reference implementation).
        let mut r = SplitMix64::new(0);
        assert_eq!(r.next_u64(), 0xe220_a839_7b1d_cdaf);
        assert_eq!(r.next_u64(), 0x6e78_9e6a_a1b9_65f4);
        let mut copy = SplitMix64::new(r.state());
        assert_eq!(copy.next_u64(), r.next_u64());
        assert!((0.0..1.0).contains(&r.uniform()));
    }
}
