"""Readable runs: a progress bar that counts rollout steps, and one compact metrics line per N steps.

* :class:`RolloutProgressBar`: Lightning's ``RichProgressBar`` counting *rollout steps* (the
  learner's ``rollout_step``, resumed runs included) toward :func:`planned_steps`, instead of the
  dataloader batches of one epoch (which read ``2/2250, ETA 13 h`` for a 2-step run). Its ETA is
  rich's ``remaining / speed`` with the speed averaged over every step of this process (rich's
  default 30 s window holds no two samples when a step takes minutes).
* :class:`StepLine`: every ``every_n_steps`` rollout steps, one line through the
  ``arlopti.progress`` logger, so in Hydra's console handler and in ``train.log``: what a SLURM
  log shows without a TTY. Its fields are :data:`LINE_FIELDS` then ``tok/s``, the step time and
  the ETA (:func:`eta_seconds`) on a terminal at least :data:`LONG_LINE_COLUMNS` wide
  (:func:`format_line`), else the 80-column form (:func:`format_compact`: no TTY, a narrow terminal;
  ``+callbacks.step_line.style=compact|long`` forces one). Both show the failed reward calls'
  fraction (``reward_err`` / ``err``) whenever it is not zero, and ``no signal`` on a step whose
  groups carried no learning signal (:func:`no_signal`; the compact form drops ``acc`` for it).
  After :data:`NO_SIGNAL_WARN_AFTER` such steps in a row it logs a warning naming the cause
  (:func:`no_signal_warning`); the end-of-run summary says it too
  (:class:`arlopti.callbacks.summary.TrainingSummary`).

Both read the module's ``rollout_step``, ``total_rollout_steps`` and ``last_step_context.metrics``
(:class:`arlopti.learner.module.GRPOModule`).
"""

from __future__ import annotations

import logging
import math
import time

from lightning.pytorch.callbacks import Callback, RichProgressBar

from arlopti.callbacks.cadence import check_every
from arlopti.utils.console import watch_fit_stop

log = logging.getLogger("arlopti.progress")
warn_log = logging.getLogger(__name__)  # warnings keep Hydra's prefix (the step lines print bare)

#: (label, metric tag, format) of the line's fields, in order; a tag absent this step is left out.
LINE_FIELDS = (
    ("reward", "reward/mean", "{:.3f}"),
    ("acc", "reward/accuracy", "{:.3f}"),
    ("kl", "update/kl", "{:.2e}"),
    ("ent", "update/entropy", "{:.3f}"),
    ("clip", "update/clip_frac", "{:.3f}"),  # clip_frac_low + clip_frac_high (+ dual), see clip_fraction
    ("len", "rollout/response_len_mean", "{:.0f}"),
    ("turns", "turns/mean", "{:.2f}"),  # multi-turn episodes only (task.env)
)


#: Advantage estimators whose baseline is the batch's, not the group's: a step has a signal there as
#: long as the batch's rewards differ (``reward/std`` > 0), even when every group's are equal.
BATCH_BASELINE_ESTIMATORS = ("reinforce_pp",)
#: Consecutive rollout steps without a learning signal after which :class:`StepLine` warns.
NO_SIGNAL_WARN_AFTER = 3


def no_signal(metrics: dict[str, float], advantage: str = "grpo") -> bool:
    """Whether a step's rollout carried no learning signal: in every group all responses got the same
    reward (``reward/zero_std_group_frac`` = 1), so every group-relative advantage is 0, and with it the
    policy gradient (for :data:`BATCH_BASELINE_ESTIMATORS`: the whole batch's rewards were equal,
    ``reward/std`` = 0). False when the metric is not logged."""
    frac = metrics.get("reward/zero_std_group_frac")
    if frac is None or float(frac) < 1.0:
        return False
    return advantage not in BATCH_BASELINE_ESTIMATORS or float(metrics.get("reward/std") or 0.0) == 0.0


def no_signal_warning(first: int, last: int, reward: float | None) -> str:
    """The warning for rollout steps ``first``..``last`` without a learning signal, naming the cause."""
    same = f" (mean reward {reward:.3f})" if reward is not None else ""
    return (f"rollout steps {first}-{last} had no learning signal: in every group all responses got the same "
            f"reward{same}, so every advantage was 0 (reward/zero_std_group_frac = 1) and the policy learned nothing "
            "from its reward. The reward cannot tell this model's responses to a prompt apart: a task far too hard "
            "or too easy for the model (the tiny random model scores -3 on every K&K response), or a reward that "
            "returns a constant. Check the reward on a few responses, or raise sizes.group_size / "
            "rollout.temperature, or use an easier data set or a stronger model")


def advantage_estimator(pl_module) -> str:
    """The learner's ``algorithm.advantage`` (``grpo`` when it has no config)."""
    cfg = getattr(pl_module, "cfg", None)
    return getattr(getattr(cfg, "algorithm", None), "advantage", "grpo")


def planned_steps(rollout_steps: int | None, max_epochs: int | None, batches_per_epoch: float | None) -> float:
    """Rollout steps the run will take: ``rollout_steps`` when set (capped by the epochs' total
    when that is smaller), else ``max_epochs × batches_per_epoch`` (one batch = one rollout
    step); ``inf`` when neither is known (``max_epochs = -1`` / None, an iterable of unknown length)."""
    by_epochs = math.inf
    if max_epochs is not None and max_epochs >= 0 and batches_per_epoch is not None and math.isfinite(
            float(batches_per_epoch)):
        by_epochs = float(max_epochs) * float(batches_per_epoch)
    if rollout_steps is not None:
        return float(min(float(rollout_steps), by_epochs))
    return by_epochs


def eta_seconds(step: int, total: float, start_step: int, elapsed_s: float) -> float | None:
    """Seconds left: ``(total − step) × elapsed_s / (step − start_step)``, the mean time of the
    steps this process has run (``start_step`` = the step it resumed from, 0 for a fresh run;
    ``elapsed_s`` from the start of training, so validation time is included). None before the
    first step or when ``total`` is unknown."""
    done = step - start_step
    if done <= 0 or not math.isfinite(total):
        return None
    return max(0.0, total - step) * elapsed_s / done


def format_duration(seconds: float | None) -> str:
    """``H:MM:SS`` (``D d H:MM:SS`` past a day); ``?`` for None."""
    if seconds is None or not math.isfinite(seconds):
        return "?"
    s = int(round(seconds))
    d, s = divmod(s, 86400)
    h, s = divmod(s, 3600)
    m, s = divmod(s, 60)
    return (f"{d} d " if d else "") + f"{h}:{m:02d}:{s:02d}"


def clip_fraction(metrics: dict[str, float]) -> float | None:
    """Fraction of tokens clipped: ``update/clip_frac_low + update/clip_frac_high +
    update/clip_frac_dual`` (disjoint sets of tokens: A < 0 below 1 − ε_low, A > 0 above
    1 + ε_high, and A < 0 capped by dual-clip; docs/metrics.md); None when none is logged."""
    parts = [metrics[k] for k in ("update/clip_frac_low", "update/clip_frac_high", "update/clip_frac_dual")
             if k in metrics]
    return float(sum(parts)) if parts else None


def reward_error_fraction(metrics: dict[str, float]) -> float:
    """Responses whose reward function failed this step: ``reward/error + reward/timeout`` (task=custom's
    components; 0 when not logged)."""
    return float(sum(float(metrics.get(k) or 0.0) for k in ("reward/error", "reward/timeout")))


def format_line(step: int, total: float, metrics: dict[str, float], step_s: float | None,
                eta_s: float | None) -> str:
    """``step 3/10 | reward -1.250 | acc 0.125 | kl 1.00e-03 | ent 1.234 | clip 0.010 | len 85 |
    tok/s 312 | 4.1 s/step | ETA 0:00:29`` (fields without a value are left out; ``reward_err``
    after ``reward`` when some reward call failed, :func:`reward_error_fraction`; ``no signal`` after
    them when ``metrics["no_signal"]`` is set, :func:`no_signal`)."""
    values = dict(metrics)
    clip = clip_fraction(metrics)
    if clip is not None:
        values["update/clip_frac"] = clip
    parts = [f"step {step}/{int(total) if math.isfinite(total) else '?'}"]
    for label, tag, fmt in LINE_FIELDS:
        if tag in values and values[tag] is not None:
            parts.append(f"{label} {fmt.format(float(values[tag]))}")
        if tag == "reward/mean" and reward_error_fraction(values) > 0:
            parts.append(f"reward_err {reward_error_fraction(values):.3f}")
        if tag == "reward/mean" and values.get("no_signal"):
            parts.append("no signal")
    if "timing/tokens_per_s" in values:
        parts.append(f"tok/s {float(values['timing/tokens_per_s']):.0f}")
    parts += async_fields(values)
    if step_s is not None:
        parts.append(f"{step_s:.1f} s/step")
    parts.append(f"ETA {format_duration(eta_s)}")
    return " | ".join(parts)


#: (label, metric tag, format) of the compact line (:func:`format_compact`).
COMPACT_FIELDS = (("rew", "reward/mean", "{:.3f}"), ("acc", "reward/accuracy", "{:.3f}"),
                  ("kl", "update/kl", "{:.1e}"), ("len", "rollout/response_len_mean", "{:.0f}"),
                  ("turns", "turns/mean", "{:.1f}"))
#: The compact line's most characters (an 80-column terminal).
COMPACT_COLUMNS = 80
#: Terminal columns from which the long line is used (Hydra's console prefix takes about 50).
LONG_LINE_COLUMNS = 160


def format_compact(step: int, total: float, metrics: dict[str, float], step_s: float | None,
                   eta_s: float | None) -> str:
    """The line for an 80-column terminal or a log file: ``step 3/10 rew -1.250 acc 0.125
    kl 1.0e-03 len 85 ETA 0:00:29`` (``err`` after ``rew`` when some reward call failed; ``(no signal)``
    instead of ``acc`` on a step without a learning signal, the ``no_signal`` key; entropy,
    clip, tok/s, the step time and the rollout workers' side only in the long form, and in the loggers). At most
    :data:`COMPACT_COLUMNS` characters: fields that would pass them are left out from the end (``turns`` first,
    then ``len``), which for up to 9,999 steps, |reward| < 10 and an ETA under a day only happens with turns."""
    parts = [f"step {step}/{int(total) if math.isfinite(total) else '?'}"]
    flat = bool(metrics.get("no_signal"))
    for label, tag, fmt in COMPACT_FIELDS:
        if tag == "reward/accuracy" and flat:
            parts.append("(no signal)")  # in acc's place, so the line still fits 80 columns
        elif metrics.get(tag) is not None:
            parts.append(f"{label} {fmt.format(float(metrics[tag]))}")
        if tag == "reward/mean" and reward_error_fraction(metrics) > 0:
            parts.append(f"err {reward_error_fraction(metrics):.2f}")
    eta = f"ETA {format_duration(eta_s)}"
    while len(" ".join([*parts, eta])) > COMPACT_COLUMNS and len(parts) > 1:
        parts.pop()
    return " ".join([*parts, eta])


def async_fields(metrics: dict[str, float]) -> list[str]:
    """The worker side of a ``rollout.placement=server`` step for the long line: ``stale 1 | wait 0.3 s |
    idle 0.1 s | queue 2 | worker tok/s 340`` (the largest staleness, the trainer's wait for generation,
    the workers' idle time, the batches queued, every worker's decoding speed summed); none otherwise."""
    if metrics.get("async/staleness_max") is None:
        return []
    out = [f"stale {float(metrics['async/staleness_max']):.0f}"]
    for label, tag in (("wait", "async/trainer_wait_s"), ("idle", "async/worker_idle_s")):
        if metrics.get(tag) is not None:
            out.append(f"{label} {float(metrics[tag]):.1f} s")
    if metrics.get("async/queue_depth") is not None:
        out.append(f"queue {float(metrics['async/queue_depth']):.0f}")
    speeds = [float(v) for k, v in metrics.items() if k.startswith("async/worker") and k.endswith("/tokens_per_s")]
    if speeds:
        out.append(f"worker tok/s {sum(speeds):.0f}")
    return out


def line_style(columns: int | None = None) -> str:
    """``long`` on a terminal at least :data:`LONG_LINE_COLUMNS` wide, else ``compact`` (no TTY:
    ``shutil.get_terminal_size``'s fallback, ``$COLUMNS`` or 80)."""
    import shutil

    columns = columns if columns is not None else shutil.get_terminal_size((80, 24)).columns
    return "long" if columns >= LONG_LINE_COLUMNS else "compact"


def _planned(trainer, pl_module) -> float:
    return planned_steps(getattr(pl_module, "total_rollout_steps", None), trainer.max_epochs,
                         trainer.num_training_batches)


class StepLine(Callback):
    """One compact line per ``every_n_steps`` rollout steps (rank 0), through the
    ``arlopti.progress`` logger: console and ``train.log`` (see the module docstring)."""

    def __init__(self, every_n_steps: int = 1, style: str = "auto"):
        check_every("callbacks.step_line.every_n_steps", every_n_steps, allow_none=False)
        if style not in ("auto", "compact", "long"):
            raise ValueError(f"callbacks.step_line.style={style!r}: use auto, compact or long")
        self.every_n_steps = every_n_steps
        self.style = style
        self._t0: float | None = None
        self._start_step = 0
        self._last_t: float | None = None
        self._accuracy = True  # the task defines correctness (not a reward model alone): "acc" on the line
        self._flat_since: int | None = None  # first step of the current run of steps without a signal
        self._warned_since: int | None = None

    def on_train_start(self, trainer, pl_module) -> None:
        watch_fit_stop(trainer)  # so Lightning's closing line names rollout_steps, not max_epochs
        self._t0 = self._last_t = time.perf_counter()
        self._start_step = int(getattr(pl_module, "rollout_step", 0))
        from arlopti.loggers.tb_layout import shows_accuracy

        self._accuracy = shows_accuracy(getattr(pl_module, "task_options", None))

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        step = int(getattr(pl_module, "rollout_step", 0))
        ctx = getattr(pl_module, "last_step_context", None)
        if trainer.global_rank != 0 or ctx is None or self._t0 is None:
            return
        flat = no_signal(ctx.metrics, advantage_estimator(pl_module))
        self._watch_signal(step, flat, ctx.metrics.get("reward/mean"))
        if step % self.every_n_steps:
            return
        now = time.perf_counter()
        total = _planned(trainer, pl_module)
        step_s = (now - self._last_t) / self.every_n_steps if self._last_t is not None else None
        self._last_t = now
        fmt = format_line if (self.style if self.style != "auto" else line_style()) == "long" else format_compact
        metrics = {**ctx.metrics, "no_signal": flat}
        if not self._accuracy:  # a reward model's raw score > 0 is no "correct": no acc 0.000 on every line
            metrics.pop("reward/accuracy", None)
        log.info(fmt(step, total, metrics, step_s, eta_seconds(step, total, self._start_step, now - self._t0)))

    def _watch_signal(self, step: int, flat: bool, reward: float | None) -> None:
        """Warn once per run of :data:`NO_SIGNAL_WARN_AFTER` or more steps in a row without a signal."""
        if not flat:
            self._flat_since = None
            return
        if self._flat_since is None:
            self._flat_since = step
        if step - self._flat_since + 1 >= NO_SIGNAL_WARN_AFTER and self._warned_since != self._flat_since:
            self._warned_since = self._flat_since
            warn_log.warning(no_signal_warning(self._flat_since, step, reward))


class RolloutProgressBar(RichProgressBar):
    """Lightning's rich bar counting rollout steps toward :func:`planned_steps`, one bar for the
    whole run (see the module docstring)."""

    @property
    def total_train_batches(self):
        total = _planned(self.trainer, self.trainer.lightning_module)
        return int(total) if math.isfinite(total) else total

    def _get_train_description(self, current_epoch: int) -> str:
        return "rollout steps"

    def _init_progress(self, trainer) -> None:
        super()._init_progress(trainer)
        if self.progress is not None:  # the speed (and so the ETA) over every step, not the last 30 s
            self.progress.speed_estimate_period = math.inf

    def on_train_epoch_start(self, trainer, pl_module) -> None:
        super().on_train_epoch_start(trainer, pl_module)
        if self.progress is not None and self.train_progress_bar_id is not None:
            # start at the steps already taken (resume, later epochs) without counting them as speed
            self.progress.reset(self.train_progress_bar_id, total=self.total_train_batches,
                                completed=int(getattr(pl_module, "rollout_step", 0)),
                                description=self._get_train_description(trainer.current_epoch))

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if not self.is_disabled and self.train_progress_bar_id is None:
            self._initialize_train_progress_bar_id()
        self._update(self.train_progress_bar_id, int(getattr(pl_module, "rollout_step", batch_idx + 1)))
        self._update_metrics(trainer, pl_module)
        self.refresh()
