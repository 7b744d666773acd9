#!/usr/bin/env bash
# The alphabet-sort recipe: tiny model with a BPE trained on the task's text (each name is one or
# two tokens, not ten characters) -> SFT warm start -> multi-turn GRPO, on CPU (see
# scripts/run-recipe.sh). Usage: ./scripts/alphabet-sort.sh [--clean] [--seed N] [--variant V]
# By default the 15-minute recipe: the BPE's pieces attached to their spaces and the `fast`
# variant (configs/alphabet_sort/sft_fast.toml + rl_fast.toml layered on sft.toml + rl.toml).
# --variant base runs sft.toml + rl.toml alone with the BPE's default isolated pieces (the 30-minute recipe of
# 2026-11-26); --variant exact the balanced-SFT attempt. docs/recipes.md has each one's figures.
set -euo pipefail
args=()
variant=""
pieces=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --variant) variant="${2:?--variant needs a name}"; shift 2 ;;
    --bpe-pieces) pieces="${2:?--bpe-pieces needs a kind}"; shift 2 ;;
    *) args+=("$1"); shift ;;
  esac
done
case "$variant" in
  "") variant=fast; pieces="${pieces:-attached}" ;;
  base) variant="" ;;
  *) pieces="${pieces:-attached}" ;;
esac
[[ -n $pieces ]] && args+=(--bpe-pieces "$pieces")
[[ -n $variant ]] && args+=(--variant "$variant")
exec "$(dirname "$0")/run-recipe.sh" alphabet_sort alphabet-sort --tokenizer-task alphabet-sort "${args[@]}"
