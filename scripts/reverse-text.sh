#!/usr/bin/env bash
# The reverse-text recipe, from nothing to a trained model on CPU:
#   rl model init (tiny preset) -> rl sft (warm start) -> rl rl (GRPO).
# Outputs land under ./outputs; pass --clean to start over.
set -euo pipefail
cd "$(dirname "$0")/.."
clean=()
[[ "${1:-}" == "--clean" ]] && clean=(--clean)
cargo build --release --locked -p rl-cli
rl=target/release/rl
if [[ ${#clean[@]} -gt 0 || ! -e outputs/models/tiny/config.json ]]; then
  "$rl" model init --out outputs/models/tiny --preset tiny --seed 0 --force
fi
"$rl" sft @ configs/reverse_text/sft.toml "${clean[@]}"
"$rl" rl @ configs/reverse_text/rl.toml "${clean[@]}"
