#!/usr/bin/env bash
# The wiki-nav recipe: tiny model with a BPE trained on the task's text -> SFT on shortest-path
# demonstrations of the env's own graph -> multi-turn GRPO with native tool calls, greedy walks
# from held-out start/target pairs before and during RL (see scripts/run-recipe.sh).
# Usage: ./scripts/wiki-nav.sh [--text] [--clean] [--seed N]
#   --text: the text harness (actions as XML tags; configs/wiki_nav/sft_text.toml, rl_text.toml).
args=()
for a in "$@"; do
  if [[ $a == --text ]]; then args+=(--variant text); else args+=("$a"); fi
done
exec "$(dirname "$0")/run-recipe.sh" wiki_nav wiki-nav --tokenizer-task wiki-nav "${args[@]}"
