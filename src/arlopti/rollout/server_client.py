"""The trainer's side of one rollout worker (``rollout.placement=server``): start, connect, sync, sample.

A worker is vLLM's OpenAI-compatible server started by :mod:`arlopti.rollout.serve`, on this
machine (:meth:`RolloutWorker.spawn`) or elsewhere (:meth:`RolloutWorker.remote`). Everything goes
through vLLM's own HTTP routes:

* ``GET /v1/models``: readiness, and the served name ``arlopti-<base fingerprint>`` (``-untied-head``
  when the run's LoRA adapts an embedding the base ties to its LM head, and the worker gave its head its own
  copy as the trainer did) compared with the trainer's own (:meth:`RolloutWorker.check_base`): another
  base model, or the other head, is refused at connect time;
* the weight-transfer routes, driven by :class:`arlopti.rollout.gloo_transfer.GlooSender`, then
  ``/reset_prefix_cache`` (cached KV blocks were computed with the old weights);
* ``POST /inference/v1/generate``: token ids in, token ids and processed log-probs out, one request
  per response with its own seed (the colocated engine's seeding, :func:`arlopti.rollout.seeds.sample_seed`),
  all of a batch in flight at once. vLLM reports the weight version of every token span; a response
  that is not entirely of the version the worker was synced to is an error (:class:`WorkerError`).

Faults: a refused connection, an HTTP error or a request unanswered within
``rollout.server.timeout_s`` raises :class:`WorkerError` naming the worker; the pool
(:mod:`arlopti.rollout.server_rollouts`) restarts a spawned worker or stops the run. A spawned worker
runs in its own session, with the trainer's pid as its watchdog's parent (no orphan if the trainer is
killed), and :meth:`RolloutWorker.stop` kills its whole process group.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import requests

from arlopti.rollout.engine import Completion, SamplingConfig
from arlopti.rollout.gloo_transfer import GlooSender, WorkerBusy
from arlopti.rollout.seeds import sample_seed
log = logging.getLogger(__name__)

#: The name prefix of a served model: ``arlopti-<first 16 hex digits of the base fingerprint>``.
SERVED_PREFIX = "arlopti-"
#: The suffix of a worker whose LM head was untied from the embedding for LoRA
#: (:func:`arlopti.models.lora.untie_adapted_embedding`).
UNTIED_SUFFIX = "-untied-head"


def served_model_name(identity: dict, untied_head: bool = False) -> str:
    """The served model name that carries the base identity (:func:`arlopti.models.lora.base_identity`)
    and whether the worker untied the base's LM head for the run's LoRA on the embedding;
    :mod:`arlopti.rollout.serve` serves under it and :meth:`RolloutWorker.check_base` compares it."""
    return SERVED_PREFIX + identity["fingerprint"][:16] + (UNTIED_SUFFIX if untied_head else "")


def write_run_config(model_cfg, rollout_cfg, path: Path) -> Path:
    """The JSON a spawned worker reads (``serve --run-config``): the trainer's own model and rollout configs."""
    path.write_text(json.dumps({"model": dataclasses.asdict(model_cfg), "rollout": dataclasses.asdict(rollout_cfg)}))
    return path


class WorkerError(RuntimeError):
    """A rollout worker failed (died, hung, refused, or answered wrongly); the message names it."""

    def __init__(self, worker: str, what: str):
        super().__init__(f"rollout worker {worker}: {what}")
        self.worker = worker


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _url(host_port: str) -> str:
    return host_port if host_port.startswith("http") else f"http://{host_port}"


def worker_env(devices: list[str], index: int) -> dict[str, str]:
    """What spawned worker ``index`` adds to the trainer's environment: its GPU
    (``rollout.server.devices[index]`` as ``CUDA_VISIBLE_DEVICES``), or nothing (the trainer's devices)."""
    return {"CUDA_VISIBLE_DEVICES": str(devices[index])} if devices else {}


class RolloutWorker:
    """One worker (module docstring). Create with :meth:`spawn` (then :meth:`launch`) or :meth:`remote`;
    :meth:`wait_ready`, :meth:`check_base`, :meth:`start_transfer`, then :meth:`sync` and :meth:`generate`."""

    def __init__(self, url: str, *, timeout_s: float, transfer_host: str, name: str,
                 spawn_args: dict | None = None):
        self.url = _url(url).rstrip("/")
        self.name = name
        self.timeout_s = float(timeout_s)
        self.transfer_host = transfer_host
        self.spawn_args = spawn_args  # None: started by the user elsewhere (cannot be restarted by us)
        self.process: subprocess.Popen | None = None
        self.sender: GlooSender | None = None
        self.version: int | None = None
        self.restarts = 0
        self.generated_tokens = 0
        self._local = threading.local()

    # ------------------------------------------------------------------ construction
    @classmethod
    def remote(cls, host_port: str, server_cfg) -> "RolloutWorker":
        host = server_cfg.transfer_host or socket.getfqdn()
        return cls(host_port, timeout_s=server_cfg.timeout_s, transfer_host=host, name=_url(host_port))

    @classmethod
    def spawn(cls, index: int, model_cfg, rollout_cfg, run_dir: Path) -> "RolloutWorker":
        run_dir.mkdir(parents=True, exist_ok=True)
        cfg_file = write_run_config(model_cfg, rollout_cfg, run_dir / f"worker{index}.json")
        args = dict(cfg_file=str(cfg_file), log=str(run_dir / f"worker{index}.log"),
                    startup_timeout_s=rollout_cfg.server.startup_timeout_s,
                    env=worker_env(rollout_cfg.server.devices, index))
        server = rollout_cfg.server
        worker = cls("127.0.0.1:0", timeout_s=server.timeout_s, transfer_host=server.transfer_host or "127.0.0.1",
                     name=f"worker{index}", spawn_args=args)
        return worker

    @property
    def spawned(self) -> bool:
        return self.spawn_args is not None

    def launch(self) -> None:
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        a = self.spawn_args
        argv = [sys.executable, "-m", "arlopti.rollout.serve", "--run-config", a["cfg_file"], "--port", str(port),
                "--parent-pid", str(os.getpid())]
        with open(a["log"], "ab") as out:
            self.process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                                            env={**os.environ, **a.get("env", {})})
        log.info("started rollout %s (pid %d) at %s; its log: %s", self.name, self.process.pid, self.url, a["log"])

    def start_transfer(self, run: str = "") -> None:
        """Form the weight-transfer group with the worker as run ``run``; its weights are unknown until the
        next sync. A worker that already serves another live run refuses (its answer names that run)."""
        if self.sender is not None:
            self.sender.close()
        self.sender = GlooSender(self.post, self.transfer_host, self.timeout_s, run=run)
        try:
            self.sender.connect()
        except WorkerError:
            raise
        except WorkerBusy as err:
            raise WorkerError(self.name, str(err)) from err
        except Exception as err:  # torch.distributed's store or group: the worker never joined
            raise WorkerError(self.name, f"did not join the weight-transfer group on {self.transfer_host} within "
                                         f"{self.timeout_s:.0f} s (rollout.server.timeout_s): {type(err).__name__}: "
                                         f"{err}. Is it a worker started by python -m arlopti.rollout.serve, and "
                                         "can it reach this host (rollout.server.transfer_host)?") from err
        self.version = None

    def wait_ready(self, wait_s: float, key: str = "rollout.server.startup_timeout_s",
                   report_every_s: float = 10.0) -> None:
        """Wait until the worker serves ``/v1/models``, saying at once why it does not yet answer and then
        every ``report_every_s``; a server that answers wrongly (not vLLM) is an error at once."""
        t0 = time.monotonic()
        deadline, next_report = t0 + wait_s, t0
        while time.monotonic() < deadline:
            if self.process is not None and self.process.poll() is not None:
                raise WorkerError(self.name, f"exited with status {self.process.returncode} while starting; "
                                             f"its log: {self.spawn_args['log']}\n{self.log_tail()}")
            try:
                r = requests.get(f"{self.url}/v1/models", timeout=5)
                if r.status_code == 200:
                    self._models(r)
                    log.info("rollout %s answers at %s after %.0f s", self.name, self.url, time.monotonic() - t0)
                    return
                if r.status_code < 500:  # 5xx: a server still starting may say so; anything else is not vLLM
                    raise WorkerError(self.name, f"{self.url}/v1/models answered {r.status_code} "
                                                 f"({r.text[:200]!r}): not a vLLM server; start the worker with "
                                                 "python -m arlopti.rollout.serve")
                why = f"answered {r.status_code}"
            except requests.RequestException as err:
                why = "connection refused" if isinstance(err, requests.ConnectionError) else type(err).__name__
            if time.monotonic() >= next_report:
                what = "vLLM is starting" if self.spawned else why
                log.info("waiting for rollout %s at %s: %s (%.0f s of %s=%.0f)", self.name, self.url, what,
                         time.monotonic() - t0, key, wait_s)
                next_report += report_every_s
            time.sleep(0.5)
        raise WorkerError(self.name, f"did not answer at {self.url} within {wait_s:.0f} s ({key})"
                          + (f"\n{self.log_tail()}" if self.spawned else ""))

    def _models(self, response) -> list[str]:
        """The served model names of a ``/v1/models`` answer; a WorkerError when it is not vLLM's JSON."""
        try:
            return [m["id"] for m in response.json()["data"]]
        except (ValueError, KeyError, TypeError) as err:
            raise WorkerError(self.name, f"{self.url}/v1/models answered {response.text[:200]!r}, not vLLM's model "
                                         "list: start the worker with python -m arlopti.rollout.serve") from err

    def log_tail(self, lines: int = 15) -> str:
        if not self.spawned or not Path(self.spawn_args["log"]).exists():
            return ""
        return "\n".join(Path(self.spawn_args["log"]).read_text(errors="replace").splitlines()[-lines:])

    def check_base(self, expected: str) -> None:
        """Refuse a worker whose served model is not the trainer's base (module docstring)."""
        served = (self.get("v1/models") or {}).get("data", [{}])[0].get("id", "")
        if served != expected and served.removesuffix(UNTIED_SUFFIX) == expected.removesuffix(UNTIED_SUFFIX):
            want, has = (("its own copy of the LM head", "the LM head tied to the embedding")
                         if expected.endswith(UNTIED_SUFFIX) else
                         ("the LM head tied to the embedding", "its own copy of the LM head"))
            raise WorkerError(self.name, f"serves the trainer's base with {has}, but this run needs {want} (model.lora "
                                         "adapts the embedding, target_modules or modules_to_save, of a base with "
                                         "tie_word_embeddings): start it with the run's model.lora.* overrides "
                                         "(python -m arlopti.rollout.serve model=... model.lora...).")
        if served != expected:
            what = ("was not started by arlopti.rollout.serve" if not served.startswith(SERVED_PREFIX)
                    else "was built from another base model")
            raise WorkerError(self.name, f"serves {served!r}, but the trainer's base model is {expected!r}: it {what}. "
                                         "Start it with the trainer's model=... (python -m arlopti.rollout.serve "
                                         "model=<the trainer's> ...).")

    # ------------------------------------------------------------------ HTTP
    def _session(self) -> requests.Session:
        if not hasattr(self._local, "session"):
            self._local.session = requests.Session()
        return self._local.session

    def _call(self, method: str, path: str, json: dict | None = None):
        try:
            r = self._session().request(method, f"{self.url}/{path}", json=json, timeout=self.timeout_s)
        except requests.Timeout as err:
            raise WorkerError(self.name, f"{path} unanswered after {self.timeout_s:.0f} s (rollout.server.timeout_s): "
                                         "hung") from err
        except requests.RequestException as err:
            raise WorkerError(self.name, f"{path} failed: {type(err).__name__}: {err} (dead?)") from err
        if r.status_code != 200:
            raise WorkerError(self.name, f"{path} answered {r.status_code}: {r.text[:500]}")
        try:
            return r.json() if r.content else None
        except ValueError as err:
            raise WorkerError(self.name, f"{path} answered 200 with {r.text[:200]!r}, not JSON: not a vLLM "
                                         "rollout worker (python -m arlopti.rollout.serve)") from err

    def post(self, path: str, json: dict | None = None):
        return self._call("POST", path, json)

    def get(self, path: str):
        return self._call("GET", path)

    # ------------------------------------------------------------------ weights
    def sync(self, items, bucket_bytes: int, dtype, version: int) -> dict:
        """Send the weights (:meth:`GlooSender.send`) as ``version`` and reset the prefix cache. A worker
        that dies during the broadcast fails in gloo (``Connection closed by peer``), not over HTTP: that
        is a :class:`WorkerError` too, so that the run restarts the worker or saves its steps and stops
        (:mod:`arlopti.rollout.server_rollouts`) as for any other fault of the worker."""
        if self.sender is None:
            raise WorkerError(self.name, "sync before start()")
        try:
            sent = self.sender.send(items, bucket_bytes, dtype, version)
        except WorkerError:
            raise
        except RuntimeError as err:  # gloo's errors are RuntimeErrors (torch.distributed.DistError among them)
            raise WorkerError(self.name, f"the weight sync to version {version} failed: {type(err).__name__}: "
                                         f"{' '.join(str(err).split())[:300]} (dead?)") from err
        self.post("reset_prefix_cache")
        self.version = version
        return sent

    # ------------------------------------------------------------------ sampling
    def request(self, prompt: list[int], sampling: SamplingConfig, seed: int | None) -> dict:
        params = dict(n=1, temperature=float(sampling.temperature), top_p=float(sampling.top_p),
                      top_k=int(sampling.top_k) if sampling.top_k and sampling.top_k > 0 else -1,
                      max_tokens=int(sampling.max_new_tokens), include_stop_str_in_output=True,
                      skip_special_tokens=True, seed=seed)
        if sampling.stop:
            params["stop"] = list(sampling.stop)
        if sampling.logprobs:
            params["logprobs"] = 0
        body = {"token_ids": list(prompt), "sampling_params": params}
        if sampling.stop:  # stop strings need the detokenised text on the server
            body["output_mode"] = "text"
        return body

    def generate(self, prompts: list[list[int]], first_index: int, n: int, sampling: SamplingConfig,
                 tokenizer, pool: ThreadPoolExecutor) -> list[list[Completion]]:
        """``n`` completions of each prompt; prompt ``i`` here is prompt ``first_index + i`` of the step
        (its seeds are the colocated engine's for that index)."""
        jobs = []
        for i, p in enumerate(prompts):
            for j in range(n):
                seed = None if sampling.seed is None or sampling.temperature == 0 else \
                    sample_seed(sampling.seed, first_index + i, j)
                jobs.append(pool.submit(self.post, "inference/v1/generate", self.request(p, sampling, seed)))
        outs = [self._completion(f.result(), sampling.logprobs, tokenizer) for f in jobs]
        self.generated_tokens += sum(len(c.token_ids) for c in outs)
        return [outs[i * n:(i + 1) * n] for i in range(len(prompts))]

    def _completion(self, response: dict, want_logprobs: bool, tokenizer) -> Completion:
        (choice,) = response["choices"]
        ids = list(choice["token_ids"])
        versions = {v["version"] for v in choice.get("weight_versions") or []}
        if self.version is not None and versions and versions != {str(self.version)}:
            raise WorkerError(self.name, f"a response was generated by weight version(s) {sorted(versions)}, "
                                         f"but the worker was synced to {self.version}")
        reason = choice["finish_reason"]
        if reason not in ("stop", "length"):
            raise WorkerError(self.name, f"finished a request with reason {reason!r}")
        lps = None
        if want_logprobs:
            content = (choice.get("logprobs") or {}).get("content") or []
            if len(content) != len(ids):
                raise WorkerError(self.name, "returned no log-probs for a request that asked for them")
            lps = [float(c["logprob"]) for c in content]
        text = tokenizer.decode(ids, skip_special_tokens=True)
        return Completion(token_ids=ids, text=text, finish_reason=reason, logprobs=lps)

    # ------------------------------------------------------------------ life
    def stop(self, grace_s: float = 10.0) -> None:
        """Stop a spawned worker and everything in its process group (SIGTERM, then SIGKILL)."""
        if self.sender is not None:
            self.sender.close()
            self.sender = None
        proc, self.process = self.process, None
        if proc is None:
            return
        for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
            try:
                os.killpg(proc.pid, sig)
                os.killpg(proc.pid, signal.SIGCONT)  # a stopped (hung) worker acts on SIGTERM only once resumed
            except (ProcessLookupError, PermissionError):
                break
            try:
                proc.wait(timeout=wait)
                break
            except subprocess.TimeoutExpired:
                continue
        self.kill_group(proc.pid)  # the group may outlive its leader (vLLM's engine process): no survivor

    @staticmethod
    def kill_group(pgid: int) -> None:
        """SIGKILL every process left in a spawned worker's process group."""
        try:
            os.killpg(pgid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


__all__ = ["SERVED_PREFIX", "UNTIED_SUFFIX", "RolloutWorker", "WorkerError", "free_port", "served_model_name", "worker_env",
           "write_run_config"]
