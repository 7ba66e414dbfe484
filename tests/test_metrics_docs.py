"""docs/metrics.md lists every TensorBoard tag, and every tag it lists is written.

Two smoke runs (GRPO, and AR + Lopti with the diagnostics' update direction every step and DAPO's
dynamic sampling and overlong shaping, both with validation) write TensorBoard; every scalar, histogram and text tag of their event files
must match a row of docs/metrics.md, and every row must be matched by some tag (all rows' "when"
conditions are covered by these two runs, except ``rollout.placement=server``'s ``async/*``,
checked by tests/learner/test_async_metrics.py, and multi-turn's ``turns/*``, checked by
tests/learner/test_turn_metrics.py). Also: the two runs share the core ``update/*``
tags, so GRPO and Lopti overlay on the same cards.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from conftest import REPO_ROOT
from helpers.compose import compose_train

DOC = REPO_ROOT / "docs" / "metrics.md"
CORE = ["update/loss", "update/kl", "update/entropy", "update/clip_frac_low", "update/clip_frac_high",
        "update/grad_norm", "update/lr", "update/ratio_mean"]


def documented() -> dict[str, re.Pattern]:
    rows = {}
    for line in DOC.read_text().splitlines():
        m = re.match(r"\| `([^`]+)` \|", line)
        if m:
            tag = m.group(1)
            pattern = re.escape(tag)
            pattern = re.sub(r"<[a-z]+>", "[^/]+", pattern.replace(r"\<", "<").replace(r"\>", ">"))
            rows[tag] = re.compile(pattern + "$")
    return rows


def event_tags(run_dir: Path) -> set[str]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    tags = set()
    for ev in (run_dir / "tensorboard").rglob("events.out.tfevents.*"):
        acc = EventAccumulator(str(ev.parent), size_guidance={"scalars": 0, "histograms": 0, "tensors": 0})
        acc.Reload()
        t = acc.Tags()
        tags |= set(t["scalars"]) | set(t["histograms"]) | set(t["tensors"])
        try:
            if acc.PluginTagToContent("hparams"):  # the HPARAMS tab's summaries
                tags.add("_hparams_/")
        except KeyError:
            pass
    # text is stored as "<tag>/text_summary"; the hparams plugin's summaries as "_hparams_/..."
    return {"hparams" if k.startswith("_hparams_/") else k.removesuffix("/text_summary") for k in tags}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    from arlopti.tasks.base import RewardResult
    from arlopti.tasks.kk import KKTask
    from arlopti.entry.train import train

    # A random tiny model never writes the K&K format (every reward -3, every advantage 0), so the
    # gradient-mass and update-direction diagnostics would have nothing to report: a varied stand-in
    # reward with the K&K components makes the advantages non-zero.
    def varied(self, responses, ground_truths, metas):
        return [RewardResult(float(len(set(r)) % 3), False, {"format_ok": 0.0, "parsed": 0.0, "answer_score": -2.0})
                for r in responses]

    mp = pytest.MonkeyPatch()
    mp.setattr(KKTask, "score", varied)
    out = {}
    for name in ("kk_grpo", "kk_ar_lopti"):
        d = tmp_path_factory.mktemp(name)
        cfg = compose_train([f"experiment={name}", "debug=smoke", "data=kk_generated",
                             "callbacks.benchmark_eval.limit=1", "callbacks.diagnostics.update_direction_every_n_steps=1",
                             "algorithm.lopti.eta=0.002"]  # eta splits a random tiny model's p_old
                            + (["algorithm.dapo.dynamic_sampling=true", "algorithm.dapo.overlong_buffer=4"]
                               if name == "kk_ar_lopti" else []), d)  # DAPO's tags
        train(cfg)
        out[name] = event_tags(d)
    mp.undo()
    return out


@pytest.mark.slow
def test_every_written_tag_is_documented_and_every_documented_tag_is_written(runs):
    rows = documented()
    written = runs["kk_grpo"] | runs["kk_ar_lopti"]
    undocumented = sorted(t for t in written if not any(p.match(t) for p in rows.values()))
    assert not undocumented, f"tags missing from docs/metrics.md: {undocumented}"
    # async/* need rollout.placement=server, which these colocated runs are not: tests/learner/test_async_metrics.py
    # checks those rows both ways
    unwritten = sorted(tag for tag, p in rows.items()  # turns/*: multi-turn runs, tests/learner/test_turn_metrics.py
                       if not tag.startswith(("async/", "turns/")) and not any(p.match(t) for t in written))
    assert not unwritten, f"docs/metrics.md rows no run wrote: {unwritten}"


@pytest.mark.slow
def test_grpo_and_lopti_share_the_core_update_tags(runs):
    for name, tags in runs.items():
        missing = [t for t in CORE if t not in tags]
        assert not missing, f"{name} lacks {missing}"
    assert not any(t.startswith("update/low/") for t in runs["kk_grpo"])
    assert any(t.startswith("update/low/") for t in runs["kk_ar_lopti"])
