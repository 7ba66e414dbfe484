"""LoRA checkpoints: the adapter, the optimizer and the run state only; the base's identity is
recorded and checked; resume is exact; export writes a PEFT adapter folder (or merged weights)
that gives the trainer's log-probs, and so does ``eval.py``'s loading, also for an adapter on the
embedding the tiny model ties to its LM head (issue 38: merged 16.9 nats off before).

Every run here trains on the toy reward (distinct characters mod 4: it varies inside each group),
and each comparison first shows that the adapter and the optimizer state moved
(:func:`helpers.moved.assert_moved`): a comparison of adapters that never left B = 0 cannot fail."""

from __future__ import annotations

import json
from dataclasses import replace

import lightning.pytorch as L
import pytest
import torch

from arlopti.callbacks.checkpointing import RolloutCheckpoint
from arlopti.checkpoints.resume import load_checkpoint_metadata
from arlopti.config import (AlgorithmConfig, ConfigError, LoraConfig, ModelConfig, OptimConfig, RolloutConfig,
                            RunConfig, SizesConfig, TinyModelConfig)
from arlopti.learner.module import GRPOModule
from helpers.moved import assert_moved, snapshot
from helpers.toy import ToyDataModule, toy_trainer

#: An adapter on the tied embedding too (the tiny model's LM head is its embedding matrix).
EMBED = LoraConfig(r=4, target_modules=["embed_tokens", "q_proj", "v_proj"])


def lora_cfg(seed: int = 0, lora: LoraConfig | None = None) -> RunConfig:
    return RunConfig(algorithm=AlgorithmConfig(kl_coef=0.01, ar_alpha=0.3),
                     sizes=SizesConfig(prompts_per_step=2, group_size=4, mini_batch_size=8, micro_batch_size=4,
                                       logprob_micro_batch_size=8),
                     model=ModelConfig(lora=lora or LoraConfig(r=4), tiny=TinyModelConfig(seed=seed)),
                     optim=OptimConfig(lr=1e-2), rollout=RolloutConfig(temperature=1.0, max_new_tokens=6))


class Rewards(L.Callback):
    def __init__(self):
        self.rows = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        m = pl_module.last_step_context.metrics
        self.rows.append((pl_module.rollout_step, m["update/loss"], m["update/kl"], m["reward/mean"],
                          float(torch.rand(()))))


def run(tok, steps, ckpt_dir, ckpt_path=None, cfg=None):
    L.seed_everything(7, verbose=False)
    module = GRPOModule(cfg or lora_cfg(), tokenizer=tok, total_rollout_steps=steps)
    module.initial = snapshot(module.policy)
    dm = ToyDataModule(n=4, tokenizer=tok, prompts_per_step=2, max_prompt_length=256)
    rec = Rewards()
    trainer = toy_trainer(callbacks=[rec, RolloutCheckpoint(str(ckpt_dir), every_n_steps=1)],
                          enable_checkpointing=True, max_epochs=2)
    trainer.fit(module, datamodule=dm, ckpt_path=ckpt_path)
    return module, rec


@pytest.fixture(scope="module")
def lora_runs(tiny_tokenizer, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("lora_ckpt")
    full, rec_full = run(tiny_tokenizer, 4, tmp / "a")
    part, rec1 = run(tiny_tokenizer, 2, tmp / "b")
    print(assert_moved(full.initial, full.policy, full.trainer.optimizers[0], what="the 4-step LoRA run"))
    return dict(tmp=tmp, full=full, part=part, rec_full=rec_full, rec1=rec1, last=tmp / "b" / "last.ckpt")


@pytest.fixture(scope="module")
def embed_run(tiny_tokenizer, tmp_path_factory):
    """2 steps of LoRA on the tied embedding (and q, v), checkpointed."""
    tmp = tmp_path_factory.mktemp("lora_embed")
    module, _ = run(tiny_tokenizer, 2, tmp, cfg=lora_cfg(lora=EMBED))
    print(assert_moved(module.initial, module.policy, module.trainer.optimizers[0], what="the embedding LoRA run"))
    assert any("embed_tokens.lora_embedding_B" in k and float(v.detach().abs().max()) > 0
               for k, v in module.policy.named_parameters()), "the embedding's adapter trained"
    return dict(module=module, last=tmp / "last.ckpt")


def test_a_lora_checkpoint_holds_the_adapter_and_the_base_identity_only(lora_runs):
    ckpt = torch.load(lora_runs["last"], map_location="cpu", weights_only=False)
    keys = list(ckpt["state_dict"])
    assert keys and all("lora_" in k for k in keys), [k for k in keys if "lora_" not in k][:5]
    states = ckpt["optimizer_states"][0]["state"]
    assert len(states) == len(keys), "optimizer state for the trainable (LoRA) parameters only"
    assert ckpt["arlopti"]["lora_base"]["fingerprint"]


def test_lora_resume_is_exact(lora_runs, tiny_tokenizer):
    # saves under c/: b/last.ckpt stays the 2-step checkpoint the export tests read
    resumed, rec2 = run(tiny_tokenizer, 4, lora_runs["tmp"] / "c", ckpt_path=str(lora_runs["last"]))
    print(assert_moved(snapshot(lora_runs["part"].policy), resumed.policy, resumed.trainer.optimizers[0],
                       what="steps 3-4 after the resume"))
    assert lora_runs["rec1"].rows + rec2.rows == lora_runs["rec_full"].rows
    a = dict(lora_runs["full"].policy.named_parameters())
    for k, v in resumed.policy.named_parameters():
        assert torch.equal(v, a[k]), f"{k} differs after resume"


def test_resume_on_another_base_is_refused(lora_runs, tiny_tokenizer, tmp_path):
    with pytest.raises(ConfigError, match="another base model"):
        run(tiny_tokenizer, 4, tmp_path, ckpt_path=str(lora_runs["last"]), cfg=lora_cfg(seed=1))


def trainer_side(tok, last, lora: LoraConfig | None = None) -> GRPOModule:
    """The trainer's policy as the checkpoint ``last`` left it."""
    module = GRPOModule(lora_cfg(lora=lora), tokenizer=tok)
    module.load_state_dict(torch.load(last, weights_only=False)["state_dict"], strict=False)
    return module


@pytest.fixture(params=["all-linear", "tied embedding"])
def trained(request, lora_runs, embed_run):
    """(checkpoint, its LoRA config, its trainer's policy): the plain LoRA run and the embedding one."""
    if request.param == "all-linear":
        return lora_runs["last"], None, lora_runs["part"]
    return embed_run["last"], EMBED, embed_run["module"]


def test_export_adapter_round_trip_gives_the_trainers_logprobs(trained, tiny_tokenizer, tmp_path):
    """The exported adapter folder loads with PeftModel.from_pretrained on the base and gives the
    log-probs of the policy that saved the checkpoint; merged export (export.merge) gives them too,
    also with the adapter on the embedding the LM head is tied to (the merged folder is untied)."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from arlopti.checkpoints.export import export_checkpoint
    from arlopti.learner.policy import PolicyLM
    from arlopti.models.loading import build_tiny_model

    last, lora, module = trained
    out = export_checkpoint(last, tmp_path / "adapter")
    assert (out / "adapter_model.safetensors").exists() and (out / "adapter_config.json").exists()
    info = json.loads((out / "arlopti_export.json").read_text())
    assert info["lora"] == "adapter" and info["lora_base"]["fingerprint"]
    trainer = trainer_side(tiny_tokenizer, last, lora)
    ids = torch.randint(3, 200, (3, 12), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    with torch.no_grad():
        want, _ = trainer.policy.eval()(ids, mask, 5)
        trained_now, _ = module.policy.eval()(ids, mask, 5)
        torch.testing.assert_close(want, trained_now, rtol=0, atol=0)  # the checkpoint is the trained policy
        base, _ = PolicyLM(build_tiny_model(tiny_tokenizer), trainer.cfg.model.logprob_impl).eval()(ids, mask, 5)
        assert float((want - base).abs().max()) > 1e-3, "training moved the log-probs: the checks below can fail"
        loaded = PeftModel.from_pretrained(build_tiny_model(tiny_tokenizer), str(out)).eval()
        got, _ = PolicyLM(loaded, trainer.cfg.model.logprob_impl)(ids, mask, 5)
        torch.testing.assert_close(got, want, rtol=0, atol=0)
        merged_dir = export_checkpoint(last, tmp_path / "merged", merge=True)
        merged = AutoModelForCausalLM.from_pretrained(merged_dir).eval()
        got_m, _ = PolicyLM(merged, trainer.cfg.model.logprob_impl)(ids, mask, 5)
    torch.testing.assert_close(got_m, want, rtol=1e-5, atol=1e-5)
    assert not (merged_dir / "adapter_config.json").exists()


def test_eval_loads_a_lora_checkpoint_as_the_merged_policy(trained, tiny_tokenizer):
    """``eval.py ckpt_path=...``: :func:`arlopti.entry.evaluate.load_model_for_eval` on a LoRA checkpoint
    (before issue 38, on the embedding run: greedy reward 1.000 where the trainer's validation gave 0.833)."""
    from omegaconf import OmegaConf

    from arlopti.entry.evaluate import load_model_for_eval

    last, lora, _ = trained
    policy, _ = load_model_for_eval(OmegaConf.create({"model": {"name_or_path": "tiny"}}), str(last))
    trainer = trainer_side(tiny_tokenizer, last, lora)
    ids = torch.randint(3, 200, (2, 10), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want, _ = trainer.policy.eval()(ids, torch.ones_like(ids), 4)
        got, _ = policy.eval()(ids, torch.ones_like(ids), 4)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
