#!/usr/bin/env bash
# The alphabet-sort recipe: tiny model with a BPE trained on the task's text (each name is one or
# two tokens, not ten characters) -> SFT warm start -> multi-turn GRPO, on CPU (see
# scripts/run-recipe.sh). Usage: ./scripts/alphabet-sort.sh [--clean] [--seed N] [--variant V] [--init-std X]
# By default the 15-minute recipe: the BPE's pieces attached to their spaces, the initial weights
# drawn at std 0.05 instead of 0.02 (both sort keys' name pairings then formed in SFT from four
# seeds of six, where 0.02 left three of four without them; docs/recipes.md) and the `fast` variant (configs/alphabet_sort/sft_fast.toml +
# rl_fast.toml layered on sft.toml + rl.toml).
# --variant base runs sft.toml + rl.toml alone with the BPE's default isolated pieces (the 30-minute recipe of
# 2026-11-26); --variant exact the balanced-SFT attempt. docs/recipes.md has each one's figures.
set -euo pipefail
args=()
variant=""
pieces=""
init_std=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --variant) variant="${2:?--variant needs a name}"; shift 2 ;;
    --bpe-pieces) pieces="${2:?--bpe-pieces needs a kind}"; shift 2 ;;
    --init-std) init_std="${2:?--init-std needs a number}"; shift 2 ;;
    *) args+=("$1"); shift ;;
  esac
done
case "$variant" in
  "") variant=fast; pieces="${pieces:-attached}"; init_std="${init_std:-0.05}" ;;
  base) variant="" ;;
  *) pieces="${pieces:-attached}" ;;
esac
[[ -n $pieces ]] && args+=(--bpe-pieces "$pieces")
[[ -n $init_std ]] && args+=(--init-std "$init_std")
[[ -n $variant ]] && args+=(--variant "$variant")
exec "$(dirname "$0")/run-recipe.sh" alphabet_sort alphabet-sort --tokenizer-task alphabet-sort "${args[@]}"
