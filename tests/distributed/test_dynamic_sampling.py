"""DAPO dynamic sampling: 2 ranks (DDP, gloo, CPU) train on the groups 1 rank trains on.

One ``torchrun --nproc_per_node=2`` launch of :func:`worker` runs 2 rollout steps of the tiny
model with dynamic sampling; the test compares it with the same run on 1 rank in the pytest
process. Both see identical rollouts (:class:`helpers.flat_toy.SpyEngine`: responses depend only on
the prompt and the sample index). The flat set is chosen so that round 0 leaves all its signal on
rank 0 (prompts 2 and 3, rank 1's half of step 1's main batch, are flat), more rounds are needed,
and groups must move between ranks for each to hold 2. Checked: the same prompts trained on (rank
0's followed by rank 1's = 1 rank's, in order), the same ``dapo/*``, reward and token metrics, and the
same parameters after the two SGD steps (one mini-batch per step, so the update is the same
gradient).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from helpers.torchrun import launch_two_ranks

HERE = Path(__file__).resolve()
TESTS = HERE.parents[1]
P, G, STEPS = 4, 4, 2
FLAT = {2, 3, 5, 8, 9, 10, 12, 13, 15}  # prompts whose groups carry no signal (shuffle off: step 1 = 0..3)


def make_cfg():
    from arlopti.config import AlgorithmConfig, DapoConfig, OptimConfig, RolloutConfig, RunConfig, SizesConfig

    return RunConfig(algorithm=AlgorithmConfig(dapo=DapoConfig(dynamic_sampling=True, max_gen_batches=6)),
                     sizes=SizesConfig(prompts_per_step=P, group_size=G, mini_batch_size=P * G, micro_batch_size=4,
                                       logprob_micro_batch_size=8),
                     optim=OptimConfig(name="sgd", lr=0.1, weight_decay=0.0, grad_clip=None),
                     rollout=RolloutConfig(temperature=1.0, max_new_tokens=10))


def fit(tok, strategy=None, devices: int = 1):
    """2 steps; returns (module, per-step rows: metrics, this rank's trained and generated prompts)."""
    import lightning.pytorch as L

    from arlopti.callbacks.rollout import RolloutCallback
    from arlopti.learner.module import GRPOModule
    from helpers.flat_toy import FlatToyDataModule, SpyEngine, prompt_index

    class Record(L.Callback):
        def __init__(self):
            self.rows = []

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            exp = batch.experience
            m = {k: v for k, v in pl_module.last_step_context.metrics.items() if not k.startswith("timing/")}
            trained = [prompt_index(exp.prompt_texts[i]) for i in range(0, len(exp), G)]
            self.rows.append({"metrics": m, "trained": trained,
                              "generated": sorted(i for c in spy.calls for i in c)})
            spy.calls.clear()

    L.seed_everything(5, verbose=False)
    module = GRPOModule(make_cfg(), tokenizer=tok, total_rollout_steps=STEPS)
    spy = module.rollout_engine = SpyEngine(tok)
    dm = FlatToyDataModule(n=16, flat=FLAT, tokenizer=tok, prompts_per_step=P, max_prompt_length=256, shuffle=False)
    rec = Record()
    trainer = L.Trainer(accelerator="cpu", devices=devices, strategy=strategy or "auto", max_epochs=1, logger=False,
                        enable_checkpointing=False, limit_val_batches=0, num_sanity_val_steps=0,
                        use_distributed_sampler=False, enable_progress_bar=False, enable_model_summary=False,
                        callbacks=[RolloutCallback(group_size=G), rec])
    trainer.fit(module, datamodule=dm)
    return module, rec.rows


def worker(out: Path) -> None:
    import torch
    import torch.distributed as dist
    from lightning.pytorch.strategies import DDPStrategy

    from arlopti.models.loading import build_tiny_tokenizer

    torch.set_num_threads(1)
    module, rows = fit(build_tiny_tokenizer(), DDPStrategy(find_unused_parameters=False), devices=2)
    params = {k: v.detach().cpu() for k, v in module.policy.state_dict().items()}
    torch.save({"params": params, "rows": rows}, out / f"rank{dist.get_rank()}.pt")
    if dist.get_rank() == 0:
        (out / "done.json").write_text(json.dumps({"world": dist.get_world_size()}))


pytestmark = pytest.mark.distributed


@pytest.fixture(scope="module")
def two_rank(tmp_path_factory):
    out = tmp_path_factory.mktemp("ds_two_rank")
    launch_two_ranks(HERE, out, "done.json")
    import torch

    return [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(2)]


def test_two_ranks_train_on_the_groups_one_rank_trains_on(two_rank, tiny_tokenizer):
    import torch

    module, rows = fit(tiny_tokenizer)
    r0, r1 = two_rank
    moved = 0
    for step in range(STEPS):
        one, a, b = rows[step], r0["rows"][step], r1["rows"][step]
        print(f"step {step + 1}: 1 rank trained {one['trained']}; rank 0 {a['trained']} (generated {a['generated']}), "
              f"rank 1 {b['trained']} (generated {b['generated']}); rounds {one['metrics']['dapo/gen_rounds']}")
        assert len(a["trained"]) == len(b["trained"]) == 2
        assert a["trained"] + b["trained"] == one["trained"]
        assert not set(one["trained"]) & FLAT
        moved += len(set(a["trained"]) - set(a["generated"])) + len(set(b["trained"]) - set(b["generated"]))
        for key in ("dapo/gen_rounds", "dapo/groups_generated", "dapo/kept_frac", "dapo/groups_trained",
                    "dapo/no_signal_fallback", "rollout/tokens", "rollout/responses"):
            assert a["metrics"][key] == b["metrics"][key] == pytest.approx(one["metrics"][key], abs=1e-12), key
        for key in ("reward/mean", "update/loss", "update/grad_norm"):
            assert a["metrics"][key] == pytest.approx(one["metrics"][key], rel=1e-5, abs=1e-7), key
    assert rows[0]["metrics"]["dapo/gen_rounds"] > 1, "the flat set must force extra rounds"
    assert rows[0]["metrics"]["update/grad_norm"] > 0, "the update must be visible for the comparison to mean anything"
    assert moved > 0, "some groups must have been generated on the other rank for the test to cover the move"
    from arlopti.models.loading import build_tiny_model
    from helpers.moved import assert_moved

    initial = {f"hf.{k}": v for k, v in build_tiny_model(tiny_tokenizer).state_dict().items()}
    print(assert_moved(initial, r0["params"], module.trainer.optimizers[0], what="2 ranks, 2 SGD steps"))
    ref = {k: v.detach() for k, v in module.policy.state_dict().items()}
    for k in ref:
        torch.testing.assert_close(r0["params"][k], ref[k], rtol=1e-5, atol=1e-6, msg=k)
        assert torch.equal(r0["params"][k], r1["params"][k]), f"{k} differs between ranks"


if __name__ == "__main__":
    sys.path.insert(0, str(TESTS))
    worker(Path(sys.argv[1]))
