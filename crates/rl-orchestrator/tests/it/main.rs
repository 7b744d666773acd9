//! Integration tests of rl-orchestrator: packing invariants (property tests).

mod packing;
