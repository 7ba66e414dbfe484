"""``study kk-mechanism``, ``kk-run`` and ``kk-report`` end to end on the tiny model at minimal size; the
report's tables against the runs' own logs.

The pilot's ``train.py`` and ``eval.py`` commands (:func:`arlopti.study.kk.train_command`,
``eval_command``) run as written plus the tiny-size overrides (``train_extra`` / ``eval_extra``), in this
process (:func:`_run_here`, as ``python <script> ...`` would) to save two interpreter starts per run.
The tiny random model fails the K&K format everywhere (every reward -3, every advantage 0), so the
K&K score is replaced here by a rule that varies with the response and the puzzle (:func:`varied_score`):
the runs then get advantages, and the accuracies checked below lie between 0 and 1. Every number
checked is recomputed from the runs' own files (``csv/metrics.csv``, ``eval_results.json``'s items, the
mechanism's ``batch<b>.json``) with code of this file.
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import logging
import statistics
import zlib
from pathlib import Path

import pytest
import torch

from arlopti.study.__main__ import main
from arlopti.tasks.base import RewardResult

REPO = Path(__file__).resolve().parents[2]
METHODS, SEEDS, STEPS, VAL_PER_N = ("grpo", "ar_lopti"), (0, 1), 1, 3
#: the mechanism's methods here: one of each kind (the default, every method, is study_methods.default_methods)
MECHANISM = ("grpo", "ar_lopti", "otb")
TRAIN = ("model=tiny", f"rollout_steps={STEPS}", "sizes.prompts_per_step=1", "callbacks.cold_start.steps=1",
         "callbacks.cold_start.puzzles=2", "callbacks.cold_start.batch_size=2", "rollout.max_new_tokens=4",
         "data.max_prompt_length=4096", "data.train_count_per_n=2", "~callbacks.rich_progress_bar")
EVAL = ("model=tiny", "rollout.max_new_tokens=4", "data.max_prompt_length=4096")


def varied_score(self, responses, ground_truths, metas):
    """A K&K stand-in for the tiny model: correct (reward 3) when the CRC-32 of the response and the
    puzzle's solution is even, else -3. The tiny model's greedy answer hardly depends on the prompt;
    the solution makes the score vary from puzzle to puzzle."""
    right = [zlib.crc32(f"{r}|{g}".encode()) % 2 == 0 for r, g in zip(responses, ground_truths)]
    return [RewardResult(3.0 if ok else -3.0, ok, {"format_ok": 1.0}) for ok in right]


@contextlib.contextmanager
def _logging_given_back():
    """The root logger's handlers and level, and torch's thread count, as they were (each Hydra job the
    study runs in this process configures logging for its run folder)."""
    root, threads = logging.getLogger(), torch.get_num_threads()
    handlers, level = root.handlers[:], root.level
    try:
        yield
    finally:
        for h in root.handlers:
            if h not in handlers:
                h.close()
        root.handlers[:] = handlers
        root.setLevel(level)
        torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    import arlopti.study.kk as kk
    from arlopti.tasks.kk import KKTask

    out = tmp_path_factory.mktemp("kk")
    torch.set_num_threads(1)  # tiny tensors: a second thread only adds synchronisation (given back below)
    with _logging_given_back(), pytest.MonkeyPatch.context() as mp:
        mp.setattr(KKTask, "score", varied_score)
        mp.chdir(tmp_path_factory.mktemp("elsewhere"))  # the study needs no particular working folder
        main(["kk-mechanism", "--out", str(out), "--model", "tiny", "--methods", ",".join(MECHANISM),
              "--batches", "2", "--prompts", "2", "--group-size", "2", "--max-new-tokens", "6"])
        for m in METHODS:
            for s in SEEDS:
                kk.kk_pilot_run(m, s, out, VAL_PER_N, train_extra=TRAIN, eval_extra=EVAL)
        main(["kk-report", "--out", str(out)])
    return out, json.loads((out / "kk_study.json").read_text())


def _csv_rewards(run: Path) -> list[float]:
    with open(run / "csv" / "metrics.csv", newline="") as f:
        by_step = {int(r["step"]): float(r["reward/mean"]) for r in csv.DictReader(f) if r.get("reward/mean")}
    assert len(by_step) == STEPS
    return [by_step[k] for k in sorted(by_step)]


def _items(run: Path) -> dict[tuple[str, str], bool]:
    """``{(set, uid): correct}`` of a run's greedy evaluation."""
    items = json.loads((run / "eval_results.json").read_text())["items"]
    return {(it["set"], it["uid"]): bool(it["correct"]) for it in items if it["mode"] == "greedy"}


def _accuracy(items: dict) -> float:
    sets = sorted({s for s, _ in items})
    return statistics.fmean(statistics.fmean(c for (s, _), c in items.items() if s == name) for name in sets)


def test_the_pilot_runs_train_what_they_say(study):
    from omegaconf import OmegaConf

    out, _ = study
    for m in METHODS:
        for s in SEEDS:
            run = out / "pilot" / m / f"seed{s}"
            cfg = OmegaConf.load(run / ".hydra" / "config.yaml")
            assert (cfg.seed, cfg.rollout.seed, cfg.sizes.mini_batch_size) == (s, s, 4)
            assert (cfg.algorithm.ar_alpha > 0, cfg.algorithm.lopti.enabled) == ((m == "ar_lopti",) * 2)
            assert not (run / "checkpoints" / "last.ckpt").exists()  # deleted after its evaluation
            assert len(_items(run)) == 2 * VAL_PER_N  # 2 and 3 people
    # the same puzzles for every run: the pairs of eval.compare
    keys = {frozenset(_items(out / "pilot" / m / f"seed{s}")) for m in METHODS for s in SEEDS}
    assert len(keys) == 1


def test_the_pilot_table_agrees_with_the_runs_own_logs(study):
    out, data = study
    pilot = data["pilot"]
    assert list(pilot) == list(METHODS)
    runs = {(m, s): out / "pilot" / m / f"seed{s}" for m in METHODS for s in SEEDS}
    assert any(0 < _accuracy(_items(run)) < 1 for run in runs.values())  # the checks below are not vacuous
    for (m, s), run in runs.items():
        assert pilot[m]["accuracy"][str(s)] == pytest.approx(_accuracy(_items(run)), abs=1e-9)
        assert pilot[m]["train_reward"][str(s)] == pytest.approx(_csv_rewards(run), abs=1e-6)
    vs = pilot["ar_lopti"]["vs_grpo"]
    diffs = []
    a_only = b_only = 0
    for s in SEEDS:
        base, mine = _items(runs["grpo", s]), _items(runs["ar_lopti", s])
        diffs.append(_accuracy(mine) - _accuracy(base))
        assert vs["per_seed"][str(s)]["diff"] == pytest.approx(diffs[-1], abs=1e-9)
        a_only += sum(base[k] and not mine[k] for k in base)
        b_only += sum(mine[k] and not base[k] for k in base)
    pooled = vs["pooled"]  # pairs (seed, puzzle); sets s<seed>/<set>, each the same size: the mean of the seeds
    assert pooled["diff"] == pytest.approx(statistics.fmean(diffs), abs=1e-9)
    assert (pooled["mcnemar"]["a_only"], pooled["mcnemar"]["b_only"]) == (a_only, b_only)
    assert pooled["ci95"][0] <= pooled["diff"] <= pooled["ci95"][1] and pooled["items"] == 2 * VAL_PER_N * len(SEEDS)
    md = (out / "kk_tables.md").read_text()
    row = next(line for line in md.splitlines() if line.startswith("| ar_lopti |") and "s0:" in line)
    assert f"{pooled['diff']:+.3f} [{pooled['ci95'][0]:+.3f}, {pooled['ci95'][1]:+.3f}]" in row
    assert f"s1: {_accuracy(_items(runs['ar_lopti', 1])):.3f}" in row


def test_the_mechanism_tables_agree_with_its_batch_files(study):
    from arlopti.plugins.buckets import BUCKET_NAMES
    from arlopti.study.methods import default_methods

    out, data = study
    mech = data["mechanism"]
    batches = [json.loads((out / "mechanism" / f"batch{b}.json").read_text()) for b in range(2)]
    assert mech["batches"] == 2 and list(mech["methods"]) == list(MECHANISM)
    assert set(MECHANISM) < set(default_methods())  # what kk-mechanism measures without --methods
    for x in batches:
        assert sum(x["tokens_per_bucket"].values()) == x["batch"]["tokens"]
    top = BUCKET_NAMES[-1]
    for m, e in mech["methods"].items():
        for key in ("delta_p_pos_mean", "delta_p_neg_mean", "pos_frac", "bucket_grad_norm", "norm_share"):
            for b in BUCKET_NAMES:
                vals = [x["methods"][m][key][b] for x in batches]
                assert e[key][b]["per_batch"] == vals
                known = [v for v in vals if v is not None]
                assert e[key][b]["mean"] == (pytest.approx(statistics.fmean(known)) if known else None)
        for x in batches:
            shares = [v for v in x["methods"][m]["norm_share"].values() if v is not None]
            assert not shares or sum(shares) == pytest.approx(1.0, abs=1e-5)
    md = (out / "kk_tables.md").read_text()
    def shown(x, fmt):
        return "–" if x is None else fmt.format(x)

    grpo_rows = [line for line in md.splitlines() if line.startswith("| grpo |")]
    rose = [b["methods"]["grpo"]["pos_frac"][top] for b in batches]
    assert ", ".join(shown(x, "{:.2f}") for x in rose) in grpo_rows[0]  # the mechanism table, then Δp's
    dp = [mech["methods"]["grpo"]["delta_p_pos_mean"][b]["mean"] for b in BUCKET_NAMES]
    assert " / ".join(shown(x, "{:+.2e}") for x in dp) in grpo_rows[1]
    assert "Δp by probability bucket" in md and (out / "kk_study.png").stat().st_size > 5000


@pytest.mark.process
def test_the_study_script_runs_every_piece_then_the_report():
    """benchmarks/run_kk_study.sh (the lead's one job): valid bash, the issue's four pilot methods (experiment
    files the study knows), mechanism, runs, then the report, into a folder the caller names or else the run
    tree's (no machine's folder: issue 44)."""
    import re
    import subprocess

    from arlopti.study.methods import parse_methods

    script = REPO / "benchmarks" / "run_kk_study.sh"
    assert subprocess.run(["bash", "-n", str(script)], capture_output=True).returncode == 0
    text = script.read_text()
    methods = re.search(r"KK_METHODS:-([^}]*)}", text).group(1).split()
    assert methods == ["grpo", "ar_lopti", "sapo", "ce_gppo"] and parse_methods(",".join(methods)) == methods
    where = [text.index(f"study {part}") for part in ("kk-mechanism", "kk-run", "kk-report")]
    assert where == sorted(where)
    assert re.search(r"^OUT=\$\{1:-logs/study/kk\}$", text, re.M) and "/work/" not in text
