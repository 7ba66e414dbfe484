"""What the learner writes to the loggers each rollout step (rank 0 only): the reduced scalars at
``rollout_step`` as the x-axis, and a few sample completions as text where the logger takes text.
Every tag is listed in docs/metrics.md."""

from __future__ import annotations

from arlopti.learner.experience import Experience


def write_step(loggers, metrics: dict[str, float], exp: Experience, step: int, n_samples: int) -> None:
    for logger in loggers:
        logger.log_metrics(metrics, step=step)
        writer = getattr(logger, "experiment", None)
        if writer is None or not hasattr(writer, "add_text"):
            continue
        for i in range(min(n_samples, len(exp))):
            prompt = exp.prompt_texts[i][-300:] if exp.prompt_texts else ""
            text = (f"**reward {float(exp.rewards[i]):.2f}**\n\n    ...{prompt}\n\n    "
                    + exp.response_texts[i].replace("\n", "\n    "))
            writer.add_text(f"samples/{i}", text, step)


# Final values shown beside the hyper-parameters in TensorBoard's HPARAMS tab (besides every val/*).
HPARAM_METRICS = ("reward/mean", "reward/accuracy", "update/kl", "update/entropy", "rollout/response_len_mean")


def write_hparams(loggers, config: dict, last_metrics: dict[str, float], callback_metrics, step: int) -> None:
    """TensorBoard's HPARAMS tab: the run config beside its final metrics.

    Only the hparams summary is written: the metric values shown are the last points of the
    scalar series of the same tags (``reward/mean``, ``val/...``), which the learner and the eval
    callback already logged, so no scalar is written twice. Other loggers get the config alone."""
    from lightning.fabric.loggers.tensorboard import _TENSORBOARD_AVAILABLE
    from lightning.fabric.utilities.logger import _convert_params, _flatten_dict, _sanitize_params

    final = {k: v for k, v in last_metrics.items() if k.startswith(HPARAM_METRICS)}
    final.update({k: float(v) for k, v in callback_metrics.items() if k.startswith("val/")})
    params = _sanitize_params(_flatten_dict(_convert_params(config)))
    for logger in loggers:
        writer = getattr(logger, "experiment", None)
        if _TENSORBOARD_AVAILABLE and hasattr(writer, "_get_file_writer"):
            from torch.utils.tensorboard.summary import hparams

            file_writer = writer._get_file_writer()
            for summary in hparams(params, final):
                file_writer.add_summary(summary, step)
        else:
            logger.log_hyperparams(config)
