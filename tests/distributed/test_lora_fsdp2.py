"""LoRA under FSDP2 on 2 CPU ranks (gloo): the distributed checkpoint, a bit-exact resume, and export.

One ``torchrun --nproc_per_node=2`` launch of :func:`worker` runs the tiny model with LoRA (r=4) under
``FSDP2Strategy()``, AdamW, on :class:`FixedEngine` rollouts (rank-independent) scored by the toy reward
(distinct characters mod 4, :mod:`helpers.toy`; the rule of :mod:`helpers.varied_reward`), which varies
inside each group, so every step has a gradient and the adapter's ``B`` leaves 0:

* 4 rollout steps in one go;
* 2 steps saving a distributed checkpoint folder every step, then a resume from it to step 4.

The tests then show the runs moved (:func:`helpers.moved.assert_moved`: the adapter's weights and
AdamW's first moments), that the folder is a ``torch.distributed.checkpoint`` folder holding the
adapter and its optimizer state but not one frozen base weight, that the resumed run's steps 3-4
(metrics, RNG draws) and final adapter are the uninterrupted run's bit for bit, and that
``arlopti.checkpoints.export`` turns the folder into a PEFT adapter (and merged weights) giving the
sharded policy's log-probs.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from helpers.torchrun import launch_two_ranks

HERE = Path(__file__).resolve()
TESTS = HERE.parents[1]
STEPS = 4
pytestmark = [pytest.mark.distributed]


def make_cfg():
    from arlopti.config import (AlgorithmConfig, LoraConfig, ModelConfig, OptimConfig, RolloutConfig, RunConfig,
                                SizesConfig)

    return RunConfig(algorithm=AlgorithmConfig(kl_coef=0.01),
                     sizes=SizesConfig(prompts_per_step=2, group_size=4, mini_batch_size=4, micro_batch_size=2,
                                       logprob_micro_batch_size=8),
                     model=ModelConfig(lora=LoraConfig(r=4)), optim=OptimConfig(lr=1e-2),
                     rollout=RolloutConfig(temperature=1.0, max_new_tokens=10))


def probe(tok):
    import torch

    ids = torch.randint(3, len(tok), (3, 14), generator=torch.Generator().manual_seed(0))
    return ids, torch.ones_like(ids), 5


def fit(tok, steps: int, ckpt_dir: Path | None = None, ckpt_path: str | None = None, devices: int = 2):
    """Fit the toy task under FSDP2; returns (module, per-step rows of metrics and RNG draws)."""
    import random

    import lightning.pytorch as L
    import numpy as np
    import torch

    from arlopti.callbacks.checkpointing import RolloutCheckpoint
    from arlopti.callbacks.rollout import RolloutCallback
    from arlopti.learner.module import GRPOModule
    from arlopti.learner.sharding import FSDP2Strategy
    from helpers.fixed_rollouts import FixedEngine
    from helpers.toy import ToyDataModule

    rows: list[dict] = []

    class Recorder(L.Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            m = {k: v for k, v in pl_module.last_step_context.metrics.items() if not k.startswith("timing/")}
            rows.append({**m, "step": pl_module.rollout_step, "rng": [float(torch.rand(())), float(np.random.rand()),
                                                                      random.random()]})

    L.seed_everything(11, verbose=False)
    cfg = make_cfg()
    module = GRPOModule(cfg, tokenizer=tok, total_rollout_steps=steps)
    module.rollout_engine = FixedEngine(tok, min_len=2)
    callbacks = [RolloutCallback(group_size=cfg.sizes.group_size), Recorder()]
    if ckpt_dir is not None:
        callbacks.append(RolloutCheckpoint(str(ckpt_dir), every_n_steps=1))
    trainer = L.Trainer(accelerator="cpu", devices=devices, strategy=FSDP2Strategy(), max_epochs=1, logger=False,
                        enable_checkpointing=ckpt_dir is not None, limit_val_batches=0, num_sanity_val_steps=0,
                        use_distributed_sampler=False, enable_progress_bar=False, enable_model_summary=False,
                        callbacks=callbacks)
    trainer.fit(module, datamodule=ToyDataModule(n=16, tokenizer=tok, prompts_per_step=cfg.sizes.prompts_per_step,
                                                 max_prompt_length=256), ckpt_path=ckpt_path)
    return module, rows


# ---------------------------------------------------------------------------------------------------- 2 ranks


def worker(out: Path) -> None:
    import torch
    import torch.distributed as dist

    from arlopti.learner.sharding import full_state_dict
    from arlopti.models.loading import build_tiny_tokenizer
    from helpers.moved import optimizer_summary

    torch.set_num_threads(1)
    tok = build_tiny_tokenizer()

    def result(module, rows):
        ids, mask, plen = probe(tok)
        module.policy.eval()
        with torch.no_grad():
            logp, _ = module.policy(ids, mask, plen, 1.0, with_entropy=False)
        adapter = {k: v for k, v in full_state_dict(module.policy).items() if "lora_" in k}  # collective
        return {"adapter": adapter, "optim": optimizer_summary(module.trainer.optimizers[0]), "rows": rows,
                "rollout_step": module.rollout_step, "probe_logp": logp.detach().cpu()}

    straight = result(*fit(tok, STEPS))
    fit(tok, 2, ckpt_dir=out / "ckpts")
    resumed = result(*fit(tok, STEPS, ckpt_dir=out / "resumed", ckpt_path=str(out / "ckpts" / "last.ckpt")))
    if dist.get_rank() == 0:
        torch.save({"straight": straight, "resumed": resumed}, out / "runs.pt")
        (out / "done.json").write_text(json.dumps({"world": dist.get_world_size()}))


# ---------------------------------------------------------------------------------------------------- tests


@pytest.fixture(scope="module")
def two_rank(tmp_path_factory):
    import torch

    out = launch_two_ranks(HERE, tmp_path_factory.mktemp("lora_fsdp2"), "done.json")
    return out, torch.load(out / "runs.pt", weights_only=False)


@pytest.fixture(scope="module")
def initial_adapter(tiny_tokenizer):
    """The adapter every run starts from (apply_lora's seeded initialisation; B = 0)."""
    from arlopti.learner.module import GRPOModule

    module = GRPOModule(make_cfg(), tokenizer=tiny_tokenizer)
    return {k: v.detach().clone() for k, v in module.policy.state_dict().items() if "lora_" in k}


def test_the_runs_trained_the_adapter(two_rank, initial_adapter):
    from helpers.moved import assert_learning_signal, assert_moved

    _, runs = two_rank
    for name in ("straight", "resumed"):
        run = runs[name]
        print(assert_moved(initial_adapter, run["adapter"], run["optim"], what=f"LoRA under FSDP2, {name}"))
        for row in run["rows"]:
            assert_learning_signal(row, what=f"{name}, step {row['step']}")


def test_the_checkpoint_is_a_distributed_folder_of_the_adapter_only(two_rank, initial_adapter):
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    out, runs = two_rank
    folder = out / "ckpts" / "last.ckpt"
    assert folder.is_dir() and list(folder.glob("*.distcp")), f"{folder} is not a distributed checkpoint folder"
    saved = FileSystemReader(str(folder)).read_metadata().state_dict_metadata
    tensors = [k for k, v in saved.items() if isinstance(v, TensorStorageMetadata)]
    weights = [k for k in tensors if k.startswith("state_dict.")]
    assert weights and all("lora_" in k for k in weights), [k for k in weights if "lora_" not in k][:5]
    assert len(weights) == len(initial_adapter) == len(runs["straight"]["adapter"])
    optimizer = [k for k in tensors if "exp_avg" in k]
    assert optimizer and all("lora_" in k for k in optimizer), "AdamW's state: of the adapter, nothing else"


def test_resume_from_the_distributed_checkpoint_is_exact(two_rank):
    _, runs = two_rank
    straight, resumed = runs["straight"], runs["resumed"]
    assert resumed["rollout_step"] == STEPS and [r["step"] for r in resumed["rows"]] == [3, 4]
    for a, b in zip(straight["rows"][2:], resumed["rows"]):
        bad = {k: (a[k], b.get(k)) for k in a if a[k] != b.get(k)}
        assert not bad, f"step {a['step']}: differs after the resume: {bad}"
    assert straight["adapter"].keys() == resumed["adapter"].keys()
    for k, v in straight["adapter"].items():
        assert resumed["adapter"][k].dtype == v.dtype and bool((resumed["adapter"][k] == v).all()), k
    assert bool((straight["probe_logp"] == resumed["probe_logp"]).all())


def test_export_of_the_folder_gives_the_sharded_policys_logprobs(two_rank, tiny_tokenizer, tmp_path):
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from arlopti.checkpoints.export import export_checkpoint
    from arlopti.learner.policy import PolicyLM
    from arlopti.models.loading import build_tiny_model

    out, runs = two_rank
    last = out / "resumed" / "last.ckpt"  # written by the resumed run at step 4
    want = runs["resumed"]["probe_logp"]
    ids, mask, plen = probe(tiny_tokenizer)
    with torch.no_grad():
        base, _ = PolicyLM(build_tiny_model(tiny_tokenizer)).eval()(ids, mask, plen, 1.0, with_entropy=False)
        assert float((want - base).abs().max()) > 1e-3, "the adapter moved the log-probs: the check can fail"
        adapter_dir = export_checkpoint(last, tmp_path / "adapter")
        assert (adapter_dir / "adapter_model.safetensors").is_file()
        peft = PeftModel.from_pretrained(build_tiny_model(tiny_tokenizer), str(adapter_dir)).eval()
        got, _ = PolicyLM(peft)(ids, mask, plen, 1.0, with_entropy=False)
        merged = AutoModelForCausalLM.from_pretrained(export_checkpoint(last, tmp_path / "merged", merge=True)).eval()
        got_merged, _ = PolicyLM(merged)(ids, mask, plen, 1.0, with_entropy=False)
    print(f"export: max |logp(adapter) - logp(FSDP2)| = {float((got - want).abs().max()):.3g}, merged "
          f"{float((got_merged - want).abs().max()):.3g} (moved {float((want - base).abs().max()):.3g})")
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got_merged, want, rtol=1e-5, atol=1e-5)


if __name__ == "__main__":
    sys.path.insert(0, str(TESTS))
    worker(Path(sys.argv[1]))
