#!/usr/bin/env bash
# The reverse-text recipe, from nothing to a trained model on CPU:
#   rl model init (tiny preset) -> rl sft (warm start) -> rl rl (GRPO).
# Outputs land under ./outputs; pass --clean to start over, --seed N for another seed (the model's
# initialisation, the SFT order and the RL task order; the data and the eval set stay the same).
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
sft=reverse-text-sft-seed$seed
if [[ ${#clean[@]} -gt 0 || ! -e $model/config.json ]]; then
  "$rl" model init --out "$model" --preset tiny --seed "$seed" --force
fi
"$rl" sft @ configs/reverse_text/sft.toml --model.path "$model" --seed "$seed" --run.name "$sft" "${clean[@]}"
"$rl" rl @ configs/reverse_text/rl.toml --model.path "outputs/$sft/model" --orchestrator.seed "$seed" \
  --run.name "reverse-text-rl-seed$seed" "${clean[@]}"
