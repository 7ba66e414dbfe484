"""A rollout worker: vLLM's own OpenAI-compatible server on the policy's model, ready for weight syncs.

Started by the trainer (``rollout.placement=server rollout.server.spawn=true``) or by hand on
another host, then named in the trainer's ``rollout.server.urls``::

    python -m arlopti.rollout.serve model=smollm2 rollout.server.host=0.0.0.0 rollout.server.port=8100

The overrides are the training run's own (``train.yaml`` composed with them); only ``model.*`` and
``rollout.*`` are read. What it does:

1. loads the policy's model exactly as the trainer does (:func:`arlopti.models.loading.load_causal_lm`) and
   takes its base identity (:func:`arlopti.models.lora.base_identity`: the architecture and a fingerprint of
   the embedding); the identity becomes the served model name, ``arlopti-<fingerprint>``, which the
   trainer compares with its own when it connects (a worker built from another base is refused). Where the
   run's ``model.lora`` adapts an embedding the base ties to its LM head, the worker unties the head as the
   trainer does (:func:`arlopti.models.lora.untie_adapted_embedding`: vLLM then builds a separate
   ``lm_head`` that the syncs fill with the trainer's frozen head) and serves as ``arlopti-<fingerprint>-untied-head``;
2. writes the engine's model directory (config, tokenizer; no weights: vLLM starts with dummy weights
   and the trainer's first sync loads the policy), as the colocated engine does
   (:func:`arlopti.rollout.vllm_startup.save_for_engine`);
3. runs ``vllm.entrypoints.openai.api_server`` as a child process with the RL routes
   (``VLLM_SERVER_DEV_MODE=1``: pause, weight transfer, prefix-cache reset), the tokens-in/tokens-out
   route ``/inference/v1/generate`` (``--enable-scale-out``), processed log-probs, and the gloo
   weight-transfer engine (:mod:`arlopti.rollout.gloo_transfer`);
4. supervises it: SIGTERM / SIGINT stop the server; with ``--parent-pid`` (the trainer spawned it) a
   watchdog stops everything within a second once the trainer is gone, even killed with SIGKILL, so
   no worker outlives its trainer. The server and vLLM's engine process share this process's group
   (the trainer starts it in a new session), and the whole group is killed on the way out.

A refused configuration (an override of the wrong type, a value outside its choices such as
``rollout.dtype=fp8``, an unknown key) is reported as the trainer reports it: one line,
``ConfigError: <key and what to use>``, exit status 1, before any model loads
(:func:`arlopti.config.cli_report.run_command`; ``HYDRA_FULL_ERROR=1`` gives the traceback).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from arlopti.rollout.server_client import served_model_name

log = logging.getLogger("arlopti.rollout.serve")


def vllm_server_argv(model_dir: str, served_name: str, dtype: str, max_model_len: int, rollout, *,
                     host: str, port: int) -> list[str]:
    """The vLLM API server's command line (a pure function of its inputs)."""
    argv = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model_dir,
            "--served-model-name", served_name, "--dtype", dtype, "--max-model-len", str(max_model_len),
            "--host", host, "--port", str(port), "--seed", str(rollout.seed), "--load-format", "dummy",
            "--logprobs-mode", "processed_logprobs", "--enable-scale-out",
            "--gpu-memory-utilization", str(rollout.gpu_memory_utilization),
            "--weight-transfer-config", json.dumps({"backend": "arlopti_gloo"}),
            "--worker-extension-cls", "arlopti.rollout.gloo_transfer.GlooWorkerExtension",
            "--disable-log-stats", "--uvicorn-log-level", "warning"]
    if rollout.enforce_eager:
        argv.append("--enforce-eager")
    return argv


def server_env(base: dict | None = None) -> dict:
    """The server's environment: the RL routes on; a 1 GiB KV cache on CPU unless the user set one."""
    env = dict(os.environ if base is None else base)
    env["VLLM_SERVER_DEV_MODE"] = "1"
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    return env


def prepare_model_dir(model_cfg, rollout_cfg, out_dir: Path) -> tuple[dict, str, int, bool]:
    """Load the model as the trainer does, write the engine's directory, and return
    ``(base identity, dtype name, max_model_len, whether the LM head was untied for the run's LoRA)``."""
    from arlopti.models.lora import base_identity, lora_enabled, untie_adapted_embedding
    from arlopti.models.loading import load_causal_lm, load_tokenizer
    from arlopti.rollout.vllm_startup import engine_model_spec, save_for_engine
    from arlopti.utils.dtypes import dtype_name

    tokenizer = load_tokenizer(model_cfg.name_or_path, model_cfg.tiny.vocab_size)
    model = load_causal_lm(model_cfg.name_or_path, tokenizer, dtype=model_cfg.dtype, tiny=model_cfg.tiny)
    identity = base_identity(model)  # as loaded (tied), as the trainer takes it
    untied = lora_enabled(model_cfg.lora) and untie_adapted_embedding(model, model_cfg.lora)
    dtype, max_len, _ = engine_model_spec(model, rollout_cfg)
    save_for_engine(model, tokenizer, out_dir, dtype, 0, weights=False)
    del model
    return identity, dtype_name(dtype), max_len, untied


def _parent_gone(parent_pid: int) -> bool:
    return os.getppid() != parent_pid


def die_with_parent(sig: int = signal.SIGTERM):
    """A ``preexec_fn``: the kernel sends the child ``sig`` when its parent dies, even by SIGKILL (Linux
    ``prctl(PR_SET_PDEATHSIG)``; elsewhere nothing). SIGTERM lets vLLM's server shut its engine down."""
    def arm() -> None:
        import ctypes

        try:
            ctypes.CDLL(None, use_errno=True).prctl(1, int(sig))  # 1 = PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass

    return arm


#: The sentinel (a child of the supervisor, in its process group): when the supervisor dies without
#: stopping the server (kill -9), the kernel's parent-death SIGTERM wakes it; after ``grace`` seconds for
#: the server's own shutdown it kills whatever is left of the group (vLLM's engine core and its helpers,
#: which the server's own parent-death signal does not reach). A SIGTERM sent to the whole group while
#: the supervisor lives (a normal stop) is left to the supervisor.
SENTINEL = """
import os, signal, sys, time
pgid, grace, parent = int(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3])
def on_term(signum, frame):
    if os.getppid() == parent:
        return
    time.sleep(grace)
    os.killpg(pgid, signal.SIGKILL)
signal.signal(signal.SIGTERM, on_term)
if os.getppid() != parent:
    on_term(0, None)
while True:
    signal.pause()
"""


def start_sentinel(grace_s: float = 5.0) -> subprocess.Popen | None:
    """The group's sentinel (:data:`SENTINEL`); only where this supervisor leads its process group (spawned
    by the trainer, or a shell's job), so that nothing outside the worker is killed."""
    if os.getpgid(0) != os.getpid():
        return None
    return subprocess.Popen([sys.executable, "-c", SENTINEL, str(os.getpid()), str(grace_s), str(os.getpid())],
                            preexec_fn=die_with_parent(signal.SIGTERM))


def supervise(argv: list[str], env: dict, parent_pid: int | None, cpus: str | None = None) -> int:
    """Run the server until it exits, a signal arrives, or the parent (trainer) is gone. If this supervisor
    dies first (even by SIGKILL), the server gets SIGTERM from the kernel and the group's sentinel kills
    what is left of it (:func:`start_sentinel`): no process of the worker outlives it."""
    if cpus:
        argv = ["taskset", "-c", str(cpus), *argv]
    sentinel = start_sentinel()
    child = subprocess.Popen(argv, env=env, preexec_fn=die_with_parent(signal.SIGTERM))
    stop = threading.Event()

    def on_signal(signum, frame):  # noqa: ARG001
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    while child.poll() is None and not stop.is_set():
        if parent_pid is not None and _parent_gone(parent_pid):
            log.warning("the trainer (pid %d) is gone: stopping this rollout worker", parent_pid)
            break
        time.sleep(0.5)
    if child.poll() is None:
        child.terminate()
        try:
            child.wait(timeout=10)
        except subprocess.TimeoutExpired:
            child.kill()
    if sentinel is not None:
        sentinel.kill()
    return child.returncode or 0


def _configs(overrides: list[str], run_config: str | None):
    """``(model config, rollout config)`` from a run-config JSON (spawned) or train.yaml + overrides
    (:func:`arlopti.config.compose.compose`, as ``train.py`` composes it), each value checked against
    the schema (type, choices, range) so that a bad one is a :class:`ConfigError` naming its key before
    any model loads, not an error from deep inside the loading."""
    from arlopti.config import ModelConfig, RolloutConfig, check_fields, check_overrides, from_dict

    if run_config:
        data = json.loads(Path(run_config).read_text())
    else:
        check_overrides(overrides)  # before OmegaConf converts them (``port=abc``, ``enforce_eager=no``)
        data = _composed(overrides)
    model = from_dict(ModelConfig, data["model"], "model")
    rollout = from_dict(RolloutConfig, data["rollout"], "rollout")
    check_fields(model, "model")
    check_fields(rollout, "rollout")
    return model, rollout


def _composed(overrides: list[str]) -> dict:
    """The ``model`` and ``rollout`` nodes of train.yaml composed with ``overrides``; an override Hydra
    cannot apply (an unknown key or group choice) is a :class:`ConfigError` with Hydra's own message."""
    from hydra.errors import HydraException
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    from arlopti.config import ConfigError
    from arlopti.config.compose import compose

    try:
        cfg = compose(overrides)
        return {k: OmegaConf.to_container(cfg[k], resolve=True) for k in ("model", "rollout")}
    except (HydraException, OmegaConfBaseException) as err:
        raise ConfigError(" ".join(str(err).split())) from err


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m arlopti.rollout.serve", description=__doc__.split("\n")[0])
    parser.add_argument("--run-config", help="JSON with the model and rollout configs (the trainer writes it)")
    parser.add_argument("--port", type=int, help="overrides rollout.server.port")
    parser.add_argument("--parent-pid", type=int, help="stop when this process (the trainer) is gone")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides of train.yaml (model=..., rollout.server.*)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="[serve %(process)d] %(message)s")
    model_cfg, rollout_cfg = _configs(args.overrides, args.run_config)
    server = rollout_cfg.server
    port = args.port or server.port
    model_dir = Path(tempfile.mkdtemp(prefix="arlopti-serve-"))
    try:
        identity, dtype, max_len, untied = prepare_model_dir(model_cfg, rollout_cfg, model_dir)
        name = served_model_name(identity, untied)
        log.info("serving %s (%s) at %s:%d as %s", model_cfg.name_or_path, dtype, server.host, port, name)
        argv_ = vllm_server_argv(str(model_dir), name, dtype, max_len, rollout_cfg, host=server.host, port=port)
        return supervise(argv_, server_env(), args.parent_pid, server.cpus)
    finally:
        shutil.rmtree(model_dir, ignore_errors=True)
        kill_own_group()


def kill_own_group() -> None:
    """SIGKILL every other process of this process's group when it leads one (a spawned worker: the
    trainer starts it in a new session): vLLM's engine process stays in the group even when the server
    that started it is gone."""
    import psutil

    group = os.getpgid(0)
    if group != os.getpid():
        return
    for proc in psutil.process_iter(["pid"]):
        try:
            if proc.pid != os.getpid() and os.getpgid(proc.pid) == group:
                proc.kill()
        except (ProcessLookupError, psutil.Error):
            continue


if __name__ == "__main__":
    from arlopti.config.cli_report import run_command

    sys.exit(run_command(main))
