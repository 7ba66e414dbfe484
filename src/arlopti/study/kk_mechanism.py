"""``study kk-mechanism``: every method's first update on the same SmolLM2 K&K batches (:mod:`.kk`).

Batch ``b`` is sampled with sampling seed ``b`` and puzzle seed ``4242 + b`` (2 and 3 people) from the
model after the demo's cold start; on it one ``compare-methods`` call measures every method it knows,
with the methods' own settings (:func:`arlopti.study.mechanism.shared_settings`) and the demo's
optimizer (AdamW, lr 3e-5, one step per phase). Each batch is written as ``mechanism/batch<b>.json``, so
the batches can run as separate locked jobs (``--first-batch``); a batch whose file is there already is
not measured again (delete the file to measure it again).
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

log = logging.getLogger("arlopti.study")


def kk_mechanism(args) -> dict:
    """Measure the batches ``--first-batch`` .. ``+ --batches`` that ``--out`` lacks (module docstring)."""
    from arlopti.analysis.compare_methods import KNOWN_METHODS
    from arlopti.analysis.inputs import load_policy
    from arlopti.study.kk import demo_settings
    from arlopti.study.mechanism import shared_settings
    from arlopti.study.methods import method_algorithms, parse_methods

    out = Path(args.out) / "mechanism"
    out.mkdir(parents=True, exist_ok=True)
    wanted = {b: out / f"batch{b}.json" for b in range(args.first_batch, args.first_batch + args.batches)}
    for b in [b for b, path in wanted.items() if path.is_file()]:
        log.info("kk-mechanism: batch %d is done (%s), not measured again", b, wanted[b])
    todo = [b for b, path in wanted.items() if not path.is_file()]
    t0 = time.perf_counter()
    if todo:
        methods = parse_methods(args.methods)
        demo = demo_settings()
        algos = method_algorithms(methods, demo["max_new_tokens"])
        known = {m: a for m, a in algos.items() if m in KNOWN_METHODS}
        loaded = load_policy(args.model, demo["cold_start_steps"])
        for b in todo:
            measure_batch(args, b, loaded, methods, known, (*shared_settings(known), demo["lr"]), wanted[b])
    return {"files": {b: str(path) for b, path in wanted.items()}, "seconds": time.perf_counter() - t0}


def measure_batch(args, b: int, loaded, methods: list[str], known: dict, settings: tuple, path: Path) -> None:
    """Batch ``b`` sampled from ``loaded`` and every method of ``known`` measured on it with ``settings`` =
    ``(α, η, token_cfg, lr)``, into ``path`` (whole or absent: written under a temporary name, then renamed)."""
    from arlopti.analysis.compare_methods import KNOWN_METHODS, compare_methods
    from arlopti.analysis.inputs import sample_kk_batch
    from arlopti.study.mechanism import mechanism_entry

    alpha, eta, token_cfg, lr = settings
    t1 = time.perf_counter()
    batch = sample_kk_batch(loaded, args.prompts, args.group_size, args.max_new_tokens, args.temperature, seed=b,
                            num_people=[2, 3], puzzle_seed=4242 + b, advantages="auto")
    r = compare_methods(loaded.policy, batch, tuple(known), alpha, eta, "adamw", lr,
                        micro_batch_size=args.micro_batch, token_cfg=token_cfg)
    result = {"batch_index": b, "batch": {k: v for k, v in batch.summary().items() if k != "model_info"},
              "model": portable_info(loaded.info), "tokens_per_bucket": r["tokens_per_bucket"], "support": r["support"],
              "advantage_source": batch.advantage_source, "optimizer": "adamw", "lr": lr,
              "alpha": alpha, "eta": eta, "methods": {m: {**mechanism_entry(e), "same_update_as":
                                                           e.get("same_update_as")} for m, e in r["methods"].items()},
              "not_measured": [m for m in methods if m not in KNOWN_METHODS], "seconds": time.perf_counter() - t1}
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(result, indent=1, default=str) + "\n")
    tmp.replace(path)
    log.info("kk-mechanism: batch %d (%d tokens) in %.0f s", b, result["batch"]["tokens"], result["seconds"])


def portable_info(info: dict) -> dict:
    """The loaded model's record without a machine path: the cold start's cache folder by its name only."""
    if "cold_start_cache" not in info:
        return dict(info)
    return {**info, "cold_start_cache": Path(info["cold_start_cache"]).name}
