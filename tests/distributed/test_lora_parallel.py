"""LoRA under FSDP2 and DDP (gloo, CPU): 2 ranks give the 1-rank update of the adapter, only the
trainable parameters are in the optimizer, and under FSDP2 the frozen base is sharded (each
rank holds a part of every decoder weight, not a copy).

One ``torchrun --nproc_per_node=2`` launch of :func:`worker` runs both strategies; the 1-rank
runs are made in the pytest process. Rollouts are :class:`FixedEngine`'s (rank-independent), scored
by the toy reward, which varies inside each group: before the adapters are compared, each run shows
that its adapter and optimizer moved (:func:`helpers.moved.assert_moved`), so that the comparison
could fail.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from helpers.torchrun import launch_two_ranks

HERE = Path(__file__).resolve()
ETA = 0.002
pytestmark = pytest.mark.distributed


def make_cfg():
    from arlopti.config import (AlgorithmConfig, LoptiConfig, LoraConfig, ModelConfig, OptimConfig, RolloutConfig,
                                RunConfig, SizesConfig)

    return RunConfig(algorithm=AlgorithmConfig(kl_coef=0.01, ar_alpha=0.3, lopti=LoptiConfig(enabled=True, eta=ETA)),
                     sizes=SizesConfig(prompts_per_step=4, group_size=4, mini_batch_size=16, micro_batch_size=2,
                                       logprob_micro_batch_size=8),
                     # SGD: the update is the gradient (AdamW's first step, g / (|g| + eps), would amplify
                     # float rounding on near-zero gradients)
                     model=ModelConfig(lora=LoraConfig(r=4)),
                     optim=OptimConfig(name="sgd", lr=0.5, weight_decay=0.0, grad_clip=None),
                     rollout=RolloutConfig(temperature=1.0, max_new_tokens=12))


def fit(tok, strategy=None, devices: int = 1):
    import lightning.pytorch as L

    from arlopti.callbacks.rollout import RolloutCallback
    from arlopti.learner.module import GRPOModule
    from helpers.fixed_rollouts import FixedEngine
    from helpers.toy import ToyDataModule

    L.seed_everything(123, verbose=False)
    cfg = make_cfg()
    module = GRPOModule(cfg, tokenizer=tok, total_rollout_steps=1)
    module.rollout_engine = FixedEngine(tok, min_len=2)
    dm = ToyDataModule(tokenizer=tok, prompts_per_step=cfg.sizes.prompts_per_step, max_prompt_length=256)
    trainer = L.Trainer(accelerator="cpu", devices=devices, strategy=strategy or "auto", max_epochs=1, logger=False,
                        enable_checkpointing=False, limit_val_batches=0, num_sanity_val_steps=0,
                        use_distributed_sampler=False, enable_progress_bar=False, enable_model_summary=False,
                        callbacks=[RolloutCallback(group_size=cfg.sizes.group_size)])
    module.initial_adapter = {n: p.detach().clone() for n, p in module.policy.named_parameters() if p.requires_grad}
    trainer.fit(module, datamodule=dm)
    return module


def adapter_and_state(module) -> dict:
    """The adapter before and after (full tensors; a collective under FSDP2), the optimizer's parameter
    count and :func:`helpers.moved.optimizer_summary`, and per frozen base weight the fraction of it this
    rank holds."""
    from arlopti.learner.sharding import full_state_dict
    from helpers.moved import optimizer_summary

    opt = module.trainer.optimizers[0]
    trainable = [p for p in module.policy.parameters() if p.requires_grad]
    frozen = {n: p for n, p in module.policy.named_parameters() if not p.requires_grad}
    local = {n: (p.to_local().numel() if hasattr(p, "to_local") else p.numel()) / p.numel() for n, p in frozen.items()}
    return {"adapter": full_state_dict(module.policy), "initial": module.initial_adapter,
            "optim": optimizer_summary(opt), "opt_params": sum(len(g["params"]) for g in opt.param_groups),
            "trainable": len(trainable), "frozen_local_frac": local,
            "steps": module.trainer.global_step}


def worker(out: Path) -> None:
    import torch
    import torch.distributed as dist
    from lightning.pytorch.strategies import DDPStrategy

    from arlopti.learner.sharding import FSDP2Strategy
    from arlopti.models.loading import build_tiny_tokenizer

    torch.set_num_threads(1)
    tok = build_tiny_tokenizer()
    for name, strategy in (("fsdp", FSDP2Strategy()), ("ddp", DDPStrategy(find_unused_parameters=False))):
        result = adapter_and_state(fit(tok, strategy, devices=2))
        if dist.get_rank() == 0:
            torch.save(result, out / f"{name}.pt")
    if dist.get_rank() == 0:
        (out / "done.json").write_text(json.dumps({"world": dist.get_world_size()}))


@pytest.fixture(scope="module")
def two_rank(tmp_path_factory):
    return launch_two_ranks(HERE, tmp_path_factory.mktemp("lora_two_rank"), "done.json")


@pytest.fixture(scope="module")
def one_rank(tiny_tokenizer):
    return adapter_and_state(fit(tiny_tokenizer))


@pytest.mark.parametrize("strategy", ["fsdp", "ddp"])
def test_lora_two_ranks_give_the_one_rank_adapter(two_rank, one_rank, strategy):
    import torch

    two = torch.load(two_rank / f"{strategy}.pt", weights_only=False)
    assert two["steps"] == one_rank["steps"] == 2  # Lopti: a low and a high phase
    assert set(two["adapter"]) == set(one_rank["adapter"]) and all("lora_" in k for k in two["adapter"])
    from helpers.moved import assert_moved

    print(assert_moved(one_rank["initial"], one_rank["adapter"], one_rank["optim"], "LoRA, 1 rank"))
    print(assert_moved(two["initial"], two["adapter"], two["optim"], f"LoRA, 2 ranks ({strategy})"))
    for k, v in one_rank["adapter"].items():
        torch.testing.assert_close(two["adapter"][k], v, rtol=1e-5, atol=1e-6, msg=k)
    assert two["opt_params"] == two["trainable"] == one_rank["trainable"], "the optimizer holds the adapter only"
    fracs = two["frozen_local_frac"]
    if strategy == "fsdp":  # every frozen decoder weight is split over the 2 ranks, none replicated
        layers = {n: f for n, f in fracs.items() if ".layers." in n}
        assert layers and all(f <= 0.5 + 1e-9 for f in layers.values()), layers
    else:
        assert all(f == 1.0 for f in fracs.values())


if __name__ == "__main__":
    worker(Path(sys.argv[1]))
