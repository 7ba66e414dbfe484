"""K&K with feedback (arlopti/tasks/env/kk_feedback.py): the violated statements of the official puzzles, the
replies, and whole episodes through the turn loop on the official prompts, the final turn scored by the
official K&K scorer."""

from __future__ import annotations

import gzip
import itertools
import json

import pytest
from conftest import need_fixture
from helpers.turns import ScriptedEngine, turn_number

from arlopti.config import RolloutConfig
from arlopti.config.schema import EnvConfig
from arlopti.prompts.batch import collate_prompts
from arlopti.prompts.records import PromptRecord, tokenize_records
from arlopti.rollout.engine import SamplingConfig
from arlopti.rollout.source import collect_groups
from arlopti.rollout.turns import build_turn_loop
from arlopti.tasks.env.kk_feedback import FORMAT_HELP, KKFeedbackEnv, puzzle_of, violations
from arlopti.tasks.kk import KKTask

# Amelia: "Evelyn is not a knight"; Penelope: "Penelope is a knight or Evelyn is a knave";
# Evelyn: "Penelope is a knight if and only if Penelope is a knave". Solution: knight, knight, knave.
ROW = {"quiz": "You meet 3 inhabitants: Amelia, Penelope, and Evelyn. (the statements)", "names": ["Amelia", "Penelope",
                                                                                                  "Evelyn"],
       "solution": [True, True, False], "solution_text_format": "(1) Amelia is a knight\n(2) Penelope is a knight\n"
                                                                "(3) Evelyn is a knave",
       "statements": "(('not', ('telling-truth', 2)), ('or', ('telling-truth', 1), ('lying', 2)), "
                     "('<=>', ('telling-truth', 1), ('lying', 1)))", "uid": "kk/t/0", "prompt": "..."}


def answer(*roles: str) -> str:
    lines = "\n".join(f"({i + 1}) {n} is a {r}" for i, (n, r) in enumerate(zip(ROW["names"], roles)))
    return f"I reason. </think> <answer> {lines} </answer>"


def test_violations_are_the_statements_that_do_not_fit_their_speaker():
    puzzle = puzzle_of(ROW)
    assert violations(puzzle, dict(zip(puzzle.names, ["knight", "knight", "knave"]))) == []
    # Evelyn a knight: her statement (always false) breaks, and so does Amelia's ("Evelyn is not a knight").
    assert violations(puzzle, dict(zip(puzzle.names, ["knight", "knight", "knight"]))) == [0, 2]
    assert violations(puzzle, dict(zip(puzzle.names, ["knave", "knight", "knave"]))) == [0]


def _official_rows():
    rows = []
    for n in (3, 4, 5, 6, 7):
        with open(need_fixture(f"kk/kk_test_{n}ppl.jsonl")) as fh:
            rows += [json.loads(line) for line in fh]
    return rows


def test_on_every_official_test_puzzle_only_the_solution_violates_nothing():
    rows = _official_rows()
    assert len(rows) == 500
    for row in rows:
        puzzle = puzzle_of(row)
        for roles in itertools.product(("knight", "knave"), repeat=puzzle.num_people):
            clean = not violations(puzzle, dict(zip(puzzle.names, roles)))
            assert clean == (tuple(r == "knight" for r in roles) == puzzle.solution)


def test_the_replies():
    env = KKFeedbackEnv()
    assert env.reset(ROW) is None and env.turn_prefix == "<think>"
    assert env.step(answer("knight", "knight", "knave")) == (None, True, None)
    reply, done, reward = env.step(answer("knight", "knight", "knight"))
    assert not done and reward is None
    assert reply.splitlines()[:3] == [
        "Your answer does not fit these statements:",
        ("- Amelia says that Evelyn is not a knight. With your answer this is false, but Amelia is a knight in your "
         "answer, and a knight cannot say something false."),
        ("- Evelyn says that Penelope is a knight if and only if Penelope is a knave. With your answer this is false, "
         "but Evelyn is a knight in your answer, and a knight cannot say something false.")]
    assert reply.endswith(FORMAT_HELP) and env.violated == [2]
    bad_format, done, _ = env.step("<think> twice </think> <answer> (1) Amelia is a knight </answer>")
    assert not done and bad_format.startswith("Your reply is not in the required format")
    unread, done, _ = env.step("</think> <answer> Amelia is a knight, Penelope is a knight </answer>")
    assert not done and unread.startswith("I could not read your answer: it must name each of the 3 people")


def test_a_row_without_the_puzzle_is_refused_with_the_fix():
    with pytest.raises(ValueError, match=r"no \['quiz', 'names', 'solution', 'statements'\].*data=prompts"):
        KKFeedbackEnv().reset({"n_people": 3, "split": "train", "index": 1, "ground_truth": "(1) A is a knight",
                               "solution_text_format": "(1) A is a knight"})
    # Amelia now says "Amelia is a knight": she may be either, so the stored solution is not the only one
    broken = {**ROW, "statements": ROW["statements"].replace("('not', ('telling-truth', 2))", "('telling-truth', 0)")}
    with pytest.raises(ValueError, match="consistent assignment"):
        KKFeedbackEnv().reset(broken)


@pytest.mark.process


def test_episodes_on_official_prompts_end_on_the_corrected_answer(tiny_tokenizer):
    """Turn 0 gives a wrong answer, the environment names a violated statement, turn 1 gives the solution
    (or, for half the samples, the same wrong answer): the official scorer gives 3 or -0.5 to the final turn."""
    tok = tiny_tokenizer
    with gzip.open(need_fixture("kk/kk_train_34567ppl.jsonl.gz"), "rt") as fh:
        rows = [json.loads(next(fh)) for _ in range(2)]
    recs = [PromptRecord(uid=f"kk/t/{i}", ground_truth=r["solution_text_format"], task="kk", text=r["prompt"],
                         meta={k: r[k] for k in ("quiz", "names", "solution", "solution_text_format", "statements")})
            for i, r in enumerate(rows)]
    batch = collate_prompts(tokenize_records(recs, tok, 100_000, "test")[0])
    by_quiz = {r["quiz"]: r for r in rows}

    def say(tok, ctx, seed):
        text = tok.decode(ctx, skip_special_tokens=False)
        row = next(r for q, r in by_quiz.items() if q in text)
        solution = [s if turn_number(tok, ctx) > 0 and seed % 2 else not s for s in row["solution"]]
        lines = "\n".join(f"({i + 1}) {n} is a {'knight' if k else 'knave'}"
                          for i, (n, k) in enumerate(zip(row["names"], solution)))
        return f"Thinking. </think> <answer> {lines} </answer>", False

    loop = build_turn_loop(RolloutConfig(max_turns=2, max_new_tokens=2048, max_reply_tokens=2048),
                           EnvConfig(env="arlopti.tasks.env.kk_feedback:KKFeedbackEnv"), tok)
    groups = collect_groups(ScriptedEngine(tok, say).generate, batch.prompt_ids, 4, SamplingConfig(seed=5),
                            turns=loop, batch=batch)
    task = KKTask()
    totals = set()
    for row, group in zip(rows, groups):
        scores = task.score([e.text for e in group], [row["solution_text_format"]] * len(group), [{}] * len(group))
        for e, s in zip(group, scores):
            assert e.meta["turns"] == 2 and e.meta["env_steps"] == 2 and e.meta["tool_calls"] == 0  # read by step
            assert e.meta["turn_limit"] == int(s.reward != 3.0)  # a wrong final turn was due a reply
            env_part = e.meta["transcript"].split("[[env]]")[1].split("[[/env]]")[0]
            assert "Your answer does not fit these statements:" in env_part and env_part.endswith("<think>")
            totals.add(s.reward)
    assert totals == {3.0, -0.5}


def test_the_experiment_hands_the_official_records_to_the_environment(tmp_path, tiny_tokenizer):
    import hydra

    from arlopti.rollout.turns import episode_prompts
    from helpers.compose import compose_train

    need_fixture("kk/kk_train_34567ppl.jsonl.gz")
    cfg = compose_train(["experiment=kk_feedback_ar_lopti", "data.limit=20"], tmp_path)
    assert cfg.task.env == "arlopti.tasks.env.kk_feedback:KKFeedbackEnv" and cfg.data.task == "kk"
    assert (cfg.rollout.max_turns, cfg.algorithm.ar_alpha, cfg.algorithm.lopti.enabled) == (3, 0.3, True)
    records = hydra.utils.instantiate(cfg.data, tokenizer=tiny_tokenizer).train_records()
    assert len(records) == 20 and all(r.text.endswith("<|im_start|>assistant\n<think>") for r in records)
    rows = [p.row for p in episode_prompts(collate_prompts(tokenize_records(records, tiny_tokenizer, 10_000,
                                                                            "test")[0]))]
    for row in rows:  # the row the environment is reset on holds the whole puzzle
        env = KKFeedbackEnv()
        assert env.reset(row) is None and env.puzzle.solution_text_format == row["ground_truth"]
