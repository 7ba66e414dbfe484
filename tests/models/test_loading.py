"""``model.name_or_path=<an adapter export>`` (arlopti/models/loading.py): the folder that
``python -m arlopti.checkpoints.export`` writes for a LoRA run loads as its base with the adapter
merged, for ``eval.py`` as for anything that loads a model by name, and gives the trained policy's
log-probs; a folder whose base cannot be found says to export with ``--merge``."""

from __future__ import annotations

import json

import pytest
import torch

from arlopti.callbacks.checkpointing import RolloutCheckpoint
from arlopti.config import LoraConfig, ModelConfig, OptimConfig, RolloutConfig, RunConfig, SizesConfig
from arlopti.learner.module import GRPOModule
from helpers.toy import ToyDataModule, toy_trainer


@pytest.fixture(scope="module")
def adapter_export(tiny_tokenizer, tmp_path_factory):
    """(trained module, adapter folder) after one LoRA step under a reward that varies in each group."""
    from arlopti.checkpoints.export import export_checkpoint

    tmp = tmp_path_factory.mktemp("adapter")
    cfg = RunConfig(sizes=SizesConfig(prompts_per_step=2, group_size=4, mini_batch_size=8, micro_batch_size=4),
                    model=ModelConfig(lora=LoraConfig(r=4)), optim=OptimConfig(lr=1e-2),
                    rollout=RolloutConfig(temperature=1.0, max_new_tokens=6))
    module = GRPOModule(cfg, tokenizer=tiny_tokenizer, total_rollout_steps=1)
    dm = ToyDataModule(n=4, tokenizer=tiny_tokenizer, prompts_per_step=2, max_prompt_length=256)
    toy_trainer(callbacks=[RolloutCheckpoint(str(tmp / "checkpoints"), every_n_steps=1)],
                enable_checkpointing=True).fit(module, datamodule=dm)
    moved = [n for n, p in module.policy.hf.named_parameters() if "lora_B" in n and p.abs().max() > 0]
    assert moved, "the adapter did not move: the comparison below could not fail"
    return module, export_checkpoint(tmp / "checkpoints" / "last.ckpt", tmp / "adapter")


def logprobs(model, tok):
    from arlopti.learner.policy import PolicyLM

    ids = torch.tensor([tok("Zoey said that Oliver is a knight. So Emma is a knave.")["input_ids"]])
    with torch.no_grad():
        return PolicyLM(model).eval()(ids, torch.ones_like(ids), 4, 1.0, with_entropy=False)[0]


def test_an_adapter_export_loads_by_name_as_the_trained_policy(adapter_export, tiny_tokenizer):
    from arlopti.models.loading import build_tiny_model, load_causal_lm, load_tokenizer

    module, folder = adapter_export
    assert (folder / "adapter_config.json").is_file() and not (folder / "config.json").exists()
    assert json.loads((folder / "adapter_config.json").read_text())["base_model_name_or_path"] is None  # tiny
    tok = load_tokenizer(str(folder))
    assert tok("a knight and a knave")["input_ids"] == tiny_tokenizer("a knight and a knave")["input_ids"]
    model = load_causal_lm(str(folder), tok)
    assert not hasattr(model, "peft_config")  # merged: a plain HF model
    want = logprobs(module.policy.hf, tiny_tokenizer)
    torch.testing.assert_close(logprobs(model, tiny_tokenizer), want, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(logprobs(build_tiny_model(tiny_tokenizer), tiny_tokenizer), want, atol=1e-4)


def test_eval_takes_an_adapter_export_as_its_model(adapter_export, tiny_tokenizer):
    from omegaconf import OmegaConf

    from arlopti.entry.evaluate import load_model_for_eval

    module, folder = adapter_export
    policy, _ = load_model_for_eval(OmegaConf.create({"model": {"name_or_path": str(folder)}}))
    torch.testing.assert_close(logprobs(policy.hf, tiny_tokenizer), logprobs(module.policy.hf, tiny_tokenizer),
                               rtol=1e-5, atol=1e-5)


def test_an_adapter_folder_whose_base_is_unknown_says_to_export_with_merge(adapter_export, tmp_path):
    import shutil

    from arlopti.models.loading import load_causal_lm

    _, folder = adapter_export
    bare = tmp_path / "bare"
    shutil.copytree(folder, bare)
    (bare / "arlopti_export.json").unlink()  # a PEFT folder from elsewhere, its base not named
    with pytest.raises(FileNotFoundError, match="names no base model .* --merge"):
        load_causal_lm(str(bare), None)
    config = json.loads((bare / "adapter_config.json").read_text())
    (bare / "adapter_config.json").write_text(json.dumps({**config, "base_model_name_or_path": "/nowhere/base"}))
    with pytest.raises(FileNotFoundError, match=r"on the base '/nowhere/base', which could not be loaded .* --merge"):
        load_causal_lm(str(bare), None)
