"""``arlopti study toy`` end to end on the tiny model at minimal size; its tables against the runs' own logs.

The runs are training runs (``arlopti.run``); their own log is ``csv/metrics.csv``, written by the learner
through the CSV logger; the study's tables are built from its own recorder (``steps.jsonl``). Every number
checked here is recomputed from the CSV files with code of this file, not with the study's.
"""

from __future__ import annotations

import csv
import json
import statistics

import pytest

from arlopti.study.__main__ import main

METHODS = ["grpo", "ar_lopti"]
SEEDS, STEPS, THRESHOLD, WINDOW = 2, 3, 0.4, 2


def _csv_rewards(folder) -> list[float]:
    with open(folder / "csv" / "metrics.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    by_step = {int(r["step"]): float(r["reward/mean"]) for r in rows if r.get("reward/mean")}
    assert sorted(by_step) == list(range(1, STEPS + 1)) or sorted(by_step) == list(range(STEPS))
    return [by_step[k] for k in sorted(by_step)]


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    out = tmp_path_factory.mktemp("study")
    main(["toy", "--out", str(out), "--methods", ",".join(METHODS), "--seeds", str(SEEDS), "--steps",
          str(STEPS), "--warm-start-steps", "4", "--threshold", str(THRESHOLD), "--final-window", str(WINDOW),
          "--workers", "1"])
    return out, json.loads((out / "study.json").read_text())


def test_the_folder_holds_tables_figures_and_every_run(study):
    out, data = study
    for name in ("curves", "paired", "mechanism"):
        assert (out / f"{name}.png").stat().st_size > 5000
    md = (out / "tables.md").read_text()
    assert "| ar_lopti |" in md and "sign-test p" in md
    assert data["methods"] == METHODS and data["seeds"] == list(range(SEEDS))
    for m in METHODS:
        for s in range(SEEDS):
            assert len((out / "runs" / m / f"seed{s}" / "steps.jsonl").read_text().splitlines()) == STEPS


def test_tables_agree_with_the_learners_own_csv_logs(study):
    out, data = study
    csv_rewards = {m: [_csv_rewards(out / "runs" / m / f"seed{s}") for s in range(SEEDS)] for m in METHODS}
    for m in METHODS:
        finals = [statistics.fmean(r[-WINDOW:]) for r in csv_rewards[m]]
        assert data["learning"][m]["final"]["mean"] == pytest.approx(statistics.fmean(finals), abs=1e-6)
        assert data["learning"][m]["auc"]["mean"] == pytest.approx(
            statistics.fmean(statistics.fmean(r) for r in csv_rewards[m]), abs=1e-6)
        for s in range(SEEDS):  # the curve's steps, and the steps to the threshold recomputed by hand
            r = csv_rewards[m][s]
            assert data["per_run"][m][str(s)]["rewards"] == pytest.approx(r, abs=1e-6)
            first = next((t for t in range(3, STEPS + 1) if statistics.fmean(r[t - 3:t]) >= THRESHOLD), STEPS + 1)
            assert data["per_run"][m][str(s)]["steps_to_threshold"] == first
        band = data["learning"][m]["curve"]
        assert band["mean"] == pytest.approx([statistics.fmean(c[t] for c in csv_rewards[m]) for t in range(STEPS)])
        assert all(lo <= mu <= hi for lo, mu, hi in zip(band["lo"], band["mean"], band["hi"]))
    diffs = [statistics.fmean(a[-WINDOW:]) - statistics.fmean(b[-WINDOW:])
             for a, b in zip(csv_rewards["ar_lopti"], csv_rewards["grpo"])]
    paired = data["learning"]["ar_lopti"]["vs_grpo"]["final"]
    assert paired["mean"] == pytest.approx(statistics.fmean(diffs), abs=1e-6)
    assert paired["wins"] == sum(d > 0 for d in diffs) and paired["losses"] == sum(d < 0 for d in diffs)
    assert paired["ci95"][0] <= paired["mean"] <= paired["ci95"][1]


def test_the_mechanism_sees_the_runs_first_batch_and_warm_start(study):
    out, _ = study
    for s in range(SEEDS):
        first = [_csv_rewards(out / "runs" / m / f"seed{s}")[0] for m in METHODS]
        assert first[0] == first[1]  # same seed: same weights, same first batch, whatever the method
        mech = json.loads((out / "mechanism" / f"seed{s}.json").read_text())
        assert mech["batch"]["reward_mean"] == pytest.approx(first[0], abs=1e-6)
        assert sum(mech["tokens_per_bucket"].values()) == mech["batch"]["tokens"]
        for m in METHODS:
            shares = [v for v in mech["methods"][m]["norm_share"].values() if v is not None]
            assert sum(shares) == pytest.approx(1.0, abs=1e-5)
    for m in METHODS:  # the warm start ran, the same for every method of a seed, and fitted its data
        losses = [json.loads((out / "runs" / m / f"seed{s}" / "run.json").read_text())["warm_start_losses"]
                  for s in range(SEEDS)]
        assert all(len(x) == 4 and x[-1] < x[0] for x in losses)
        assert losses == [json.loads((out / "runs" / "grpo" / f"seed{s}" / "run.json").read_text())
                          ["warm_start_losses"] for s in range(SEEDS)]


def test_finished_runs_are_recognised_and_reused(study):
    """A run with the same settings is reused; other settings rerun."""
    from dataclasses import replace

    from arlopti.study.methods import method_algorithms
    from arlopti.study.toy import run_is_done
    from arlopti.study.toy_run import ToySizes

    out, _ = study
    algos = method_algorithms(METHODS, 8)
    sizes = ToySizes(steps=STEPS, lr=3e-3, warm_start_steps=4)
    assert all(run_is_done(out / "runs" / m / f"seed{s}", s, algos[m], sizes) for m in METHODS for s in range(SEEDS))
    assert not run_is_done(out / "runs" / "grpo" / "seed0", 0, algos["grpo"], replace(sizes, lr=1e-2))
    assert not run_is_done(out / "runs" / "grpo" / "seed0", 1, algos["grpo"], sizes)


def test_the_runs_are_training_runs_of_the_methods_algorithm(study):
    """Each run went through the training seam: Hydra's run folder with the composed config, the method's
    algorithm in it (KL off), the study's two callbacks beside the rollout callback the run adds itself."""
    from omegaconf import OmegaConf

    from arlopti.study.methods import method_algorithms

    out, _ = study
    algos = method_algorithms(METHODS, 8)
    for m in METHODS:
        cfg = OmegaConf.load(out / "runs" / m / "seed1" / ".hydra" / "config.yaml")
        assert cfg.algorithm.lopti.enabled == algos[m].lopti.enabled and cfg.algorithm.ar_alpha == algos[m].ar_alpha
        assert cfg.algorithm.kl_coef == 0.0 and (cfg.seed, cfg.model.tiny.seed, cfg.rollout.seed) == (1, 1, 1)
        assert sorted(cfg.callbacks) == ["study_steps", "study_warm_start"]
        assert (out / "runs" / m / "seed1" / "train.log").is_file()


@pytest.mark.process  # the report asks git for the code's version
def test_a_second_call_trains_only_what_is_missing_and_gives_the_same_tables(study):
    """Resume: a run cut short (no run.json) is trained again, everything else is reused, and the rebuilt
    tables are the same numbers (the run is reproducible from its seed)."""
    out, first = study
    (out / "runs" / "ar_lopti" / "seed1" / "run.json").unlink()
    rows = (out / "runs" / "ar_lopti" / "seed1" / "steps.jsonl").read_text()
    main(["toy", "--out", str(out), "--methods", ",".join(METHODS), "--seeds", str(SEEDS), "--steps",
          str(STEPS), "--warm-start-steps", "4", "--threshold", str(THRESHOLD), "--final-window", str(WINDOW),
          "--workers", "1"])
    again = json.loads((out / "study.json").read_text())
    assert len(again["timings_s"]["run_s"]) == 1 and again["timings_s"]["mechanism_s"] == []
    assert (out / "runs" / "ar_lopti" / "seed1" / "steps.jsonl").read_text() == rows
    assert again["learning"] == first["learning"] and again["mechanism"] == first["mechanism"]


def test_methods_come_from_the_experiment_files():
    from arlopti.study.methods import BASE_METHODS, algorithm_overrides, default_methods, parse_methods

    methods = default_methods()
    assert tuple(methods[:4]) == BASE_METHODS and "tr_grpo" in methods
    assert not any(m.endswith("_lopti") for m in methods[4:]) and "lopti_demo" not in methods
    assert parse_methods("ar_lopti") == ["grpo", "ar_lopti"]
    with pytest.raises(ValueError, match="kk_<name>"):
        parse_methods("grpo,no_such_method")
    assert algorithm_overrides("grpo", 128) == ["algorithm=grpo"]
    assert sorted(algorithm_overrides("ar_lopti", 128)[1:]) == ["algorithm.ar_alpha=0.3",
                                                                "algorithm.lopti.enabled=true"]
    assert algorithm_overrides("archer", 128)[1:] == ["algorithm.token_method.name=archer"]
