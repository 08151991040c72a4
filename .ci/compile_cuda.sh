#!/usr/bin/env bash
# Compile every CUDA source under csrc/ with nvcc, compile only (no link, no GPU needed), for
# sm_80 and sm_90, against the installed torch's headers, so the CUDA code cannot rot on a
# CPU-only CI. Exits 0 with a message when nvcc is absent; non-zero on any compile error.
#
# Usage: .ci/compile_cuda.sh          (from anywhere; NVCC=/path/to/nvcc to pick a compiler)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
NVCC="${NVCC:-$(command -v nvcc || true)}"
if [[ -z "${NVCC}" && -x /usr/local/cuda/bin/nvcc ]]; then NVCC=/usr/local/cuda/bin/nvcc; fi
if [[ -z "${NVCC}" ]]; then
  echo "compile_cuda: nvcc not found; skipping the CUDA compile check"
  exit 0
fi

PYTHON="${PYTHON:-python}"
# torch's include dirs, Python's include dir, the C++ standard and ABI torch was built with.
# Works with a CPU-only build of torch too (its headers include c10/cuda).
mapfile -t FLAGS < <("${PYTHON}" - <<'PY'
import sysconfig
import torch
from torch.utils import cpp_extension
for d in cpp_extension.include_paths():
    print(f"-I{d}")
print(f"-I{sysconfig.get_paths()['include']}")
print(f"-D_GLIBCXX_USE_CXX11_ABI={int(torch.compiled_with_cxx11_abi())}")
major, minor = (int(x) for x in torch.__version__.split(".")[:2])
print("-std=c++20" if (major, minor) >= (2, 10) else "-std=c++17")
# A CPU build of torch ships c10/cuda's headers without the generated cuda_cmake_macros.h (it
# only defines C10_CUDA_BUILD_SHARED_LIBS, used on Windows): tell CUDAMacros.h not to include it.
import os
if not any(os.path.exists(os.path.join(d, "c10/cuda/impl/cuda_cmake_macros.h"))
           for d in cpp_extension.include_paths()):
    print("-DC10_CUDA_NO_CMAKE_CONFIGURE_FILE")
PY
)

mapfile -t SOURCES < <(find "${ROOT}/csrc" -name '*.cu' | sort)
if [[ ${#SOURCES[@]} -eq 0 ]]; then
  echo "compile_cuda: no .cu files under csrc/"
  exit 0
fi

OUT="$(mktemp -d)"
trap 'rm -rf "${OUT}"' EXIT
status=0
for src in "${SOURCES[@]}"; do
  cmd=("${NVCC}" -c "${src}" -o "${OUT}/$(basename "${src}").o"
       -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=sm_90
       -O3 --expt-relaxed-constexpr -Xcompiler -fPIC -DSPECDEC_WITH_CUDA
       -DTORCH_API_INCLUDE_EXTENSION_H -DTORCH_EXTENSION_NAME=_C
       -I"${ROOT}/csrc" "${FLAGS[@]}")
  echo "+ ${cmd[*]}"
  if "${cmd[@]}"; then
    echo "compile_cuda: OK ${src#"${ROOT}"/}"
  else
    echo "compile_cuda: FAILED ${src#"${ROOT}"/}"
    status=1
  fi
done
exit "${status}"
