"""The weight publisher (arlopti/rollout/publisher.py): exactly which names and tensors each plan sends.

Hand-built tiny policies (the tiny model ties its LM head to its embedding): full training, LoRA with
``lora_sync=merged`` (with ``modules_to_save`` copies) and with ``lora_sync=adapter``, each to a
receiver that does not yet and that does hold the base. The expected names come from a freshly built
plain tiny model, which is what an engine or a rollout worker loads; the merged tensors are computed
here by hand, ``W + (alpha / r) B A``.
"""

from __future__ import annotations

import json

import pytest
import torch

from arlopti.config import LoraConfig
from arlopti.learner.policy import PolicyLM
from arlopti.models.loading import build_tiny_model
from arlopti.models.lora import apply_lora
from arlopti.rollout.publisher import WeightPublisher, tied_as_loaded, tied_embeddings
from arlopti.rollout.vllm_startup import engine_weight_names
from arlopti.rollout.weight_sync import WeightSyncError

PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
SCALE = 2.0  # model.lora.alpha = null: 2 x r, so alpha / r = 2


@pytest.fixture(scope="module")
def plain_names(tiny_tokenizer) -> list[str]:
    """What the receiver holds: the plain tiny model's parameters (the tied head listed once, as the embedding)."""
    names = [n for n, _ in build_tiny_model(tiny_tokenizer).named_parameters()]
    assert "lm_head.weight" not in names and "model.embed_tokens.weight" in names
    return names


def adapted(names: list[str]) -> list[str]:
    return [n for n in names if n.endswith(".weight") and n.split(".")[-2] in PROJECTIONS]


def saved(policy: PolicyLM) -> list[str]:
    """The plain names of the parameters the PEFT model holds trained copies of, read from its
    ``modules_to_save`` wrappers (which modules a name entry takes is peft's and arlopti's business, not
    this test's: tests/models/test_lora.py checks that)."""
    base = base_of(policy)
    return [f"{owner}.{leaf}" for owner, module in base.named_modules() if hasattr(module, "modules_to_save")
            for leaf, _ in module.modules_to_save["default"].named_parameters()]


def lora_policy(tok, **lora) -> PolicyLM:
    """A LoRA policy whose adapter has moved (B != 0) and whose ``modules_to_save`` copies differ from the base."""
    policy = PolicyLM(apply_lora(build_tiny_model(tok), LoraConfig(r=4, **lora)))
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in policy.named_parameters():
            if "lora_B" in name or "modules_to_save" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.1)
    return policy


def base_of(policy):
    return policy.hf.get_base_model()


def by_hand(policy, name: str) -> torch.Tensor:
    """The tensor a merged sync should send under ``name``: the merged weight, the trained copy, or the base's own."""
    base = base_of(policy)
    owner, leaf = name.rsplit(".", 1)
    module = base.get_submodule(owner)
    if name in adapted([name]):
        a, b = module.lora_A["default"].weight, module.lora_B["default"].weight
        return module.base_layer.weight + SCALE * b @ a
    if hasattr(module, "modules_to_save"):
        return getattr(module.modules_to_save["default"], leaf)
    return getattr(module, leaf)


def names_of(plan) -> list[str]:
    return [n for n, _ in plan.items]


def test_full_training_sends_every_parameter_itself_whether_or_not_the_base_is_held(tiny_tokenizer, plain_names):
    policy = PolicyLM(build_tiny_model(tiny_tokenizer))
    own = dict(policy.hf.named_parameters())
    publisher = WeightPublisher(plain_names, tie_word_embeddings=True)
    for holds_base in (False, True):
        plan = publisher.plan(policy, holds_base=holds_base)
        assert (plan.kind, plan.adapter) == ("full", False)
        assert names_of(plan) == plain_names
        assert all(t is own[n] for n, t in plan.items), "the parameters themselves, no copies"
        assert plan.nbytes == sum(p.numel() * p.element_size() for p in own.values())


@pytest.mark.parametrize("modules_to_save", [["norm"], ["input_layernorm", "norm"]])
def test_merged_lora_sends_the_merged_model_then_only_what_can_move(tiny_tokenizer, plain_names, modules_to_save):
    policy = lora_policy(tiny_tokenizer, modules_to_save=modules_to_save)
    assert saved(policy) and set(saved(policy)) <= set(plain_names)
    publisher = WeightPublisher(plain_names, tie_word_embeddings=True, lora_sync="merged")
    first = publisher.plan(policy, holds_base=False)
    assert (first.kind, first.adapter) == ("full", False) and names_of(first) == plain_names
    for name, tensor in first.items:
        want = by_hand(policy, name)
        if name in adapted(plain_names):
            torch.testing.assert_close(tensor, want, rtol=0, atol=1e-6)
            assert not torch.equal(tensor, base_of(policy).get_submodule(name[:-7]).base_layer.weight)
        else:
            assert tensor is want, name
    later = publisher.plan(policy, holds_base=True)
    moving = adapted(plain_names) + saved(policy)
    assert (later.kind, later.adapter) == ("changed", False)
    assert names_of(later) == [n for n in plain_names if n in moving]
    assert "model.embed_tokens.weight" not in names_of(later)
    sent = dict(first.items)
    assert all(torch.equal(t, sent[n]) for n, t in later.items)


def test_adapter_mode_sends_the_frozen_base_once_then_the_adapter_alone(tiny_tokenizer, plain_names):
    policy = lora_policy(tiny_tokenizer)
    publisher = WeightPublisher(plain_names, tie_word_embeddings=True, lora_sync="adapter")
    first = publisher.plan(policy, holds_base=False)
    assert (first.kind, first.adapter) == ("base", True) and names_of(first) == plain_names
    for name, tensor in first.items:
        owner = base_of(policy).get_submodule(name.rsplit(".", 1)[0])
        frozen = owner.base_layer if name in adapted(plain_names) else owner
        assert tensor is getattr(frozen, name.rsplit(".", 1)[1]), f"{name}: the base, never merged"
    later = publisher.plan(policy, holds_base=True)
    assert (later.kind, later.items, later.adapter, later.nbytes) == ("adapter", [], True, 0)


def test_lora_sync_applies_to_a_lora_policy_only(tiny_tokenizer, plain_names):
    plan = WeightPublisher(plain_names, True, lora_sync="adapter").plan(PolicyLM(build_tiny_model(tiny_tokenizer)),
                                                                       holds_base=True)
    assert (plan.kind, plan.adapter, names_of(plan)) == ("full", False, plain_names)
    with pytest.raises(ValueError, match=r"rollout.lora_sync='both': use 'merged' or 'adapter'"):
        WeightPublisher(plain_names, True, lora_sync="both")


@pytest.mark.parametrize("holds_base", [False, True])
def test_a_name_the_receiver_does_not_hold_is_refused_before_anything_is_sent(tiny_tokenizer, plain_names,
                                                                              holds_base):
    """The whole list is checked, also for a ``changed`` plan that would send a subset of it."""
    receiver = [n for n in plain_names if n != "model.norm.weight"] + ["model.renamed.weight"]
    publisher = WeightPublisher(receiver, True, where="the test engine")
    with pytest.raises(WeightSyncError) as err:
        publisher.plan(lora_policy(tiny_tokenizer, modules_to_save=["norm"]), holds_base=holds_base)
    msg = str(err.value)
    assert "weight sync name mismatch with the test engine:" in msg
    assert "1 name(s) sent that the test engine does not hold: model.norm.weight" in msg
    assert "1 name(s) the test engine holds that were not sent (would stay stale): model.renamed.weight" in msg


@pytest.mark.parametrize("lora", [None, {"modules_to_save": ["norm"]}], ids=["full", "lora"])
def test_the_workers_publisher_expects_the_base_as_a_worker_loads_it(tiny_tokenizer, plain_names, lora):
    policy = PolicyLM(build_tiny_model(tiny_tokenizer)) if lora is None else lora_policy(tiny_tokenizer, **lora)
    publisher = WeightPublisher.for_policy(policy)
    assert publisher.expected_names == plain_names
    assert names_of(publisher.plan(policy, holds_base=False)) == plain_names


@pytest.mark.parametrize("lora", [{"target_modules": ["embed_tokens", "q_proj"]}, {"modules_to_save": ["embed_tokens"]}],
                         ids=["adapter", "copy"])
def test_workers_untie_their_head_as_the_trainer_did(tiny_tokenizer, plain_names, lora, tmp_path):
    """LoRA on the embedding unties the trainer's head (issue 38). The colocated engine is built from the
    untied policy and takes ``lm_head.weight``; a rollout worker composes the run's ``model.lora`` and
    unties its own head the same way (:func:`arlopti.rollout.serve.prepare_model_dir`), says so in its
    served name (a worker with the tied head is refused at connect time: test_server_offline.py), and its
    publisher sends the trainer's frozen head with the rest."""
    from arlopti.config import ModelConfig, RolloutConfig
    from arlopti.rollout.publisher import head_untied_for_lora
    from arlopti.rollout.serve import prepare_model_dir
    from arlopti.rollout.server_client import served_model_name
    from arlopti.models.lora import base_identity, base_model_of

    policy = lora_policy(tiny_tokenizer, **lora)
    assert not tied_embeddings(policy) and tied_as_loaded(policy) and head_untied_for_lora(policy)
    colocated = WeightPublisher(engine_weight_names(policy.hf), tied_embeddings(policy))
    assert names_of(colocated.plan(policy, holds_base=False)) == plain_names + ["lm_head.weight"]
    workers = WeightPublisher.for_policy(policy)
    assert workers.expected_names == plain_names + ["lm_head.weight"]
    plan = workers.plan(policy, holds_base=False)
    assert names_of(plan) == plain_names + ["lm_head.weight"]
    assert torch.equal(dict(plan.items)["lm_head.weight"], base_model_of(policy).lm_head.weight)  # frozen head
    for case, untie in ((lora, True), ({}, False)):  # the worker: with the run's model.lora, and without LoRA
        cfg = ModelConfig(lora=LoraConfig(r=4, **case) if case else LoraConfig())
        identity, _, _, untied = prepare_model_dir(cfg, RolloutConfig(), tmp_path / f"w{untie}")
        config = json.loads((tmp_path / f"w{untie}" / "config.json").read_text())
        assert untied is untie and config.get("tie_word_embeddings", False) is not untie, config
        assert (served_model_name(identity, untied) == served_model_name(base_identity(base_model_of(policy)),
                                                                         head_untied_for_lora(policy))) is untie
