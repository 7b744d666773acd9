//! The workspace's seeded generator, re-exported where model code has always found it.

pub use rl_configs::SplitMix64;
