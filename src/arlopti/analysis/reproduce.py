"""``python -m arlopti.analysis reproduce --out docs/figures``: every mechanism figure, in two settings.

Two settings, each into its own sub-folder, because neither small-model batch has both properties
the paper's figures rely on:

* ``raw``: SmolLM2-135M-Instruct as shipped. Its sampled tokens spread over the probability
  buckets much like the paper's (about half above .75, a fifth below .25), but it fails the K&K
  format everywhere, so the rewards do not vary and the advantages are **synthetic** (±1 per
  sequence, labelled on every figure and in every JSON);
* ``sft``: the same model after ``--cold-start-steps`` SFT steps (default 10, a short cold start
  like the CPU demo's; cached). Its rewards vary, so the advantages are real GRPO advantages, but
  even the short SFT makes it more confident than the paper's model: most sampled tokens sit in
  (.75, 1] (docs/results.md has the numbers). A longer cold start makes this worse and costs
  about 16 s a step on 2 cores.

Per setting, on one sampled batch and one set of weights:

1. one gradient pass at θ for every loss the figures need: the four bucket-masked GRPO losses
   (their sum is the all-token GRPO gradient), the AR loss and Lopti's low phase
   (:func:`arlopti.analysis.updates.loss_gradients`: one forward per micro-batch, one backward each);
2. ``token-distribution``, ``grad-norms`` (per-token and aggregate), ``prob-shift`` (SGD), ``update-direction`` (SGD, and
   AdamW unless ``--skip-adamw``), reusing those gradients; ``compare-methods`` (SGD, unless
   ``--skip-compare-methods``: GRPO, AR, Lopti, AR + Lopti and the token methods);
3. ``sft`` only: a second live sample written as a rollout dump (``rollouts_word_categories.jsonl.gz``),
   read back and pooled with the mechanism batch for ``word-categories``.

``summary.json`` (top level) holds the headline numbers of both settings, each step's wall time and
the machine's load average. ``--quick`` shrinks every size (tests; the numbers then mean nothing).
"""

from __future__ import annotations

import json
import os
import time
from argparse import Namespace
from pathlib import Path

from arlopti.analysis.cli_args import DEFAULT_LR, fill_method_args

SETTINGS = ("raw", "sft")


def add_reproduce_args(p) -> None:
    from arlopti.analysis.cli_args import add_input_args, add_method_args

    add_input_args(p)
    # 4 prompts x 4 responses per setting: the whole run fits the CPU budget (docs/results.md)
    p.set_defaults(out="docs/figures", prompts=4)
    p.add_argument("--settings", default="raw,sft", help="comma list of raw, sft (module docstring)")
    p.add_argument("--raw-prompts", type=int, default=4, help="prompts of the raw setting's batch")
    p.add_argument("--max-tokens", type=int, default=48, help="per-token grad norms: tokens analysed")
    p.add_argument("--max-sequences", type=int, default=8)
    p.add_argument("--layer", type=int, default=None)
    p.add_argument("--sgd-lr", type=float, default=None, help="SGD lr of prob-shift and update-direction")
    p.add_argument("--adamw-lr", type=float, default=None, help="AdamW lr of update-direction")
    add_method_args(p)
    p.add_argument("--skip-adamw", action="store_true", help="only the SGD update-direction runs")
    p.add_argument("--skip-compare-methods", action="store_true", help="no compare-methods (the token methods)")
    p.add_argument("--cov-ratio", type=float, default=0.02, help="compare-methods: Clip-Cov / KL-Cov share")
    p.add_argument("--word-prompts", type=int, default=8, help="extra prompts sampled for word-categories")
    p.add_argument("--quick", action="store_true", help="tiny sizes, for tests (numbers meaningless)")


def _quick(args) -> None:
    args.prompts, args.raw_prompts, args.group_size = 2, 2, 2
    args.max_new_tokens = min(args.max_new_tokens, 16)
    args.max_tokens, args.max_sequences, args.word_prompts = 8, 2, 2


def setting_args(args, name: str) -> Namespace:
    """The command arguments of one setting (module docstring)."""
    if name == "raw":
        return Namespace(**{**vars(args), "cold_start_steps": 0, "advantages": "synthetic",
                            "prompts": args.raw_prompts, "out": str(Path(args.out) / "raw")})
    if name == "sft":
        if args.cold_start_steps < 1:
            raise ValueError("the sft setting needs --cold-start-steps >= 1")
        return Namespace(**{**vars(args), "out": str(Path(args.out) / "sft")})
    raise ValueError(f"--settings: unknown setting {name!r}; choose from {list(SETTINGS)}")


class _Ticker:
    """Seconds spent in each named stage, measured between consecutive :meth:`tick` calls."""

    def __init__(self):
        self.timings: dict[str, float] = {}
        self.t = time.perf_counter()

    def tick(self, name: str) -> None:
        now = time.perf_counter()
        self.timings[name], self.t = now - self.t, now


def _with(args, **changes) -> Namespace:
    return Namespace(**{**vars(args), **changes})


def run_setting(args, word_categories: bool) -> tuple[dict, dict[str, float]]:
    """All figures of one setting into ``args.out``; returns (headline numbers, timings)."""
    from arlopti.analysis import commands as cli
    from arlopti.analysis.update_direction import first_step_specs
    from arlopti.analysis.updates import add_gradients, bucket_specs, loss_gradients

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    ticker = _Ticker()
    loaded, batch, old = cli.load_inputs(args)
    ticker.tick("load_and_sample")
    specs = bucket_specs(old, batch.response_mask, batch.advantages)
    first = first_step_specs(old, batch, ("ar", "lopti"), args.alpha, args.eta)
    bank = loss_gradients(loaded.policy, batch, old, {**specs, **first}, args.micro_batch)
    ticker.tick("gradient_pass")
    inputs = (loaded, batch, old)
    dist = cli.cmd_token_distribution(args, inputs)
    grad = cli.cmd_grad_norms(_with(args, mode="both"), inputs, bank)
    ticker.tick("grad_norms")
    sgd_lr = args.sgd_lr if args.sgd_lr is not None else DEFAULT_LR["sgd"]
    adamw_lr = args.adamw_lr if args.adamw_lr is not None else DEFAULT_LR["adamw"]
    ps = cli.cmd_prob_shift(_with(args, optimizer="sgd", lr=sgd_lr, grad_clip=None), inputs, bank)
    ticker.tick("prob_shift")
    first_grads = {"grpo": add_gradients(*(bank[f"b{b}"] for b in range(4))), "ar": bank["ar"],
                   "lopti": bank["lopti"]}
    del bank  # the bucket buffers (one parameter-sized buffer each) are no longer needed
    ud = {}
    for opt, lr in (("sgd", sgd_lr),) + (() if args.skip_adamw else (("adamw", adamw_lr),)):
        ud_args = _with(args, optimizer=opt, lr=lr, grad_clip=None, methods="grpo,ar,lopti")
        ud[opt] = cli.cmd_update_direction(ud_args, inputs, first_grads)
        ticker.tick(f"update_direction_{opt}")
    del first_grads
    headline = {
        "batch": {k: v for k, v in batch.summary().items() if k != "model_info"},
        "token_distribution": {k: dist[k] for k in ("fraction", "adv_mean", "adv_pos_frac")},
        "grad_norms": {"per_token": grad.get("per_token", {}).get("summary"), "aggregate": grad.get("aggregate")},
        "prob_shift": {"lr": sgd_lr, **ps["variants"]},
        "update_direction": {opt: {"lr": r["lr"], **r["methods"]} for opt, r in ud.items()},
    }
    if not args.skip_compare_methods:
        cm = cli.cmd_compare_methods(_with(args, optimizer="sgd", lr=sgd_lr, grad_clip=None, methods=None), inputs)
        headline["compare_methods"] = {"lr": sgd_lr, **cm["methods"]}
        ticker.tick("compare_methods")
    if word_categories:
        headline["word_categories"] = _word_categories(args, loaded, batch, out)
        ticker.tick("word_categories")
    return headline, ticker.timings


def _word_categories(args, loaded, batch, out: Path) -> dict:
    """Fig. 5's word categories over a second, larger batch plus the mechanism batch's responses."""
    from arlopti.analysis import commands as cli
    from arlopti.analysis.inputs import sample_kk_batch
    from arlopti.learner.rollout_dump import read_dump
    from arlopti.analysis.updates import sampled_log_probs

    wbatch = sample_kk_batch(loaded, args.word_prompts, args.group_size, args.max_new_tokens, args.temperature,
                             args.seed + 1, args.num_people, args.puzzle_seed + 1, args.advantages)
    dump = cli.write_live_dump(wbatch, sampled_log_probs(loaded.policy, wbatch, args.micro_batch),
                               out / "rollouts_word_categories.jsonl.gz")
    rows = read_dump(dump)
    texts = [r["completion"] for r in rows] + batch.response_texts
    rewards = [r["reward"] for r in rows] + batch.rewards.tolist()
    wc = cli.cmd_word_categories(args, (texts, rewards), f"{dump.name} ({len(rows)} responses) + the "
                                                         f"mechanism batch ({len(batch)} responses)")
    return {"responses": wc["responses"], **{c: v["r_rate"] for c, v in wc["categories"].items()}}


def merge_summaries(path: Path, new: dict, names: list[str]) -> dict:
    """``new`` plus the settings of an existing ``summary.json`` that this run did not redo.

    So that ``--settings raw`` then ``--settings sft`` (two shorter runs) leave one summary holding
    both. Each setting keeps the arguments and timings of the run that produced it
    (``runs[<setting>]``); ``timings_s.total`` is the sum of every kept setting's step timings (the
wall time ``make reproduce`` spends, less start-up), ``timings_s.this_run`` this run's wall time. A file
    that is not valid JSON is replaced (its settings are lost), with a warning.
    """
    import logging

    run = {"args": new["args"], "total_s": new["timings_s"]["total"], "load_avg_1_5_15_at_end":
           new["load_avg_1_5_15_at_end"], "cpu_count": new["cpu_count"]}
    old: dict = {}
    if path.exists():
        try:
            old = json.loads(path.read_text())
        except json.JSONDecodeError as err:
            logging.getLogger(__name__).warning("%s is not valid JSON (%s): rewriting it", path, err)
    merged = {"settings": {}, "timings_s": {}, "runs": {}}
    for name in SETTINGS:
        if name in names:
            merged["settings"][name] = new["settings"][name]
            merged["timings_s"][name] = new["timings_s"][name]
            merged["runs"][name] = run
        elif name in old.get("settings", {}) and name in old.get("runs", {}):
            merged["settings"][name] = old["settings"][name]
            merged["timings_s"][name] = old["timings_s"][name]
            merged["runs"][name] = old["runs"][name]
    merged["timings_s"]["total"] = sum(sum(merged["timings_s"][n].values()) for n in merged["settings"])
    merged["timings_s"]["this_run"] = new["timings_s"]["total"]
    merged.update({k: new[k] for k in ("load_avg_1_5_15_at_end", "cpu_count", "args")})
    return merged


def reproduce(args) -> dict:
    fill_method_args(args)  # --alpha / --eta left out: algorithm=ar_lopti's
    if args.quick:
        _quick(args)
    names = [s.strip() for s in args.settings.split(",") if s.strip()]
    if not names:
        raise ValueError(f"--settings {args.settings!r}: name at least one of {list(SETTINGS)}")
    all_args = {name: setting_args(args, name) for name in names}  # bad names fail before any work
    t0 = time.perf_counter()
    summary: dict = {"settings": {}, "timings_s": {}}
    for name in names:
        sargs = all_args[name]
        headline, timings = run_setting(sargs, word_categories=name == "sft")
        summary["settings"][name] = headline
        summary["timings_s"][name] = timings
    total = time.perf_counter() - t0
    summary["timings_s"]["total"] = total
    summary["load_avg_1_5_15_at_end"] = list(os.getloadavg())
    summary["cpu_count"] = os.cpu_count()
    summary["args"] = {k: v for k, v in vars(args).items() if k != "command"}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    summary = merge_summaries(out / "summary.json", summary, names)
    (out / "summary.json").write_text(json.dumps(summary, indent=1, default=str) + "\n")
    print(json.dumps({"out": str(out), "timings_s": summary["timings_s"]}, indent=1))
    return summary
