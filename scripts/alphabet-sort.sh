#!/usr/bin/env bash
# The alphabet-sort recipe: tiny model -> SFT warm start -> multi-turn GRPO, on CPU (see
# scripts/run-recipe.sh). Usage: ./scripts/alphabet-sort.sh [--clean] [--seed N]
exec "$(dirname "$0")/run-recipe.sh" alphabet_sort alphabet-sort "$@"
