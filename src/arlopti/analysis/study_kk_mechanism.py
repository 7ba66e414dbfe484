"""``study kk-mechanism``: every method's first update on the same SmolLM2 K&K batches (:mod:`.study_kk`).

Batch ``b`` is sampled with sampling seed ``b`` and puzzle seed ``4242 + b`` (2 and 3 people) from the
model after the demo's cold start; on it one ``compare-methods`` call measures every method it knows,
with the methods' own settings (:func:`arlopti.analysis.study_mechanism.shared_settings`) and the demo's
optimizer (AdamW, lr 3e-5, one step per phase). Each batch is written as ``mechanism/batch<b>.json``, so
the batches can run as separate locked jobs (``--first-batch``).
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

log = logging.getLogger("arlopti.analysis")


def kk_mechanism(args) -> dict:
    from arlopti.analysis.compare_methods import METHODS, compare_methods
    from arlopti.analysis.inputs import load_policy, sample_kk_batch
    from arlopti.analysis.study_kk import DEMO_COLD_START_STEPS, DEMO_LR, DEMO_MAX_NEW_TOKENS
    from arlopti.analysis.study_mechanism import mechanism_entry, shared_settings
    from arlopti.analysis.study_methods import method_algorithms, parse_methods

    out = Path(args.out) / "mechanism"
    out.mkdir(parents=True, exist_ok=True)
    methods = parse_methods(args.methods)
    algos = method_algorithms(methods, DEMO_MAX_NEW_TOKENS)
    known = {m: a for m, a in algos.items() if m in METHODS}
    alpha, eta, token_cfg = shared_settings(known)
    t0 = time.perf_counter()
    loaded = load_policy(args.model, DEMO_COLD_START_STEPS)
    written = {}
    for b in range(args.first_batch, args.first_batch + args.batches):
        t1 = time.perf_counter()
        batch = sample_kk_batch(loaded, args.prompts, args.group_size, args.max_new_tokens, args.temperature, seed=b,
                                num_people=[2, 3], puzzle_seed=4242 + b, advantages="auto")
        r = compare_methods(loaded.policy, batch, tuple(known), alpha, eta, "adamw", DEMO_LR,
                            micro_batch_size=args.micro_batch, token_cfg=token_cfg)
        result = {"batch_index": b, "batch": {k: v for k, v in batch.summary().items() if k != "model_info"},
                  "model": loaded.info, "tokens_per_bucket": r["tokens_per_bucket"],
                  "advantage_source": batch.advantage_source, "optimizer": "adamw", "lr": DEMO_LR,
                  "alpha": alpha, "eta": eta, "methods": {m: {**mechanism_entry(e), "same_update_as":
                                                               e.get("same_update_as")} for m, e in r["methods"].items()},
                  "not_measured": [m for m in methods if m not in METHODS], "seconds": time.perf_counter() - t1}
        path = out / f"batch{b}.json"
        path.write_text(json.dumps(result, indent=1, default=str) + "\n")
        written[b] = str(path)
        log.info("kk-mechanism: batch %d (%d tokens) in %.0f s", b, result["batch"]["tokens"], result["seconds"])
    return {"files": written, "seconds": time.perf_counter() - t0}
