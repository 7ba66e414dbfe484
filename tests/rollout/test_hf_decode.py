"""The HF engine's own decoding loop (``arlopti.rollout.hf.decode``, ``rollout.hf_decoder=loop``)
against transformers' ``generate`` with the same sampler (``rollout.hf_decoder=generate``).

The two must sample the same tokens with the same log-probs: the same prompts of different
lengths (left padding), sampled (temperature, top-k, top-p) and greedy, Qwen2 and Llama, rows
that stop on an EOS while others go on, and the generation config's ``min_new_tokens``. The loop
must also stop as soon as every row has ended, and hand stop strings to ``generate``.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from arlopti.rollout.engine import SamplingConfig
from arlopti.rollout.hf import HFEngine

SAMPLED = SamplingConfig(temperature=0.9, top_k=50, top_p=0.95, max_new_tokens=24, seed=5, logprobs=True)
GREEDY = SamplingConfig(temperature=0.0, max_new_tokens=12, seed=5, logprobs=True)


def _prompts(tok):
    texts = ["Zoey said that Oliver is a knight.", "Is Ava a knave?", "A very long prompt " * 5, "Hi"]
    return [tok(t)["input_ids"] for t in texts]


def _run(model, tok, decoder: str, sampling: SamplingConfig, n: int = 3):
    return HFEngine(model, tok, generation_batch_size=64, decoder=decoder).generate(_prompts(tok), n, sampling)


def _assert_same(a, b):
    flat_a = [c for cs in a for c in cs]
    flat_b = [c for cs in b for c in cs]
    assert [c.token_ids for c in flat_a] == [c.token_ids for c in flat_b]
    assert [c.finish_reason for c in flat_a] == [c.finish_reason for c in flat_b]
    for x, y in zip(flat_a, flat_b):
        torch.testing.assert_close(torch.tensor(x.logprobs), torch.tensor(y.logprobs), atol=1e-6, rtol=0)


@pytest.mark.parametrize("arch", ["tiny_model", "tiny_llama"])
@pytest.mark.parametrize("sampling", [SAMPLED, GREEDY], ids=["sampled", "greedy"])
def test_loop_samples_what_generate_samples(arch, sampling, tiny_tokenizer, request):
    model = request.getfixturevalue(arch)
    loop = _run(model, tiny_tokenizer, "loop", sampling)
    assert len({tuple(c.token_ids) for cs in loop for c in cs}) > 3  # not a constant output
    _assert_same(loop, _run(model, tiny_tokenizer, "generate", sampling))


def _frequent_tokens(responses, k: int) -> list[int]:
    counts = torch.bincount(torch.tensor([t for cs in responses for c in cs for t in c.token_ids]))
    return counts.topk(k).indices.tolist()


def test_rows_that_stop_early_and_min_new_tokens(tiny_model, tiny_tokenizer):
    # Make three of the tokens the model samples often EOS tokens: some rows stop early, others do not.
    eos = _frequent_tokens(_run(tiny_model, tiny_tokenizer, "loop", SAMPLED), 3)
    tiny_model.generation_config.eos_token_id = eos
    loop = _run(tiny_model, tiny_tokenizer, "loop", SAMPLED)
    reasons = {c.finish_reason for cs in loop for c in cs}
    assert reasons == {"stop", "length"}, reasons
    for c in (c for cs in loop for c in cs if c.finish_reason == "stop"):
        assert c.token_ids[-1] in eos and not set(c.token_ids[:-1]) & set(eos)  # cut after the first EOS
    _assert_same(loop, _run(tiny_model, tiny_tokenizer, "generate", SAMPLED))

    tiny_model.generation_config.min_new_tokens = 6
    loop = _run(tiny_model, tiny_tokenizer, "loop", SAMPLED)
    assert min(len(c.token_ids) for cs in loop for c in cs) >= 6
    _assert_same(loop, _run(tiny_model, tiny_tokenizer, "generate", SAMPLED))


def test_loop_ends_when_every_row_has_stopped(tiny_model, tiny_tokenizer):
    """Greedy decoding of one prompt: make its 3rd token the EOS, and count the model's forwards."""
    prompt = _prompts(tiny_tokenizer)[:1]
    engine = HFEngine(tiny_model, tiny_tokenizer, decoder="loop")
    third = engine.generate(prompt, 1, GREEDY)[0][0].token_ids[2]
    tiny_model.generation_config.eos_token_id = third
    calls = []
    handle = tiny_model.register_forward_hook(lambda *a: calls.append(1))
    try:
        out = engine.generate(prompt, 2, GREEDY)
    finally:
        handle.remove()
    assert [c.finish_reason for c in out[0]] == ["stop", "stop"]
    first_eos = out[0][0].token_ids.index(third)
    assert len(calls) == first_eos + 1 < GREEDY.max_new_tokens  # prefill + one forward per later token


def test_stop_strings_go_through_generate(tiny_model, tiny_tokenizer, monkeypatch):
    engine = HFEngine(tiny_model, tiny_tokenizer, decoder="loop")
    called = []
    real = type(tiny_model).generate
    monkeypatch.setattr(type(tiny_model), "generate", lambda self, **kw: called.append(kw) or real(self, **kw))
    engine.generate(_prompts(tiny_tokenizer)[:1], 1, SAMPLED)
    assert not called
    stop = dataclasses.replace(SAMPLED, stop=("zz",))
    engine.generate(_prompts(tiny_tokenizer)[:1], 1, stop)
    assert called and called[0]["stop_strings"] == ["zz"]


def test_rows_stopped_by_a_stop_string_keep_one_log_prob_per_token(tiny_model, tiny_tokenizer):
    """generate() pads a row it stopped on a stop string while the others go on; the engine drops that
    padding, and must drop its log-probs with it (they misaligned every later turn of a multi-turn
    episode: docs/multi_turn.md's example failed with 'an episode has 40 log-probs for 24 tokens')."""
    engine = HFEngine(tiny_model, tiny_tokenizer, decoder="loop")
    free = [c for cs in engine.generate(_prompts(tiny_tokenizer), 3, SAMPLED) for c in cs]
    stopped = [c for cs in engine.generate(_prompts(tiny_tokenizer), 3, dataclasses.replace(SAMPLED, stop=(" ",)))
               for c in cs]
    assert len({len(c.token_ids) for c in stopped}) > 1  # rows stop at different steps: some were padded
    for s, f in zip(stopped, free):
        assert len(s.logprobs) == len(s.token_ids)
        assert s.token_ids == f.token_ids[:len(s.token_ids)]  # the same draws up to the stop
        torch.testing.assert_close(torch.tensor(s.logprobs), torch.tensor(f.logprobs[:len(s.token_ids)]),
                                   atol=1e-6, rtol=0)


def test_unknown_decoder_names_the_key(tiny_model, tiny_tokenizer):
    with pytest.raises(ValueError, match="rollout.hf_decoder='fast'"):
        HFEngine(tiny_model, tiny_tokenizer, decoder="fast")


@pytest.mark.parametrize("decoder", ["loop", "generate"])
def test_the_config_key_reaches_the_engine(decoder, tiny_model, tiny_tokenizer):
    from arlopti.config import RolloutConfig
    from arlopti.rollout.factory import build_engine

    engine = build_engine(RolloutConfig(hf_decoder=decoder), tiny_model, tiny_tokenizer)
    assert isinstance(engine, HFEngine) and engine.decoder == decoder

