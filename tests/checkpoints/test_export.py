"""``python -m arlopti.checkpoints.export``: a trained checkpoint becomes a ``from_pretrained`` model + tokenizer.

A single-file checkpoint of a 1-step run (tiny model) is exported; the exported model gives the
trained module's log-probs exactly and the tokenizer encodes as the training one did. The FSDP2
(distributed folder) case is in tests/distributed/test_data_parallel.py, which has such a folder.
Bad input: a truncated file, a folder that is no checkpoint, a run directory without one.
"""

from __future__ import annotations

import json

import pytest
import torch

from arlopti.callbacks.checkpointing import RolloutCheckpoint
from arlopti.config import AlgorithmConfig, OptimConfig, RolloutConfig, RunConfig, SizesConfig
from arlopti.checkpoints.export import export_checkpoint, load_policy_from_checkpoint, main
from arlopti.learner.module import GRPOModule
from arlopti.learner.policy import PolicyLM
from arlopti.checkpoints.resume import CheckpointError
from helpers.toy import ToyDataModule, toy_trainer


@pytest.fixture(scope="module")
def trained(tiny_tokenizer, tmp_path_factory):
    """(module, run_dir) after one rollout step, with checkpoints/last.ckpt written."""
    run_dir = tmp_path_factory.mktemp("run")
    cfg = RunConfig(algorithm=AlgorithmConfig(), optim=OptimConfig(lr=1e-2),
                    sizes=SizesConfig(prompts_per_step=2, group_size=4, mini_batch_size=8, micro_batch_size=4),
                    rollout=RolloutConfig(temperature=1.0, max_new_tokens=6))
    module = GRPOModule(cfg, tokenizer=tiny_tokenizer, total_rollout_steps=1)
    dm = ToyDataModule(n=4, tokenizer=tiny_tokenizer, prompts_per_step=2, max_prompt_length=256)
    ckpt = RolloutCheckpoint(str(run_dir / "checkpoints"), every_n_steps=1)
    toy_trainer(callbacks=[ckpt], enable_checkpointing=True).fit(module, datamodule=dm)
    return module, run_dir


def probe(tok):
    prompt = tok("Zoey said that Oliver is a knight.", add_special_tokens=False)["input_ids"]
    response = tok(" So Emma is a knave.<|im_end|>", add_special_tokens=False)["input_ids"]
    ids = torch.tensor([prompt + response])
    return ids, torch.ones_like(ids), len(prompt)


def test_export_loads_with_from_pretrained_and_gives_the_same_logprobs(trained, tiny_tokenizer, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    module, run_dir = trained
    out = export_checkpoint(run_dir / "checkpoints" / "last.ckpt", tmp_path / "hf")
    model = AutoModelForCausalLM.from_pretrained(out)
    tok = AutoTokenizer.from_pretrained(out)
    text = "Zoey said that Oliver is a knight. <answer> (1) Zoey is a knave </answer>"
    assert tok(text)["input_ids"] == tiny_tokenizer(text)["input_ids"]
    assert tok.eos_token == tiny_tokenizer.eos_token and tok.pad_token == tiny_tokenizer.pad_token
    ids, mask, plen = probe(tiny_tokenizer)
    module.policy.eval()
    with torch.no_grad():
        expected, _ = module.policy(ids, mask, plen, 0.7, with_entropy=False)
        got, _ = PolicyLM(model).eval()(ids, mask, plen, 0.7, with_entropy=False)
    print(f"export: max |logp(HF) - logp(module)| = {float((got - expected).abs().max()):.3g}")
    # Weights are bit-identical (next test); the forward may differ in the last float bits (the
    # exported config can pick another attention kernel), hence a float tolerance, not equality.
    for k, v in module.policy.hf.state_dict().items():
        assert torch.equal(model.state_dict()[k], v), k
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    info = json.loads((out / "arlopti_export.json").read_text())
    assert info["rollout_step"] == 1 and info["model"] == "tiny"
    # the untrained model differs: the comparison above can fail
    from arlopti.models.loading import build_tiny_model

    with torch.no_grad():
        untrained, _ = PolicyLM(build_tiny_model(tiny_tokenizer)).eval()(ids, mask, plen, 0.7, with_entropy=False)
    assert not torch.allclose(untrained, expected)
    from helpers.moved import assert_moved

    initial = {f"hf.{k}": v for k, v in build_tiny_model(tiny_tokenizer).named_parameters()}
    print(assert_moved(initial, module.policy, module.trainer.optimizers[0], what="the exported run"))


def test_load_policy_from_a_run_directory_and_cli(trained, tmp_path, capsys):
    module, run_dir = trained
    model, tok = load_policy_from_checkpoint(run_dir)  # a run directory: its checkpoints/last.ckpt
    assert not model.training
    for k, v in module.policy.hf.state_dict().items():
        assert torch.equal(model.state_dict()[k], v), k
    assert main([str(run_dir / "checkpoints" / "last.ckpt"), str(tmp_path / "bf16"), "--dtype", "bfloat16"]) == 0
    assert "exported" in capsys.readouterr().out
    from transformers import AutoModelForCausalLM

    assert AutoModelForCausalLM.from_pretrained(tmp_path / "bf16").dtype == torch.bfloat16


def test_bad_checkpoints_are_named(trained, tmp_path, capsys):
    _, run_dir = trained
    data = (run_dir / "checkpoints" / "last.ckpt").read_bytes()
    cut = tmp_path / "cut.ckpt"
    cut.write_bytes(data[: len(data) // 3])
    assert main([str(cut), str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert str(cut) in err and "truncated or corrupt" in err
    (tmp_path / "empty_run" / "checkpoints").mkdir(parents=True)
    with pytest.raises(CheckpointError, match="run directory without checkpoints/last.ckpt"):
        load_policy_from_checkpoint(tmp_path / "empty_run")
    (tmp_path / "folder").mkdir()
    with pytest.raises(CheckpointError, match="is a folder that holds no checkpoint"):
        load_policy_from_checkpoint(tmp_path / "folder")
    plain = tmp_path / "plain.ckpt"
    torch.save({"state_dict": {"w": torch.zeros(1)}}, plain)
    with pytest.raises(CheckpointError, match="no saved run config"):
        load_policy_from_checkpoint(plain)
