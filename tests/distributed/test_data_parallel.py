"""Two ranks (gloo, CPU) against one: FSDP2 and DDP updates, clipping, gradient sync, exact resume.

One ``torchrun --nproc_per_node=2`` launch of this file's :func:`worker` does all the 2-rank
runs (so the process start-up is paid once); the tests compare its outputs with 1-rank runs
made in the pytest process:

* the same update: 2 ranks on half the prompts each give the parameters 1 rank gives on all
  of them, for GRPO (with active clipping) and Lopti (two phases), under FSDP2 and DDP, with
  the global token-mean normaliser, and for REINFORCE++ (batch-global whitening) under DDP. Every response has its own length, so a per-rank token
  count would give a different update;
* the clip norm is the global norm under FSDP2 (the logged pre-clip norm equals the 1-rank one,
  and since clipping is active a shard-local norm would also change the parameters);
* DDP with several micro-batch backwards and four optimizer steps per training step leaves the
  two ranks' parameters bit-identical;
* a non-finite loss on one rank only (its gradient finite) skips that optimizer step on both;
* FSDP2 resume is exact: 4 rollout steps in one go, or 2 then a resume from the distributed
  checkpoint then 2 more, give identical step-3/4 metrics, RNG draws and final parameters;
* and so after ``kill -9`` of one rank: a launch of its own (:func:`kill_worker`, before the main
  one) saves every step and rank 1 sends itself SIGKILL at the start of step 3, so rank 0 fails in its
  next collective; the main launch resumes that run's ``last.ckpt`` (step 2) to 4 steps, which equal
  the uninterrupted run bit for bit;
* the FSDP2 checkpoint folder exports to a HF model with the same log-probs as the sharded policy.

Both runs see identical rollouts: :class:`FixedEngine` returns completions that depend only on
the prompt's tokens and the sample index (the HF engine's seeds depend on the rank), scored by the
toy reward, which varies inside each group: every comparison first shows that the weights and the
optimizer state moved (:func:`helpers.moved.assert_moved`), so it compares real updates.
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

import pytest

from helpers.torchrun import launch_two_ranks, run_two_ranks

HERE = Path(__file__).resolve()
TESTS = HERE.parents[1]
ETA = 0.002  # a random tiny model puts p_old near 1/vocab on every token: this splits them in two


# ---------------------------------------------------------------------------------------------
# shared by the worker and the tests
# ---------------------------------------------------------------------------------------------


def fixed_engine(tok):
    """:class:`helpers.fixed_rollouts.FixedEngine` with responses of at least 2 tokens."""
    from helpers.fixed_rollouts import FixedEngine

    return FixedEngine(tok, min_len=2)


def make_cfg(kind: str):
    """``grpo``/``lopti``: one mini-batch per phase, SGD (the update is the gradient); ``sync``: Lopti
    with 2 mini-batches per phase and AdamW; ``resume``: GRPO + KL with AdamW."""
    from arlopti.config import (AlgorithmConfig, LoptiConfig, OptimConfig, RolloutConfig, RunConfig,
                                SizesConfig)

    rollout = RolloutConfig(temperature=1.0, max_new_tokens=12)
    if kind in ("grpo", "lopti", "rpp"):
        # rpp: REINFORCE++, whose whitening statistics are global over the batch (so over ranks)
        algo = AlgorithmConfig(lopti=LoptiConfig(enabled=kind == "lopti", eta=ETA),
                               advantage="reinforce_pp" if kind == "rpp" else "grpo")
        sizes = SizesConfig(prompts_per_step=4, group_size=4, mini_batch_size=16, micro_batch_size=2,
                            logprob_micro_batch_size=8)
        # GRPO: a clip far below the gradient norm, so the clip coefficient matters
        optim = OptimConfig(name="sgd", lr=0.1, weight_decay=0.0, grad_clip=0.05 if kind == "grpo" else None)
    elif kind == "sync":
        algo = AlgorithmConfig(lopti=LoptiConfig(enabled=True, eta=ETA))
        sizes = SizesConfig(prompts_per_step=4, group_size=2, mini_batch_size=4, micro_batch_size=1,
                            logprob_micro_batch_size=8)
        optim = OptimConfig(lr=1e-2)
    elif kind == "resume":
        algo = AlgorithmConfig()
        sizes = SizesConfig(prompts_per_step=2, group_size=4, mini_batch_size=4, micro_batch_size=2,
                            logprob_micro_batch_size=8)
        optim = OptimConfig(lr=1e-2)
    else:
        raise ValueError(kind)
    return RunConfig(algorithm=algo, sizes=sizes, optim=optim, rollout=rollout)


def recorder_class():
    import lightning.pytorch as L
    import numpy as np
    import torch

    class Recorder(L.Callback):
        """Per-step learner metrics (all-reduced) plus one draw from each global RNG."""

        def __init__(self):
            self.rows = []

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            m = {k: v for k, v in pl_module.last_step_context.metrics.items() if not k.startswith("timing/")}
            m.update(step=pl_module.rollout_step, rng_torch=float(torch.rand(())), rng_numpy=float(np.random.rand()),
                     rng_python=random.random())
            self.rows.append(m)

    return Recorder


def fit(kind: str, tok, steps: int, strategy=None, devices: int = 1, callbacks=(), ckpt_path=None):
    """Fit the toy task with :class:`FixedEngine`; returns (module, recorder)."""
    import lightning.pytorch as L

    from arlopti.learner.module import GRPOModule
    from helpers.toy import ToyDataModule

    from arlopti.callbacks.rollout import RolloutCallback

    L.seed_everything(123, verbose=False)  # as train.py does: every run starts from the same RNG state
    cfg = make_cfg(kind)
    module = GRPOModule(cfg, tokenizer=tok, total_rollout_steps=steps)
    module.rollout_engine = fixed_engine(tok)
    dm = ToyDataModule(tokenizer=tok, prompts_per_step=cfg.sizes.prompts_per_step, max_prompt_length=256)
    rec = recorder_class()()
    trainer = L.Trainer(accelerator="cpu", devices=devices, strategy=strategy or "auto", max_epochs=1, logger=False,
                        enable_checkpointing=any(hasattr(c, "save_last_checkpoint") for c in callbacks),
                        limit_val_batches=0, num_sanity_val_steps=0, use_distributed_sampler=False,
                        enable_progress_bar=False, enable_model_summary=False,
                        callbacks=[RolloutCallback(group_size=cfg.sizes.group_size), rec, *callbacks])
    trainer.fit(module, datamodule=dm, ckpt_path=ckpt_path)
    return module, rec


def probe_batch(tok):
    """A fixed batch for comparing log-probs: (input_ids, attention_mask, prompt_len)."""
    import torch

    prompt = tok("Zoey said that Oliver is a knight.", add_special_tokens=False)["input_ids"]
    response = tok(" So Emma is a knave and Zoey is a knight.", add_special_tokens=False)["input_ids"]
    ids = torch.tensor([prompt + response])
    return ids, torch.ones_like(ids), len(prompt)


# ---------------------------------------------------------------------------------------------
# the 2-rank side (run under torchrun)
# ---------------------------------------------------------------------------------------------


def worker(out: Path) -> None:
    import torch
    import torch.distributed as dist
    from lightning.pytorch.strategies import DDPStrategy

    from arlopti.callbacks.checkpointing import RolloutCheckpoint
    from arlopti.learner.sharding import FSDP2Strategy, full_state_dict
    from arlopti.models.loading import build_tiny_tokenizer
    from helpers.moved import optimizer_summary

    torch.set_num_threads(1)
    tok = build_tiny_tokenizer()

    def strategy(name):
        return FSDP2Strategy() if name == "fsdp" else DDPStrategy(find_unused_parameters=False)

    def params(module):
        return full_state_dict(module.policy)  # collective under FSDP2

    for strat in ("fsdp", "ddp"):
        for kind in ("grpo", "lopti"):
            module, rec = fit(kind, tok, 1, strategy(strat), devices=2)
            p = params(module)
            if dist.get_rank() == 0:
                torch.save({"params": p, "metrics": rec.rows, "global_step": module.trainer.global_step},
                           out / f"{strat}_{kind}.pt")

    module, rec = fit("rpp", tok, 1, strategy("ddp"), devices=2)
    p = params(module)
    if dist.get_rank() == 0:
        torch.save({"params": p, "metrics": rec.rows, "global_step": module.trainer.global_step}, out / "ddp_rpp.pt")

    def optim(module):
        return optimizer_summary(module.trainer.optimizers[0])

    module, rec = fit("sync", tok, 2, strategy("ddp"), devices=2)
    torch.save({"params": params(module), "global_step": module.trainer.global_step, "optim": optim(module)},
               out / f"ddp_sync_rank{dist.get_rank()}.pt")

    # rank 0's first micro-batch loss reads NaN while its gradient stays finite: only a global
    # skip decision keeps the ranks together
    import arlopti.learner.module as learner

    real, calls = learner.grpo_objective, {"n": 0}

    def nan_on_rank0_once(*a, **k):
        loss, m = real(*a, **k)
        calls["n"] += 1
        if dist.get_rank() == 0 and calls["n"] == 1:
            loss = loss + float("nan") * loss.detach()
        return loss, m

    learner.grpo_objective = nan_on_rank0_once
    try:
        module, _ = fit("resume", tok, 1, strategy("ddp"), devices=2)
    finally:
        learner.grpo_objective = real
    torch.save({"params": params(module), "global_step": module.trainer.global_step, "skips": module.total_skips,
                "optim": optim(module)}, out / f"ddp_skip_rank{dist.get_rank()}.pt")

    ckpts = out / "ckpts"
    full, rec_full = fit("resume", tok, 4, strategy("fsdp"), devices=2)
    p_full, o_full = params(full), optim(full)
    fit("resume", tok, 2, strategy("fsdp"), devices=2, callbacks=[RolloutCheckpoint(str(ckpts), every_n_steps=1)])
    resumed, rec_resumed = fit("resume", tok, 4, strategy("fsdp"), devices=2,
                               callbacks=[RolloutCheckpoint(str(ckpts), every_n_steps=1)],
                               ckpt_path=str(ckpts / "last.ckpt"))
    p_resumed, o_resumed = params(resumed), optim(resumed)
    ids, mask, plen = probe_batch(tok)
    resumed.policy.eval()
    with torch.no_grad():
        logp, _ = resumed.policy(ids, mask, plen, 1.0, with_entropy=False)
    if dist.get_rank() == 0:
        torch.save({"full": {"params": p_full, "metrics": rec_full.rows, "optim": o_full},
                    "resumed": {"params": p_resumed, "metrics": rec_resumed.rows, "optim": o_resumed,
                                "rollout_step": resumed.rollout_step},
                    "probe_logp": logp.detach().cpu()}, out / "fsdp_resume.pt")
    resume_after_kill(out, tok)
    if dist.get_rank() == 0:
        (out / "done.json").write_text(json.dumps({"world": dist.get_world_size()}))


#: The rollout step (1-based) at whose start :func:`kill_worker`'s rank 1 dies.
KILL_AT = 3


def kill_worker(out: Path) -> None:
    """The launch in which one rank dies: 4 planned steps of the ``resume`` run under FSDP2, saving every
    step to ``out/killed``; rank 1 SIGKILLs itself at the start of step :data:`KILL_AT` (no handler runs)."""
    import lightning.pytorch as L
    import torch

    from arlopti.callbacks.checkpointing import RolloutCheckpoint
    from arlopti.learner.sharding import FSDP2Strategy
    from arlopti.models.loading import build_tiny_tokenizer

    class KillRank1(L.Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            import os
            import signal

            if trainer.global_rank == 1 and pl_module.rollout_step + 1 == KILL_AT:
                (out / "killed.json").write_text(json.dumps({"at_step": KILL_AT}))
                os.kill(os.getpid(), signal.SIGKILL)

    torch.set_num_threads(1)
    fit("resume", build_tiny_tokenizer(), 4, FSDP2Strategy(), devices=2,
        callbacks=[RolloutCheckpoint(str(out / "killed"), every_n_steps=1), KillRank1()])


def resume_after_kill(out: Path, tok) -> None:
    """In the main launch: resume :func:`kill_worker`'s ``last.ckpt`` to 4 steps (nothing when that launch
    left none: the test says why)."""
    import torch
    import torch.distributed as dist

    from arlopti.learner.sharding import FSDP2Strategy, full_state_dict
    from helpers.moved import optimizer_summary

    last = out / "killed" / "last.ckpt"
    if not last.exists():
        return
    module, rec = fit("resume", tok, 4, FSDP2Strategy(), devices=2, ckpt_path=str(last))
    params, optim = full_state_dict(module.policy), optimizer_summary(module.trainer.optimizers[0])
    if dist.get_rank() == 0:
        torch.save({"params": params, "metrics": rec.rows, "optim": optim, "rollout_step": module.rollout_step},
                   out / "fsdp_kill_resume.pt")


# ---------------------------------------------------------------------------------------------
# the tests
# ---------------------------------------------------------------------------------------------

pytestmark = pytest.mark.distributed


@pytest.fixture(scope="module")
def two_rank(tmp_path_factory):
    """Run :func:`kill_worker` on 2 processes (it fails by design: its exit status and output tail are
    kept for the test), then :func:`worker` once; returns their output folder."""
    import subprocess

    out = tmp_path_factory.mktemp("two_rank")
    try:
        killed = run_two_ranks(HERE, out, "kill", timeout_s=300)
        kill = {"rc": killed.returncode, "tail": killed.stdout[-2000:] + killed.stderr[-4000:]}
    except subprocess.TimeoutExpired as err:
        kill = {"rc": None, "tail": f"timed out: {err}"}
    (out / "kill_launch.json").write_text(json.dumps(kill))
    launch_two_ranks(HERE, out, "done.json")
    return out


@pytest.fixture(scope="module")
def one_rank(tiny_tokenizer):
    """The 1-rank reference runs: {kind: (params, metrics rows)}."""
    from arlopti.learner.sharding import full_state_dict

    ref = {}
    for kind in ("grpo", "lopti", "rpp"):
        module, rec = fit(kind, tiny_tokenizer, 1)
        ref[kind] = (full_state_dict(module.policy), rec.rows, module.trainer.global_step)
    return ref


def max_abs_diff(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k].double() - b[k].double()).abs().max()) for k in a)


def initial_params() -> dict:
    """The policy every run here starts from, under its ``full_state_dict`` names."""
    from arlopti.models.loading import build_tiny_model, build_tiny_tokenizer

    return {f"hf.{k}": v for k, v in build_tiny_model(build_tiny_tokenizer()).state_dict().items()}


@pytest.mark.parametrize("strategy,kind", [("fsdp", "grpo"), ("fsdp", "lopti"), ("ddp", "grpo"), ("ddp", "lopti"),
                                           ("ddp", "rpp")])
def test_two_ranks_give_the_one_rank_update(two_rank, one_rank, kind, strategy):
    """rpp: REINFORCE++ whitens over every valid token of the batch; on 2 ranks the mean and
    variance are summed over ranks, so each rank's advantages are the 1-rank ones."""
    import torch

    two = torch.load(two_rank / f"{strategy}_{kind}.pt", weights_only=False)
    ref_params, ref_rows, ref_steps = one_rank[kind]
    from arlopti.models.loading import build_tiny_model, build_tiny_tokenizer

    init = {f"hf.{k}": v for k, v in build_tiny_model(build_tiny_tokenizer()).state_dict().items()}
    moved = max_abs_diff({k: ref_params[k] for k in init}, init)
    assert moved > 1e-4, "the update must be visible for the comparison to mean anything"
    diff = max_abs_diff(two["params"], ref_params)
    print(f"{strategy}/{kind}: max |param(2 ranks) - param(1 rank)| = {diff:.3g} (update size {moved:.3g})")
    for k in ref_params:
        torch.testing.assert_close(two["params"][k], ref_params[k], rtol=1e-5, atol=1e-6, msg=k)
    assert two["global_step"] == ref_steps == (2 if kind == "lopti" else 1)
    r1, r2 = ref_rows[0], two["metrics"][0]
    assert r2["reward/mean"] == pytest.approx(r1["reward/mean"], abs=1e-6)
    assert r2["rollout/tokens"] == r1["rollout/tokens"]  # summed over ranks


def test_clip_norm_is_the_global_norm_under_fsdp2(two_rank, one_rank):
    import torch

    two = torch.load(two_rank / "fsdp_grpo.pt", weights_only=False)
    n1 = one_rank["grpo"][1][0]["update/grad_norm"]
    n2 = two["metrics"][0]["update/grad_norm"]
    print(f"grad norm: 1 rank {n1:.8f}, FSDP2 2 ranks {n2:.8f}, diff {abs(n1 - n2):.3g}")
    assert n1 > 0.05 * 10, "clipping (grad_clip=0.05) must be active for the parameter check to cover it"
    assert n2 == pytest.approx(n1, rel=1e-5)


def test_ddp_manual_optimisation_keeps_ranks_identical(two_rank):
    import torch

    from helpers.moved import assert_moved

    r0 = torch.load(two_rank / "ddp_sync_rank0.pt", weights_only=False)
    r1 = torch.load(two_rank / "ddp_sync_rank1.pt", weights_only=False)
    # 2 rollout steps x 2 phases x 2 mini-batches, each of 2 micro-batch backwards per rank
    assert r0["global_step"] == r1["global_step"] == 8
    print(assert_moved(initial_params(), r0["params"], r0["optim"], what="DDP rank 0"))
    for k in r0["params"]:
        assert torch.equal(r0["params"][k], r1["params"][k]), f"{k} differs between ranks"


def test_a_nonfinite_loss_on_one_rank_skips_the_step_on_every_rank(two_rank):
    import torch

    from helpers.moved import assert_moved

    r0 = torch.load(two_rank / "ddp_skip_rank0.pt", weights_only=False)
    r1 = torch.load(two_rank / "ddp_skip_rank1.pt", weights_only=False)
    # 8 responses / mini-batch 4 = 2 optimizer steps; the first is skipped on both ranks
    assert r0["skips"] == r1["skips"] == 1 and r0["global_step"] == r1["global_step"] == 1
    print(assert_moved(initial_params(), r0["params"], r0["optim"], what="the step taken after the skip"))
    for k in r0["params"]:
        assert torch.equal(r0["params"][k], r1["params"][k]), f"{k} differs between ranks"


def test_fsdp2_resume_is_exact(two_rank):
    import torch

    from helpers.moved import assert_moved

    res = torch.load(two_rank / "fsdp_resume.pt", weights_only=False)
    full, resumed = res["full"], res["resumed"]
    assert resumed["rollout_step"] == 4
    assert [r["step"] for r in resumed["metrics"]] == [3, 4]
    assert all(r["reward/zero_std_group_frac"] < 1 for r in full["metrics"]), "every step had a gradient"
    print(assert_moved(initial_params(), full["params"], full["optim"], what="FSDP2, 4 steps"))
    print(assert_moved(initial_params(), resumed["params"], resumed["optim"], what="FSDP2, resumed"))
    for a, b in zip(full["metrics"][2:], resumed["metrics"]):
        assert a.keys() == b.keys()
        bad = {k: (a[k], b[k]) for k in a if a[k] != b[k]}
        assert not bad, f"step {a['step']}: metrics differ after resume: {bad}"
    diff = max_abs_diff(full["params"], resumed["params"])
    print(f"FSDP2 resume: max |param(4 steps) - param(2 + resume + 2)| = {diff}")
    assert diff == 0.0


def test_fsdp2_resume_after_kill_9_of_one_rank_is_exact(two_rank):
    import torch

    from arlopti.checkpoints.resume import load_checkpoint_metadata
    from helpers.moved import assert_moved

    kill = json.loads((two_rank / "kill_launch.json").read_text())
    assert kill["rc"] not in (0, None) and (two_rank / "killed.json").exists(), kill["tail"]
    last = two_rank / "killed" / "last.ckpt"
    assert load_checkpoint_metadata(last)["arlopti"]["rollout_step"] == KILL_AT - 1  # saved before the kill
    full = torch.load(two_rank / "fsdp_resume.pt", weights_only=False)["full"]
    resumed = torch.load(two_rank / "fsdp_kill_resume.pt", weights_only=False)
    assert resumed["rollout_step"] == 4 and [r["step"] for r in resumed["metrics"]] == [3, 4]
    print(assert_moved(initial_params(), resumed["params"], resumed["optim"], what="FSDP2, killed and resumed"))
    for a, b in zip(full["metrics"][KILL_AT - 1:], resumed["metrics"]):
        bad = {k: (a.get(k), b.get(k)) for k in a.keys() | b.keys() if a.get(k) != b.get(k)}
        assert not bad, f"step {a['step']}: metrics differ after the kill and resume: {bad}"
    assert max_abs_diff(full["params"], resumed["params"]) == 0.0


def test_fsdp2_checkpoint_exports_to_the_same_logprobs(two_rank, tmp_path):
    import torch
    from transformers import AutoModelForCausalLM

    from arlopti.checkpoints.export import export_checkpoint
    from arlopti.learner.policy import PolicyLM
    from arlopti.models.loading import build_tiny_tokenizer

    out = export_checkpoint(two_rank / "ckpts" / "last.ckpt", tmp_path / "hf")
    model = AutoModelForCausalLM.from_pretrained(out)
    ids, mask, plen = probe_batch(build_tiny_tokenizer())
    with torch.no_grad():
        logp, _ = PolicyLM(model).eval()(ids, mask, plen, 1.0, with_entropy=False)
    expected = torch.load(two_rank / "fsdp_resume.pt", weights_only=False)["probe_logp"]
    from arlopti.models.loading import build_tiny_model

    with torch.no_grad():
        untrained, _ = PolicyLM(build_tiny_model(build_tiny_tokenizer())).eval()(ids, mask, plen, 1.0,
                                                                                with_entropy=False)
    moved = float((expected - untrained).abs().max())
    assert moved > 1e-3, f"the trained policy's log-probs moved by {moved:.3g} only: the comparison could not fail"
    print(f"export: max |logp(HF) - logp(FSDP2)| = {float((logp - expected).abs().max()):.3g} (moved {moved:.3g})")
    torch.testing.assert_close(logp, expected, rtol=1e-5, atol=1e-5)


if __name__ == "__main__":
    sys.path.insert(0, str(TESTS))
    (kill_worker if sys.argv[2:] == ["kill"] else worker)(Path(sys.argv[1]))
