#!/usr/bin/env bash
# Runs a recipe from nothing to a trained model on CPU:
#   rl model init (tiny preset) -> rl sft @ configs/<dir>/sft.toml -> rl rl @ configs/<dir>/rl.toml.
# Usage: run-recipe.sh <config dir> <run prefix> [--tokenizer-task NAME [--bpe-pieces KIND]
#        [--vocab-size N]] [--init-std X] [--clean] [--seed N] [--lora] [--variant V]
# Outputs land under ./outputs; --clean starts over; --seed N changes the model's initialisation,
# the SFT order and the RL task order (the data and the eval set stay the same);
# --tokenizer-task NAME gives the model a BPE trained on that task's text instead of characters
# (--bpe-pieces KIND: what the BPE merges within, `rl model init --help`; --vocab-size N its
# vocabulary, 512 by default); --init-std X draws the initial weights at that standard deviation
# (`rl model init --init-std`; 0.02 by default);
# --lora trains LoRA adapters in the RL stage (configs/<dir>/lora.toml layered on rl.toml), from
# the same SFT model, into a run named <prefix>-rl-lora-seedN; --variant V layers
# configs/<dir>/sft_V.toml on sft.toml and configs/<dir>/rl_V.toml on rl.toml (each where it
# exists), into runs named <prefix>-sft-V-seedN and <prefix>-rl-V-seedN.
set -euo pipefail
cd "$(dirname "$0")/.."
dir="$1"
prefix="$2"
shift 2
clean=()
seed=0
tokenizer=()
pieces=()
vocab=()
init_std=()
lora=()
suffix=""
variant=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --clean) clean=(--clean) ;;
    --seed) seed="$2"; shift ;;
    --tokenizer-task) tokenizer=(--tokenizer-task "$2"); shift ;;
    --bpe-pieces) pieces=(--bpe-pieces "$2"); shift ;;
    --vocab-size) vocab=(--vocab-size "$2"); shift ;;
    --init-std) init_std=(--init-std "$2"); shift ;;
    --lora) lora=(@ "configs/$dir/lora.toml"); suffix="-lora" ;;
    --variant) variant="$2"; shift ;;
    *) echo "usage: $0 <config dir> <run prefix> [--tokenizer-task NAME [--bpe-pieces KIND] [--vocab-size N]] [--init-std X] [--clean] [--seed N] [--lora] [--variant V]" >&2; exit 2 ;;
  esac
  shift
done
cargo build --release --locked -p rl-cli
rl=target/release/rl
model=outputs/models/tiny-seed$seed
if [[ ${#tokenizer[@]} -gt 0 ]]; then
  model=outputs/models/tiny-${tokenizer[1]}-bpe${pieces[1]:+-${pieces[1]}}${vocab[1]:+-${vocab[1]}}-seed$seed
  tokenizer+=("${pieces[@]}" "${vocab[@]}")
elif [[ ${#pieces[@]} -gt 0 || ${#vocab[@]} -gt 0 ]]; then
  echo "--bpe-pieces and --vocab-size shape the BPE of --tokenizer-task" >&2
  exit 2
fi
if [[ ${#init_std[@]} -gt 0 ]]; then
  model=${model%-seed$seed}-std${init_std[1]}-seed$seed
fi
sft_layers=()
rl_layers=()
tag=""
if [[ -n $variant ]]; then
  tag="-$variant"
  [[ -e configs/$dir/sft_$variant.toml ]] && sft_layers=(@ "configs/$dir/sft_$variant.toml")
  [[ -e configs/$dir/rl_$variant.toml ]] && rl_layers=(@ "configs/$dir/rl_$variant.toml")
  if [[ ${#sft_layers[@]} -eq 0 && ${#rl_layers[@]} -eq 0 ]]; then
    echo "no configs/$dir/sft_$variant.toml or rl_$variant.toml" >&2
    exit 2
  fi
fi
sft=$prefix-sft$tag-seed$seed
if [[ ${#clean[@]} -gt 0 || ! -e $model/config.json ]]; then
  "$rl" model init --out "$model" --preset tiny --seed "$seed" --force "${tokenizer[@]}" "${init_std[@]}"
fi
# The SFT model is reused when it exists (a --lora run after a full one starts from the same one).
if [[ ${#clean[@]} -gt 0 || ! -e outputs/$sft/model/config.json ]]; then
  "$rl" sft @ "configs/$dir/sft.toml" "${sft_layers[@]}" --model.path "$model" --seed "$seed" --run.name "$sft" "${clean[@]}"
fi
"$rl" rl @ "configs/$dir/rl.toml" "${rl_layers[@]}" "${lora[@]}" --model.path "outputs/$sft/model" \
  --orchestrator.seed "$seed" --run.name "$prefix-rl$tag$suffix-seed$seed" "${clean[@]}"
