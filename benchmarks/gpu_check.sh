#!/usr/bin/env bash
# One prepared GPU check for one CUDA device, < 8 minutes on one H200 (step timeouts add up to
# 7.5 min at worst: export 60 s, vLLM fp32 200 s + bf16 retry 120 s, FSDP2 120 s; plus up to 5 min
# when vLLM is not importable and has to be pip-installed):
#
#   bash benchmarks/gpu_check.sh [--cpu-dry-run]     # from anywhere; uses the repo it sits in
#   bash benchmarks/gpu_check.sh --prepare           # here, on CPU: write the tiny model files to carry
#
# 1. vLLM rollout engine (benchmarks/gpu_vllm_check.py) on the CUDA backend, with the tiny model
#    carried as files (.gpu_check/tiny-model, written by --prepare; name .gpu_check in the device
#    run's carry if it is git-ignored; exported on the spot when
#    absent): weight-sync agreement with the trainer's log-probs after an optimizer step, the
#    stale-weight gap without a sync, greedy vLLM == greedy HF engine, sleep levels 1 and 2.
#    fp32 first; if the engine cannot start in fp32, the same checks in bf16 (looser tolerance).
# 2. FSDP2 on CUDA + NCCL (benchmarks/gpu_check_fsdp.py --out "$RESULTS/fsdp"): train, resume, export.
#
# Prints PASS / FAIL lines, then "GPU CHECK: PASS|FAIL"; exit 0 iff both parts passed, 2 if the
# machine has no CUDA torch. Reports: $RESULTS/gpu_check_fp32.json (and _bf16), $RESULTS/fsdp/
# gpu_check_fsdp.json, with RESULTS=$OUT when set, else /tmp/arlopti-gpu-check.
#
# Assumptions (a bare machine holding only this repo; nothing of it is installed, PYTHONPATH=src):
# * python3 (or $PYTHON) has a CUDA torch, transformers, tokenizers, safetensors and lightning.
# * vLLM: used if `import vllm` works in that python. Otherwise wheels carried in ./.whl
#   (vllm and its pins) are installed offline into a venv at $VLLM_VENV (default
#   /tmp/arlopti-vllm-venv, a CUDA vllm pins its own torch), else `pip install vllm` is tried
#   there (needs PyPI). Without vLLM part 1 is reported FAIL with the reason and part 2 still runs.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 2
REPO=$(pwd)
PY=${PYTHON:-python3}
RESULTS=${OUT:-/tmp/arlopti-gpu-check}
TINY=${TINY_MODEL_DIR:-$REPO/.gpu_check/tiny-model}
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
export PYTHONPATH="$REPO/src${PYTHONPATH:+:$PYTHONPATH}"
DRY=""
case "${1:-}" in
  --prepare)
    exec "$PY" "$REPO/benchmarks/gpu_vllm_check.py" --export-model "$TINY" ;;
  --cpu-dry-run) DRY=1 ;;
  "") ;;
  *) echo "usage: bash benchmarks/gpu_check.sh [--cpu-dry-run | --prepare]"; exit 2 ;;
esac
mkdir -p "$RESULTS"
T0=$SECONDS

echo "== machine"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || echo "(no nvidia-smi)"
"$PY" -c "import sys, torch; print('python', sys.version.split()[0], '| torch', torch.__version__, '| cuda', torch.version.cuda, '| available', torch.cuda.is_available())" \
  || { echo "FAIL setup: $PY cannot import torch"; echo "GPU CHECK: FAIL"; exit 2; }
if [[ -z "$DRY" ]] && ! "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  echo "FAIL setup: torch sees no CUDA device (use --cpu-dry-run on a CPU machine)"; echo "GPU CHECK: FAIL"; exit 2
fi

echo "== tiny model files"
if [[ -f "$TINY/config.json" ]]; then
  echo "carried: $TINY"
else
  echo "not carried ($TINY); exporting it here"
  timeout -k 10 60 "$PY" "$REPO/benchmarks/gpu_vllm_check.py" --export-model "$TINY" \
    || { echo "FAIL setup: could not export the tiny model"; echo "GPU CHECK: FAIL"; exit 2; }
fi

echo "== vllm"
VPY=$PY
if "$PY" -c "import vllm" >/dev/null 2>&1; then
  echo "vllm importable in $PY: $("$PY" -c 'import vllm; print(vllm.__version__)' 2>/dev/null)"
else
  VENV=${VLLM_VENV:-/tmp/arlopti-vllm-venv}
  echo "vllm not importable in $PY; installing into $VENV"
  if "$PY" -m venv "$VENV"; then
    if compgen -G "$REPO/.whl/vllm-*.whl" >/dev/null; then
      timeout 300 "$VENV/bin/pip" install -q --no-index --find-links "$REPO/.whl" vllm
    else
      timeout 300 "$VENV/bin/pip" install -q --timeout 15 --retries 1 vllm
    fi
  fi
  if "$VENV/bin/python" -c "import vllm, torch, transformers, safetensors, tokenizers" >/dev/null 2>&1; then
    VPY="$VENV/bin/python"
    echo "installed vllm $("$VPY" -c 'import vllm; print(vllm.__version__)') in $(( SECONDS - T0 )) s"
  else
    VPY=""
  fi
fi

VRC=0
if [[ -z "$VPY" ]]; then
  echo "FAIL vllm: vllm is not importable and could not be installed (no PyPI access? carry its wheels in .whl/)"
  VRC=2
else
  echo "== vllm checks (fp32)"
  timeout -k 10 200 "$VPY" "$REPO/benchmarks/gpu_vllm_check.py" ${DRY:+--cpu-dry-run} --model-dir "$TINY" \
    --dtype float32 --out "$RESULTS/gpu_check_fp32.json"
  VRC=$?
  if [[ $VRC -eq 3 ]]; then
    echo "== the engine did not start in fp32; checks again in bf16"
    timeout -k 10 120 "$VPY" "$REPO/benchmarks/gpu_vllm_check.py" ${DRY:+--cpu-dry-run} --model-dir "$TINY" \
      --dtype bfloat16 --out "$RESULTS/gpu_check_bf16.json"
    VRC=$?
  fi
  [[ $VRC -eq 124 || $VRC -eq 137 ]] && echo "FAIL vllm: timed out"
fi
echo "vLLM part: $([[ $VRC -eq 0 ]] && echo PASS || echo "FAIL (exit $VRC)") at $(( SECONDS - T0 )) s"

echo "== FSDP2 check"
# ~1 min on an H200 (budget 120 s); the CPU dry run (gloo, 2 cores) took 637 s here
timeout -k 10 "$([[ -n "$DRY" ]] && echo 900 || echo 120)" "$PY" "$REPO/benchmarks/gpu_check_fsdp.py" ${DRY:+--dry-run} \
  --out "$RESULTS/fsdp"
FRC=$?
[[ $FRC -eq 124 || $FRC -eq 137 ]] && echo "FAIL fsdp: timed out"
echo "FSDP2 part: $([[ $FRC -eq 0 ]] && echo PASS || echo "FAIL (exit $FRC)")"

echo "== done in $(( SECONDS - T0 )) s; reports under $RESULTS"
if [[ $VRC -eq 0 && $FRC -eq 0 ]]; then echo "GPU CHECK: PASS"; exit 0; fi
echo "GPU CHECK: FAIL (vllm exit $VRC, fsdp exit $FRC)"
exit 1
