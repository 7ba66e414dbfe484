"""The study's tables: from each run's ``steps.jsonl`` rows and each seed's mechanism, per method.

Per run (one method, one seed; ``rows`` = its steps in order):

* ``final``: the mean reward of the last ``final_window`` rollout steps; ``auc``: the mean reward over
  all steps (the area under the curve per step);
* ``steps_to_threshold``: :func:`arlopti.study.stats.steps_to_threshold` (censored runs
  counted at steps + 1 and reported);
* the in-training Fig. 3 numbers per bucket, pooled over the run's steps: the A > 0 tokens whose
  probability rose after their step's update (Σ pos_up / Σ pos_total), the A < 0 tokens that fell,
  the mean Δp of A > 0 and of A < 0 tokens, and the share of the run's signed tokens in each bucket.

Per method: each of those as :func:`~arlopti.study.stats.mean_ci` over seeds; against GRPO
(the seeds are the pairs) :func:`~arlopti.study.stats.paired` of ``final``, ``auc``,
``steps_to_threshold`` and ``top_pos_rose`` (the in-training A > 0 "rose" fraction of the top bucket, Fig. 3); and the first-step mechanism (:mod:`arlopti.study.mechanism`) per
bucket, :func:`mean_ci` over seeds. :func:`markdown_tables` renders the headline columns.
"""

from __future__ import annotations

from arlopti.algorithms.buckets import BUCKET_LABELS, BUCKET_NAMES, NUM_BUCKETS
from arlopti.study.stats import curve_bands, mean_ci, paired, steps_to_threshold

TOP, LOW = BUCKET_NAMES[-1], BUCKET_NAMES[0]
TOP_LABEL, LOW_LABEL = BUCKET_LABELS[-1], BUCKET_LABELS[0]


def _ratio(num: float, den: float) -> float | None:
    return num / den if den > 0 else None


def run_summary(rows: list[dict], threshold: float, final_window: int = 5, threshold_window: int = 3) -> dict:
    """The per-run numbers of the module docstring."""
    rewards = [r["reward/mean"] for r in rows]
    step, reached = steps_to_threshold(rewards, threshold, threshold_window)
    sums = {k: [sum(r[k][b] for r in rows) for b in range(NUM_BUCKETS)]
            for k in ("pos_up", "pos_total", "neg_down", "neg_total", "dp_pos_sum", "dp_neg_sum")}
    signed = [sums["pos_total"][b] + sums["neg_total"][b] for b in range(NUM_BUCKETS)]
    total = sum(signed)
    per_bucket = {
        "pos_rose": [_ratio(sums["pos_up"][b], sums["pos_total"][b]) for b in range(NUM_BUCKETS)],
        "neg_fell": [_ratio(sums["neg_down"][b], sums["neg_total"][b]) for b in range(NUM_BUCKETS)],
        "dp_pos_mean": [_ratio(sums["dp_pos_sum"][b], sums["pos_total"][b]) for b in range(NUM_BUCKETS)],
        "dp_neg_mean": [_ratio(sums["dp_neg_sum"][b], sums["neg_total"][b]) for b in range(NUM_BUCKETS)],
        "token_share": [_ratio(signed[b], total) for b in range(NUM_BUCKETS)],
    }
    return {"rewards": rewards, "final": sum(rewards[-final_window:]) / len(rewards[-final_window:]),
            "auc": sum(rewards) / len(rewards), "steps_to_threshold": step, "reached": reached,
            "in_training": per_bucket}


def method_table(runs: dict[str, dict[int, dict]], seeds: list[int], baselines: tuple[str, ...] = ("grpo",)) -> dict:
    """``{method: {...}}`` from ``runs[method][seed]`` = :func:`run_summary` (module docstring); the paired
    comparisons against each of ``baselines`` present in ``runs`` (``vs_<baseline>``)."""
    out = {}
    for method, by_seed in runs.items():
        rs = [by_seed[s] for s in seeds]
        entry = {"final": mean_ci([r["final"] for r in rs]), "auc": mean_ci([r["auc"] for r in rs]),
                 "steps_to_threshold": mean_ci([r["steps_to_threshold"] for r in rs]),
                 "reached": sum(r["reached"] for r in rs), "seeds": len(rs),
                 "curve": curve_bands([r["rewards"] for r in rs]),
                 "in_training": {k: {BUCKET_NAMES[b]: mean_ci([r["in_training"][k][b] for r in rs])
                                     for b in range(NUM_BUCKETS)} for k in rs[0]["in_training"]}}
        for baseline in (b for b in baselines if b in runs and b != method):
            base = runs[baseline]
            vs = {key: paired([r[key] for r in rs], [base[s][key] for s in seeds])
                  for key in ("final", "auc", "steps_to_threshold")}
            vs["top_pos_rose"] = paired([r["in_training"]["pos_rose"][-1] for r in rs],
                                        [base[s]["in_training"]["pos_rose"][-1] for s in seeds])
            entry["vs_" + baseline] = vs
        out[method] = entry
    return out


def mechanism_table(per_seed: list[dict]) -> dict:
    """``{method: {key: {bucket: mean_ci over seeds}}}`` from :func:`seed_mechanism` results."""
    methods = list(per_seed[0]["methods"]) if per_seed else []
    out = {}
    for m in methods:
        keys = per_seed[0]["methods"][m]
        out[m] = {k: {b: mean_ci([s["methods"][m][k][b] for s in per_seed]) for b in BUCKET_NAMES} for k in keys}
    tokens = {b: mean_ci([s["tokens_per_bucket"][b] for s in per_seed]) for b in BUCKET_NAMES} if per_seed else {}
    return {"methods": out, "tokens_per_bucket": tokens,
            "not_measured": per_seed[0]["not_measured"] if per_seed else []}


# ------------------------------------------------------------------------------------------ markdown
def _ci(c: dict, fmt: str = "{:.3f}") -> str:
    if c["mean"] is None:
        return "–"
    return f"{fmt.format(c['mean'])} [{fmt.format(c['ci95'][0])}, {fmt.format(c['ci95'][1])}]"


def learning_markdown(table: dict, threshold: float, baseline: str = "grpo") -> str:
    lines = [f"| method | final reward | Δ final vs {baseline} | wins / losses | sign-test p | Δ AUC vs {baseline} "
             f"| steps to {threshold:g} (reached) | Δ steps vs {baseline} |", "|---|---|---|---|---|---|---|---|"]
    for m, e in table.items():
        v = e.get("vs_" + baseline)
        steps = f"{_ci(e['steps_to_threshold'], '{:.1f}')} ({e['reached']}/{e['seeds']})"
        if v is None and m != baseline:
            continue
        if v is None:
            lines.append(f"| {m} | {_ci(e['final'])} | – | – | – | – | {steps} | – |")
            continue
        f, a, s = v["final"], v["auc"], v["steps_to_threshold"]
        lines.append(f"| {m} | {_ci(e['final'])} | {_ci(f, '{:+.3f}')} | {f['wins']} / {f['losses']} | "
                     f"{f['sign_test_p']:.3g} | {_ci(a, '{:+.3f}')} | {steps} | {_ci(s, '{:+.1f}')} |")
    return "\n".join(lines)


def in_training_markdown(table: dict) -> str:
    head = " | ".join(BUCKET_LABELS)
    lines = [f"| method | A>0 rose: {head} | Δ A>0 rose {TOP_LABEL} vs grpo | mean Δp A>0 {TOP_LABEL} | "
             f"A<0 fell {TOP_LABEL} | token share {TOP_LABEL} |", "|---|" + "---|" * (NUM_BUCKETS + 4)]
    for m, e in table.items():
        t = e["in_training"]
        rose = " | ".join(_ci(t["pos_rose"][b], "{:.2f}") for b in BUCKET_NAMES)
        vs = e.get("vs_grpo", {}).get("top_pos_rose")
        lines.append(f"| {m} | {rose} | {_ci(vs, '{:+.3f}') if vs else '–'} | {_ci(t['dp_pos_mean'][TOP], '{:+.4f}')} "
                     f"| {_ci(t['neg_fell'][TOP], '{:.2f}')} | {_ci(t['token_share'][TOP], '{:.2f}')} |")
    return "\n".join(lines)


def mechanism_markdown(mech: dict) -> str:
    span = f"{LOW_LABEL} / {TOP_LABEL}"
    lines = [f"| method | weight vs GRPO {TOP_LABEL} | mass share {span} | norm share {span} | ‖g_b‖ {span} "
             f"| A>0 rose {TOP_LABEL} | mean Δp A>0 {TOP_LABEL} |", "|---|---|---|---|---|---|---|"]
    for m, e in mech["methods"].items():
        def two(key, fmt="{:.3f}", e=e):
            return f"{_ci(e[key][LOW], fmt)} / {_ci(e[key][TOP], fmt)}"

        lines.append(f"| {m} | {_ci(e['effective_weight'][TOP])} | {two('mass_share')} | {two('norm_share')} | "
                     f"{two('bucket_grad_norm')} | {_ci(e['pos_frac'][TOP], '{:.2f}')} | "
                     f"{_ci(e['delta_p_pos_mean'][TOP], '{:+.4f}')} |")
    return "\n".join(lines)
