"""TensorBoard's Custom Scalars layout (arlopti/loggers/tb_layout.py): reward first, the
low-probability diagnostics as a group of their own, written once into the run's event file.

A smoke run of AR + Lopti (tiny model, K&K with a varied stand-in reward so that the advantages,
the gradient-mass shares and the update direction are not all zero) writes TensorBoard; the layout
is read back from its event file with TensorBoard's own ``EventAccumulator`` and
``layout_pb2.Layout``: categories in order, each chart's patterns matching tags the same run wrote.
Without the layout (the code before it) the event file holds no ``custom_scalars__config__`` and the
first test fails. The browser check (what a user sees) is a manual step: docs/logging.md.
"""

from __future__ import annotations

import itertools
import re
from pathlib import Path

import pytest

from arlopti.plugins.buckets import BUCKET_NAMES
from arlopti.loggers.tb_layout import (LOW_PROB, REWARD, ROLLOUT, UPDATE, LayoutFacts, scalar_layout,
                                       write_scalar_layout)
from conftest import REPO_ROOT
from helpers.compose import compose_train

LAYOUT_TAG = "custom_scalars__config__"  # tensorboard.plugins.custom_scalar.metadata.CONFIG_SUMMARY_TAG


def read_layouts(tb_dir: Path):
    """``(layouts, scalar tags)`` of the event files under ``tb_dir``: every Custom Scalars layout
    written (``layout_pb2.Layout``) and every scalar tag."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.custom_scalar import layout_pb2, metadata

    assert metadata.CONFIG_SUMMARY_TAG == LAYOUT_TAG
    acc = EventAccumulator(str(tb_dir), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    tags = acc.Tags()
    events = acc.Tensors(LAYOUT_TAG) if LAYOUT_TAG in tags["tensors"] else []
    layouts = [layout_pb2.Layout.FromString(e.tensor_proto.string_val[0]) for e in events]
    return layouts, set(tags["scalars"])


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    from arlopti.entry.train import train
    from arlopti.tasks.kk import KKTask
    from helpers.varied_reward import varied_kk_score as varied


    out = tmp_path_factory.mktemp("layout")
    mp = pytest.MonkeyPatch()
    mp.setattr(KKTask, "score", varied)
    try:
        train(compose_train(["experiment=kk_ar_lopti", "debug=smoke", "data=kk_generated", "data.train_count_per_n=4",
                             "data.val_count_per_n=1", "callbacks.benchmark_eval.limit=1",
                             "callbacks.diagnostics.update_direction_every_n_steps=1",
                             "algorithm.lopti.eta=0.002"], out))  # eta splits a random tiny model's p_old
    finally:
        mp.undo()
    return out


def test_the_layout_is_written_once_with_reward_first(run):
    layouts, tags = read_layouts(run / "tensorboard")
    assert len(layouts) == 1, f"{len(layouts)} layouts in the event file (want exactly one, at the start)"
    layout = layouts[0]
    titles = [c.title for c in layout.category]
    print("categories:", titles)
    assert titles == [REWARD, LOW_PROB, UPDATE, ROLLOUT]
    first = [c.title for c in layout.category[0].chart]
    assert first[:4] == ["train reward (mean)", "train accuracy", "train format rate (K&K format_ok)",
                         "validation accuracy (mean over sets)"]
    # the layout in the file is the one the run's facts give (AR + Lopti, diagnostics, validation, KL)
    facts = LayoutFacts(ar=True, lopti=True, kl=True, diag_prefix="diag", diag_buckets=True, update_direction=True,
                        validation=True)
    want = scalar_layout(facts)
    assert {c.title: {ch.title: list(ch.multiline.tag) for ch in c.chart} for c in layout.category} == \
        {cat: {title: chart[1] for title, chart in charts.items()} for cat, charts in want.items()}


def test_every_chart_draws_tags_the_run_wrote(run):
    (layout,), tags = read_layouts(run / "tensorboard")
    matched: dict[str, list[str]] = {}
    for cat in layout.category:
        for chart in cat.chart:
            hits = sorted(t for t in tags for p in chart.multiline.tag if re.match(p, t))
            assert hits, f"chart {cat.title!r} / {chart.title!r} ({list(chart.multiline.tag)}) matches no tag of the run"
            matched[chart.title] = hits
    assert matched["train reward (mean)"] == ["reward/mean"]
    assert matched["train accuracy"] == ["reward/accuracy"]
    assert matched["validation accuracy (mean over sets)"] == ["val/kk/mean/greedy/acc", "val/kk/mean/sampling/acc"]
    assert all("/mean/" not in t for t in matched["validation accuracy per set"])
    assert matched[TOKEN_SHARE] == [f"diag/bucket_frac/{b}" for b in BUCKET_NAMES if f"diag/bucket_frac/{b}" in tags]
    assert matched["Lopti phases: token share"] == ["lopti/high_frac", "lopti/low_frac"]
    low_prob = {t for cat in layout.category if cat.title == LOW_PROB for ch in cat.chart for t in matched[ch.title]}
    assert not low_prob & {t for t in tags if t.startswith(("reward/", "val/"))}  # a group of its own


def documented_tags() -> set[str]:
    """Concrete tags of docs/metrics.md's rows, each placeholder filled with a few real values."""
    fill = {"b": BUCKET_NAMES, "phase": ("low", "high"), "task": ("kk", "math"), "set": ("kk_3ppl", "math500"),
            "mode": ("greedy", "sampling"), "component": ("format_ok", "boxed"),
            "metric": ("acc", "avg@16", "pass@16", "format_rate", "loss", "steps"), "k": ("rollout_s",)}
    out = set()
    for line in (REPO_ROOT / "docs" / "metrics.md").read_text().splitlines():
        m = re.match(r"\| `([^`]+)` \|", line)
        if not m:
            continue
        names = re.findall(r"<([a-z]+)>", m.group(1))
        for values in itertools.product(*(fill.get(n, ("x",)) for n in names)):
            tag = m.group(1)
            for n, v in zip(names, values):
                tag = tag.replace(f"<{n}>", v, 1)
            out.add(tag)
    return out


def test_every_pattern_names_a_documented_tag():
    """Each pattern of the fullest layout matches a tag docs/metrics.md lists: no made-up names."""
    tags = documented_tags()
    full = scalar_layout(LayoutFacts(ar=True, lopti=True, kl=True))
    for cat, charts in full.items():
        for title, (kind, patterns) in charts.items():
            assert kind == "Multiline"
            for p in patterns:
                assert p.endswith("$"), f"{title}: {p} (re.match is anchored at the start only)"
                assert any(re.match(p, t) for t in tags), f"{cat} / {title}: {p} matches no documented tag"


def test_charts_follow_the_run():
    grpo = scalar_layout(LayoutFacts(kl=False, diag_prefix=None, validation=False))
    assert list(grpo) == [REWARD, LOW_PROB, UPDATE, ROLLOUT]
    names = {t for charts in grpo.values() for t in charts}
    assert not any(t.startswith(("Lopti", "AR ")) or "before AR" in t or "validation" in t for t in names)
    assert "KL to the reference" not in names and TOKEN_SHARE not in names
    other = scalar_layout(LayoutFacts(diag_prefix="probe", update_direction=False))
    assert other[LOW_PROB][TOKEN_SHARE][1] == [f"probe/bucket_frac/{re.escape(b)}$" for b in BUCKET_NAMES]
    assert not any("update direction" in t for t in other[LOW_PROB])


#: The token-share chart's title: the buckets' order in it, since a chart has no legend setting.
TOKEN_SHARE = f"token share per bucket (p_old {BUCKET_NAMES[0]} ... {BUCKET_NAMES[-1]})"


def test_each_bucket_is_a_series_of_its_own():
    """Issue 54 item 6: one pattern per bucket, so each bucket is named in the chart's list (the layout has
    no legend or y-axis option: ``layout_pb2.Chart`` holds a title and the patterns only)."""
    from tensorboard.plugins.custom_scalar import layout_pb2

    assert set(layout_pb2.Chart.DESCRIPTOR.fields_by_name) == {"title", "multiline", "margin"}
    low = scalar_layout(LayoutFacts(ar=True, lopti=True))[LOW_PROB]
    per_bucket = {t: p for t, (_, p) in low.items() if "per bucket" in t or "update direction" in t}
    assert len(per_bucket) == 7
    for title, patterns in per_bucket.items():
        assert title.endswith(f"(p_old {BUCKET_NAMES[0]} ... {BUCKET_NAMES[-1]})"), title
        assert len(patterns) == len(BUCKET_NAMES)
        for pattern, name in zip(patterns, BUCKET_NAMES):
            tag = pattern.removesuffix("$").replace("\\", "")
            assert tag.endswith("/" + name) and re.match(pattern, tag), (pattern, tag)


def test_charts_of_tags_the_task_does_not_write_are_left_out():
    """Issue 54 item 6: ``task=custom`` writes no format rate (the K&K / math charts showed "Matches (0)"),
    math writes ``reward/boxed`` and no validation format rate; a task without accuracy gets no accuracy chart."""
    titles = {task: list(scalar_layout(LayoutFacts(task=task))[REWARD]) for task in ("kk", "math", "custom")}
    assert "train format rate (K&K format_ok)" in titles["kk"] and "validation format rate (mean over sets)" in titles["kk"]
    assert "train boxed-answer rate (math)" in titles["math"]
    assert not any("format" in t for t in titles["math"] if t != "train boxed-answer rate (math)")
    assert not any("format" in t or "boxed" in t for t in titles["custom"])
    assert "train accuracy" in titles["custom"]
    assert "train accuracy" not in scalar_layout(LayoutFacts(task="custom", accuracy=False))[REWARD]


def test_only_tensorboard_loggers_get_it(tmp_path):
    from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger

    tb = TensorBoardLogger(str(tmp_path), name="tb", version="")
    n = write_scalar_layout([CSVLogger(str(tmp_path), name="csv"), tb], scalar_layout(LayoutFacts()))
    tb.experiment.flush()
    assert n == 1
    (layout,), _ = read_layouts(tmp_path / "tb")
    assert layout.category[0].title == REWARD


def test_the_callbacks_are_found_by_their_real_names():
    from arlopti.callbacks.benchmark_eval import BenchmarkEvalCallback
    from arlopti.callbacks.diagnostics import TokenDiagnosticsCallback
    from arlopti.loggers.tb_layout import DIAGNOSTICS, EVAL, layout_facts

    assert (TokenDiagnosticsCallback.__name__, BenchmarkEvalCallback.__name__) == (DIAGNOSTICS, EVAL)
    diag = TokenDiagnosticsCallback(update_direction_every_n_steps=None, prefix="probe")
    facts = layout_facts({"algorithm": {"ar_alpha": 0.3, "lopti": {"enabled": False}, "kl_coef": 0.0}}, [diag])
    assert facts == LayoutFacts(ar=True, lopti=False, kl=False, diag_prefix="probe", diag_buckets=True,
                                update_direction=False, validation=False)
    diag.enabled = False
    assert layout_facts({}, [diag]).diag_prefix is None


def test_the_accuracy_pattern_is_the_eval_runners():
    from arlopti.eval.runner import ACCURACY_METRIC
    from arlopti.loggers.tb_layout import ACCURACY_PATTERN

    assert ACCURACY_PATTERN == ACCURACY_METRIC.pattern
