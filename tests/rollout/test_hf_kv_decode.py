"""The HF engine's direct decoding step (``arlopti.rollout.kv_decode.KVDecoder``, under
``rollout.hf_decoder=loop``) and the engine's ``min_new_tokens``.

The step must give the model's own logits bit for bit (left padding, grouped-query heads, Qwen2's
biases and Llama's untied head, fp32 and bf16 autocast, LoRA adapters), and the engine the same
tokens and log-probs through every decoder. Models the step does not run fall back to the
model's forward. ``HFEngine(min_new_tokens=k)`` holds every response to at least ``k`` tokens
under every decoder (benchmarks/bench_rollout.py depends on it).
"""

from __future__ import annotations

import contextlib

import pytest
import torch

from arlopti.rollout import hf
from arlopti.rollout.engine import SamplingConfig
from arlopti.rollout.hf import HFEngine
from arlopti.rollout.kv_decode import KVDecoder, unsupported_reason
from helpers.decoding import left_padded_batch as _batch
from helpers.decoding import step_logits as _logits

SAMPLED = SamplingConfig(temperature=0.9, top_k=50, top_p=0.95, max_new_tokens=16, seed=5, logprobs=True)


@pytest.mark.parametrize("arch", ["tiny_model", "tiny_llama"])
@pytest.mark.parametrize("autocast", [False, True], ids=["fp32", "bf16_autocast"])
def test_the_step_gives_the_models_logits_bit_for_bit(arch, autocast, tiny_tokenizer, request):
    model = request.getfixturevalue(arch).eval()
    assert unsupported_reason(model) is None and model.config.num_key_value_heads < model.config.num_attention_heads
    ids, mask, pos = _batch(tiny_tokenizer)
    tokens = torch.randint(3, len(tiny_tokenizer), (6, ids.shape[0]), generator=torch.Generator().manual_seed(0))
    amp = torch.autocast("cpu", dtype=torch.bfloat16) if autocast else contextlib.nullcontext()
    with amp:
        want = _logits(hf._ForwardStepper(model), ids, mask, pos, tokens)
        got = _logits(KVDecoder(model, ids.shape[1] + len(tokens)), ids, mask, pos, tokens)
    assert want[-1].dtype == (torch.bfloat16 if autocast else torch.float32)
    assert all(torch.equal(a, b) for a, b in zip(want, got))
    assert not torch.equal(want[1], want[2])  # the steps do move


def test_the_step_runs_lora_adapters(tiny_model, tiny_tokenizer):
    peft = pytest.importorskip("peft")
    model = peft.get_peft_model(tiny_model, peft.LoraConfig(r=4, target_modules="all-linear", init_lora_weights=False))
    model.eval()
    assert unsupported_reason(model) is None
    ids, mask, pos = _batch(tiny_tokenizer)
    tokens = torch.randint(3, len(tiny_tokenizer), (3, ids.shape[0]), generator=torch.Generator().manual_seed(1))
    want = _logits(hf._ForwardStepper(model), ids, mask, pos, tokens)
    got = _logits(KVDecoder(model, ids.shape[1] + 3), ids, mask, pos, tokens)
    with model.disable_adapter():
        plain = _logits(hf._ForwardStepper(model), ids, mask, pos, tokens)
    assert not torch.equal(want[-1], plain[-1])  # the adapters change the logits ...
    assert all(torch.equal(a, b) for a, b in zip(want, got))  # ... and the step applies them


def test_a_full_cache_raises(tiny_model, tiny_tokenizer):
    ids, mask, pos = _batch(tiny_tokenizer)
    with pytest.raises(RuntimeError, match="holds"):
        _logits(KVDecoder(tiny_model.eval(), ids.shape[1] + 1), ids, mask, pos, torch.zeros(2, ids.shape[0],
                                                                                          dtype=torch.long))


def test_other_models_fall_back_to_their_forward(tiny_model, tiny_tokenizer):
    tiny_model.config._attn_implementation = "eager"
    assert "eager" in unsupported_reason(tiny_model)
    assert isinstance(hf.stepper_for(tiny_model, 8), hf._ForwardStepper)


def _frequent_tokens(model, tok, k: int) -> list[int]:
    out = HFEngine(model, tok).generate([tok("Is Ava a knave?")["input_ids"]], 4, SAMPLED)
    counts = torch.bincount(torch.tensor([t for cs in out for c in cs for t in c.token_ids]))
    return counts.topk(k).indices.tolist()


def test_every_decoder_samples_the_same_and_honours_min_new_tokens(tiny_model, tiny_tokenizer):
    tiny_model.generation_config.eos_token_id = _frequent_tokens(tiny_model, tiny_tokenizer, 3)
    prompts = [tiny_tokenizer(t)["input_ids"] for t in ("Zoey said that Oliver is a knight.", "Hi")]
    runs = {}
    for min_new in (None, 10, 16):
        for decoder in hf.DECODERS:
            engine = HFEngine(tiny_model, tiny_tokenizer, decoder=decoder, min_new_tokens=min_new)
            runs[min_new, decoder] = [c for cs in engine.generate(prompts, 3, SAMPLED) for c in cs]
    assert {c.finish_reason for c in runs[None, "loop"]} == {"stop", "length"}  # some rows stop early
    for (min_new, decoder), cs in runs.items():
        assert [c.token_ids for c in cs] == [c.token_ids for c in runs[min_new, "generate"]], (min_new, decoder)
        for c, ref in zip(cs, runs[min_new, "generate"]):
            torch.testing.assert_close(torch.tensor(c.logprobs), torch.tensor(ref.logprobs), atol=1e-6, rtol=0)
        assert min(len(c.token_ids) for c in cs) >= (min_new or 1)
    assert {len(c.token_ids) for c in runs[16, "loop"]} == {16}  # bench_rollout's exact lengths


def test_the_loop_stops_stepping_when_every_row_has_ended(tiny_model, tiny_tokenizer, monkeypatch):
    """One sampled response (fixed seed): make a later token of it the EOS, and count the steps."""
    prompt = [tiny_tokenizer("Hi")["input_ids"]]
    seq = HFEngine(tiny_model, tiny_tokenizer).generate(prompt, 1, SAMPLED)[0][0].token_ids
    k = next(i for i in range(1, len(seq)) if seq[i] not in seq[:i])  # its first occurrence
    tiny_model.generation_config.eos_token_id = seq[k]
    steps = []
    real = KVDecoder.step
    monkeypatch.setattr(KVDecoder, "step", lambda self, *a: steps.append(1) or real(self, *a))
    out = HFEngine(tiny_model, tiny_tokenizer).generate(prompt, 1, SAMPLED)[0][0]
    assert out.token_ids == seq[:k + 1] and out.finish_reason == "stop"
    assert len(steps) == k  # one step per token after the prefill's, none after the last EOS
