"""Analysis inputs on the tiny model: the cold-start cache, advantage labelling, dump round trip."""

from __future__ import annotations

import pytest
import torch

import arlopti.analysis.inputs as inputs
from arlopti.analysis.inputs import (GRPO_SOURCE, SYNTHETIC_SOURCE, batch_from_dump, choose_advantages,
                                     cold_start_cache_dir, cold_start_config, load_policy, sample_kk_batch)


@pytest.fixture()
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("ARLOPTI_CACHE", str(tmp_path))
    return tmp_path


def test_cold_start_is_cached_by_settings(cache, monkeypatch):
    calls = []
    real = inputs.run_cold_start

    def counting(policy, tok, cfg, log_fn=None):
        calls.append(cfg.steps)
        return real(policy, tok, cfg, log_fn)

    monkeypatch.setattr(inputs, "run_cold_start", counting)
    small = {"batch_size": 2, "puzzles": 4, "max_response_tokens": 16}
    first = load_policy("tiny", 1, small)
    second = load_policy("tiny", 1, small)
    assert calls == [1] and first.info["cache_hit"] is False and second.info["cache_hit"] is True
    for a, b in zip(first.policy.state_dict().values(), second.policy.state_dict().values()):
        assert torch.equal(a, b)
    raw = load_policy("tiny", 0)
    assert any(not torch.equal(a, b) for a, b in zip(raw.policy.state_dict().values(),
                                                      first.policy.state_dict().values()))
    # another setting is another folder, and runs again
    load_policy("tiny", 1, {**small, "lr": 1e-4})
    assert calls == [1, 1]
    assert cold_start_cache_dir("tiny", cold_start_config(1, small)) != cold_start_cache_dir(
        "tiny", cold_start_config(1, {**small, "lr": 1e-4}))
    with pytest.raises(ValueError, match="not ColdStartConfig fields"):
        cold_start_config(1, {"nope": 1})


def test_advantages_are_real_when_rewards_vary_else_labelled_synthetic():
    groups = torch.tensor([0, 0, 1, 1])
    adv, src = choose_advantages(torch.tensor([3.0, -3.0, 1.0, 1.0]), groups)
    assert src == GRPO_SOURCE and adv[2] == 0 and adv[0] > 0 > adv[1]
    adv, src = choose_advantages(torch.tensor([-3.0] * 4), groups)
    assert src == SYNTHETIC_SOURCE and set(adv.tolist()) <= {-1.0, 1.0}
    adv, src = choose_advantages(torch.tensor([-3.0] * 4), groups, mode="grpo")
    assert src == GRPO_SOURCE and not adv.any()
    with pytest.raises(ValueError, match="--advantages"):
        choose_advantages(torch.zeros(4), groups, mode="random")


def test_live_batch_round_trips_through_a_dump(tmp_path):
    from arlopti.analysis.commands import write_live_dump
    from arlopti.analysis.updates import sampled_log_probs

    loaded = load_policy("tiny", 0)
    batch = sample_kk_batch(loaded, num_prompts=2, group_size=2, max_new_tokens=6, temperature=1.0)
    assert batch.input_ids.shape[0] == 4 and batch.response_mask.shape[1] <= 6
    old = sampled_log_probs(loaded.policy, batch)
    path = write_live_dump(batch, old, tmp_path / "d.jsonl")
    back = batch_from_dump(path, temperature=1.0, pad_id=loaded.tokenizer.pad_token_id)
    assert torch.equal(back.input_ids, batch.input_ids) and torch.equal(back.response_mask, batch.response_mask)
    assert torch.equal(back.rewards, batch.rewards) and back.prompt_len == batch.prompt_len
    assert back.response_texts == batch.response_texts
    with pytest.raises(ValueError, match="no records for step 7"):
        batch_from_dump(path, temperature=1.0, step=7)
