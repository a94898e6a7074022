#!/usr/bin/env bash
# Build kvevents.native._speedups (all of kvevents/native/*.c) with -fsanitize=address,undefined in a scratch
# copy of the tree and run the differential tests (tests/native, the /score body reader's and splitter's, the answer's rows) against it
# once. Any sanitizer report fails (-s: a report is printed before the process stops). Run by .ci/run; skipped without gcc/libasan.
#   scripts/asan_check.sh            (needs gcc with libasan/libubsan; ~30-60 s on 2 cores)
set -euo pipefail
if ! command -v gcc >/dev/null; then echo "asan_check: skipped (no gcc)"; exit 0; fi
asan="$(gcc -print-file-name=libasan.so)"
ubsan="$(gcc -print-file-name=libubsan.so)"
if [ ! -e "$asan" ] || [ ! -e "$ubsan" ]; then echo "asan_check: skipped (no libasan/libubsan)"; exit 0; fi
repo="$(cd "$(dirname "$0")/.." && pwd)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
cd "$repo"
# the tracked and new files of the working tree, without built artifacts
{ git ls-files; git ls-files --others --exclude-standard; } | grep -v '\.so$' | sort -u |
  while read -r f; do [ -f "$f" ] && printf '%s\0' "$f"; done | tar --null -cf - -T - | tar -xf - -C "$work"
cd "$work"
KVEVENTS_SANITIZE=1 python3 setup.py -q build_ext --inplace >build.log 2>&1 || { cat build.log; exit 1; }
ls kvevents/native/_speedups*.so >/dev/null || { echo "asan_check: the sanitized extension did not build" >&2; cat build.log; exit 1; }
export LD_PRELOAD="$asan $ubsan"
export ASAN_OPTIONS="detect_leaks=0:abort_on_error=1:halt_on_error=1"
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1"
export PYTHONPATH="$work"
# run from the scratch copy, so `kvevents` is the sanitized build, not the installed tree
python3 -c "import kvevents.native._speedups as s, kvevents; assert kvevents.__file__.startswith('$work'), kvevents.__file__; print('asan_check: sanitized', s.__file__)"
python3 -m pytest -q -s -p no:cacheprovider tests/native tests/consumers/test_score_body.py tests/consumers/test_score_split.py \
  tests/consumers/test_answer_rows.py
echo "asan_check: ok (no sanitizer reports)"
