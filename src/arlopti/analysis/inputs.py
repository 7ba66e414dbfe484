"""What every analysis runs on: a policy (optionally SFT-warmed, cached) and one batch of rollouts.

Policy: :func:`load_policy` loads a model by name (``smollm2-135m-instruct`` offline, ``tiny``, a
local ``save_pretrained`` folder) in float32 and, with ``cold_start_steps > 0``, first runs
:func:`arlopti.learner.cold_start.run_cold_start` on it. The warmed-up weights are cached under
``arlopti.models.loading.cache_dir() / "analysis" / "cold_start"`` in a folder named by a hash of every
setting that changes them (model, dtype, each :class:`ColdStartConfig` field), so repeated commands
and tests reuse them; delete the folder to redo it.

Batch: :func:`sample_kk_batch` samples ``group_size`` responses for each of ``num_prompts``
generated K&K puzzles with the HF engine (the learner's sampler), scores them with the K&K reward
and lays them out exactly as the learner does (``[left-padded prompt | right-padded response]``).
:func:`batch_from_dump` rebuilds the same layout from a rollout dump written with token arrays.

Advantages (:func:`choose_advantages`): the real GRPO advantages of the sampled groups whenever some
group's rewards vary. When none does (e.g. the raw model, which fails the format everywhere),
``mode="auto"`` falls back to **synthetic** advantages, ±1 per sequence at random; the batch then
carries ``advantage_source = "synthetic ±1 per sequence"`` and every figure and JSON says so.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from torch import Tensor

from arlopti.algorithms import broadcast_to_tokens, grpo_advantages
from arlopti.learner.cold_start import ColdStartConfig, run_cold_start
from arlopti.learner.experience import Experience, build_experience, pad_prompt_response
from arlopti.learner.policy import PolicyLM, disable_dropout
from arlopti.models.loading import cache_dir, load_causal_lm, load_tokenizer, resolve_model_path

log = logging.getLogger(__name__)

ADVANTAGE_MODES = ("auto", "grpo", "synthetic")
GRPO_SOURCE = "grpo"
SYNTHETIC_SOURCE = "synthetic ±1 per sequence"
_CACHE_VERSION = 1  # bump when the cold-start recipe changes in a way the key does not capture


@dataclass
class LoadedPolicy:
    policy: PolicyLM
    tokenizer: object
    info: dict = field(default_factory=dict)  # model name, cold-start settings and losses, cache folder


def cold_start_config(steps: int, overrides: dict | None = None) -> ColdStartConfig:
    """A :class:`ColdStartConfig` with ``steps`` and any field overrides (unknown names raise)."""
    fields = set(ColdStartConfig.__dataclass_fields__)
    unknown = sorted(set(overrides or {}) - fields)
    if unknown:
        raise ValueError(f"cold-start overrides {unknown} are not ColdStartConfig fields; known: {sorted(fields)}")
    return ColdStartConfig(**{**(overrides or {}), "steps": steps, "enabled": True})


def cold_start_cache_dir(model_name: str, cfg: ColdStartConfig, dtype: str = "float32") -> Path:
    """The cache folder of a warmed-up model: ``<cache>/analysis/cold_start/<model>-<steps>steps-<hash>``."""
    ident = model_name if model_name.startswith("tiny") else resolve_model_path(model_name)
    payload = json.dumps({"model": ident, "dtype": dtype, "cfg": asdict(cfg), "v": _CACHE_VERSION},
                         sort_keys=True)
    digest = hashlib.sha1(payload.encode()).hexdigest()[:12]
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in Path(model_name).name)
    return cache_dir() / "analysis" / "cold_start" / f"{safe}-{cfg.steps}steps-{digest}"


def load_policy(model_name: str = "smollm2-135m-instruct", cold_start_steps: int = 0,
                cold_start_overrides: dict | None = None, dtype: str = "float32") -> LoadedPolicy:
    """Load the policy, SFT-warmed for ``cold_start_steps`` steps when > 0 (cached, see module doc)."""
    from safetensors.torch import load_model, save_model

    if cold_start_steps < 0:
        raise ValueError(f"--cold-start-steps must be >= 0, got {cold_start_steps}")
    tok = load_tokenizer(model_name)
    model = load_causal_lm(model_name, tok, dtype=dtype)
    disable_dropout(model)
    policy = PolicyLM(model, "naive")
    info: dict = {"model": model_name, "dtype": dtype, "cold_start_steps": cold_start_steps}
    if cold_start_steps == 0:
        return LoadedPolicy(policy, tok, info)
    cfg = cold_start_config(cold_start_steps, cold_start_overrides)
    folder = cold_start_cache_dir(model_name, cfg, dtype)
    info.update(cold_start=asdict(cfg), cold_start_cache=folder.name)  # by name: records name no machine path
    weights, meta = folder / "model.safetensors", folder / "cold_start.json"
    if weights.exists() and meta.exists():
        load_model(model, str(weights))
        info.update(json.loads(meta.read_text()), cache_hit=True)
        return LoadedPolicy(policy, tok, info)
    t0 = time.perf_counter()
    losses = run_cold_start(policy, tok, cfg)
    policy.eval()
    record = {"losses": losses, "cold_start_seconds": time.perf_counter() - t0}
    tmp = folder.with_name(folder.name + f".tmp{os.getpid()}")
    tmp.mkdir(parents=True, exist_ok=True)
    save_model(model, str(tmp / "model.safetensors"))
    (tmp / "cold_start.json").write_text(json.dumps(record, indent=1))
    try:
        tmp.rename(folder)
    except OSError:  # another process cached the same settings first: theirs is identical
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)
    info.update(record, cache_hit=False)
    return LoadedPolicy(policy, tok, info)


@dataclass
class AnalysisBatch:
    """One batch of scored rollouts in the learner's layout (see :mod:`arlopti.learner.experience`)."""

    input_ids: Tensor  # long [B, P + R]
    attention_mask: Tensor  # long [B, P + R]
    response_mask: Tensor  # float [B, R]
    prompt_len: int
    rewards: Tensor  # float [B]
    group_ids: Tensor  # long [B]
    seq_advantages: Tensor  # float [B]
    advantage_source: str
    temperature: float
    response_texts: list[str] = field(default_factory=list)
    prompt_texts: list[str] = field(default_factory=list)
    components: dict[str, Tensor] = field(default_factory=dict)
    info: dict = field(default_factory=dict)

    def __len__(self) -> int:
        return self.input_ids.shape[0]

    @property
    def advantages(self) -> Tensor:
        """``[B, R]``: each response's advantage on its tokens, 0 on padding."""
        return broadcast_to_tokens(self.seq_advantages, self.response_mask)

    @property
    def response_ids(self) -> Tensor:
        return self.input_ids[:, self.prompt_len:]

    def select(self, rows: list[int]) -> "AnalysisBatch":
        """The sub-batch of ``rows`` (advantages kept, not recomputed), cut to its longest response."""
        idx = torch.as_tensor(rows, dtype=torch.long)
        r = max(1, int(self.response_mask[idx].sum(-1).max()))
        cut = self.prompt_len + r
        return AnalysisBatch(
            self.input_ids[idx, :cut], self.attention_mask[idx, :cut], self.response_mask[idx, :r], self.prompt_len,
            self.rewards[idx], self.group_ids[idx], self.seq_advantages[idx], self.advantage_source,
            self.temperature, [self.response_texts[i] for i in rows] if self.response_texts else [],
            [self.prompt_texts[i] for i in rows] if self.prompt_texts else [],
            {k: v[idx] for k, v in self.components.items()}, dict(self.info))

    def to_experience(self) -> Experience:
        """The :class:`Experience` the learner would get for this batch (for replaying a step)."""
        b = len(self)
        return Experience(
            input_ids=self.input_ids.clone(), attention_mask=self.attention_mask.clone(),
            response_mask=self.response_mask.clone(), prompt_len=self.prompt_len, rewards=self.rewards.clone(),
            group_ids=self.group_ids.clone(), truncated=torch.zeros(b, dtype=torch.bool),
            correct=self.rewards >= 3.0, components={k: v.clone() for k, v in self.components.items()},
            response_texts=list(self.response_texts), prompt_texts=list(self.prompt_texts))

    def summary(self) -> dict:
        """JSON-ready description: sizes, reward spread, the advantage source."""
        lengths = self.response_mask.sum(-1)
        return {
            "responses": len(self), "prompts": int(torch.unique(self.group_ids).numel()),
            "tokens": int(self.response_mask.sum()), "response_len_mean": float(lengths.mean()),
            "reward_mean": float(self.rewards.mean()),
            "reward_values": {str(float(v)): int((self.rewards == v).sum()) for v in torch.unique(self.rewards)},
            "advantage_source": self.advantage_source, "temperature": self.temperature, **self.info,
        }


def choose_advantages(rewards: Tensor, group_ids: Tensor, mode: str = "auto", seed: int = 0
                      ) -> tuple[Tensor, str]:
    """``(advantages [B], source)``; see the module docstring for the rule."""
    if mode not in ADVANTAGE_MODES:
        raise ValueError(f"--advantages {mode!r}: choose one of {list(ADVANTAGE_MODES)}")
    real = grpo_advantages(rewards, group_ids)
    if mode == "grpo" or (mode == "auto" and bool((real != 0).any())):
        return real, GRPO_SOURCE
    gen = torch.Generator().manual_seed(seed)
    signs = torch.randint(0, 2, (rewards.shape[0],), generator=gen).float() * 2 - 1
    return signs, SYNTHETIC_SOURCE


def kk_prompts(tokenizer, num_prompts: int, num_people: list[int], puzzle_seed: int,
               template: str = "qwen-instruct") -> tuple[list[list[int]], list[str], list[str], list[dict]]:
    """``num_prompts`` generated puzzles, cycling over ``num_people``: (ids, texts, gold answers, metas)."""
    from arlopti.prompts.records import render_prompt
    from arlopti.tasks.kk import build_prompt, sample_puzzles

    if num_prompts < 1 or not num_people:
        raise ValueError(f"need --prompts >= 1 and at least one --num-people, got {num_prompts}, {num_people}")
    per_n = {n: sample_puzzles(n, -(-num_prompts // len(num_people)), seed=puzzle_seed) for n in num_people}
    ids, texts, golds, metas = [], [], [], []
    for i in range(num_prompts):
        n = num_people[i % len(num_people)]
        puzzle = per_n[n][i // len(num_people)]
        rec = build_prompt(puzzle, template).to_prompt_record(uid=f"analysis/{n}/{i}", ground_truth=None)
        text = render_prompt(rec, tokenizer)
        ids.append(tokenizer(text, add_special_tokens=False)["input_ids"])
        texts.append(text)
        golds.append(puzzle.solution_text_format)
        metas.append({"n_people": n, "index": puzzle.index})
    return ids, texts, golds, metas


@torch.no_grad()
def sample_kk_batch(loaded: LoadedPolicy, num_prompts: int = 8, group_size: int = 4, max_new_tokens: int = 96,
                    temperature: float = 0.7, seed: int = 0, num_people: list[int] | None = None,
                    puzzle_seed: int = 4242, advantages: str = "auto", generation_batch_size: int = 64
                    ) -> AnalysisBatch:
    """Sample, score and lay out one batch (module docstring). Deterministic given the seeds."""
    from arlopti.rollout.engine import SamplingConfig
    from arlopti.rollout.hf import HFEngine
    from arlopti.tasks.kk import KKTask

    if group_size < 2:
        raise ValueError(f"--group-size must be >= 2 (GRPO needs a group), got {group_size}")
    tok = loaded.tokenizer
    ids, texts, golds, metas = kk_prompts(tok, num_prompts, list(num_people or [2, 3]), puzzle_seed)
    engine = HFEngine(loaded.policy, tok, generation_batch_size=generation_batch_size)
    t0 = time.perf_counter()
    completions = engine.generate(ids, group_size, SamplingConfig(temperature=temperature,
                                                                  max_new_tokens=max_new_tokens, seed=seed))
    gen_s = time.perf_counter() - t0
    flat_texts = [c.text for cs in completions for c in cs]
    results = KKTask().score(flat_texts, [g for g in golds for _ in range(group_size)],
                             [m for m in metas for _ in range(group_size)])
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    exp = build_experience(ids, completions, results, pad_id=pad, prompt_texts=texts, metas=metas)
    adv, source = choose_advantages(exp.rewards, exp.group_ids, advantages, seed)
    info = {"source": "live", "model_info": loaded.info, "seed": seed, "puzzle_seed": puzzle_seed,
            "num_people": list(num_people or [2, 3]), "max_new_tokens": max_new_tokens,
            "generation_seconds": gen_s, "truncated_frac": float(exp.truncated.float().mean())}
    return AnalysisBatch(exp.input_ids, exp.attention_mask, exp.response_mask, exp.prompt_len, exp.rewards,
                         exp.group_ids, adv, source, temperature, exp.response_texts, exp.prompt_texts,
                         exp.components, info)


def batch_from_dump(path: str | Path, temperature: float, step: int | None = None, advantages: str = "auto",
                    seed: int = 0, pad_id: int = 0) -> AnalysisBatch:
    """The batch of one step of a rollout dump (default: the first step in the file).

    The dump must hold token arrays (``token_arrays: true`` in the callback). Advantages are
    recomputed from the dumped rewards and group ids (:func:`choose_advantages`); the token
    probabilities are *not* taken from the dump: analyses recompute them with the loaded model, so
    load the checkpoint the dump was written from.
    """
    from arlopti.learner.rollout_dump import read_dump

    rows = read_dump(path)
    if not rows:
        raise ValueError(f"{path}: the rollout dump is empty")
    steps = sorted({r["step"] for r in rows})
    chosen = steps[0] if step is None else step
    rows = [r for r in rows if r["step"] == chosen]
    if not rows:
        raise ValueError(f"{path}: no records for step {step}; the dump holds steps {steps}")
    if any("prompt_ids" not in r or "response_ids" not in r for r in rows):
        raise ValueError(f"{path}: the records carry no token ids; write the dump with token_arrays: true "
                         "(RolloutDumpCallback) or `python -m arlopti.analysis dump`")
    ids, attn, mask, p = pad_prompt_response([list(r["prompt_ids"]) for r in rows],
                                             [list(r["response_ids"]) for r in rows], pad_id)
    rewards = torch.tensor([float(r["reward"]) for r in rows])
    groups = torch.tensor([int(r["group_id"]) for r in rows])
    adv, source = choose_advantages(rewards, groups, advantages, seed)
    comps: dict[str, list[float]] = {}
    for r in rows:
        for k, v in (r.get("components") or {}).items():
            comps.setdefault(k, []).append(float(v))
    return AnalysisBatch(ids, attn, mask, p, rewards, groups, adv, source, temperature,
                         [r.get("completion", "") for r in rows], [r.get("prompt", "") for r in rows],
                         {k: torch.tensor(v) for k, v in comps.items() if len(v) == len(rows)},
                         {"source": f"dump:{path}", "step": chosen})
