#!/usr/bin/env bash
# The debate recipe: tiny model (characters) -> SFT on debates played by the env's kernel (debaters
# stating the true answer, a judge shown the reference picking the right one) -> self-play RL with
# RAE, greedy debates over held-out questions before and during RL (see scripts/run-recipe.sh).
# Usage: ./scripts/debate.sh [--clean] [--seed N]
exec "$(dirname "$0")/run-recipe.sh" debate debate "$@"
