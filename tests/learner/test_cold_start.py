"""SFT cold start: the examples are well-formed and a few steps lower the loss."""

from __future__ import annotations

import torch

from arlopti.learner.cold_start import ColdStartConfig, run_cold_start, sft_examples, sft_loss
from arlopti.learner.policy import PolicyLM
from arlopti.tasks.kk import score_response


def test_examples_end_with_eos_and_score_three(tiny_tokenizer):
    cfg = ColdStartConfig(num_people=[2, 3], puzzles=10)
    ex = sft_examples(tiny_tokenizer, cfg)
    assert len(ex) == 10
    for prompt, resp in ex:
        assert resp[-1] == tiny_tokenizer.eos_token_id
        assert tiny_tokenizer.decode(prompt).endswith("<think>")
    # the targets are correct answers under the reward (decode without the EOS)
    from arlopti.tasks.kk import sample_puzzles, sft_response

    p = sample_puzzles(2, 1, seed=cfg.seed + 2)[0]
    assert score_response(sft_response(p, style=cfg.style), p.solution_text_format) == 3


def test_cold_start_lowers_the_loss(tiny_tokenizer, tiny_model):
    policy = PolicyLM(tiny_model)
    cfg = ColdStartConfig(steps=25, batch_size=4, lr=3e-3, puzzles=16, num_people=[2])
    ex = sft_examples(tiny_tokenizer, cfg)[:4]
    before = float(sft_loss(policy, ex, tiny_tokenizer.pad_token_id))
    losses = run_cold_start(policy, tiny_tokenizer, cfg)
    after = float(sft_loss(policy, ex, tiny_tokenizer.pad_token_id))
    assert len(losses) == 25
    assert after < 0.8 * before, (before, after)
