"""Matplotlib figures (Agg backend, PNG) for every analysis command, plus result files and TensorBoard.

Each ``plot_*`` function takes the JSON-ready result dict its command produced and returns a
figure; :func:`save_result` writes ``<out>/<name>.png`` and ``<out>/<name>.json`` and, when a
TensorBoard folder is given, the result's scalars (tag ``analysis/<name>/<path>``) and the figure.
Missing values (empty buckets) are drawn as gaps, never as zeros.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from arlopti.plugins.buckets import BUCKET_EDGES, BUCKET_LABELS, BUCKET_NAMES  # noqa: E402

_COLORS = {"grpo": "#4c72b0", "ar": "#dd8452", "lopti": "#55a868", "ar_lopti": "#c44e52",
           "all": "#4c72b0", "low": "#dd8452", "high": "#55a868"}


def bucket_values(d: dict) -> list[float]:
    return [math.nan if d.get(n) is None else d[n] for n in BUCKET_NAMES]


def grouped_bars(ax, series: dict[str, list[float]], ylabel: str, title: str, hline: float | None = None) -> None:
    k = max(1, len(series))
    width = 0.8 / k
    for i, (name, vals) in enumerate(series.items()):
        xs = [b + (i - (k - 1) / 2) * width for b in range(len(BUCKET_NAMES))]
        ax.bar(xs, vals, width=width, label=name, color=_COLORS.get(name))
    ax.set_xticks(range(len(BUCKET_NAMES)), BUCKET_LABELS)
    ax.set_xlabel("token probability p_old")
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    if hline is not None:
        ax.axhline(hline, color="grey", lw=0.8, ls="--")
    ax.legend(fontsize=8)


def caption_under(fig, text: str) -> None:
    fig.text(0.01, 0.005, text, fontsize=7, color="dimgray", ha="left", va="bottom", wrap=True)


def plot_grad_norms(result: dict):
    """Per-token norms against (1 − p) with the bounds, and the per-bucket medians / aggregate norms."""
    recs = result.get("per_token", {}).get("records", [])
    agg = result.get("aggregate")
    fig, axes = plt.subplots(1, 4 if agg else 3, figsize=(18 if agg else 14, 4.2))
    if recs:
        x = [r["one_minus_p"] for r in recs]
        lim = [max(min(x), 1e-12), 1.0]  # the bound lines span the data
        ax = axes[0]
        ax.scatter(x, [r["logit_norm"] for r in recs], s=9, label="autograd ‖∂log p/∂z‖")
        ax.plot(lim, lim, "k--", lw=0.8, label="1 − p")
        ax.plot(lim, [math.sqrt(2) * v for v in lim], "k:", lw=0.8, label="√2 (1 − p)")
        ax.set(xscale="log", yscale="log", xlabel="1 − p", ylabel="norm", title="logits (tempered)")
        ax.legend(fontsize=7)
        for ax, key, name in ((axes[1], "hidden_norm", f"hidden states, layer {result['per_token']['summary']['layer']}"),
                              (axes[2], "param_norm", "all parameters")):
            ys = [r[key] for r in recs]
            ax.scatter(x, ys, s=9, c=[r["bucket"] for r in recs], cmap="viridis", vmin=0, vmax=3)
            pos = [(a, b) for a, b in zip(x, ys) if a > 1e-6]
            if pos:
                c = max(b / a for a, b in pos)
                ax.plot(lim, [c * v for v in lim], "k--", lw=0.8, label=f"{c:.3g}·(1 − p) (max ratio)")
                ax.legend(fontsize=7)
            ax.set(xscale="log", yscale="log", xlabel="1 − p", ylabel="‖∂ log p / ∂·‖", title=name)
    else:
        axes[0].text(0.5, 0.5, "no per-token records", ha="center")
    if agg:
        grouped_bars(axes[3], {"aggregate": bucket_values(agg["grad_norm"])}, "‖∇θ L_bucket‖",
                      "aggregate mode: GRPO loss with A kept in one bucket")
        axes[3].set_yscale("log")
    fig.suptitle("Gradient norm vs token probability (paper Fig. 1d)", fontsize=11)
    caption_under(fig, result.get("caption", ""))
    fig.tight_layout(rect=(0, 0.04, 1, 0.95))
    return fig


def plot_token_distribution(result: dict):
    """Fig. 1(a): histogram of p with the bucket shares; Fig. 1(b): advantages per bucket (box plots)."""
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.2))
    bins = result["bins"]
    total = max(1, result["tokens"])
    axes[0].bar([(i + 0.5) / bins for i in range(bins)], [c / total for c in result["histogram"]],
                width=1 / bins, color="#4c72b0", edgecolor="white")
    for edge in BUCKET_EDGES[1:-1]:
        axes[0].axvline(edge, color="grey", lw=0.8, ls="--")
    for b, name in enumerate(BUCKET_NAMES):
        f = result["fraction"][name]
        axes[0].text((BUCKET_EDGES[b] + BUCKET_EDGES[b + 1]) / 2, 0.97, f"{BUCKET_LABELS[b]}\n{100 * f:.0f}%" if f is not None else "–",
                     ha="center", va="top", fontsize=8, transform=axes[0].get_xaxis_transform())
    axes[0].set(xlabel="sampled-token probability p_old", ylabel="share of tokens", xlim=(0, 1),
                title=f"token probabilities, {result['tokens']} tokens (paper Fig. 1a)")
    stats, pos = [], []
    for b, name in enumerate(BUCKET_NAMES):
        q = result["adv_quantiles"][name]
        if q is not None:
            stats.append({"whislo": q[0], "q1": q[1], "med": q[2], "q3": q[3], "whishi": q[4],
                          "mean": result["adv_mean"][name], "label": BUCKET_LABELS[b], "fliers": []})
            pos.append(b)
    if stats:
        axes[1].bxp(stats, positions=pos, showmeans=True)
    axes[1].set_xticks(range(len(BUCKET_NAMES)), BUCKET_LABELS)
    axes[1].axhline(0, color="grey", lw=0.8)
    axes[1].set(xlabel="token probability p_old", ylabel="advantage A (whiskers 5–95%)",
                title="advantages per bucket (paper Fig. 1b)")
    caption_under(fig, result.get("caption", ""))
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    return fig


def plot_grad_norm_medians(result: dict):
    """Median per-token norm per bucket (log scale), the direct analogue of Fig. 1d."""
    s = result["per_token"]["summary"]
    fig, ax = plt.subplots(figsize=(6, 4))
    grouped_bars(ax, {"params": bucket_values(s["median"]["param_norm"]), "hidden": bucket_values(s["median"]["hidden_norm"]),
                       "logits": bucket_values(s["median"]["logit_norm"])}, "median ‖∂ log p / ∂·‖",
                  "per-token gradient norm by bucket")
    ax.set_yscale("log")
    caption_under(fig, result.get("caption", ""))
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    return fig


def plot_prob_shift(result: dict):
    """Mean Δp of positive/negative tokens and mean |Δp| per bucket, for all / low / high updates."""
    v = result["variants"]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    for ax, key, title in ((axes[0], "delta_p_pos_mean", "mean Δp, A > 0 tokens"),
                           (axes[1], "delta_p_neg_mean", "mean Δp, A < 0 tokens"),
                           (axes[2], "abs_delta_p_mean", "mean |Δp|, all tokens")):
        grouped_bars(ax, {f"{n} (r={v[n]['corr_with_all']:.2f})" if v[n]["corr_with_all"] is not None else n:
                           bucket_values(v[n][key]) for n in v}, "Δp", title, hline=0.0)
    fig.suptitle(f"Δp after one {result['optimizer'].upper()} step (lr {result['lr']:g}) updating all / "
                 f"only {BUCKET_LABELS[0]} / only {BUCKET_LABELS[-1]} tokens (paper Fig. 1c, 1e, 1f)", fontsize=11)
    caption_under(fig, result.get("caption", ""))
    fig.tight_layout(rect=(0, 0.04, 1, 0.94))
    return fig


def plot_update_direction(result: dict):
    m = result["methods"]
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.2))
    grouped_bars(axes[0], {k: bucket_values(v["pos_frac"]) for k, v in m.items()}, "fraction",
                  "A > 0 tokens whose probability rose", hline=0.5)
    grouped_bars(axes[1], {k: bucket_values(v["neg_frac"]) for k, v in m.items()}, "fraction",
                  "A < 0 tokens whose probability fell", hline=0.5)
    for ax in axes:
        ax.set_ylim(0, 1.05)
    fig.suptitle(f"Update direction after one step ({result['optimizer'].upper()}, lr {result['lr']:g}; "
                 f"AR α={result['alpha']}, Lopti η={result['eta']}) (paper Fig. 3)", fontsize=11)
    caption_under(fig, result.get("caption", ""))
    fig.tight_layout(rect=(0, 0.04, 1, 0.94))
    return fig


def plot_word_categories(result: dict, paper_signs: dict[str, int] | None = None):
    cats = result["categories"]
    names = list(cats)
    rs = [math.nan if cats[c]["r_rate"] is None else cats[c]["r_rate"] for c in names]
    fig, ax = plt.subplots(figsize=(8, 4.2))
    colors = ["#55a868" if (r == r and r >= 0) else "#c44e52" for r in rs]
    ax.bar(range(len(names)), rs, color=colors)
    for i, c in enumerate(names):
        ci = cats[c]["ci95"]
        if ci:
            ax.plot([i, i], ci, color="k", lw=1)
        if paper_signs and c in paper_signs:
            ax.text(i, 1.02, "paper: +" if paper_signs[c] > 0 else "paper: −", ha="center", fontsize=8)
        if cats[c]["r_rate"] is None:
            ax.text(i, 0.02, "absent", ha="center", fontsize=8, rotation=90)
    ax.axhline(0, color="grey", lw=0.8)
    ax.set_xticks(range(len(names)), names, rotation=20)
    ax.set_ylim(-1, 1.12)
    ax.set_ylabel("Pearson r (rate per 100 words vs reward)")
    ax.set_title(f"Reasoning-word categories vs reward, {result['responses']} responses (paper Fig. 5)", fontsize=10)
    caption_under(fig, result.get("caption", ""))
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    return fig


def _scalars(obj, prefix: str = "") -> dict[str, float]:
    """Flatten nested dicts of numbers into ``{"a/b/c": value}`` (lists and strings skipped)."""
    out: dict[str, float] = {}
    if isinstance(obj, dict):
        for k, v in obj.items():
            out.update(_scalars(v, f"{prefix}/{k}" if prefix else str(k)))
    elif isinstance(obj, bool):
        out[prefix] = float(obj)
    elif isinstance(obj, (int, float)) and not (isinstance(obj, float) and math.isnan(obj)):
        out[prefix] = float(obj)
    return out


def save_result(out_dir: str | Path, name: str, result: dict, fig=None, tb_dir: str | Path | None = None,
                extra_figs: dict | None = None) -> dict[str, str]:
    """Write ``<name>.json`` (and ``<name>.png``, and each extra figure ``<key>.png``); returns the paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"json": str(out / f"{name}.json")}
    (out / f"{name}.json").write_text(json.dumps(result, indent=1, default=str) + "\n")
    figs = {name: fig} if fig is not None else {}
    figs.update(extra_figs or {})
    for key, f in figs.items():
        f.savefig(out / f"{key}.png", dpi=110)
        paths[key] = str(out / f"{key}.png")
    if tb_dir is not None:
        from torch.utils.tensorboard import SummaryWriter

        writer = SummaryWriter(str(tb_dir))
        for tag, value in _scalars({k: v for k, v in result.items() if k != "records"}).items():
            if "/records/" not in tag:
                writer.add_scalar(f"analysis/{name}/{tag}", value, 0)
        for key, f in figs.items():
            writer.add_figure(f"analysis/{key}", f, 0, close=False)
        writer.close()
    for f in figs.values():
        plt.close(f)
    return paths
