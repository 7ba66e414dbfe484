"""What the learner logs (arlopti/learner/step_logging.py): the HPARAMS columns, what tells runs apart first, and
the sample completions of a multi-turn step in TensorBoard."""

from __future__ import annotations

import pytest

import re
from dataclasses import asdict

from arlopti.config import AlgorithmConfig, LoptiConfig, RunConfig
from arlopti.learner.step_logging import hparams_first


def test_runs_are_told_apart_by_the_first_columns():
    grpo = asdict(RunConfig())
    lopti = asdict(RunConfig(algorithm=AlgorithmConfig(ar_alpha=0.3, lopti=LoptiConfig(enabled=True, eta=0.4))))
    ident = {"seed": 7, "task_name": "kk_lopti"}
    first = list(hparams_first(lopti, ident).items())[:8]
    assert first == [("algorithm", "ar_lopti"), ("estimator", "grpo"), ("loss", "ppo_clip / token-mean"),
                     ("token_method", "none"), ("alpha", 0.3), ("eta", 0.4), ("seed", 7), ("task_name", "kk_lopti")]
    g = hparams_first(grpo)
    assert (g["algorithm"], g["alpha"], g["eta"]) == ("grpo", 0.0, 0.0) and "seed" not in g
    assert g["algorithm/lopti/enabled"] is False  # the full run config follows, flattened


@pytest.mark.process


def test_tensorboards_sample_completions_mark_the_environments_parts(tmp_path, tiny_tokenizer):
    """A multi-turn step's samples in TensorBoard: the whole episode, each environment reply between [[env]] and
    [[/env]] (the turn loop's transcript), the model's turns outside them."""
    from lightning.pytorch.loggers import TensorBoardLogger
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from arlopti.config import RolloutConfig
    from arlopti.config.schema import EnvConfig
    from arlopti.learner.experience import build_experience
    from arlopti.learner.step_logging import sample_records, write_samples
    from arlopti.prompts.batch import collate_prompts
    from arlopti.prompts.records import PromptRecord, tokenize_records
    from arlopti.rollout.engine import SamplingConfig
    from arlopti.rollout.source import collect_groups
    from arlopti.rollout.turns import build_turn_loop
    from arlopti.tasks.base import RewardResult
    from arlopti.tasks.env.loading import register_env
    from helpers.turns import CountEnv, ScriptedEngine, counting

    tok = tiny_tokenizer
    loop = build_turn_loop(RolloutConfig(max_turns=3, max_new_tokens=16), EnvConfig(env=register_env(CountEnv)), tok)
    batch = collate_prompts(tokenize_records([PromptRecord(uid="p/0", ground_truth=None, task="toy",
                                                           messages=[{"role": "user", "content": "Count"}])],
                                             tok, 512, "test")[0])
    sampling = SamplingConfig(temperature=1.0, max_new_tokens=16, seed=5)
    groups = collect_groups(ScriptedEngine(tok, counting).generate, batch.prompt_ids, 1, sampling, turns=loop,
                            batch=batch)
    exp = build_experience(batch.prompt_ids, groups, [RewardResult(1.0, True)], pad_id=tok.pad_token_id)
    logger = TensorBoardLogger(str(tmp_path), name="tb")
    write_samples([logger], sample_records(exp, step=3, n_samples=1), step=3)
    logger.experiment.flush()
    acc = EventAccumulator(logger.log_dir, size_guidance={"tensors": 0})
    acc.Reload()
    (event,) = acc.Tensors("samples/0/text_summary")
    text = event.tensor_proto.string_val[0].decode()
    assert event.step == 3 and "**reward 1.00**" in text
    # the model's turns t0?, t1?, done; the replies (a user message "ok 1", then "ok 2", as the template encodes
    # them, the next turn's header included) marked as the environment's
    env = r"\[\[env]]\n    <\|im_start\|>user\n    ok {}<\|im_end\|>\n    <\|im_start\|>assistant\n    \[\[/env]]"
    assert re.search(rf"\n    t0[abc]{env.format(1)}t1[abc]{env.format(2)}done$", text), text
