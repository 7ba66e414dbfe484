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

from arlopti.plugins.buckets import BUCKET_LABELS, BUCKET_NAMES, NUM_BUCKETS
from arlopti.study.mechanism import MECHANISM_KEYS
from arlopti.study.stats import adjusted_ci, bonferroni, curve_bands, mean_ci, paired, steps_to_threshold

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
    """``{method: {key: {bucket: mean_ci over seeds}}}`` from :func:`seed_mechanism` results, for each of
    :data:`~arlopti.study.mechanism.MECHANISM_KEYS`; with the counts (files that have them):
    ``top_counts`` (:func:`top_bucket_counts`) and ``top_rose_vs_grpo``, the top bucket's first-step A > 0
    "rose" fraction paired against GRPO's by seed (:func:`~arlopti.study.stats.paired`: the seed is the unit)."""
    methods = list(per_seed[0]["methods"]) if per_seed else []
    out = {}
    for m in methods:
        keys = [k for k in MECHANISM_KEYS if k in per_seed[0]["methods"][m]]
        out[m] = {k: {b: mean_ci([s["methods"][m][k][b] for s in per_seed]) for b in BUCKET_NAMES} for k in keys}
        if "pos_rose" in per_seed[0]["methods"][m]:
            out[m]["top_counts"] = top_bucket_counts(per_seed, m)
        if m != "grpo" and "grpo" in methods:
            out[m]["top_rose_vs_grpo"] = paired([s["methods"][m]["pos_frac"][TOP] for s in per_seed],
                                                [s["methods"]["grpo"]["pos_frac"][TOP] for s in per_seed])
    tokens = {b: mean_ci([s["tokens_per_bucket"][b] for s in per_seed]) for b in BUCKET_NAMES} if per_seed else {}
    return {"methods": out, "tokens_per_bucket": tokens,
            "not_measured": per_seed[0]["not_measured"] if per_seed else []}


def top_bucket_counts(per_seed: list[dict], method: str) -> dict:
    """The top bucket's A > 0 counts of ``method``'s first step, summed over the seeds: ``rose`` of ``tokens``,
    the ``responses`` and ``groups`` they come from, and against GRPO (when measured) the discordant tokens
    (``this_only`` / ``grpo_only``) and the responses that raised more / fewer of their tokens
    (:mod:`arlopti.analysis.direction_counts`). Descriptive: tokens of one seed share one update."""
    def total(get):
        return sum(get(s) for s in per_seed)

    out = {"rose": total(lambda s: s["methods"][method]["pos_rose"][TOP]),
           "tokens": total(lambda s: s["support"]["pos"]["tokens"][TOP]),
           "responses": total(lambda s: s["support"]["pos"]["responses"][TOP]),
           "groups": total(lambda s: s["support"]["pos"]["groups"][TOP])}
    if "vs_grpo" in per_seed[0]["methods"][method]:
        for key, name in (("this_only", "this_only"), ("base_only", "grpo_only"), ("responses_more", "responses_more"),
                          ("responses_fewer", "responses_fewer")):
            out[name] = total(lambda s, key=key: s["methods"][method]["vs_grpo"]["pos"][TOP][key])
    return out


# ------------------------------------------------------------------------------------------ the step-matched control
#: (method, its step-matched control): the comparisons the control exists for (issue 51); one family.
CONTROL_PAIRS = (("lopti", "grpo_two_steps"), ("ar_lopti", "ar_two_steps"))
#: (control, the one-step method it extends): what the second step alone does; a second family.
SECOND_STEP_PAIRS = (("grpo_two_steps", "grpo"), ("ar_two_steps", "ar"))
CONTROL_KEYS = ("steps_to_threshold", "auc", "final")


def control_table(runs: dict[str, dict[int, dict]], seeds: list[int], pairs=CONTROL_PAIRS) -> list[dict]:
    """One row per pair of ``pairs`` whose two methods are in ``runs``: for each of :data:`CONTROL_KEYS`,
    :func:`~arlopti.study.stats.paired` (method − control by seed) with the Bonferroni-adjusted sign-test p
    and the family-wise CI (:func:`~arlopti.study.stats.adjusted_ci`), the family being every test of the
    table (rows x keys)."""
    present = [(m, c) for m, c in pairs if m in runs and c in runs]
    tests = len(present) * len(CONTROL_KEYS)
    rows = []
    for m, c in present:
        row = {"method": m, "control": c, "comparisons": tests}
        for key in CONTROL_KEYS:
            a, b = [runs[m][s][key] for s in seeds], [runs[c][s][key] for s in seeds]
            p = paired(a, b)
            row[key] = {**p, "p_adjusted": bonferroni(p["sign_test_p"], tests),
                        "ci_family": adjusted_ci([x - y for x, y in zip(a, b)], tests)}
        rows.append(row)
    return rows


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


def control_markdown(rows: list[dict], threshold: float) -> str:
    """:func:`control_table` as a table: per key the mean difference [95% CI] {family-wise CI}, the seeds
    where the method is higher / lower, and the sign test's p (Bonferroni-adjusted)."""
    names = {"steps_to_threshold": f"steps to {threshold:g}", "auc": "AUC", "final": "final reward"}
    fmt = {"steps_to_threshold": "{:+.1f}", "auc": "{:+.3f}", "final": "{:+.3f}"}
    head = " | ".join(f"Δ {names[k]} [95% CI] {{family-wise}} | higher / lower | p (adj.)" for k in CONTROL_KEYS)
    lines = [f"| method − control | {head} |", "|---|" + "---|---|---|" * len(CONTROL_KEYS)]
    for r in rows:
        cells = []
        for k in CONTROL_KEYS:
            v, f = r[k], fmt[k]
            lo, hi = v["ci_family"]
            fam = "–" if lo is None else f"{{{f.format(lo)}, {f.format(hi)}}}"
            cells.append(f"{_ci(v, f)} {fam} | {v['wins']} / {v['losses']} | "
                         f"{v['sign_test_p']:.3g} ({v['p_adjusted']:.3g})")
        lines.append(f"| {r['method']} − {r['control']} | " + " | ".join(cells) + " |")
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


def mechanism_counts_markdown(mech: dict) -> str:
    """The counts behind the first step's top-bucket A > 0 "rose" fraction (:func:`top_bucket_counts`, summed
    over the seeds) and the fraction paired against GRPO's by seed, the unit; methods without counts are
    left out."""
    lines = [f"| method | A>0 rose {TOP_LABEL}: tokens k / n (responses, groups), summed over seeds | "
             f"discordant tokens vs grpo: this only / grpo only | responses more / fewer rose than under grpo | "
             f"Δ rose vs grpo, paired by seed [95% CI] | seeds higher / lower | sign-test p |",
             "|---|---|---|---|---|---|---|"]
    for m, e in mech["methods"].items():
        c = e.get("top_counts")
        if c is None:
            continue
        disc = f"{c['this_only']} / {c['grpo_only']}" if "this_only" in c else "–"
        resp = f"{c['responses_more']} / {c['responses_fewer']}" if "responses_more" in c else "–"
        v = e.get("top_rose_vs_grpo")
        paired_cells = (f"{_ci(v, '{:+.3f}')} | {v['wins']} / {v['losses']} | {v['sign_test_p']:.3g}" if v
                        else "– | – | –")
        lines.append(f"| {m} | {c['rose']} / {c['tokens']} ({c['responses']}, {c['groups']}) | {disc} | {resp} | "
                     f"{paired_cells} |")
    return "\n".join(lines)


#: The paired differences whose seed-to-seed variance :func:`seed_variance_rows` splits (the pilot's arithmetic).
VARIANCE_PAIRS = (("lopti", "grpo"), ("ar_lopti", "grpo"), ("lopti", "grpo_two_steps"), ("ar_lopti", "ar_two_steps"))


def seed_variance_rows(runs: dict[str, dict[int, dict]], seeds: list[int], window: int,
                       pairs=VARIANCE_PAIRS) -> list[dict]:
    """For each pair in ``runs``: the variance over seeds of the paired ``final`` difference, split into the
    runs' own sampling noise and the between-seed term (:func:`~arlopti.study.stats.between_seed_variance`,
    each run's noise by :func:`~arlopti.study.stats.window_noise_variance` over its last ``window`` steps)."""
    from arlopti.study.stats import between_seed_variance, window_noise_variance

    rows = []
    for m, b in ((m, b) for m, b in pairs if m in runs and b in runs):
        diffs = [runs[m][s]["final"] - runs[b][s]["final"] for s in seeds]
        noise = [window_noise_variance(runs[m][s]["rewards"], window) +
                 window_noise_variance(runs[b][s]["rewards"], window) for s in seeds]
        rows.append({"method": m, "baseline": b, **between_seed_variance(diffs, noise)})
    return rows
