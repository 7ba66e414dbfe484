"""``python -m arlopti.data.preview``: write exactly the prompts a run feeds the model, as JSONL.

The training config is composed as ``python train.py`` composes it (``configs/train.yaml`` with
the same Hydra overrides), the tokenizer is built from ``model`` and the DataModule from ``data``
(as :func:`arlopti.entry.train.build` does), ``setup()`` runs (rendering, tokenising, length filter),
and every prompt that survives is written, one JSON object per line:

``uid``, ``split`` (``train`` or ``val``), ``set`` (the validation set's name, or ``train``),
``prompt_text`` (the rendered string), ``prompt_ids`` (the token ids the model receives),
``ground_truth``, ``task`` and ``meta``.

Order: the training prompts in file order (before any shuffling), then each validation set in
the DataModule's order. Prompts dropped by ``max_prompt_length`` are not written (the counts go
to stderr). Examples::

    python -m arlopti.data.preview data=kk model=smollm2-135m-instruct --split val --out kk_val.jsonl
    python -m arlopti.data.preview experiment=kk_grpo model=smollm2-135m-instruct --split train --limit 3
    python -m arlopti.data.preview data=dsr_uniform model=smollm2-135m-instruct --split val --limit 2
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any, Iterator

from arlopti.config import ConfigError
from arlopti.config.cli_report import run_command
from arlopti.config.compose import compose

SPLITS = ("train", "val", "all")
# The sampler's complaint about a training set smaller than one step: the prompts are still worth
# showing (e.g. every prompt over max_prompt_length), so preview warns instead of failing.
_TOO_FEW = "fewer than data.prompts_per_step"  # training would stop, but preview shows what is left


def build_datamodule(cfg):
    """(tokenizer, DataModule after ``setup()``), built from ``cfg.model`` and ``cfg.data``."""
    import hydra
    from omegaconf import OmegaConf

    from arlopti.config import ModelConfig, from_dict
    from arlopti.data.prompt_datamodule import VAL_ALL_TOO_LONG
    from arlopti.models.loading import load_tokenizer

    model = from_dict(ModelConfig, OmegaConf.to_container(cfg.model, resolve=True), "model")
    tokenizer = load_tokenizer(model.name_or_path, model.tiny.vocab_size)
    datamodule = hydra.utils.instantiate(cfg.data, tokenizer=tokenizer)
    try:
        datamodule.setup("fit")
    except ValueError as err:
        if _TOO_FEW not in str(err) and VAL_ALL_TOO_LONG not in str(err):
            raise
        print(f"preview: warning: training would stop here: {err}", file=sys.stderr)
    return tokenizer, datamodule


def _jsonable(value: Any) -> Any:
    return json.loads(json.dumps(value, default=str))


def preview_records(datamodule, split: str = "all", limit: int | None = None) -> Iterator[dict]:
    """One dict per prompt fed (see the module docstring); ``limit``: at most N per set."""
    if split not in SPLITS:
        raise ValueError(f"split={split!r}: use one of {list(SPLITS)}")
    sets = []
    if split in ("train", "all"):
        sets.append(("train", "train", datamodule.train_samples))
    if split in ("val", "all"):
        sets.extend(("val", name, samples) for name, samples in datamodule.val_sets.items())
    for split_name, set_name, samples in sets:
        for sample in samples[:limit] if limit is not None else samples:
            yield {"uid": sample.uid, "split": split_name, "set": set_name,
                   "prompt_text": sample.prompt_text, "prompt_ids": [int(i) for i in sample.prompt_ids],
                   "ground_truth": _jsonable(sample.ground_truth), "task": sample.task,
                   "meta": _jsonable(sample.meta)}


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m arlopti.data.preview", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("overrides", nargs="*", metavar="OVERRIDE",
                   help="Hydra overrides of configs/train.yaml, as for train.py (data=kk, "
                        "model=smollm2-135m-instruct, experiment=kk_grpo, data.template=qwen-instruct, ...)")
    p.add_argument("--split", choices=SPLITS, default="all",
                   help="training prompts, validation prompts, or both (default: all)")
    p.add_argument("--limit", type=int, default=None, metavar="N",
                   help="at most N prompts per set (the training set and each validation set)")
    p.add_argument("--out", type=Path, default=None, metavar="FILE",
                   help="write the JSONL here (default: stdout)")
    p.add_argument("--config-dir", type=Path, default=None,
                   help="the configs folder (default: the checkout's configs/)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_intermixed_args(argv)
    if args.limit is not None and args.limit < 0:
        print("preview: error: --limit must be >= 0", file=sys.stderr)
        return 2
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    try:
        cfg = compose(args.overrides, config_dir=args.config_dir)
        _, dm = build_datamodule(cfg)
    except ConfigError:
        raise  # one line and exit status 1, as every command reports it (arlopti.config.cli_report)
    except (FileNotFoundError, ValueError, KeyError, HydraException, OmegaConfBaseException) as err:
        print(f"preview: error: {type(err).__name__}: {err}", file=sys.stderr)
        return 2
    counts: dict[str, int] = {}
    to_file = args.out is not None
    out = open(args.out, "w", encoding="utf-8") if to_file else sys.stdout
    try:
        for rec in preview_records(dm, args.split, args.limit):
            out.write(json.dumps(rec, ensure_ascii=False) + "\n")
            counts[rec["set"]] = counts.get(rec["set"], 0) + 1
        out.flush()
    except BrokenPipeError:  # `... | head`: the reader has what it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no error at exit's flush
        return 0
    finally:
        if to_file:
            out.close()
    dropped = {k: v for k, v in dm.filtered_counts.items() if v}
    summary = ", ".join(f"{k}: {v}" for k, v in counts.items()) or "no prompts"
    print(f"preview: wrote {sum(counts.values())} prompts ({summary})"
          + (f" to {args.out}" if args.out is not None else "")
          + (f"; dropped over max_prompt_length: {dropped}" if dropped else ""), file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(run_command(main))
