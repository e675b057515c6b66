#!/usr/bin/env bash
# Rebuild the native core with AddressSanitizer + UBSan into a temporary
# directory (the in-tree extension is not touched) and run the native coder
# and codec tests against that build, plus hostile payloads through the public
# read paths (tests/codecs/test_hostile_payloads.py runs those in subprocesses, which
# inherit the sanitizer environment set here).  Exits non-zero on a compiler
# warning (-Werror), any test failure or sanitizer finding (every finding
# aborts the process).
#
#   native/run_sanitized_tests.sh PYTHON [pytest args...]
#
# Extra pytest args replace the default test selection.
set -euo pipefail

PY=${1:-python3}
shift || true
ROOT=$(cd "$(dirname "$0")/.." && pwd)
TMP=$(mktemp -d "${TMPDIR:-/tmp}/mvc-asan.XXXXXX")
trap 'rm -rf "$TMP"' EXIT

CC_BIN=${CC:-gcc}
LIBASAN=$("$CC_BIN" -print-file-name=libasan.so)
if [ ! -e "$LIBASAN" ]; then
    echo "run_sanitized_tests: $CC_BIN has no libasan.so (install gcc's sanitizer runtime)" >&2
    exit 2
fi

# -Werror: the core builds warning-free under -Wall -Wextra (build_native.py) and stays so.
export MVC_NATIVE_CFLAGS="-fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer -g -O1 -Werror"
export MVC_NATIVE_LDFLAGS="-fsanitize=address,undefined"

cd "$ROOT"
"$PY" setup.py -q build_ext --build-lib "$TMP/lib" --build-temp "$TMP/obj" --force >"$TMP/build.log" 2>&1 || {
    cat "$TMP/build.log" >&2
    exit 1
}
# A copy of the package with the sanitized extension in it, first on the path.
mkdir -p "$TMP/pkg"
cp -r "$ROOT/mvc" "$TMP/pkg/"
find "$TMP/pkg" \( -name '*.so' -o -name '__pycache__' \) -prune -exec rm -rf {} +
cp "$TMP"/lib/mvc/_mvc_native*.so "$TMP/pkg/mvc/"

if [ $# -eq 0 ]; then
    set -- tests/native/test_native_huffman.py tests/native/test_native_rle.py \
        tests/native/test_native_byteplane.py tests/native/test_native_rans.py \
        tests/codecs/test_codec_lossless.py tests/quant/test_quant_assign.py tests/codecs/test_delta_groups.py \
        tests/codecs/test_codec_quantized.py tests/native/test_native_chain.py tests/codecs/test_hostile_payloads.py \
        tests/native/test_native_layer.py tests/native/test_native_pinned_output.py tests/codecs/test_delta_ablations.py tests/quant/test_quant_parallel.py \
        tests/quant/test_quant_error.py tests/native/test_native_kmeans.py tests/quant/test_quant_kmeans.py \
        tests/quant/test_moment_bound.py \
        tests/native/test_native_rans_legacy.py tests/native/test_native_rans_recover.py tests/native/test_native_simd.py \
        tests/native/test_native_log.py tests/quant/test_quant_sketch.py \
        tests/native/test_native_heap.py::test_release_mapped_checks_its_range \
        tests/native/test_native_heap.py::test_native_heap_bound_checks_its_arguments \
        tests/native/test_native_heap.py::test_release_mapped_unmaps_a_file_mapping_and_keeps_its_contents \
        tests/store/test_store_lmdb_mapped.py tests/native/test_native_lmdbcheck.py
fi

# -P keeps the source tree (cwd) off sys.path so the sanitized copy is imported.
# --capture=sys leaves fd 2 alone so a sanitizer report is printed before the abort.
# Python itself "leaks" at exit; everything else must be clean.
export ASAN_OPTIONS="detect_leaks=0:abort_on_error=1:halt_on_error=1:verify_asan_link_order=0"
export UBSAN_OPTIONS="halt_on_error=1:abort_on_error=1:print_stacktrace=1"
export PYTHONPATH="$TMP/pkg${PYTHONPATH:+:$PYTHONPATH}"

LD_PRELOAD="$LIBASAN" "$PY" -P -c 'import sys, mvc._mvc_native as m; assert m.__file__.startswith(sys.argv[1]), m.__file__; print("sanitized build:", m.__file__)' "$TMP/pkg"
LD_PRELOAD="$LIBASAN" "$PY" -P -m pytest -p no:cacheprovider --capture=sys "$@"
