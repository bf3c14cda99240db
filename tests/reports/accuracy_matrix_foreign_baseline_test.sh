#!/usr/bin/env bash
# The accuracy matrix, one bf16 cell, checked against a copy of its baseline
# that claims a CPU of another kind (no AVX-512) running 10x faster than this
# one: the memory checks must still pass and the speed must be reported as
# not compared. Before reports recorded their machine, this failed with
# "throughput vs baseline ... (-77%, allowed -50%)" on any slower CPU.
#   accuracy_matrix_foreign_baseline_test.sh SOURCE_DIR SHARDFIT
set -euo pipefail
src=$1 shardfit=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cell=gpt2-tiny__zero3_bf16_wrap-block
python3 - "$src/reports/baselines/$cell.json" "$work/$cell.json" <<'PY'
import json, sys
b = json.load(open(sys.argv[1]))
b["run"]["tokens_per_s"] *= 10
b["machine"] = {"cpu_model": "Some Other CPU", "isa_flags": ["avx2"], "l2_cache_bytes": 262144,
                "threads_per_rank": 1}
json.dump(b, open(sys.argv[2], "w"))
PY
out=$(MATRIX_BASELINES="$work" MATRIX_MODELS=gpt2-tiny MATRIX_PRECISIONS=bf16 \
      MATRIX_CANDIDATES=zero3/bf16/wrap=block bash "$src/scripts/accuracy-matrix" check "$shardfit")
echo "$out"
grep -q "^1 passed, 0 failed$" <<<"$out"
grep -q "throughput vs baseline: .*not compared, measured on" <<<"$out"
