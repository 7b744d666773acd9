#!/usr/bin/env bash
# A lent GPU session's benchmark in one device call (docs/gpu.md, "A device session").
#
#   here:       ./scripts/gpu-session.sh pack
#               builds the CUDA `rl` (cargo xtask build-cuda), the xtask binary and the CUPTI
#               kernel profiler, and leaves them stripped and xz-compressed in target/gpu-carry
#               (~17 MB: a call carries 64 MiB).
#   on the GPU: ./scripts/gpu-session.sh run [bench gpu options...]
#               (device `run` with carry = ["target/gpu-carry"]): unpacks them, puts the machine's
#               own CUDA 13 libraries (its PyTorch's nvidia wheels) on the library path, then runs
#               the stages of $STAGES in order (default "leads-on profile bench leads-off"), with
#               `nvidia-smi dmon` beside them:
#                 leads-on   the trainer of `xtask bench gpu` with the two CUDA leads;
#                 profile    the whole benchmark but PyTorch under the CUPTI profiler
#                            (scripts/cupti_profile.c): per CUDA process a summary of its kernels,
#                            copies, synchronisations and API calls by time, in profile/;
#                 bench      the whole benchmark, PyTorch's same-run reference included;
#                 leads-off  the trainer with both leads undone (RL_CUDA_EVENT_TRACKING=1
#                            RL_CUDA_POOL_RELEASE=1).
#               Everything lands in $OUT (or target/gpu-session): <stage>.txt and
#               <stage>-metrics.jsonl, profile/cupti-<pid>.txt, dmon.txt, gpu.txt.
# The run half's plumbing runs on a CPU too, with a CPU build packed by hand and
# `run --device cpu --dtype f32 --preset tiny --tokens 1024`.
set -euo pipefail
cd "$(dirname "$0")/.."
carry=target/gpu-carry
case "${1:-}" in
  pack)
    cargo xtask build-cuda
    cargo build --release --locked -p xtask
    rm -rf "$carry"
    mkdir -p "$carry"
    strip -o "$carry/rl" target/cuda/dist/bin/rl
    strip -o "$carry/xtask" target/release/xtask
    cp target/cuda/dist/lib/libcupti_profile.so target/cuda/dist/lib/libcupti.so.13 "$carry/"
    xz -T0 -6 "$carry/rl" "$carry/xtask" "$carry/libcupti_profile.so" "$carry/libcupti.so.13"
    # xtask finds the repository where it was built; `run` links that path to the copy it runs in.
    pwd >"$carry/built-at"
    du -sh "$carry"
    ;;
  run)
    shift
    out=${OUT:-target/gpu-session}
    mkdir -p "$out"
    bin=$(mktemp -d)
    for b in rl xtask libcupti_profile.so libcupti.so.13; do
      xz -dc "$carry/$b.xz" >"$bin/$b"
      chmod +x "$bin/$b"
    done
    built_at=$(cat "$carry/built-at")
    if [[ $built_at != "$(pwd)" && ! -e $built_at ]]; then
      mkdir -p "$(dirname "$built_at")"
      ln -s "$(pwd)" "$built_at"
    fi
    if libs=$(python3 -c "import nvidia, os; print(os.path.join(nvidia.__path__[0], 'cu13', 'lib'))" 2>/dev/null); then
      export LD_LIBRARY_PATH="$libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    fi
    dmon=""
    if command -v nvidia-smi >/dev/null; then
      nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv >"$out/gpu.txt" 2>&1 || true
      nvidia-smi dmon -s u -d 1 >"$out/dmon.txt" 2>&1 &
      dmon=$!
    fi
    trap '[[ -n $dmon ]] && kill $dmon 2>/dev/null || true' EXIT
    work=target/bench/gpu
    # A stage that fails is reported and the next one still runs. The default order puts first
    # what a session cut short by its time would miss most: our trainer's figure with the leads,
    # where its time goes, the whole benchmark against PyTorch, then the leads' A/B.
    stage() {
      local name=$1
      shift
      echo "== $name"
      SECONDS=0
      if "$@" 2>&1 | tee "$out/$name.txt"; then
        cp "$work/gpu-train/metrics.jsonl" "$out/$name-metrics.jsonl" 2>/dev/null || true
        echo "== $name took ${SECONDS}s"
      else
        echo "== $name FAILED after ${SECONDS}s"
      fi
    }
    for name in ${STAGES:-leads-on profile bench leads-off}; do
      case $name in
        leads-on) stage leads-on "$bin/xtask" bench gpu --rl "$bin/rl" --trainer-only "$@" ;;
        profile)
          mkdir -p "$out/profile"
          stage profile env CUDA_INJECTION64_PATH="$bin/libcupti_profile.so" RL_CUPTI_PROFILE_DIR="$out/profile" \
            "$bin/xtask" bench gpu --rl "$bin/rl" --no-reference "$@"
          ls "$out/profile"/cupti-*.txt 2>/dev/null || echo "== profile: no CUDA process wrote a profile"
          ;;
        bench) stage bench "$bin/xtask" bench gpu --rl "$bin/rl" "$@" ;;
        leads-off)
          stage leads-off env RL_CUDA_EVENT_TRACKING=1 RL_CUDA_POOL_RELEASE=1 \
            "$bin/xtask" bench gpu --rl "$bin/rl" --trainer-only "$@"
          ;;
        *) echo "unknown stage $name (leads-on, profile, bench, leads-off)" >&2; exit 2 ;;
      esac
    done
    # The profiles' heads last, so the call's output tail carries them even if its files do not
    # come back: per process its command, the kernels' share, the top kernels and driver calls.
    for f in "$out"/profile/cupti-*.txt; do
      [[ -e $f ]] || continue
      echo "== $(basename "$f")"
      awk '/^(kernels by total time|driver API)/ { n = 9 } /^runtime API/ { n = 0 } NR <= 4 || n-- > 0' "$f" | cut -c1-150
    done
    ;;
  *)
    echo "usage: $0 pack | run [bench gpu options...]" >&2
    exit 2
    ;;
esac
