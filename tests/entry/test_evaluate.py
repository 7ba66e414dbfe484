"""``eval.py`` edges (issue 14, row 7): non-finite weights are refused naming the checkpoint and
the first bad tensor; ``eval.limit=0`` and a suite with nothing in it are errors (before any
model is loaded); ``ckpt_path=last`` finds the newest checkpoint of a training run as
``train.py`` does (``train_task`` / ``train_run``, or ``task_name`` / ``run_name``)."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import pytest
import torch

import arlopti  # noqa: F401  (resolvers)
from arlopti.entry.evaluate import evaluate
from conftest import FIXTURES, REPO_ROOT
from helpers.compose import compose_eval


@pytest.fixture(autouse=True)
def _no_inherited_answer(monkeypatch):
    """train.resume_from exports its answer for launched ranks; keep it out of other tests."""
    from arlopti.checkpoints.resume import RESOLVED_ENV

    monkeypatch.delenv(RESOLVED_ENV, raising=False)
    yield
    os.environ.pop(RESOLVED_ENV, None)


@pytest.fixture(scope="module")
def trained_ckpt(tiny_tokenizer, tmp_path_factory) -> Path:
    """A real single-file checkpoint of a 1-step toy run (tiny model)."""
    from arlopti.callbacks.checkpointing import RolloutCheckpoint
    from arlopti.config import AlgorithmConfig, OptimConfig, RolloutConfig, RunConfig, SizesConfig
    from arlopti.learner.module import GRPOModule
    from helpers.toy import ToyDataModule, toy_trainer

    out = tmp_path_factory.mktemp("run")
    cfg = RunConfig(algorithm=AlgorithmConfig(), optim=OptimConfig(lr=1e-2),
                    sizes=SizesConfig(prompts_per_step=2, group_size=4, mini_batch_size=8, micro_batch_size=4),
                    rollout=RolloutConfig(temperature=1.0, max_new_tokens=6))
    module = GRPOModule(cfg, tokenizer=tiny_tokenizer, total_rollout_steps=1)
    dm = ToyDataModule(n=4, tokenizer=tiny_tokenizer, prompts_per_step=2, max_prompt_length=256)
    toy_trainer(callbacks=[RolloutCheckpoint(str(out), every_n_steps=1)], enable_checkpointing=True).fit(
        module, datamodule=dm)
    return out / "last.ckpt"


@pytest.fixture()
def no_model(monkeypatch):
    """Loading a model fails the test: the checks must come first."""
    import arlopti.entry.evaluate as ev

    def refuse(*a, **k):
        raise AssertionError("the model was loaded before the suite was checked")

    monkeypatch.setattr(ev, "load_model_for_eval", refuse)


def test_non_finite_weights_are_refused(trained_ckpt, tmp_path):
    state = torch.load(trained_ckpt, map_location="cpu", weights_only=False)
    name = next(k for k in state["state_dict"] if k.startswith("policy.") and k.endswith("q_proj.weight"))
    state["state_dict"][name] = state["state_dict"][name].clone()
    state["state_dict"][name][0, 0] = float("nan")
    poisoned = tmp_path / "nan.ckpt"
    torch.save(state, poisoned)
    cfg = compose_eval(tmp_path, [f"ckpt_path={poisoned}", "eval.limit=1", "eval.benchmarks=[math500]",
                                  f"eval.data_dir={FIXTURES / 'math'}"])
    if not (FIXTURES / "math" / "math500.jsonl").exists():
        pytest.skip("the shared math fixtures are absent")
    with pytest.raises(ValueError) as err:
        evaluate(cfg)
    msg = str(err.value)
    assert f"checkpoint {poisoned} holds non-finite weights" in msg
    assert re.search(r"first bad tensor '[^']*q_proj.weight' \(1 of \d+ values NaN/inf\)", msg)
    assert not (tmp_path / "eval_results.json").exists()


def test_limit_zero_is_an_error(tmp_path, no_model):
    with pytest.raises(ValueError, match=r"eval.limit=0: evaluate at least one problem"):
        evaluate(compose_eval(tmp_path, ["eval.limit=0"]))


def test_an_empty_suite_is_an_error(tmp_path, no_model):
    (tmp_path / "kk").mkdir()
    (tmp_path / "kk" / "kk_test_3ppl.jsonl").write_text("")
    with pytest.raises(ValueError,
                       match=r"'kk_suite' has nothing to evaluate: set\(s\) \['kk_3ppl'\] hold no problems"):
        evaluate(compose_eval(tmp_path, ["eval=kk_suite", f"eval.data_dir={tmp_path / 'kk'}", "eval.people=[3]"]))
    with pytest.raises(ValueError, match="it names no sets"):
        evaluate(compose_eval(tmp_path, ["eval.benchmarks=[]"]))


def test_ckpt_path_last_finds_the_training_runs_newest_checkpoint(trained_ckpt, tmp_path):
    from arlopti.entry.evaluate import eval_ckpt_path

    logs = tmp_path / "logs"

    def put(run, time, mtime):
        d = logs / "kk_lopti" / run / time / "checkpoints"
        d.mkdir(parents=True)
        shutil.copy(trained_ckpt, d / "last.ckpt")
        os.utime(d / "last.ckpt", (mtime, mtime))
        return str(d / "last.ckpt")

    old = put("e0.5_s42", "2026-01-01_00-00-00", 1_000_000)
    new = put("e0.5_s42", "2026-01-02_00-00-00", 2_000_000)
    assert eval_ckpt_path(compose_eval(tmp_path, ["ckpt_path=last", "train_task=kk_lopti"])) == new != old
    assert eval_ckpt_path(compose_eval(tmp_path, ["ckpt_path=last", "train_task=kk_lopti",
                                                  "train_run=e0.5_s42"])) == new
    # the training run's own names work too
    assert eval_ckpt_path(compose_eval(tmp_path, ["ckpt_path=last", "task_name=kk_lopti",
                                                  "run_name=e0.5_s42"])) == new
    assert eval_ckpt_path(compose_eval(tmp_path, ["ckpt_path=last", "task_name=kk_lopti"])) == new
    other = put("a0.3_e0.5_s42", "2026-01-03_00-00-00", 3_000_000)
    with pytest.raises(ValueError, match=r"holds the runs a0.3_e0.5_s42, e0.5_s42; pass train_run"):
        eval_ckpt_path(compose_eval(tmp_path, ["ckpt_path=last", "train_task=kk_lopti"]))
    assert eval_ckpt_path(compose_eval(tmp_path, ["ckpt_path=last", "train_task=kk_lopti",
                                                  "train_run=a0.3_e0.5_s42"])) == other
    with pytest.raises(ValueError, match="ckpt_path=last needs the training run: pass train_task="):
        eval_ckpt_path(compose_eval(tmp_path, ["ckpt_path=last"]))
    with pytest.raises(FileNotFoundError, match="no last.ckpt"):
        eval_ckpt_path(compose_eval(tmp_path, ["ckpt_path=last", "train_task=kk_lopti", "train_run=nope"]))
    assert eval_ckpt_path(compose_eval(tmp_path, [f"ckpt_path={old}"])) == old
    assert eval_ckpt_path(compose_eval(tmp_path, [])) is None


def test_ckpt_path_last_end_to_end(trained_ckpt, tmp_path):
    if not (FIXTURES / "math" / "math500.jsonl").exists():
        pytest.skip("the shared math fixtures are absent")
    d = tmp_path / "logs" / "dsr_lopti" / "e0.5_s42" / "2026-01-01_00-00-00" / "checkpoints"
    d.mkdir(parents=True)
    shutil.copy(trained_ckpt, d / "last.ckpt")
    cfg = compose_eval(tmp_path, ["ckpt_path=last", "train_task=dsr_lopti", "eval.limit=1",
                                  "eval.benchmarks=[math500]", "eval.samples_per_problem=2",
                                  "rollout.max_new_tokens=4",
                                  f"eval.data_dir={FIXTURES / 'math'}"])
    report = evaluate(cfg)
    assert report["model"] == str(d / "last.ckpt")
    assert report["mean_over"] == {"math": ["math500"]}
    assert report["metrics"]["val/math/mean/sets"] == 1.0


def test_eval_val_scores_the_data_configs_validation_set_with_any_registered_task(tmp_path, no_model):
    """``eval=val`` (issue 17): the data config's validation sets, scored by the task the records name;
    without a data config, or with a suite task other than kk / math, the error says what to pass."""
    with pytest.raises(ValueError, match="eval=val evaluates the validation sets of a data config"):
        evaluate(compose_eval(tmp_path, ["eval=val"]))
    with pytest.raises(ValueError, match="eval.task='custom': .* eval=val data="):
        evaluate(compose_eval(tmp_path, ["eval.task=custom"]))
    rows = tmp_path / "p.jsonl"
    rows.write_text('{"prompt": "1 + 1?", "answer": "2"}\n{"prompt": "2 + 2?", "answer": "4"}\n')
    data = ["eval=val", "data=prompts", f"data.train_file={rows}", f"data.val_file={rows}"]
    from arlopti.config import ConfigError

    with pytest.raises(ConfigError, match="task.reward_fn is not set"):  # task=custom not given: before any model
        evaluate(compose_eval(tmp_path, data))


def test_eval_val_end_to_end_with_the_math_reward(tmp_path, tiny_tokenizer):
    rows = tmp_path / "p.jsonl"
    rows.write_text('{"prompt": "1 + 1?", "answer": "2"}\n{"prompt": "2 + 2?", "answer": "4"}\n'
                    '{"prompt": "3 + 3?", "answer": "6"}\n')
    report = evaluate(compose_eval(tmp_path, ["eval=val", "data=prompts", f"data.train_file={rows}",
                                              "data.val_fraction=0.5", "data.task=math", "eval.limit=1",
                                              "rollout.max_new_tokens=4"]))
    assert report["mean_over"] == {"math": ["val"]}
    assert [(s["name"], s["mode"], s["problems"], s["n"]) for s in report["sets"]] == [("val", "greedy", 1, 1)]
    assert report["metrics"]["val/math/val/greedy/acc"] == 0.0  # a random model boxes no answer
