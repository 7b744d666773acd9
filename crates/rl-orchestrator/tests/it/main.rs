//! Integration tests of rl-orchestrator: packing invariants (property tests) and a two-step run.

mod dispatch;
mod packing;
mod vllm;
