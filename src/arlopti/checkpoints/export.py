"""Export a training checkpoint as a Hugging Face model: ``python -m arlopti.checkpoints.export <ckpt> <out_dir>``.

``<ckpt>`` is a single-file Lightning checkpoint (single process, DDP) or an FSDP2
distributed-checkpoint folder (``trainer=fsdp``), e.g. ``logs/<task>/<run_name>/<time>/checkpoints/last.ckpt``;
a run directory works too (its ``checkpoints/last.ckpt``). ``<out_dir>`` receives
``save_pretrained`` weights (safetensors), config, generation config and tokenizer, plus
``arlopti_export.json`` naming the source checkpoint and its rollout step, and ``README.md``, a
Hugging Face model card of the run (:mod:`arlopti.checkpoints.model_card`: settings, data, the last
validation of these weights, the paper's citation). The result loads with
``AutoModelForCausalLM.from_pretrained(out_dir)`` and ``AutoTokenizer.from_pretrained(out_dir)``.
A LoRA run (``model.lora.r > 0``) exports its adapter as a PEFT folder, or merged weights with
``--merge`` (docs/lora.md). ``--push-to-hub OWNER/NAME`` then uploads the folder with
``huggingface_hub.HfApi().upload_folder`` (the repo created if needed; ``--private``); the card's quick
start loads that repo. Nothing in the folder names a path of this machine: ``arlopti_export.json``
names the checkpoint by its run (``<task_name>/<run_name>/<time>/checkpoints/last.ckpt``).

The model architecture and tokenizer come from the run config saved in the checkpoint
(``hyper_parameters.run.model``): ``tiny`` models and their tokenizer are rebuilt
deterministically; others are built from ``model.name_or_path``'s config (no base weights are
needed) and its tokenizer. Only the policy is exported (never the reference model).

From Python: :func:`export_checkpoint` and :func:`load_policy_from_checkpoint` (which ``eval.py``
can use to evaluate a checkpoint directly). Everything runs on CPU in one process, with no
process group: distributed folders are read with ``torch.distributed.checkpoint`` in
non-distributed mode.
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from pathlib import Path

import torch

from arlopti.config import ConfigError, ModelConfig, from_dict
from arlopti.config.cli_report import run_command
from arlopti.models.lora import apply_lora, check_base_identity, lora_enabled
from arlopti.checkpoints.model_card import CARD, card_text
from arlopti.checkpoints.resume import CheckpointError, load_checkpoint_metadata, named_checkpoint
from arlopti.utils.dtypes import torch_dtype

POLICY_PREFIX = "policy.hf."
_DCP_PREFIX = "state_dict." + POLICY_PREFIX  # how Lightning's ModelParallelStrategy names the weights


def model_config_of(meta: dict, where: Path) -> ModelConfig:
    """The :class:`ModelConfig` a checkpoint was trained with."""
    run = (meta.get("hyper_parameters") or {}).get("run")
    if not run or "model" not in run:
        raise CheckpointError(f"checkpoint {where} has no saved run config (hyper_parameters.run.model): "
                              "not an arlopti training checkpoint")
    return from_dict(ModelConfig, run["model"], "model")


def build_model_and_tokenizer(model_cfg: ModelConfig):
    """An untrained HF model of the checkpoint's architecture, and its tokenizer."""
    from arlopti.models.loading import load_tokenizer, resolve_model_path

    tok = load_tokenizer(model_cfg.name_or_path, model_cfg.tiny.vocab_size)
    dtype = torch_dtype(model_cfg.dtype, "model.dtype")
    if model_cfg.name_or_path.startswith("tiny"):
        from arlopti.models.loading import load_causal_lm

        return load_causal_lm(model_cfg.name_or_path, tok, dtype=model_cfg.dtype, tiny=model_cfg.tiny), tok
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(resolve_model_path(model_cfg.name_or_path))
    model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    if model.generation_config.pad_token_id is None:
        model.generation_config.pad_token_id = tok.pad_token_id
    return model, tok


def policy_state_dict(path: Path, like: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The policy's weights (HF names) from a checkpoint file or distributed folder.

    ``like`` (the target model's state dict) gives the names wanted from a distributed folder.
    """
    if path.is_file():
        ckpt = torch.load(path, map_location="cpu", mmap=True, weights_only=False)
        state = ckpt.get("state_dict", {})
        out = {k[len(POLICY_PREFIX):]: v for k, v in state.items() if k.startswith(POLICY_PREFIX)}
        if not out:
            raise CheckpointError(f"checkpoint {path} holds no '{POLICY_PREFIX}*' weights: not an arlopti checkpoint")
        return out
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    reader = FileSystemReader(str(path))
    saved = reader.read_metadata().state_dict_metadata
    names = {k[len(_DCP_PREFIX):]: k for k, v in saved.items()
             if k.startswith(_DCP_PREFIX) and isinstance(v, TensorStorageMetadata)}
    if not names:
        raise CheckpointError(f"checkpoint folder {path} holds no '{_DCP_PREFIX}*' tensors: not an arlopti checkpoint")
    target = {}
    for name, key in names.items():
        md = saved[key]
        target[key] = torch.empty(tuple(md.size), dtype=md.properties.dtype)
    with warnings.catch_warnings():  # "torch.distributed is ... uninitialized": yes, one process here
        warnings.simplefilter("ignore", UserWarning)
        dcp.load(target, storage_reader=reader, no_dist=True)
    return {name: target[key] for name, key in names.items()}


def load_policy_from_checkpoint(ckpt: str | Path, merge: bool = True):
    """``(hf_model, tokenizer)`` of a training checkpoint, in eval mode on CPU.

    A LoRA checkpoint (``model.lora.r > 0``) holds only the adapter: the base is loaded from
    ``model.name_or_path``, checked against the identity the checkpoint recorded, and the adapter
    put on it; ``merge`` folds it into the weights (a plain HF model), else the ``PeftModel`` is
    returned."""
    path = named_checkpoint(ckpt)
    meta = load_checkpoint_metadata(path)
    model_cfg = model_config_of(meta, path)
    if lora_enabled(model_cfg.lora):
        return _load_lora_policy(path, meta, model_cfg, merge)
    model, tok = build_model_and_tokenizer(model_cfg)
    own = model.state_dict()
    state = policy_state_dict(path, own)
    tied = _tied_names(model)
    missing = sorted(set(own) - set(state) - tied)
    unexpected = sorted(set(state) - set(own))
    shapes = sorted(k for k in set(own) & set(state) if tuple(own[k].shape) != tuple(state[k].shape))
    if missing or unexpected or shapes:
        raise CheckpointError(f"checkpoint {path} does not fit its own model config: missing {missing[:5]}, "
                              f"unexpected {unexpected[:5]}, shape mismatch {shapes[:5]}")
    model.load_state_dict({k: v.to(own[k].dtype) for k, v in state.items()}, strict=False)
    if hasattr(model, "tie_weights"):
        model.tie_weights()
    model.eval()
    return model, tok


def _load_lora_policy(path: Path, meta: dict, model_cfg: ModelConfig, merge: bool):
    """The base model with the checkpoint's adapter (merged into it when ``merge``)."""
    from arlopti.models.loading import load_causal_lm, load_tokenizer

    tok = load_tokenizer(model_cfg.name_or_path, model_cfg.tiny.vocab_size)
    base = load_causal_lm(model_cfg.name_or_path, tok, dtype=model_cfg.dtype, tiny=model_cfg.tiny)
    model = apply_lora(base, model_cfg.lora)
    check_base_identity((meta.get("arlopti") or {}).get("lora_base"), model.arlopti_base_identity, f"export of {path}")
    own = model.state_dict()  # the adapter's tensors only (arlopti.models.lora drops the frozen base)
    state = policy_state_dict(path, own)
    missing, unexpected = sorted(set(own) - set(state)), sorted(set(state) - set(own))
    if missing or unexpected:
        raise CheckpointError(f"checkpoint {path} does not hold the adapter its config describes: missing "
                              f"{missing[:5]}, unexpected {unexpected[:5]}")
    model.load_state_dict({k: v.to(own[k].dtype) for k, v in state.items()}, strict=False)
    model.eval()
    return (model.merge_and_unload() if merge else model), tok


def _tied_names(model) -> set[str]:
    """State-dict names that share storage with an earlier name (e.g. a tied LM head)."""
    seen: dict[int, str] = {}
    tied = set()
    for k, v in model.state_dict(keep_vars=True).items():
        ptr = v.data_ptr()
        if ptr in seen:
            tied.add(k)
        else:
            seen[ptr] = k
    return tied


def export_dtype(name: str) -> torch.dtype:
    """``--dtype``'s torch dtype, checked before any checkpoint is read: a :class:`ConfigError` naming the choices."""
    try:
        return torch_dtype(name, "--dtype")
    except ValueError as err:
        raise ConfigError(str(err)) from None


def checkpoint_label(path: Path) -> str:
    """The checkpoint as the export records it, without the machine's folders: from its run folder
    (``<task_name>/<run_name>/<time>/checkpoints/<name>``) when it sits in one, else its name."""
    from arlopti.checkpoints.model_card import run_dir_of

    run = run_dir_of(path)
    if run is None:
        return path.name
    return "/".join([*run.resolve().parts[-3:], "checkpoints", path.name])


def push_to_hub(folder: Path, repo_id: str, private: bool = False) -> str:
    """Upload the export ``folder`` to the hub repo ``repo_id`` (created if absent) with ``HfApi``;
    returns the commit's URL. Credentials are ``huggingface_hub``'s own (``hf auth login`` / ``HF_TOKEN``)."""
    from huggingface_hub import HfApi

    api = HfApi()
    api.create_repo(repo_id, repo_type="model", private=private, exist_ok=True)
    commit = api.upload_folder(folder_path=str(folder), repo_id=repo_id, repo_type="model",
                               commit_message=f"arlopti export of {folder.name}")
    return str(getattr(commit, "commit_url", commit))


def export_checkpoint(ckpt: str | Path, out_dir: str | Path, dtype: str | None = None, merge: bool = False,
                      repo_id: str | None = None) -> Path:
    """Write ``save_pretrained`` model + tokenizer of ``ckpt`` into ``out_dir``, with its model card
    (``README.md``, :func:`arlopti.checkpoints.model_card.card_text`); returns ``out_dir``.

    ``dtype`` (``bfloat16``, ``float16``, ``float32``) casts the weights; default: as trained.
    A LoRA checkpoint exports a PEFT adapter folder (``adapter_model.safetensors`` +
    ``adapter_config.json``, for ``PeftModel.from_pretrained(base, out_dir)``), or with ``merge``
    the merged full weights. ``repo_id``: the hub repo the folder will be pushed to (the card's quick
    start loads it; :func:`push_to_hub` uploads).
    """
    cast = None if dtype is None else export_dtype(dtype)
    path = named_checkpoint(ckpt)
    meta = load_checkpoint_metadata(path)
    out = Path(out_dir)
    adapter = lora_enabled(model_config_of(meta, path).lora) and not merge
    card = card_text(meta, path, out.resolve().name, adapter, repo_id)  # a bad summary.json is named before any write
    model, tok = load_policy_from_checkpoint(path, merge=merge)
    if cast is not None:
        model = model.to(cast)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    model_cfg = (meta.get("hyper_parameters") or {}).get("run", {}).get("model", {})
    # model_config: what rebuilds the base of an adapter export (arlopti.models.loading.load_adapter_model)
    info = {"checkpoint": checkpoint_label(path), "rollout_step": (meta.get("arlopti") or {}).get("rollout_step"),
            "global_step": meta.get("global_step"), "model": model_cfg.get("name_or_path"), "model_config": model_cfg}
    if (meta.get("arlopti") or {}).get("lora_base"):
        info.update(lora="merged" if merge else "adapter", lora_base=meta["arlopti"]["lora_base"])
    (out / "arlopti_export.json").write_text(json.dumps(info, indent=2))
    (out / CARD).write_text(card, encoding="utf-8")  # after save_pretrained: PEFT writes a README.md of its own
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m arlopti.checkpoints.export", description=__doc__.split("\n\n")[0])
    ap.add_argument("ckpt", help="checkpoint file, FSDP2 checkpoint folder, or run directory")
    ap.add_argument("out_dir", help="where to write the save_pretrained model and tokenizer")
    ap.add_argument("--dtype", default=None,
                    help="cast the weights: bfloat16 | float16 | float32 (default: as trained)")
    ap.add_argument("--merge", action="store_true",
                    help="LoRA checkpoints: write merged full weights instead of the PEFT adapter folder")
    ap.add_argument("--push-to-hub", metavar="OWNER/NAME", default=None,
                    help="then upload the folder to this Hugging Face Hub repo (created if absent; HfApi's login)")
    ap.add_argument("--private", action="store_true", help="with --push-to-hub: create the repo private")
    args = ap.parse_args(argv)
    if args.private and not args.push_to_hub:
        raise ConfigError("--private: it applies to the repo --push-to-hub creates; add --push-to-hub OWNER/NAME")
    try:
        out = export_checkpoint(args.ckpt, args.out_dir, args.dtype, merge=args.merge, repo_id=args.push_to_hub)
    except ConfigError:
        raise  # one line and exit status 1, as every command reports it (arlopti.config.cli_report)
    except (CheckpointError, FileNotFoundError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"exported {args.ckpt} -> {out}")
    if args.push_to_hub:
        print(f"pushed to https://huggingface.co/{args.push_to_hub}: {push_to_hub(out, args.push_to_hub, args.private)}")
    return 0


if __name__ == "__main__":
    sys.exit(run_command(main))
