#!/usr/bin/env bash
# GPU verification of pn-kernels and the CUDA backend, in two steps:
#
#   bash scripts/gpu-check.sh build   # here (no GPU needed): compiles the kernels (sm_60 cubin +
#                                     # compute_60 PTX via scripts/cuda-toolchain.sh) and builds the
#                                     # x86-64 test binaries and the bandwidth bench into gpu-check/
#   bash scripts/gpu-check.sh run     # on the GPU machine, from the checkout root: runs every
#                                     # ignored GPU test and the bench, logs under $OUT (or
#                                     # gpu-check/logs), exits non-zero if a test failed
#
# With the device tool: build here, then `run` with carry ["gpu-check"] and the command
# `bash scripts/gpu-check.sh run`. The binaries find tests/data through PN_REPO_ROOT (set by
# `run` to the checkout root), since the path compiled into them is this machine's.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dest="$root/gpu-check"
mode="${1:-build}"

build() {
  cd "$root"
  eval "$(bash scripts/cuda-toolchain.sh)"
  export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$root/target}"
  rm -rf "$dest" && mkdir -p "$dest/bin"
  # Test binaries (release: the GPU tests run whole models), paths taken from cargo's JSON.
  local json
  json="$(cargo test --release --no-run --message-format=json \
    -p pn-kernels --test gpu --test h2_accuracy --test attention_prefill \
    -p pn-tests --test cuda_backend --test delta_rule_chunked \
    -p pn-runtime --test engine_cuda 2>/dev/null)"
  echo "$json" | python3 -c '
import json, sys, shutil, os
dest = sys.argv[1]
for line in sys.stdin:
    try: m = json.loads(line)
    except ValueError: continue
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["profile"]["test"]:
        name = m["target"]["name"]
        shutil.copy2(m["executable"], os.path.join(dest, "bin", name))
        print(name)
' "$dest" >"$dest/tests.txt"
  cargo build --release -p pn-kernels --bin pn-kernels-bench
  cp "$CARGO_TARGET_DIR/release/pn-kernels-bench" "$dest/bin/"
  if ! grep -q . "$dest/tests.txt"; then
    echo "gpu-check: no test binaries were built" >&2
    exit 1
  fi
  "$dest/bin/pn-kernels-bench" --iters 1 >/dev/null 2>&1 || true
  echo "gpu-check: built $(wc -l <"$dest/tests.txt") test binaries + bench into $dest" >&2
  du -sh "$dest" >&2
}

run() {
  cd "$root"
  local logs="${OUT:-$dest/logs}"
  mkdir -p "$logs"
  export PN_REPO_ROOT="$root"
  local failed=0
  nvidia-smi >"$logs/nvidia-smi.txt" 2>&1 || true
  while read -r t; do
    [[ -n "$t" ]] || continue
    echo "== $t" | tee -a "$logs/summary.txt"
    if timeout 300 "$dest/bin/$t" --ignored --nocapture --test-threads=1 >"$logs/$t.log" 2>&1; then
      echo "   ok" | tee -a "$logs/summary.txt"
    else
      echo "   FAILED (see $t.log)" | tee -a "$logs/summary.txt"
      failed=1
    fi
    grep -E "^test |test result|max abs diff|skipped" "$logs/$t.log" | tail -60 >>"$logs/summary.txt" || true
  done <"$dest/tests.txt"
  echo "== pn-kernels-bench" | tee -a "$logs/summary.txt"
  timeout 200 "$dest/bin/pn-kernels-bench" --iters 50 >"$logs/bench.log" 2>&1 || failed=1
  cat "$logs/bench.log" >>"$logs/summary.txt"
  cat "$logs/summary.txt"
  exit "$failed"
}

case "$mode" in
  build) build ;;
  run) run ;;
  *) echo "usage: $0 build|run" >&2; exit 2 ;;
esac
