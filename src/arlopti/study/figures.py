"""The study's figures (small PNGs, 128 colours): reward curves with CI bands, paired differences,
mechanism by bucket."""

from __future__ import annotations

import math

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from arlopti.plugins.buckets import BUCKET_LABELS, BUCKET_NAMES

DPI = 80
#: The paper's methods and their step-matched controls (dashed), drawn in the first panel of the curves; the
#: others in the second.
PAPER_METHODS = ("grpo", "ar", "lopti", "ar_lopti", "grpo_two_steps", "ar_two_steps")
CONTROLS = ("grpo_two_steps", "ar_two_steps")


def _nan(v):
    return math.nan if v is None else v


def plot_curves(table: dict, caption: str = ""):
    """Mean reward per rollout step with its 95% bootstrap band over seeds; GRPO in both panels."""
    others = [m for m in table if m not in PAPER_METHODS]
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.2), sharey=True)
    for ax, names, title in ((axes[0], [m for m in PAPER_METHODS if m in table],
                              "GRPO, the paper's methods and the step-matched controls (dashed)"),
                             (axes[1], ["grpo", *others], "GRPO and the other methods")):
        cmap = plt.get_cmap("tab20")
        for i, m in enumerate(names):
            c = table[m]["curve"]
            xs = list(range(1, len(c["mean"]) + 1))
            color = "black" if m == "grpo" else cmap(i % 20)
            ax.plot(xs, c["mean"], label=m, color=color, lw=1.6 if m == "grpo" else 1.1,
                    ls="--" if m in CONTROLS else "-")
            ax.fill_between(xs, [_nan(v) for v in c["lo"]], [_nan(v) for v in c["hi"]], color=color, alpha=0.12)
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("rollout step")
        ax.legend(fontsize=7, ncol=2)
    axes[0].set_ylabel("mean reward (95% bootstrap CI over seeds)")
    fig.text(0.01, 0.005, caption, fontsize=7, color="dimgray")
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    return fig


def plot_paired(table: dict, baseline: str = "grpo", caption: str = ""):
    """Per method, the mean paired difference to the baseline with its 95% CI: final reward and steps."""
    names = [m for m in table if m != baseline]
    fig, axes = plt.subplots(1, 2, figsize=(11, 0.45 * len(names) + 1.6))
    for ax, key, label in ((axes[0], "final", "Δ final reward"), (axes[1], "steps_to_threshold", "Δ steps to threshold")):
        for y, m in enumerate(names):
            d = table[m]["vs_" + baseline][key]
            lo, hi = d["ci95"]
            ax.plot([lo, hi], [y, y], color="gray")
            ax.plot([d["mean"]], [y], "o", color="tab:blue")
        ax.axvline(0, color="black", lw=0.8)
        ax.set_yticks(range(len(names)), names)
        ax.set_title(f"{label}, method − {baseline} by seed (95% CI)", fontsize=9)
        ax.invert_yaxis()
    fig.text(0.01, 0.005, caption, fontsize=7, color="dimgray")
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    return fig


def bucket_bars(ax, series: dict[str, list[float]], title: str, ylabel: str, hline: float | None = None) -> None:
    k = max(1, len(series))
    width = 0.8 / k
    cmap = plt.get_cmap("tab20")
    for i, (name, vals) in enumerate(series.items()):
        xs = [b + (i - (k - 1) / 2) * width for b in range(len(BUCKET_NAMES))]
        ax.bar(xs, vals, width=width, label=name, color="black" if name == "grpo" else cmap(i % 20))
    ax.set_xticks(range(len(BUCKET_NAMES)), BUCKET_LABELS)
    ax.set_title(title, fontsize=9)
    ax.set_ylabel(ylabel)
    if hline is not None:
        ax.axhline(hline, color="gray", lw=0.8, ls="--")


def plot_mechanism(table: dict, mech: dict | None, caption: str = ""):
    """In training: A > 0 tokens that rose and the mean Δp of A > 0 tokens; first step: the gradient-mass
    and gradient-norm shares; all by bucket, means over seeds."""
    def series(src: dict, key: str) -> dict[str, list[float]]:
        return {m: [_nan(e[key][b]["mean"]) for b in BUCKET_NAMES] for m, e in src.items()}

    fig, axes = plt.subplots(2, 2, figsize=(15, 8))
    train = {m: e["in_training"] for m, e in table.items()}
    bucket_bars(axes[0, 0], series(train, "pos_rose"), "in training: A > 0 tokens whose p rose (pooled over steps)",
          "fraction", hline=0.5)
    bucket_bars(axes[0, 1], series(train, "dp_pos_mean"), "in training: mean Δp of A > 0 tokens", "Δp")
    if mech and mech["methods"]:
        bucket_bars(axes[1, 0], series(mech["methods"], "mass_share"), "first step: gradient-mass share Σ|c·A|(1 − p)",
              "share")
        bucket_bars(axes[1, 1], series(mech["methods"], "norm_share"), "first step: share of the gradient ⟨g_b, g⟩/‖g‖²",
              "share")
    axes[0, 0].legend(fontsize=7, ncol=3)
    fig.text(0.01, 0.005, caption, fontsize=7, color="dimgray")
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    return fig


def save(fig, path) -> str:
    """Write ``fig`` as a PNG of at most 128 colours (a third of the size, for docs/figures/study/)."""
    import io

    from PIL import Image

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI)
    plt.close(fig)
    buf.seek(0)
    Image.open(buf).convert("RGB").quantize(colors=128, method=Image.Quantize.MEDIANCUT).save(path, optimize=True)
    return str(path)
