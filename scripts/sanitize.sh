#!/usr/bin/env bash
# Sanitizer job: build the C++ extension with AddressSanitizer + UndefinedBehaviorSanitizer and run
# the native and KV-cache tests and a short fuzz of the native ops under them; any report fails.
#
# Usage:  bash scripts/sanitize.sh            (from anywhere; Linux + GCC)
#   SANITIZE_CALLS=20000  fuzz calls (scripts/fuzz_native.py --calls)
#   SANITIZE_SEED=0       fuzz seed
#   SANITIZE_DIR=/path    copy and build there, and keep it (to rerun a step by hand), instead of
#                         in a fresh temporary directory that is removed at the end; the
#                         extension is rebuilt on every run either way
#   PYTHON=python3        the interpreter (the one torch is installed for)
#
# What it does:
#   1. copies the tree (tracked and untracked-but-not-ignored files) to a temporary directory and
#      builds the extension in place there with SPECDEC_SANITIZE=1 (setup.py: -O1 -g
#      -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer -fno-wrapv;
#      CPU only). The tree's own specdec_kernels/_C*.so is never touched;
#   2. runs, from the copy (PYTHONPATH=<copy>), with the sanitizer runtimes preloaded into the
#      stock python / torch wheel:
#        LD_PRELOAD="$(g++ -print-file-name=libasan.so) $(g++ -print-file-name=libubsan.so)"
#        ASAN_OPTIONS=detect_leaks=0   (CPython and torch keep allocations alive on purpose)
#        UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
#      tests/test_native.py tests/test_kv_cache.py tests/test_kv_cache_property.py
#      tests/test_model_kernels.py, then
#      scripts/fuzz_native.py (garbage arguments to every torch.ops.specdec native op and to the
#      cache verbs with validate=False: each call must return or raise a Python exception).
#   A sanitizer report aborts the process, so the job exits non-zero on the first one.
#   No suppressions are needed: torch itself is not instrumented, so only the extension's own
#   code is checked (plus ASan's malloc / memcpy interceptors, which torch passes).
#
# Wall time, measured on the 2-core development machine (shared with other jobs): 4 min 28 s
# (build 203 s, tests 52 s, 3000 fuzz calls 3 s) and 7 min 19 s under heavier load (build 309 s,
# tests 77 s, 20000 fuzz calls 40 s). That is over the ~4 minutes .ci/run can spend, so .ci/run
# does not run it: run it after changing csrc/.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="${PYTHON:-python}"
CXX="${CXX:-g++}"
CALLS="${SANITIZE_CALLS:-20000}"
SEED="${SANITIZE_SEED:-0}"

if [[ -n "${SANITIZE_DIR:-}" ]]; then
  WORK="${SANITIZE_DIR}"
  mkdir -p "${WORK}"
else
  WORK="$(mktemp -d "${TMPDIR:-/tmp}/specdec-sanitize.XXXXXX")"
  trap 'rm -rf "${WORK}"' EXIT
fi

libasan="$("${CXX}" -print-file-name=libasan.so)"
libubsan="$("${CXX}" -print-file-name=libubsan.so)"
for lib in "${libasan}" "${libubsan}"; do
  if [[ ! -e "${lib}" ]]; then
    echo "sanitize: ${CXX} has no $(basename "${lib}") (install the GCC sanitizer runtimes)" >&2
    exit 1
  fi
done

echo "== sanitize: copy the tree to ${WORK} =="
(cd "${ROOT}" && git ls-files -z --cached --others --exclude-standard |
  tar --null --files-from=- --ignore-failed-read -cf - 2>/dev/null) | tar -xf - -C "${WORK}"

echo "== sanitize: build the extension (SPECDEC_SANITIZE=1) =="
start=${SECONDS}
rm -rf "${WORK}/build" "${WORK}"/specdec_kernels/_C*.so  # setup.py would reuse stale objects
(cd "${WORK}" && SPECDEC_SANITIZE=1 "${PYTHON}" setup.py -q build_ext --inplace >build.log 2>&1) || {
  tail -50 "${WORK}/build.log"
  exit 1
}
so=("${WORK}"/specdec_kernels/_C*.so)
# setup.py warns instead of failing when the build fails: check that an instrumented module exists.
# (grep without -q: with pipefail, -q exiting early could fail the pipeline through nm's SIGPIPE.)
if [[ ! -e "${so[0]}" ]] || ! nm -D "${so[0]}" | grep "__asan_report" >/dev/null; then
  tail -50 "${WORK}/build.log"
  echo "sanitize: no ASan-instrumented specdec_kernels/_C*.so was built" >&2
  exit 1
fi
echo "built ${so[0]#"${WORK}"/} in $((SECONDS - start)) s"

run() {
  (cd "${WORK}" && env PYTHONPATH="${WORK}" LD_PRELOAD="${libasan} ${libubsan}" \
    ASAN_OPTIONS="detect_leaks=0:abort_on_error=0:halt_on_error=1" \
    UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1" \
    "${PYTHON}" "$@")
}

echo "== sanitize: the extension in use is the instrumented one =="
run -c "import specdec_kernels as sk, specdec_kernels._C as c
assert sk.extension_available() and c.__file__.startswith('${WORK}'), c.__file__
print(c.__file__)"

echo "== sanitize: native and KV-cache tests =="
start=${SECONDS}
run -m pytest -q -p no:cacheprovider tests/test_native.py tests/test_kv_cache.py \
  tests/test_kv_cache_property.py tests/test_model_kernels.py
echo "tests took $((SECONDS - start)) s"

echo "== sanitize: fuzz the native ops (${CALLS} calls, seed ${SEED}) =="
run scripts/fuzz_native.py --calls "${CALLS}" --seed "${SEED}"
echo "sanitize: clean"
