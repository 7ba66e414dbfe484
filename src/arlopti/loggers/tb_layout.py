"""TensorBoard's **Custom Scalars** page for an arlopti run: the curves a newcomer looks for, first.

TensorBoard's Scalars page sorts its cards by tag, so a run shows ``cold_start/*`` and the eleven
``diag/*`` cards before ``reward/*``. The custom-scalars plugin (``tensorboard.plugins.custom_scalar``)
shows instead the categories and charts of a layout (``layout_pb2.Layout``) written into the event
file, in the layout's order; each chart is a ``MultilineChartContent`` whose ``tag`` entries are
regular expressions, each matched with ``re.match`` against the run's tags (so every pattern here
ends with ``$``), all matches drawn in one chart.

:func:`scalar_layout` builds that layout from what the run will log (docs/metrics.md lists every
tag), in this order:

1. ``reward and accuracy``: the train reward, accuracy (where the task defines one) and format rate
   (K&K ``reward/format_ok``, math ``reward/boxed``; only for those tasks) of the rollouts, and the
   validation accuracy (mean over the sets and per set, ``acc`` / ``avg@n`` / ``pass@n``:
   :data:`arlopti.eval.runner.ACCURACY_METRIC`) and K&K's format rate;
2. ``low-probability tokens``: the mechanism the paper is about: the share of tokens and of the
   gradient mass per p_old bucket (``diag/*``, with AR also before AR and the AR weight), the update
   direction per bucket, the effective weight per bucket and, with Lopti, the two phases (token
   share, gradient-mass share, loss and steps per phase);
3. ``policy update``: loss, KL, entropy, clipping, gradient norm, learning rate;
4. ``rollout``: response length, truncation, p_old of the sampled tokens, tokens per second.

A per-bucket chart lists one pattern per p_old bucket (``.../0\.00-0\.25$``, from
:data:`arlopti.plugins.buckets.BUCKET_NAMES`), so each bucket is a named series of its own in the
chart's list of matches; ``layout_pb2.Chart`` has no legend or axis setting (only a title and the tag
patterns), so the bucket order is also in the chart's title.

Charts for tags the run does not write are left out: the format charts of a task that writes none
(``task=custom``), accuracy for a task that does not define it, AR's without ``algorithm.ar_alpha``, Lopti's
without ``algorithm.lopti.enabled``, the KL's without ``algorithm.kl_coef``, the ``diag/*`` ones without the diagnostics callback (its own
``prefix``; the update direction only when it measures it), validation without the eval callback.
:func:`write_scalar_layout` writes it once, at the start of training, through each TensorBoard
logger's ``SummaryWriter.add_custom_scalars`` (:class:`arlopti.callbacks.run_config.ConfigToLoggers`
calls it). Open it at ``http://localhost:6006/#custom_scalars``; the Scalars page is unchanged.
Several runs in one ``--logdir`` merge their layouts by category title (TensorBoard's rule).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

#: Category titles, in the order the Custom Scalars page shows them.
REWARD, LOW_PROB, UPDATE, ROLLOUT = "reward and accuracy", "low-probability tokens", "policy update", "rollout"

_VAL_MEAN = r"val/[^/]+/mean/[^/]+/"            # val/<task>/mean/<mode>/
_VAL_SET = r"val/[^/]+/(?!mean/)[^/]+/[^/]+/"  # val/<task>/<set>/<mode>/, the sets themselves
#: The validation's correctness metrics, acc / avg@n / pass@n: :data:`arlopti.eval.runner.ACCURACY_METRIC`,
#: restated: importing eval here would stack the units one floor higher than docs/architecture.md allows
#: (callbacks imports this module); a test keeps the two equal.
ACCURACY_PATTERN = r"acc|(avg|pass)@\d+"
_ACC = f"(?:{ACCURACY_PATTERN})$"
#: The format-rate chart of each task that writes one: (title, tag pattern).
FORMAT_CHARTS = {"kk": ("train format rate (K&K format_ok)", r"reward/format_ok$"),
                 "math": ("train boxed-answer rate (math)", r"reward/boxed$")}
#: The task whose validation writes ``format_rate`` (arlopti.eval.runner: K&K's format check).
VAL_FORMAT_TASKS = ("kk",)


@dataclass(frozen=True)
class LayoutFacts:
    """What decides which charts a run's layout has (see the module docstring)."""

    ar: bool = False                      # algorithm.ar_alpha > 0
    lopti: bool = False                   # algorithm.lopti.enabled
    kl: bool = True                       # algorithm.kl_coef > 0 (update/kl is written)
    diag_prefix: str | None = "diag"      # the diagnostics callback's prefix; None: no diagnostics
    diag_buckets: bool = True             # it writes the per-bucket statistics (every_n_steps set)
    update_direction: bool = True         # it measures the update direction (update_direction_every_n_steps set)
    validation: bool = True               # an eval callback writes val/*
    task: str | None = "kk"               # the task that scores the data (its format charts)
    accuracy: bool = True                 # the task defines correctness (reward/accuracy means something)


def _chart(*patterns: str) -> list:
    """One multi-line chart of ``add_custom_scalars``' dict form: every tag matching a pattern."""
    return ["Multiline", list(patterns)]


def _buckets(prefix: str) -> list[str]:
    """One pattern per p_old bucket under ``prefix``: each bucket a named series (module docstring)."""
    from arlopti.plugins.buckets import BUCKET_NAMES

    return [f"{prefix}/{re.escape(name)}$" for name in BUCKET_NAMES]


def _bucket_title(what: str) -> str:
    from arlopti.plugins.buckets import BUCKET_NAMES

    return f"{what} (p_old {BUCKET_NAMES[0]} ... {BUCKET_NAMES[-1]})"


def _reward_charts(f: LayoutFacts) -> dict[str, list]:
    charts = {"train reward (mean)": _chart(r"reward/mean$")}
    if f.accuracy:
        charts["train accuracy"] = _chart(r"reward/accuracy$")
    if f.task in FORMAT_CHARTS:
        title, pattern = FORMAT_CHARTS[f.task]
        charts[title] = _chart(pattern)
    if f.validation:
        charts["validation accuracy (mean over sets)"] = _chart(_VAL_MEAN + _ACC)
        charts["validation accuracy per set"] = _chart(_VAL_SET + _ACC)
        if f.task in VAL_FORMAT_TASKS:
            charts["validation format rate (mean over sets)"] = _chart(_VAL_MEAN + r"format_rate$")
    return charts


def _low_prob_charts(f: LayoutFacts) -> dict[str, list]:
    charts: dict[str, list] = {}
    d = re.escape(f.diag_prefix) if f.diag_prefix else None
    if d and f.diag_buckets:
        charts[_bucket_title("token share per bucket")] = _chart(*_buckets(f"{d}/bucket_frac"))
        charts[_bucket_title("gradient-mass share per bucket")] = _chart(*_buckets(f"{d}/grad_mass_share"))
        if f.ar:
            charts[_bucket_title("gradient-mass share per bucket, before AR")] = _chart(
                *_buckets(f"{d}/grad_mass_share_raw"))
            charts[_bucket_title("AR weight per bucket")] = _chart(*_buckets(f"{d}/ar_weight"))
    if d and f.update_direction:
        charts[_bucket_title("update direction, A > 0: share whose log-prob rose")] = _chart(
            *_buckets(f"{d}/update_dir_pos"))
        charts[_bucket_title("update direction, A < 0: share whose log-prob fell")] = _chart(
            *_buckets(f"{d}/update_dir_neg"))
    charts[_bucket_title("effective weight per bucket (1 = GRPO)")] = _chart(*_buckets("update/effective_weight"))
    if f.ar:
        charts["AR weight (mean over tokens)"] = _chart(r"ar/weight_mean$")
    if f.lopti:
        charts["Lopti phases: token share"] = _chart(r"lopti/(?:low|high)_frac$")
        if d and f.diag_buckets:
            charts["Lopti phases: gradient-mass share"] = _chart(f"{d}/lopti_grad_mass_share/(?:low|high)$")
        charts["Lopti phases: loss"] = _chart(r"update/(?:low|high)/loss$")
        charts["Lopti phases: optimizer steps"] = _chart(r"update/(?:low|high)/steps$")
    return charts


def scalar_layout(facts: LayoutFacts) -> dict[str, dict[str, list]]:
    """The run's layout in ``SummaryWriter.add_custom_scalars``' form, ``{category: {chart:
    ["Multiline", [tag regex, ...]]}}``, categories and charts in display order (module docstring)."""
    return {
        REWARD: _reward_charts(facts),
        LOW_PROB: _low_prob_charts(facts),
        UPDATE: {"loss": _chart(r"update/loss$", r"update/pg_loss$"),
                 **({"KL to the reference": _chart(r"update/kl$")} if facts.kl else {}),
                 "entropy": _chart(r"update/entropy$"),
                 "clipped token fractions": _chart(r"update/clip_frac_(?:low|high|dual)$"),
                 "gradient norm": _chart(r"update/grad_norm$"),
                 "learning rate": _chart(r"update/lr$")},
        ROLLOUT: {"response length (tokens)": _chart(r"rollout/response_len_(?:mean|max)$"),
                  "truncated responses": _chart(r"rollout/truncated_frac$"),
                  "p_old of the sampled tokens (mean)": _chart(r"rollout/token_prob_mean$"),
                  "tokens per second": _chart(r"timing/tokens_per_s$")},
    }


#: The callbacks whose tags the layout draws, by class name (subclasses count): importing them here
#: would make ``callbacks`` and ``loggers`` import each other (callbacks.run_config calls this module);
#: a test checks the names against the classes.
DIAGNOSTICS, EVAL = "TokenDiagnosticsCallback", "BenchmarkEvalCallback"


def _is(obj, class_name: str) -> bool:
    return any(c.__name__ == class_name for c in type(obj).__mro__)


def layout_facts(run: dict, callbacks, task: str | None = "kk", accuracy: bool = True) -> LayoutFacts:
    """:class:`LayoutFacts` of a run: its run config (``asdict(RunConfig)``; ``algorithm.ar_alpha``,
    ``algorithm.lopti.enabled``, ``algorithm.kl_coef``), its Lightning callbacks (the diagnostics and eval
    callbacks), the task that scores its data and whether that task defines accuracy."""
    algo = run.get("algorithm") or {}
    diag = next((cb for cb in callbacks if _is(cb, DIAGNOSTICS) and getattr(cb, "enabled", True)), None)
    return LayoutFacts(ar=float(algo.get("ar_alpha") or 0.0) > 0, lopti=bool((algo.get("lopti") or {}).get("enabled")),
                       kl=float(algo.get("kl_coef") or 0.0) > 0,
                       diag_prefix=diag.prefix if diag is not None else None,
                       diag_buckets=diag is not None and diag.every_n_steps is not None,
                       update_direction=diag is not None and diag.update_direction_every_n_steps is not None,
                       validation=any(_is(cb, EVAL) for cb in callbacks), task=task, accuracy=accuracy)


def write_scalar_layout(loggers, layout: dict[str, dict[str, list]]) -> int:
    """``layout`` into each TensorBoard logger's event file (``add_custom_scalars``); returns how
    many loggers got it. Other loggers have no such page and are left alone."""
    from lightning.pytorch.loggers import TensorBoardLogger

    written = 0
    for logger in loggers or []:
        if isinstance(logger, TensorBoardLogger):
            logger.experiment.add_custom_scalars(layout)
            written += 1
    return written


def shows_accuracy(task_options: dict | None) -> bool:
    """Whether a run's accuracy (``reward/accuracy``: correct responses) means something: always for the
    built-in tasks and for reward functions (a function's ``correct`` key, else reward > ``task.correct_above``);
    not for a reward model alone (``task.reward_model`` without ``task.reward_fn(s)``), whose raw scores'
    sign says nothing. The step line and the Custom Scalars page leave accuracy out then."""
    custom = (task_options or {}).get("custom")
    if not isinstance(custom, dict) or not custom.get("reward_model"):
        return True
    return bool(custom.get("reward_fn") or custom.get("reward_fns"))


def write_run_layout(trainer, pl_module) -> int:
    """At the start of training: the layout of this run (:func:`layout_facts` of the learner's run
    config, ``hparams["run"]``, the trainer's callbacks, the data's task and :func:`shows_accuracy` of the
    learner's task options) into its TensorBoard loggers."""
    run = dict(getattr(pl_module, "hparams", None) or {}).get("run") or {}
    task = getattr(getattr(trainer, "datamodule", None), "task_name", None)
    accuracy = shows_accuracy(getattr(pl_module, "task_options", None))
    return write_scalar_layout(trainer.loggers, scalar_layout(layout_facts(run, trainer.callbacks, task, accuracy)))
