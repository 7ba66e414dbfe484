#!/usr/bin/env bash
# Issue 35's study in the paper's setting at CPU scale (SmolLM2-135M-Instruct on K&K after the demo's
# cold start), all of it in one job: the mechanism, the learning pilot, then the report
# (src/arlopti/study/kk*.py; docs/results.md, "The paper's setting at CPU scale").
#
#   bash benchmarks/run_kk_study.sh [OUT]      # OUT: logs/study/kk, inside the run tree (= arlopti study's default)
#
# (on a shared machine, under its CPU lock: flock <lock file> bash benchmarks/run_kk_study.sh)
#
# 1. mechanism: `study kk-mechanism`, one batch per call (batch b: sampling seed b, puzzles seed 4242 + b;
#    2 K&K prompts of 2 and 3 people x 4 responses, <= 128 new tokens, T = 0.7), every method on each;
# 2. pilot: `study kk-run` for each seed (outer) and method (inner), so that a cut-short job leaves whole
#    seeds: 8 rollout steps of train.py experiment=kk_lopti_demo with the method's algorithm, then eval.py,
#    greedy, on VAL_PER_N generated puzzles per N (the same for every run);
# 3. report: `study kk-report` -> OUT/kk_tables.md, kk_study.json, kk_study.png.
# A piece already in OUT (mechanism/batch<b>.json, pilot/<m>/seed<s>/pilot_run.json, both written last)
# is not run again (the study itself skips it), so a second call finishes a cut-short job; delete OUT to
# start over. A failed piece
# is logged and the job goes on (the report covers what finished; the exit status is then 1). Each
# piece's wall time goes to OUT/timings.txt.
# Sizes (environment; defaults = the sized study, estimated at 2 h 10 min on this 2-core CPU, docs/results.md):
#   KK_BATCHES (2), KK_METHODS ("grpo ar_lopti sapo ce_gppo"), KK_SEEDS (none: the pilot is dropped at this
#   size, docs/results.md section 2 says why; KK_SEEDS="0 1 2" runs it), KK_VAL_PER_N (32).
set -euo pipefail
cd "$(dirname "$0")/.."

OUT=${1:-logs/study/kk}
PY=${PYTHON:-.venv/bin/python}
BATCHES=${KK_BATCHES:-2}
METHODS=${KK_METHODS:-grpo ar_lopti sapo ce_gppo}
SEEDS=${KK_SEEDS:-}
VAL_PER_N=${KK_VAL_PER_N:-32}
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false

mkdir -p "$OUT"
{ echo "# $(date -u +%FT%TZ) commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
  echo "# batches $BATCHES, methods $METHODS, seeds $SEEDS, val per N $VAL_PER_N"; } >> "$OUT/timings.txt"

FAILED=()
piece() {  # piece NAME COMMAND...: run it, log its wall time; a failure is logged and the job goes on
    local t0=$SECONDS status=0
    echo "[$(date +%T)] $1"
    "${@:2}" || status=$?
    local line="$1 $((SECONDS - t0)) s"
    ((status == 0)) || { line+=" FAILED (exit $status)"; FAILED+=("$1"); }
    echo "$line" >> "$OUT/timings.txt"
}

for ((b = 0; b < BATCHES; b++)); do
    [[ -f $OUT/mechanism/batch$b.json ]] && { echo "mechanism batch $b: done"; continue; }  # no interpreter start
    piece "mechanism batch$b" "$PY" -m arlopti.study kk-mechanism --out "$OUT" --first-batch "$b" \
        --batches 1 --prompts 2 --group-size 4 --max-new-tokens 128 --temperature 0.7
done
for s in $SEEDS; do
    for m in $METHODS; do
        [[ -f $OUT/pilot/$m/seed$s/pilot_run.json ]] && { echo "pilot $m seed $s: done"; continue; }
        piece "pilot $m seed$s" "$PY" -m arlopti.study kk-run --out "$OUT" --method "$m" --seed "$s" \
            --val-per-n "$VAL_PER_N"
    done
done
piece report "$PY" -m arlopti.study kk-report --out "$OUT"
echo "total $SECONDS s" >> "$OUT/timings.txt"
if ((${#FAILED[@]})); then
    echo "failed: ${FAILED[*]} (their output: OUT/pilot/<m>/seed<s>/{train,eval}.log; rerun to retry them)" >&2
    exit 1
fi
