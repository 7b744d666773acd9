#!/usr/bin/env bash
# The reverse-text recipe: tiny model -> SFT warm start -> GRPO, on CPU (see scripts/run-recipe.sh).
# Usage: ./scripts/reverse-text.sh [--clean] [--seed N]
exec "$(dirname "$0")/run-recipe.sh" reverse_text reverse-text "$@"
