#!/usr/bin/env bash
# Installs the CUDA 12.9 compiler pieces that pn-kernels needs (NVRTC, the CUDA headers, CCCL's
# <cuda/std/...> headers and ptxas) from PyPI into <checkout>/.cuda-toolchain, then prints the
# `export` lines that point pn-kernels/build.rs at them:
#
#     eval "$(scripts/cuda-toolchain.sh)"
#     cargo build -p pn-kernels
#
# Why PyPI wheels: CUDA 13 dropped sm_60 (the P100), PyPI has no CUDA 12 nvcc, but NVRTC 12.9 and
# ptxas 12.9 compile our kernels to sm_60 PTX and cubin. No GPU or driver is needed to build.
#
# Idempotent: a second run installs nothing. stdout carries only the export lines; everything else
# (pip's progress, errors) goes to stderr. Override the folder with PN_CUDA_TOOLCHAIN_DIR.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dir="${PN_CUDA_TOOLCHAIN_DIR:-$root/.cuda-toolchain}"
stamp="$dir/.pn-toolchain-v1"

# The four wheels must go in with ONE pip call: a second `pip install --target` into the same
# folder silently skips files of the shared `nvidia/` package tree.
wheels=(
  "nvidia-cuda-nvrtc-cu12==12.9.86"
  "nvidia-cuda-runtime-cu12==12.9.79"
  "nvidia-cuda-cccl-cu12==12.9.27"
  "nvidia-cuda-nvcc-cu12==12.9.86"
)

if [[ ! -f "$stamp" ]]; then
  python="${PYTHON:-python3}"
  if ! command -v "$python" >/dev/null 2>&1; then
    echo "cuda-toolchain.sh: $python not found; install Python 3 with pip" >&2
    exit 1
  fi
  rm -rf "$dir.partial"
  "$python" -m pip install --quiet --disable-pip-version-check --no-deps \
    --target "$dir.partial" "${wheels[@]}" >&2
  rm -rf "$dir"
  mv "$dir.partial" "$dir"
  printf '%s\n' "${wheels[@]}" >"$stamp"
fi

nv="$dir/nvidia"
nvrtc_lib="$nv/cuda_nvrtc/lib"
ptxas_dir="$nv/cuda_nvcc/bin"
for need in "$nvrtc_lib" "$ptxas_dir/ptxas" "$nv/cuda_runtime/include/cuda_runtime.h" "$nv/cuda_cccl/include/cuda/std/cstdint"; do
  if [[ ! -e "$need" ]]; then
    echo "cuda-toolchain.sh: $need is missing; delete $dir and rerun" >&2
    exit 1
  fi
done

printf 'export PN_NVRTC_ROOT=%q\n' "$nv"
printf 'export PN_PTXAS=%q\n' "$ptxas_dir/ptxas"
printf 'export PATH=%q:"$PATH"\n' "$ptxas_dir"
printf 'export LD_LIBRARY_PATH=%q"${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"\n' "$nvrtc_lib"
