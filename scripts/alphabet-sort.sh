#!/usr/bin/env bash
# The alphabet-sort recipe: tiny model with a BPE trained on the task's text (each name is one or
# two tokens, not ten characters) -> SFT warm start -> multi-turn GRPO, on CPU (see
# scripts/run-recipe.sh). Usage: ./scripts/alphabet-sort.sh [--clean] [--seed N]; the 15-minute
# attempts (docs/recipes.md): add --bpe-pieces attached --variant fast (or --variant exact)
exec "$(dirname "$0")/run-recipe.sh" alphabet_sort alphabet-sort --tokenizer-task alphabet-sort "$@"
