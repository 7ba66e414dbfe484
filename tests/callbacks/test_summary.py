"""TrainingSummary: start/end windows and the validation columns (no training needed)."""

from types import SimpleNamespace

import pytest

from arlopti.callbacks.summary import TrainingSummary


def _module(evals):
    return SimpleNamespace(rollout_step=4, _trainer=None, eval_results=evals)


def _history(cb, rewards):
    cb.history = [{"reward/mean": r, "reward/format_ok": r / 10} for r in rewards]


def test_windows_average_the_first_and_last_steps():
    cb = TrainingSummary(window=2)
    _history(cb, [-3.0, -1.0, 0.0, 2.0])
    s = cb.summary(_module([]))
    assert s["start"]["reward/mean"] == -2.0 and s["end"]["reward/mean"] == 1.0
    assert s["rollout_steps"] == 4 and s["eval_first"] == {} and s["eval_last"] == {}


def test_a_single_evaluation_is_not_reported_as_the_start():
    cb = TrainingSummary()
    _history(cb, [0.0])
    only = {"rollout_step": 4, "val/kk/mean/greedy/acc": 0.5}
    s = cb.summary(_module([only]))
    assert s["eval_first"] == {} and s["eval_last"] == only
    before = {"rollout_step": 0, "val/kk/mean/greedy/acc": 0.1}
    s = cb.summary(_module([before, only]))
    assert s["eval_first"] == before and s["eval_last"] == only


def test_hints_only_for_the_loggers_in_use():
    from arlopti.callbacks.summary import logger_hints

    def fake(class_name, **attrs):
        return type(class_name, (), attrs)()

    run = SimpleNamespace(dir="/runs/r1/wandb/offline-run-x/files", url=None)
    hints = logger_hints([fake("CSVLogger", log_dir="/runs/r1/csv"),
                          fake("WandbLogger", _offline=True, _experiment=run),
                          fake("MLFlowLogger", _tracking_uri="file:/runs/r1/mlruns")])
    assert hints == ["CSV: /runs/r1/csv/metrics.csv",
                     "wandb (offline): /runs/r1/wandb/offline-run-x\n  upload: wandb sync /runs/r1/wandb/offline-run-x",
                     "MLflow: mlflow ui --backend-store-uri file:/runs/r1/mlruns"]
    assert logger_hints([fake("TensorBoardLogger", log_dir="/runs/r1/tensorboard")]) == [
        "TensorBoard: tensorboard --logdir /runs/r1/tensorboard  (its Custom Scalars tab, #custom_scalars, puts "
        "reward, accuracy and validation first)"]
    assert logger_hints([]) == []


def test_reward_err_row_only_when_calls_failed(capsys, tmp_path):
    module = SimpleNamespace(rollout_step=2, _trainer=None, eval_results=[])
    trainer = SimpleNamespace(loggers=[], default_root_dir=str(tmp_path))
    for errors, shown in ((0.0, False), (0.5, True)):
        cb = TrainingSummary(out_file=str(tmp_path / "summary.json"))
        cb.history = [{"reward/mean": 0.0, "reward/error": errors, "reward/timeout": 0.0}] * 2
        cb.on_fit_end(trainer, module)
        assert ("reward_err" in capsys.readouterr().out) is shown


def test_validation_rows_are_the_correctness_metrics_only(capsys, tmp_path):
    evals = [{"rollout_step": s, "val/kk/mean/greedy/acc": a, "val/math/aime/t1/avg@16": a, "val/math/aime/t1/pass@16": a,
              "val/kk/mean/greedy/reward": a, "val/kk/mean/greedy/format_rate": a, "val/kk/mean/sets": 2.0,
              "val/math/accuracy_notes/t1/reward": a} for s, a in ((0, 0.1), (4, 0.5))]
    module = SimpleNamespace(rollout_step=4, _trainer=None, eval_results=evals)
    TrainingSummary(out_file=str(tmp_path / "summary.json")).on_fit_end(
        SimpleNamespace(loggers=[], default_root_dir=str(tmp_path)), module)
    out = capsys.readouterr().out
    for shown in ("greedy/acc", "avg@16", "pass@16"):
        assert shown in out
    for hidden in ("greedy/reward", "format_rate", "mean/sets", "accuracy_notes"):
        assert hidden not in out


def test_steps_without_a_learning_signal_are_counted_and_said(capsys, tmp_path):
    """Issue 38: debug=smoke on the tiny model gives every K&K response -3, so every advantage is 0; the
    summary says nothing was learned (and how many steps had no signal when only some did)."""
    import json

    flat = {"reward/mean": -3.0, "reward/std": 0.0, "reward/zero_std_group_frac": 1.0}
    varied = {"reward/mean": 1.0, "reward/std": 0.8, "reward/zero_std_group_frac": 0.5}
    trainer = SimpleNamespace(loggers=[], default_root_dir=str(tmp_path))
    for steps, said in (([flat, flat], "no learning signal at any of the 2 rollout steps"),
                        ([flat, varied, varied], "no learning signal at 1 of the 3 rollout steps"),
                        ([varied], None)):
        cb = TrainingSummary(out_file=str(tmp_path / "summary.json"))
        module = SimpleNamespace(rollout_step=len(steps), _trainer=None, eval_results=[], cfg=None)
        for m in steps:
            cb.on_train_batch_end(trainer, SimpleNamespace(last_step_context=SimpleNamespace(metrics=m)), None, None, 0)
        cb.on_fit_end(trainer, module)
        out = capsys.readouterr().out
        if said is None:
            assert "learning signal" not in out
        else:
            assert said in out and "every advantage was 0" in out
        assert json.loads((tmp_path / "summary.json").read_text())["no_signal_steps"] == sum(m is flat for m in steps)


def test_the_time_per_phase_is_summed_from_the_steps_and_evaluations(capsys, tmp_path):
    """Issue 43: the summary says where the time went: start-up, cold start, evaluations, rollout, update."""
    import json

    from arlopti.callbacks.summary import phase_line, process_age_s

    cb = TrainingSummary(out_file=str(tmp_path / "summary.json"))
    cb.start_up_s = 5.0
    for rollout, scoring, sync, logprobs, update in ((2.0, 0.5, 0.25, 1.0, 3.0), (4.0, 0.5, 0.25, 1.0, 5.0)):
        ctx = SimpleNamespace(metrics={"reward/mean": 0.0, "timing/rollout_s": rollout, "timing/scoring_s": scoring,
                                       "timing/sync_s": sync, "timing/logprobs_s": logprobs, "timing/update_s": update})
        cb.on_train_batch_end(None, SimpleNamespace(last_step_context=ctx, cfg=None), None, None, 0)
    evals = [{"rollout_step": 0, "timing/eval_s": 7.0}, {"rollout_step": 2, "timing/eval_s": 8.0}]
    module = SimpleNamespace(rollout_step=2, _trainer=None, eval_results=evals, cold_start_seconds=11.0)
    cb.on_fit_end(SimpleNamespace(loggers=[], default_root_dir=str(tmp_path)), module)
    phases = json.loads((tmp_path / "summary.json").read_text())["phase_seconds"]
    assert {k: phases[k] for k in ("start_up", "cold_start", "evaluations", "rollout", "update")} == {
        "start_up": 5.0, "cold_start": 11.0, "evaluations": 15.0, "rollout": 7.5, "update": 10.0}
    assert phases["total"] == pytest.approx(process_age_s(), abs=60) and phases["total"] > 0
    line = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("time: ")]
    assert line[0].startswith(phase_line(phases) + "; ") and "GFLOP/s" in line[0]
    assert line[0].startswith("time: start-up 5 s, cold start 11 s, evaluations 15 s, rollout 8 s, update 10 s, other ")
    saved = json.loads((tmp_path / "summary.json").read_text())["machine"]
    assert saved["gemm_fp32_gflops"] > 0 and saved["cores"] >= 1 and saved["cpu"]
