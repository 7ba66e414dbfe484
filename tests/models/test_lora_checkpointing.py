"""LoRA activation checkpointing (``model.lora.activation_checkpointing``, arlopti/models/lora.py): the
estimate it decides with, when each setting checkpoints (seen as the decoder layers' forward running a
second time, in the backward), that the gradients are the same bit for bit, and that a checkpointing
someone else turned on (``model.gradient_checkpointing``) is left on."""

from __future__ import annotations

import pytest
import torch

from arlopti.config import LoraConfig
from arlopti.learner.policy import PolicyLM
from arlopti.models.lora import AutoCheckpointing, apply_lora, decoder_layers_of, freed_activation_bytes


def lora_policy(tok, setting, gradient_checkpointing=False, seed=0):
    from arlopti.models.loading import TinySpec, build_tiny_model

    model = build_tiny_model(tok, TinySpec(seed=seed))
    policy = PolicyLM(apply_lora(model, LoraConfig(r=4, activation_checkpointing=setting), gradient_checkpointing))
    if gradient_checkpointing:  # as GRPOModule does after apply_lora
        policy.hf.gradient_checkpointing_enable()
    with torch.no_grad():  # a trained-looking adapter: with B = 0 the gradient of A is 0
        for name, p in policy.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.1, generator=torch.Generator().manual_seed(1))
    return policy.train()


def backward_counting_forwards(policy, rows=2, length=12):
    """One training forward + backward; returns (layer forward calls, gradients of the adapter)."""
    calls = {"n": 0}
    hooks = [layer.register_forward_pre_hook(lambda *a: calls.__setitem__("n", calls["n"] + 1))
             for layer in decoder_layers_of(policy.hf)]
    ids = torch.randint(3, 400, (rows, length), generator=torch.Generator().manual_seed(0))
    logp, _ = policy(ids, torch.ones_like(ids), 4, 1.0, with_entropy=False)
    logp.sum().backward()
    for h in hooks:
        h.remove()
    grads = {n: p.grad.clone() for n, p in policy.named_parameters() if p.requires_grad}
    return calls["n"], grads


def test_the_estimate_is_the_hand_count(tiny_tokenizer):
    """Tiny model: h 64, i 128, 2 layers, 2 kv heads of 16: (9·64 + 2·2·16 + 4·128) = 1152 elements per token
    per layer, 4 bytes each in fp32."""
    cfg = lora_policy(tiny_tokenizer, None).hf.config
    assert freed_activation_bytes(cfg, tokens=10, element_size=4) == 10 * 2 * 4 * 1152
    assert freed_activation_bytes(cfg, tokens=10, element_size=2) == 10 * 2 * 2 * 1152


@pytest.mark.parametrize("setting, min_bytes, recomputed", [
    (None, None, False),   # auto at the default bar: a tiny micro-batch keeps its activations
    (None, 0, True),       # auto with the bar at 0: every micro-batch is checkpointed
    (True, None, True),
    (False, None, False)])
def test_each_setting_checkpoints_where_it_says_with_the_same_gradients(tiny_tokenizer, setting, min_bytes, recomputed):
    policy = lora_policy(tiny_tokenizer, setting)
    auto = getattr(policy.hf, "arlopti_auto_checkpointing", None)
    assert (auto is not None) == (setting is None)
    if min_bytes is not None:
        auto.min_bytes = min_bytes
    calls, grads = backward_counting_forwards(policy)
    layers = len(decoder_layers_of(policy.hf))
    assert calls == (2 if recomputed else 1) * layers, calls
    if auto is not None:
        assert (auto.on_count, auto.off_count) == ((1, 0) if recomputed else (0, 1))
    plain, reference = backward_counting_forwards(lora_policy(tiny_tokenizer, False))
    assert plain == layers
    assert any(float(g.abs().max()) > 0 for n, g in reference.items() if "lora_A" in n), "A received a gradient"
    for name, g in reference.items():
        assert torch.equal(grads[name], g), name


def test_auto_leaves_checkpointing_that_was_already_on(tiny_tokenizer):
    """model.gradient_checkpointing=true: apply_lora attaches no controller; FSDP2's activation_checkpointing
    turns the layers on before the first training forward: the controller sees it and never acts."""
    assert getattr(lora_policy(tiny_tokenizer, None, gradient_checkpointing=True).hf,
                   "arlopti_auto_checkpointing", None) is None
    policy = lora_policy(tiny_tokenizer, None)
    auto: AutoCheckpointing = policy.hf.arlopti_auto_checkpointing
    for layer in decoder_layers_of(policy.hf):  # what learner.sharding.enable_activation_checkpointing does
        layer.gradient_checkpointing = True
    policy.hf.get_base_model().gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    calls, _ = backward_counting_forwards(policy)
    assert auto.pinned and calls == 2 * len(decoder_layers_of(policy.hf))


def test_no_grad_and_eval_passes_are_never_touched(tiny_tokenizer):
    policy = lora_policy(tiny_tokenizer, None)
    auto = policy.hf.arlopti_auto_checkpointing
    auto.min_bytes = 0
    ids = torch.randint(3, 400, (2, 8))
    with torch.no_grad():
        policy(ids, torch.ones_like(ids), 4, 1.0, with_entropy=False)
    policy.eval()
    policy(ids, torch.ones_like(ids), 4, 1.0, with_entropy=False)
    assert auto.state is None and auto.on_count == auto.off_count == 0
