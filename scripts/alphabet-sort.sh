#!/usr/bin/env bash
# The alphabet-sort recipe, from nothing to a trained model on CPU:
#   rl model init (tiny preset) -> rl sft (warm start) -> rl rl (GRPO, multi-turn).
# Outputs land under ./outputs; pass --clean to start over, --seed N for another seed.
set -euo pipefail
cd "$(dirname "$0")/.."
clean=()
seed=0
while [[ $# -gt 0 ]]; do
  case "$1" in
    --clean) clean=(--clean) ;;
    --seed) seed="$2"; shift ;;
    *) echo "usage: $0 [--clean] [--seed N]" >&2; exit 2 ;;
  esac
  shift
done
cargo build --release --locked -p rl-cli
rl=target/release/rl
model=outputs/models/tiny-seed$seed
if [[ ${#clean[@]} -gt 0 || ! -e $model/config.json ]]; then
  "$rl" model init --out "$model" --preset tiny --seed "$seed" --force
fi
"$rl" sft @ configs/alphabet_sort/sft.toml --model.path "$model" --seed "$seed" \
  --run.name "alphabet-sort-sft-seed$seed" "${clean[@]}"
"$rl" rl @ configs/alphabet_sort/rl.toml --model.path "outputs/alphabet-sort-sft-seed$seed/model" \
  --orchestrator.seed "$seed" --run.name "alphabet-sort-rl-seed$seed" "${clean[@]}"
