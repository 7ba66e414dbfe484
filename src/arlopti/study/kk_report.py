"""``study kk-report``: the K&K mechanism over batches and the pilot's paired accuracy comparisons.

Reads ``mechanism/batch<b>.json`` and ``pilot/<method>/seed<s>/`` (:mod:`.kk`) and writes
``kk_study.json``, ``kk_tables.md``, ``kk_mechanism.png`` and ``kk_pilot.png``:

* mechanism: per method and bucket, each batch's number and their mean (few batches: no CI, the
  per-batch values are listed): the gradient-mass and -norm shares, ‖g_b‖ by bucket, the top bucket's
  A > 0 "rose" fraction per batch (Fig. 3), and a second table of the mean Δp of the A > 0 and A < 0
  tokens and the "rose" fraction in every bucket;
* pilot: per method and seed the final greedy accuracy (``val/kk/mean/greedy/acc`` of the run's
  ``eval_results.json``) and the train reward per step (``csv/metrics.csv``); against GRPO,
  :func:`arlopti.eval.compare.compare` seed by seed and over all seeds at once (each seed's sets
  renamed ``s<seed>/<set>`` in a merged file per method, ``pilot/<method>/merged_eval_results.json``:
  the pairs are (seed, puzzle), McNemar's b and c summed over them). Only seeds that GRPO also has
  are compared.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

from arlopti.plugins.buckets import BUCKET_LABELS, BUCKET_NAMES
from arlopti.study.mechanism import MECHANISM_KEYS

ACC_KEY = "val/kk/mean/greedy/acc"
TOP = BUCKET_NAMES[-1]
#: The per-bucket numbers of a batch file's method entry summarised over the batches (the rest: kept per batch).
PER_BUCKET_KEYS = MECHANISM_KEYS + ("pos_rose", "neg_fell")


def _mean(xs):
    xs = [x for x in xs if x is not None]
    return sum(xs) / len(xs) if xs else None


def mechanism_summary(folder: Path) -> dict | None:
    files = sorted(folder.glob("batch*.json"), key=lambda p: int(p.stem[len("batch"):]))
    if not files:
        return None
    batches = [json.loads(f.read_text()) for f in files]
    methods = list(batches[0]["methods"])
    out = {}
    for m in methods:
        keys = [k for k in batches[0]["methods"][m] if k in PER_BUCKET_KEYS]
        out[m] = {k: {b: {"per_batch": [x["methods"][m][k][b] for x in batches],
                          "mean": _mean([x["methods"][m][k][b] for x in batches])} for b in BUCKET_NAMES}
                  for k in keys}
        out[m]["same_update_as"] = batches[0]["methods"][m].get("same_update_as")
        if "vs_grpo" in batches[0]["methods"][m]:
            out[m]["vs_grpo"] = [x["methods"][m]["vs_grpo"] for x in batches]
    return {"batches": len(batches), "methods": out, "support": [x.get("support") for x in batches],
            "tokens_per_bucket": [x["tokens_per_bucket"] for x in batches],
            "batch": [x["batch"] for x in batches], "seconds": [x["seconds"] for x in batches],
            "advantage_source": [x["advantage_source"] for x in batches], "not_measured": batches[0]["not_measured"]}


def train_rewards(run_dir: Path) -> list[float]:
    """``reward/mean`` per rollout step from the run's ``csv/metrics.csv`` (the learner's log)."""
    with open(run_dir / "csv" / "metrics.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    return [float(r["reward/mean"]) for r in rows if r.get("reward/mean")]


def merged_eval(files: dict[int, Path], path: Path) -> Path:
    """One eval_results.json holding every seed's items, set names prefixed ``s<seed>/``."""
    items = []
    for seed, f in sorted(files.items()):
        for it in json.loads(f.read_text())["items"]:
            items.append({**it, "set": f"s{seed}/{it['set']}"})
    path.write_text(json.dumps({"items": items}))
    return path


def pilot_summary(folder: Path, baseline: str = "grpo") -> dict | None:
    from arlopti.eval.compare import compare

    runs: dict[str, dict[int, Path]] = {}
    for f in sorted(folder.glob("*/seed*/eval_results.json")):
        runs.setdefault(f.parent.parent.name, {})[int(f.parent.name[len("seed"):])] = f.parent
    if baseline not in runs:
        return None
    out = {}
    for m in sorted(runs, key=lambda name: (name != baseline, name)):
        by_seed = runs[m]
        entry = {"seeds": sorted(by_seed),
                 "accuracy": {s: json.loads((d / "eval_results.json").read_text())["metrics"][ACC_KEY]
                              for s, d in sorted(by_seed.items())},
                 "train_reward": {s: train_rewards(d) for s, d in sorted(by_seed.items())},
                 "train_s": {s: json.loads((d / "pilot_run.json").read_text())["train_s"] for s, d in by_seed.items()
                             if (d / "pilot_run.json").exists()}}
        entry["mean_accuracy"] = _mean(list(entry["accuracy"].values()))
        common = sorted(set(by_seed) & set(runs[baseline]))
        if m != baseline and common:
            entry["vs_" + baseline] = {
                "per_seed": {s: compare(runs[baseline][s] / "eval_results.json", by_seed[s] / "eval_results.json")
                             ["modes"]["greedy"][-1] for s in common},
                "pooled": compare(merged_eval({s: runs[baseline][s] / "eval_results.json" for s in common},
                                              folder / baseline / "merged_eval_results.json"),
                                  merged_eval({s: by_seed[s] / "eval_results.json" for s in common},
                                              folder / m / "merged_eval_results.json"))["modes"]["greedy"][-1]}
        out[m] = entry
    return out


# ------------------------------------------------------------------------------------------ tables, figures
def _f(v, fmt="{:.3f}"):
    return "–" if v is None else fmt.format(v)


def mechanism_markdown(mech: dict) -> str:
    top, two = BUCKET_LABELS[-1], f"{BUCKET_LABELS[0]} / {BUCKET_LABELS[-1]}"
    lines = [f"| method | mass share {two} | norm share {two} | ‖g_b‖ {' / '.join(BUCKET_LABELS)} | A>0 rose {top}, "
             f"per batch | mean Δp A>0 {top} | A<0 fell {top} |",
             "|---|---|---|---|---|---|---|"]
    low = BUCKET_NAMES[0]
    for m, e in mech["methods"].items():
        norms = " / ".join(_f(e["bucket_grad_norm"][b]["mean"], "{:.3g}") for b in BUCKET_NAMES)
        rose = ", ".join(_f(v, "{:.2f}") for v in e["pos_frac"][TOP]["per_batch"])
        lines.append(f"| {m} | {_f(e['mass_share'][low]['mean'])} / {_f(e['mass_share'][TOP]['mean'])} | "
                     f"{_f(e['norm_share'][low]['mean'])} / {_f(e['norm_share'][TOP]['mean'])} | {norms} | {rose} | "
                     f"{_f(e['delta_p_pos_mean'][TOP]['mean'], '{:+.2e}')} | {_f(e['neg_frac'][TOP]['mean'], '{:.2f}')} |")
    return "\n".join(lines)


def _count(k: int, noun: str) -> str:
    return f"{k} {noun}" + ("" if k == 1 else "s")


def counts_markdown(mech: dict) -> str:
    """The counts behind the top bucket's A > 0 "rose" fraction, batch by batch (the batch files' ``support``,
    ``pos_rose`` and ``vs_grpo``, :mod:`arlopti.analysis.direction_counts`), and the batches as the unit: in
    how many batches the method raised more of these tokens than GRPO, and in how many fewer."""
    sup = mech["support"]
    n = "; ".join(f"batch {i}: {_count(s['pos']['tokens'][TOP], 'token')}, "
                  f"{_count(s['pos']['responses'][TOP], 'response')}, {_count(s['pos']['groups'][TOP], 'group')}"
                  for i, s in enumerate(sup))
    lines = [f"A > 0 tokens in {BUCKET_LABELS[-1]}: {n}.\n",
             f"| method | rose k / n, per batch | discordant tokens vs grpo: this only / grpo only, per batch | "
             f"responses more / fewer / as many rose as under grpo, per batch | batches more / fewer than grpo |",
             "|---|---|---|---|---|"]
    for m, e in mech["methods"].items():
        if "pos_rose" not in e:
            continue
        ks = e["pos_rose"][TOP]["per_batch"]
        rose = ", ".join(f"{k} / {s['pos']['tokens'][TOP]}" for k, s in zip(ks, sup))
        vs = [v["pos"][TOP] for v in e.get("vs_grpo", [])]
        disc = ", ".join(f"{v['this_only']} / {v['base_only']}" for v in vs) or "–"
        resp = ", ".join(f"{v['responses_more']} / {v['responses_fewer']} / {v['responses_same']}" for v in vs) or "–"
        base = mech["methods"]["grpo"]["pos_rose"][TOP]["per_batch"] if "grpo" in mech["methods"] else None
        sign = (f"{sum(k > g for k, g in zip(ks, base))} / {sum(k < g for k, g in zip(ks, base))} of {len(ks)}"
                if base and m != "grpo" else "–")
        lines.append(f"| {m} | {rose} | {disc} | {resp} | {sign} |")
    return "\n".join(lines)


PER_TOKEN_NOTE = ("\nThe direction fractions and mean Δp are per token: the tokens of a batch are not independent "
                  "samples (one shared update; a response's tokens share its advantage). Their counts, and the "
                  "responses and groups behind them, are in the counts table below.")
COUNTS_NOTE = ("\nThe tokens of a batch move under one shared update, and those of a response share its advantage: "
               "they are not independent samples, and a token-level standard error would overstate what a batch "
               "shows. The units are the responses and the batches.")


def delta_p_markdown(mech: dict) -> str:
    """Δp by bucket: per method the mean Δp of the A > 0 and of the A < 0 tokens and the A > 0 "rose"
    fraction in each bucket (means over the batches; ``delta_p_pos_mean`` etc. of compare-methods)."""
    span = " / ".join(BUCKET_LABELS)
    lines = [f"| method | mean Δp A>0 {span} | mean Δp A<0 {span} | A>0 rose {span} |", "|---|---|---|---|"]
    for m, e in mech["methods"].items():
        keys = (("delta_p_pos_mean", "{:+.2e}"), ("delta_p_neg_mean", "{:+.2e}"), ("pos_frac", "{:.2f}"))
        cols = [" / ".join(_f(e[key][b]["mean"], fmt) for b in BUCKET_NAMES) for key, fmt in keys]
        lines.append(f"| {m} | " + " | ".join(cols) + " |")
    return "\n".join(lines)


def pilot_markdown(pilot: dict, baseline: str = "grpo") -> str:
    lines = [f"| method | greedy accuracy per seed | mean | pooled Δ vs {baseline} [95% CI] | McNemar p "
             f"({baseline} only / method only) | per-seed Δ |", "|---|---|---|---|---|---|"]
    for m, e in pilot.items():
        accs = ", ".join(f"s{s}: {a:.3f}" for s, a in e["accuracy"].items())
        v = e.get("vs_" + baseline)
        if v is None:
            lines.append(f"| {m} | {accs} | {_f(e['mean_accuracy'])} | – | – | – |")
            continue
        p = v["pooled"]
        mc = p["mcnemar"]
        per = ", ".join(f"{r['diff']:+.3f}" for r in v["per_seed"].values())
        lines.append(f"| {m} | {accs} | {_f(e['mean_accuracy'])} | {p['diff']:+.3f} [{p['ci95'][0]:+.3f}, "
                     f"{p['ci95'][1]:+.3f}] | {mc['p']:.3g} ({mc['a_only']} / {mc['b_only']}) | {per} |")
    return "\n".join(lines)


def plot_kk(mech: dict | None, pilot: dict | None):
    """Left: the top bucket's A > 0 'rose' fraction per method and batch (Fig. 3); middle: ‖g_b‖ by bucket
    (mean over batches); right, when the pilot ran: its train reward per step, one line per run."""
    from arlopti.study.figures import bucket_bars, plt

    panels = 3 if pilot else 2  # no empty panel for a pilot that did not run
    fig, axes = plt.subplots(1, panels, figsize=(17 * panels / 3, 4.4))
    if mech:
        names = list(mech["methods"])
        for i, m in enumerate(names):
            vals = mech["methods"][m]["pos_frac"][TOP]["per_batch"]
            axes[0].plot([i] * len(vals), vals, "o", color="black" if m == "grpo" else "tab:blue", alpha=0.7)
        axes[0].set_xticks(range(len(names)), names, rotation=60, fontsize=7)
        axes[0].axhline(0.5, color="gray", ls="--", lw=0.8)
        axes[0].set_title(f"{BUCKET_LABELS[-1]}: A > 0 tokens whose p rose, each batch", fontsize=9)
        bucket_bars(axes[1], {m: [e["bucket_grad_norm"][b]["mean"] or 0.0 for b in BUCKET_NAMES]
                        for m, e in mech["methods"].items()}, "‖g_b‖ of each method's loss by bucket", "norm")
        axes[1].legend(fontsize=6, ncol=2)
    if pilot:
        cmap = plt.get_cmap("tab10")
        for i, (m, e) in enumerate(pilot.items()):
            for j, (s, r) in enumerate(e["train_reward"].items()):
                axes[2].plot(range(1, len(r) + 1), r, color=cmap(i), alpha=0.8, label=m if j == 0 else None)
        axes[2].set_xlabel("rollout step")
        axes[2].set_title("pilot: train reward per step (one line per seed)", fontsize=9)
        axes[2].legend(fontsize=7)
    fig.tight_layout()
    return fig


def kk_report(args) -> dict:
    from arlopti.study.figures import save

    out = Path(args.out)
    mech = mechanism_summary(out / "mechanism")
    pilot = pilot_summary(out / "pilot")
    md = ["# Study, K&K at CPU scale (SmolLM2-135M-Instruct after the demo's cold start)\n"]
    if mech:
        md += [f"## Mechanism: every method's first update on the same {mech['batches']} batches\n",
               mechanism_markdown(mech), PER_TOKEN_NOTE, "\n### Δp by probability bucket (mean over the batches)\n",
               delta_p_markdown(mech)]
        if any(mech["support"]):
            md += [f"\n### The counts behind the A>0 rose fraction in {BUCKET_LABELS[-1]}\n", counts_markdown(mech),
                   COUNTS_NOTE]
    if pilot:
        md += ["\n## Learning pilot: final greedy validation accuracy, paired by puzzle\n", pilot_markdown(pilot)]
    png = Path(save(plot_kk(mech, pilot), out / "kk_study.png")).name  # no machine path
    result = {"mechanism": mech, "pilot": pilot, "files": {"png": png}}
    (out / "kk_study.json").write_text(json.dumps(result, indent=1, default=str) + "\n")
    (out / "kk_tables.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))
    return result
