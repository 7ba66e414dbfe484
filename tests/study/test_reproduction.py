"""The toy study re-made in CI: a slice of the recorded run, which must give the recorded numbers exactly.

The slice is seeds 0 and 1 of GRPO, Lopti and the step-matched control (``grpo_two_steps``) at the recorded
sizes (30 rollout steps, the 100-step warm start, AdamW lr 3e-3; ``docs/figures/study/toy_control/summary.json``'s
``sizes``), trained as ``arlopti study toy`` trains them (:func:`arlopti.study.toy.run_jobs`: in this process, one
torch thread, as each of the study's workers). Each run's reward per step must equal the recorded one
(``per_run.json``: the curves of ``curves.png`` and the rows of ``tables.md``), and each seed's first-step
mechanism (``mechanism/seed<s>.json``: ``mechanism.png``, the mechanism tables) must equal the recorded file's
numbers for those methods, every float bit for bit and every count. A change that moves the science fails here,
naming the figure; re-record with the command in ``summary.json`` (then copy the folder, docs/results.md §1).

Exact equality is only expected on one kind of CPU: torch picks its float kernels by instruction set (AVX2,
AVX-512, ...), and different kernels may round differently, which a sampled token can amplify into another
trajectory. The record names the CPU capability it was made with; on another the comparison is skipped with
both named, not passed.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
RECORD = REPO / "docs" / "figures" / "study" / "toy_control"
METHODS, SEEDS = ("grpo", "lopti", "grpo_two_steps"), (0, 1)


def _recorded() -> dict:
    return json.loads((RECORD / "summary.json").read_text())


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    import torch

    from arlopti.study.methods import method_algorithms
    from arlopti.study.toy import run_jobs
    from arlopti.study.toy_run import ToySizes

    capability = torch.backends.cpu.get_cpu_capability()
    recorded = _recorded()["cpu_capability"]
    if capability != recorded:
        pytest.skip(f"the record was made on a {recorded} CPU, this one runs {capability} kernels: "
                    "bit-exact equality holds only on the same kind")
    out = tmp_path_factory.mktemp("slice")
    sizes = ToySizes(**_recorded()["sizes"])
    algos = method_algorithms(list(METHODS), sizes.max_new_tokens)
    warm = str(out / "warm_start")
    runs = [("run", m, s, sizes, str(out / "runs" / m / f"seed{s}"), warm) for s in SEEDS for m in METHODS]
    mechs = [("mechanism", s, algos, sizes, str(out / "mechanism" / f"seed{s}.json"),
              str(out / "runs" / "grpo" / f"seed{s}"), warm) for s in SEEDS]
    run_jobs(runs, workers=1, threads=1)
    run_jobs(mechs, workers=1, threads=1)
    return out


def test_the_slice_is_the_recorded_study_s_setting():
    recorded = _recorded()
    assert set(METHODS) <= set(recorded["methods"]) and set(SEEDS) <= set(recorded["seeds"])
    assert recorded["sizes"]["steps"] == 30 and recorded["sizes"]["warm_start_steps"] == 100


@pytest.mark.parametrize("method", METHODS)
def test_each_run_s_rewards_equal_the_recorded_curves(made, method):
    from arlopti.study.toy_run import read_rows

    per_run = json.loads((RECORD / "per_run.json").read_text())
    for s in SEEDS:
        got = [r["reward/mean"] for r in read_rows(made / "runs" / method / f"seed{s}")]
        want = per_run[method][str(s)]["rewards"]
        assert got == want, (f"{method} seed {s}: the rewards per step differ from the record behind "
                             f"{RECORD.relative_to(REPO)}/curves.png and tables.md (per_run.json): the science moved")


def test_each_seed_s_first_step_mechanism_equals_the_recorded_one(made):
    for s in SEEDS:
        got = json.loads((made / "mechanism" / f"seed{s}.json").read_text())
        want = json.loads((RECORD / "mechanism" / f"seed{s}.json").read_text())
        where = f"{RECORD.relative_to(REPO)}/mechanism.png and tables.md (mechanism/seed{s}.json)"
        assert got["batch"] == want["batch"], f"seed {s}: the first batch differs from the record behind {where}"
        assert got["support"] == want["support"] and got["tokens_per_bucket"] == want["tokens_per_bucket"], where
        for m in METHODS:
            assert got["methods"][m] == want["methods"][m], f"{m}, seed {s}: the first step moved ({where})"
