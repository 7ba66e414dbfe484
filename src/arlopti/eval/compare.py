"""Compare two evaluations item by item: ``python -m arlopti.eval.compare A.json B.json``.

``A.json`` and ``B.json`` are ``eval_results.json`` files of ``eval.py`` (their ``items``: one
record per response, :func:`arlopti.eval.runner.attach_items`). Both must hold the same items:
per mode, the same sets, each with the same uids and the same number of samples per item ``k``;
anything else is an error naming the file and what differs. Every item's fields are checked
first (:func:`check_item`: type and range), so a file that was edited or converted by hand, e.g.
with ``"correct": "false"``, 0.5 or null, is refused naming the file, the item and the field
rather than counted as correct.

Per mode (e.g. ``greedy``, ``sampling``), per set and overall, for B − A:

* **score**: an item's score is its mean correctness over its k samples (k = 1: 0 or 1); a set's
  score is the mean over its items (``acc`` for k = 1, ``avg@k`` for k > 1, as
  :func:`arlopti.eval.runner.metrics_of`); the overall score is the unweighted mean over the sets
  (as ``val/<task>/mean``). ``diff`` = score(B) − score(A).
* **paired bootstrap 95% CI** of ``diff``: :data:`RESAMPLES` = 10,000 resamples with
  ``numpy.random.default_rng(SEED)``, SEED = 0. Each resample draws *items* (not samples) with
  replacement within each set, the same draw for A and B (paired by uid), so an item's k samples
  stay together; a set's resampled diff is the mean of its drawn items' ``score_B − score_A``,
  the overall one the mean over sets of those. The CI is the 2.5th and 97.5th percentiles
  (``numpy.percentile``, linear interpolation) of the resampled diffs. The draws are made set by
  set in file order, one ``rng.integers(0, n_set, size=(RESAMPLES, n_set))`` per set, and the
  per-set CIs come from the same draws as the overall one.
* **McNemar's exact test** (k = 1 only): b = items A gets right and B wrong, c = the reverse; the
  two-sided p = min(1, 2 · P(X ≤ min(b, c))) with X ~ Binomial(b + c, 1/2); p = 1 when b + c = 0.
  Overall, b and c are summed over the sets. For k > 1 (avg@k) an item has no single binary
  outcome, so McNemar's test does not apply: ``p`` is None and the bootstrap CI is the test.

Output: a table on stdout and a JSON file (``--out``, default ``compare_results.json``).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections import OrderedDict
from pathlib import Path

import numpy as np

from arlopti.config.cli_report import run_command

RESAMPLES = 10_000
SEED = 0


class CompareError(ValueError):
    """Two evaluation files that cannot be compared (the message names the file)."""


def load_scores(path: str | Path) -> dict[str, dict[str, dict[str, tuple[float, int, int]]]]:
    """``{mode: {set: {uid: (score, k, correct_of_sample_0)}}}`` from an ``eval_results.json``,
    sets in file order. ``score`` = mean correctness over the item's ``k`` samples. Errors name
    ``path``: no per-item records, an item with missing or repeated sample indices."""
    path = Path(path)
    try:
        report = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise CompareError(f"{path}: cannot read an eval_results.json ({err})") from None
    items = report.get("items") if isinstance(report, dict) else None
    if not items:
        raise CompareError(f"{path}: no per-item records ('items'); it was written by an older eval.py or holds no "
                           "items. Re-run eval.py to write them.")
    if not isinstance(items, list):
        raise CompareError(f"{path}: 'items' is a {type(items).__name__}, expected a list of item records")
    samples: dict[str, dict[str, dict[str, dict[int, bool]]]] = OrderedDict()
    for index, it in enumerate(items):
        check_item(it, index, path)
        mode, set_name, uid, j, ok = it["mode"], it["set"], str(it["uid"]), it["sample"], it["correct"]
        per_item = samples.setdefault(mode, OrderedDict()).setdefault(set_name, OrderedDict()).setdefault(uid, {})
        if j in per_item:
            raise CompareError(f"{path}: item {uid!r} of set {set_name!r} ({mode}) has sample {j} twice")
        per_item[j] = ok
    out: dict = OrderedDict()
    for mode, sets in samples.items():
        for set_name, uids in sets.items():
            for uid, by_j in uids.items():
                k = len(by_j)
                if sorted(by_j) != list(range(k)):
                    raise CompareError(f"{path}: item {uid!r} of set {set_name!r} ({mode}) has samples "
                                       f"{sorted(by_j)}, expected 0..{k - 1}")
                out.setdefault(mode, OrderedDict()).setdefault(set_name, OrderedDict())[uid] = (
                    sum(by_j.values()) / k, k, int(by_j[0]))
    return out


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


#: An item's fields: (test, what is expected); ``reward`` and ``answer`` may be absent.
ITEM_FIELDS = {
    "mode": (lambda v: isinstance(v, str) and v != "", "a non-empty string (greedy, sampling, ...)"),
    "set": (lambda v: isinstance(v, str) and v != "", "a non-empty string (the set's name)"),
    "uid": (lambda v: (isinstance(v, str) and v != "") or _is_int(v), "a non-empty string or an integer"),
    "sample": (lambda v: _is_int(v) and v >= 0, "an integer >= 0 (the sample's index)"),
    "correct": (lambda v: isinstance(v, bool), "true or false (a JSON boolean)"),
}
OPTIONAL_FIELDS = {
    "reward": (lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v),
               "a finite number"),
}


def check_item(it, index: int, path: Path) -> None:
    """Refuse an item record whose fields are missing or of the wrong type or range
    (:data:`ITEM_FIELDS`, :data:`OPTIONAL_FIELDS`); the error names the file, the item (its index
    in ``items`` and its uid) and the field."""
    if not isinstance(it, dict):
        raise CompareError(f"{path}: item {index} is a {type(it).__name__}, expected a record (a JSON object)")
    uid = it.get("uid")
    where = f"{path}: item {index}" + (f" (uid {uid!r})" if uid is not None else "")
    for name, (ok, expected) in ITEM_FIELDS.items():
        if name not in it:
            raise CompareError(f"{where}: field {name!r} is missing; expected {expected}")
        if not ok(it[name]):
            raise CompareError(f"{where}: field {name!r} is {json.dumps(it[name])}, expected {expected}. Files "
                               "written by eval.py are valid; was this one edited or converted?")
    for name, (ok, expected) in OPTIONAL_FIELDS.items():
        if name in it and not ok(it[name]):
            raise CompareError(f"{where}: field {name!r} is {json.dumps(it[name])}, expected {expected}")


def _check_same_items(a: dict, b: dict, name_a: str, name_b: str) -> None:
    """Raise :class:`CompareError` naming the files unless ``a`` and ``b`` hold the same modes,
    sets, uids and samples per item."""
    def only(x, y):
        return sorted(set(x) - set(y))

    if set(a) != set(b):
        raise CompareError(f"the files evaluate different modes: {name_a} has {sorted(a)}, {name_b} has {sorted(b)}")
    for mode in a:
        if set(a[mode]) != set(b[mode]):
            raise CompareError(f"mode {mode!r}: {name_a} has sets {list(a[mode])}, {name_b} has {list(b[mode])}")
        for s in a[mode]:
            ua, ub = a[mode][s], b[mode][s]
            if set(ua) != set(ub):
                raise CompareError(
                    f"set {s!r} ({mode}): the items differ: {len(ua)} in {name_a}, {len(ub)} in {name_b}; only in "
                    f"{name_a}: {only(ua, ub)[:5]}, only in {name_b}: {only(ub, ua)[:5]}. Evaluate both on the same "
                    "items (same suite, eval.limit and data).")
            ka = {ua[u][1] for u in ua}
            kb = {ub[u][1] for u in ub}
            if ka != kb or len(ka) != 1:
                raise CompareError(f"set {s!r} ({mode}): samples per item differ: {name_a} has k={sorted(ka)}, "
                                   f"{name_b} has k={sorted(kb)}")


def mcnemar_exact(b: int, c: int) -> float:
    """Two-sided exact McNemar p: min(1, 2 · Σ_{i ≤ min(b,c)} C(b+c, i) / 2^(b+c)); 1 when b + c = 0."""
    n = b + c
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, i) for i in range(min(b, c) + 1)) / 2.0 ** n
    return min(1.0, 2.0 * tail)


def bootstrap_diffs(diffs_by_set: list[np.ndarray], resamples: int = RESAMPLES, seed: int = SEED
                    ) -> tuple[list[np.ndarray], np.ndarray]:
    """Resampled mean diffs: per set an array [resamples] (items drawn with replacement within the
    set, ``rng.integers(0, n, size=(resamples, n))``, sets in order from one generator), and the
    overall [resamples] = their mean over sets."""
    rng = np.random.default_rng(seed)
    per_set = []
    for d in diffs_by_set:
        idx = rng.integers(0, len(d), size=(resamples, len(d)))
        per_set.append(d[idx].mean(axis=1))
    return per_set, np.mean(np.stack(per_set), axis=0)


def _row(name: str, n: int, k: int, score_a: float, score_b: float, boot: np.ndarray, bc: tuple[int, int] | None):
    lo, hi = np.percentile(boot, [2.5, 97.5])
    return {"set": name, "items": n, "k": k, "metric": "acc" if k == 1 else (f"avg@{k}" if k else "mixed"),
            "a": score_a, "b": score_b, "diff": score_b - score_a, "ci95": [float(lo), float(hi)],
            "mcnemar": None if bc is None else {"a_only": bc[0], "b_only": bc[1], "p": mcnemar_exact(*bc)}}


def compare(path_a: str | Path, path_b: str | Path, resamples: int = RESAMPLES, seed: int = SEED) -> dict:
    """The comparison of B against A (see the module docstring) as a dict: ``{"a", "b",
    "resamples", "seed", "modes": {mode: [row per set..., overall row]}}``; a row is ``{set,
    items, k, metric, a, b, diff, ci95: [lo, hi], mcnemar: {a_only, b_only, p} | None}``."""
    a, b = load_scores(path_a), load_scores(path_b)
    _check_same_items(a, b, str(path_a), str(path_b))
    out = {"a": str(path_a), "b": str(path_b), "resamples": resamples, "seed": seed,
           "ci": "paired bootstrap over items, percentile 95%", "modes": OrderedDict()}
    for mode, sets in a.items():
        names = list(sets)
        uids = {s: list(sets[s]) for s in names}
        sa = {s: np.array([sets[s][u][0] for u in uids[s]]) for s in names}
        sb = {s: np.array([b[mode][s][u][0] for u in uids[s]]) for s in names}
        ks = {s: sets[s][uids[s][0]][1] for s in names}
        per_set, overall = bootstrap_diffs([sb[s] - sa[s] for s in names], resamples, seed)
        rows, b_tot, c_tot = [], 0, 0
        for s, boot in zip(names, per_set):
            bc = None
            if ks[s] == 1:
                xa = np.array([sets[s][u][2] for u in uids[s]])
                xb = np.array([b[mode][s][u][2] for u in uids[s]])
                bc = (int(((xa == 1) & (xb == 0)).sum()), int(((xa == 0) & (xb == 1)).sum()))
                b_tot, c_tot = b_tot + bc[0], c_tot + bc[1]
            rows.append(_row(s, len(uids[s]), ks[s], float(sa[s].mean()), float(sb[s].mean()), boot, bc))
        all_k1 = all(k == 1 for k in ks.values())
        k_all = ks[names[0]] if len(set(ks.values())) == 1 else 0
        rows.append(_row("overall", sum(len(u) for u in uids.values()), k_all,
                         float(np.mean([sa[s].mean() for s in names])), float(np.mean([sb[s].mean() for s in names])),
                         overall, (b_tot, c_tot) if all_k1 else None))
        out["modes"][mode] = rows
    return out


def print_comparison(result: dict) -> None:
    """The comparison as a rich table per mode."""
    from rich.console import Console
    from rich.table import Table

    console = Console(width=max(110, Console().width))
    console.print(f"A = {result['a']}\nB = {result['b']}\n95% CI: paired bootstrap over items, "
                  f"{result['resamples']} resamples, seed {result['seed']}; McNemar: exact, k = 1 only")
    for mode, rows in result["modes"].items():
        t = Table(title=f"{mode}: B − A")
        for col in ("set", "n", "metric", "A", "B", "B − A", "95% CI", "McNemar p (A only / B only)"):
            t.add_column(col, justify="left" if col in ("set", "metric") else "right")
        for r in rows:
            m = r["mcnemar"]
            t.add_row(r["set"], str(r["items"]), r["metric"], f"{r['a']:.4f}", f"{r['b']:.4f}",
                      f"{r['diff']:+.4f}", f"[{r['ci95'][0]:+.4f}, {r['ci95'][1]:+.4f}]",
                      "n/a (k > 1)" if m is None else f"{m['p']:.4g} ({m['a_only']} / {m['b_only']})")
        console.print(t)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m arlopti.eval.compare", description=__doc__.split("\n\n")[0])
    p.add_argument("a", help="eval_results.json of A (the baseline)")
    p.add_argument("b", help="eval_results.json of B; differences are B − A")
    p.add_argument("--out", default="compare_results.json", help="JSON output (default: %(default)s)")
    p.add_argument("--resamples", type=int, default=RESAMPLES, help="bootstrap resamples (default: %(default)s)")
    p.add_argument("--seed", type=int, default=SEED, help="bootstrap seed (default: %(default)s)")
    args = p.parse_args(argv)
    try:
        result = compare(args.a, args.b, args.resamples, args.seed)
    except CompareError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print_comparison(result)
    Path(args.out).write_text(json.dumps(result, indent=2))
    print(f"written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(run_command(main))
