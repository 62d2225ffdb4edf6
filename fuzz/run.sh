#!/usr/bin/env bash
# Builds the fuzz targets with libFuzzer's coverage instrumentation on the STABLE compiler (no
# sanitizer: the `-s none` build of cargo-fuzz, without needing cargo-fuzz or a nightly) and
# runs each for SECONDS (default 8) from its committed seeds. Usage:
#   fuzz/run.sh [SECONDS] [TARGET...]
# A crash leaves its input in fuzz/artifacts/<target>/ and fails the script: copy the input
# to fuzz/seeds/<target>/ (it is then replayed by `cargo test -p pn-runtime --test fuzz_replay`)
# and fix it. The working corpus grows in fuzz/corpus/<target>/ (ignored by git).
set -euo pipefail
cd "$(dirname "$0")"
secs="${1:-8}"
shift || true
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
    targets=(gguf_parse pn_validate safetensors imatrix tokenizer chat_template server_request)
fi
host="$(rustc -vV | sed -n 's/^host: //p')"
# The flags cargo-fuzz passes for `--sanitizer none`; `--target` keeps build scripts and proc
# macros uninstrumented (they link without libFuzzer).
export RUSTFLAGS="--cfg fuzzing -Cpasses=sancov-module -Cllvm-args=-sanitizer-coverage-level=4 \
-Cllvm-args=-sanitizer-coverage-inline-8bit-counters -Cllvm-args=-sanitizer-coverage-pc-table \
-Cllvm-args=-sanitizer-coverage-trace-compares -Cdebug-assertions -Coverflow-checks"
bins=()
for t in "${targets[@]}"; do bins+=(--bin "$t"); done
cargo build --release --target "$host" "${bins[@]}"
for t in "${targets[@]}"; do
    mkdir -p "corpus/$t" "artifacts/$t"
    # -rss_limit_mb bounds a run's memory; -max_len keeps inputs to the sizes the seeds have.
    "target/$host/release/$t" "corpus/$t" "seeds/$t" -max_total_time="$secs" \
        -rss_limit_mb=2048 -max_len=65536 -artifact_prefix="artifacts/$t/" -print_final_stats=1 \
        2>&1 | grep -E "^(stat::number_of_executed_units|stat::peak_rss_mb|==|SUMMARY|Done)|panicked|crash-" \
        | sed "s/^/[$t] /"
    [ "${PIPESTATUS[0]}" -eq 0 ] || { echo "fuzz target $t failed" >&2; exit 1; }
done
