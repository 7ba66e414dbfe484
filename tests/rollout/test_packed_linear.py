"""The decoding step on oneDNN-packed weights (``arlopti.rollout.packed_linear``, ``rollout.hf_packed``).

The packed step must give the model's logits to float32 rounding (it sums in another order), run on the
packed copies (not silently on the modules), re-pack what an update changed and only that, leave LoRA,
autocast and other dtypes on their modules, and keep the engine's log-probs within 1e-4 of the trainer's.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from arlopti.rollout import hf, packed_linear
from arlopti.rollout.engine import SamplingConfig
from arlopti.rollout.hf import HFEngine
from arlopti.rollout.kv_decode import KVDecoder, projection_groups
from arlopti.rollout.packed_linear import PackedLinears, packable
from helpers.decoding import left_padded_batch as _batch
from helpers.decoding import prompt_ids as _prompts
from helpers.decoding import step_logits

pytestmark = pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="torch built without oneDNN")


def _step_logits(stepper, ids, mask, pos, tokens):
    return torch.cat(step_logits(stepper, ids, mask, pos, tokens), 1)


@pytest.mark.parametrize("arch", ["tiny_model", "tiny_llama"])
def test_the_packed_step_gives_the_models_logits_to_float_rounding(arch, tiny_tokenizer, request, monkeypatch):
    model = request.getfixturevalue(arch).eval()
    ids, mask, pos = _batch(tiny_tokenizer)
    tokens = torch.randint(3, len(tiny_tokenizer), (6, ids.shape[0]), generator=torch.Generator().manual_seed(0))
    packed = PackedLinears()
    packed.refresh(projection_groups(model), ids.shape[0])
    layers = model.config.num_hidden_layers
    assert len(packed.groups) == 4 * layers + 1  # qkv, o, gate+up, down per layer, and the LM head
    calls = []
    real = torch.ops.mkldnn._linear_pointwise
    monkeypatch.setattr(packed_linear.torch.ops.mkldnn, "_linear_pointwise",
                        lambda *a: calls.append(1) or real(*a), raising=False)
    want = _step_logits(hf._ForwardStepper(model), ids, mask, pos, tokens)
    got = _step_logits(KVDecoder(model, ids.shape[1] + len(tokens), packed), ids, mask, pos, tokens)
    assert len(calls) == len(tokens) * (4 * layers + 1)  # every projection of every step ran packed
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_an_update_repacks_what_it_changed_and_only_that(tiny_model):
    groups = projection_groups(tiny_model)
    packed = PackedLinears()
    packed.refresh(groups, 4)
    before = dict(packed.groups)
    down = tiny_model.model.layers[0].mlp.down_proj
    x = torch.randn(4, 1, down.in_features)
    with torch.no_grad():
        down.weight.add_(1.0)  # what an optimizer step does: in place
    stale = packed((down,), x)[0]
    packed.refresh(groups, 4)
    changed = [k for k in packed.groups if packed.groups[k] is not before[k]]
    assert changed == [(id(down),)]
    fresh = packed((down,), x)[0]
    torch.testing.assert_close(fresh, down(x), rtol=1e-5, atol=1e-5)
    assert not torch.allclose(stale, fresh)  # the old copy was indeed out of date
    tiny_model.model.layers[0].self_attn.q_proj.weight = nn.Parameter(torch.zeros_like(
        tiny_model.model.layers[0].self_attn.q_proj.weight))  # re-assigned, not updated in place
    packed.refresh(groups, 4)
    qkv = tuple(id(m) for m in groups[0])
    assert packed.groups[qkv] is not before[qkv]


def test_lora_autocast_and_other_dtypes_stay_on_their_modules(tiny_model):
    from peft import LoraConfig, get_peft_model

    lora = get_peft_model(tiny_model, LoraConfig(r=2, target_modules=["q_proj", "v_proj"]))
    groups = projection_groups(lora)
    attn = lora.get_base_model().model.layers[0].self_attn
    assert not packable((attn.q_proj, attn.k_proj, attn.v_proj)) and packable((attn.o_proj,))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert not packable((attn.o_proj,))
    assert not packable((nn.Linear(4, 4).to(torch.bfloat16),))
    packed = PackedLinears()
    packed.refresh(groups, 2)
    assert tuple(id(m) for m in (attn.q_proj, attn.k_proj, attn.v_proj)) not in packed.groups


def test_the_engine_packs_at_sync_and_its_logprobs_match_the_trainers(tiny_model, tiny_tokenizer):
    sampling = SamplingConfig(temperature=0.9, top_k=0, top_p=1.0, max_new_tokens=12, seed=3, logprobs=True)
    engine = HFEngine(tiny_model, tiny_tokenizer, generation_batch_size=8)
    assert engine.packed is not None and not engine.packed.groups
    assert engine.sync_weights(tiny_model, 0) and len(engine.packed.groups) == len(projection_groups(tiny_model))
    prompts = _prompts(tiny_tokenizer)
    completions = [c for group in engine.generate(prompts, 2, sampling) for c in group]
    worst = 0.0
    with torch.no_grad():
        for prompt, c in zip([p for p in prompts for _ in range(2)], completions):
            seq = torch.tensor([prompt + c.token_ids])
            logits = tiny_model(seq).logits[0, len(prompt) - 1:-1].float() / sampling.temperature
            trainer = logits.log_softmax(-1).gather(-1, torch.tensor(c.token_ids)[:, None])[:, 0]
            worst = max(worst, (trainer - torch.tensor(c.logprobs)).abs().max().item())
    assert worst < 1e-4, worst
    assert not HFEngine(tiny_model, tiny_tokenizer, packed=False).packed
    assert HFEngine(tiny_model, tiny_tokenizer, autocast_dtype=torch.bfloat16).packed is None
