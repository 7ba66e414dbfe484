"""``Experience``: one rollout step's sampled responses and rewards, as the learner consumes them.

Built by the rollout callback from the prompts, the engine's completions and the task's
rewards; attached to the :class:`~arlopti.data.batch.PromptBatch` as ``batch.experience``.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch
from torch import Tensor

from arlopti.rollout.engine import Completion
from arlopti.tasks.base import RewardResult


@dataclass
class Experience:
    input_ids: Tensor  # long [B, P + R]: left-padded prompt | right-padded response
    attention_mask: Tensor  # long [B, P + R]
    response_mask: Tensor  # float [B, R]: 1 on response tokens (EOS included), 0 on padding
    prompt_len: int  # P
    rewards: Tensor  # float [B]
    group_ids: Tensor  # long [B]: responses to the same prompt share an id (unique over ranks)
    truncated: Tensor  # bool [B]: hit max_new_tokens without EOS
    correct: Tensor  # bool [B]: the task's notion of solved
    components: dict[str, Tensor] = field(default_factory=dict)  # reward components, [B] each
    response_texts: list[str] = field(default_factory=list)
    prompt_texts: list[str] = field(default_factory=list)
    metas: list[dict] = field(default_factory=list)
    engine_logprobs: Tensor | None = None  # [B, R] from the engine, if it returned them
    timings: dict[str, float] = field(default_factory=dict)
    # DAPO dynamic sampling's per-rank counts (arlopti.callbacks.rollout; empty when it is off):
    # gen_rounds, groups_generated, kept_frac, groups_trained, no_signal_fallback
    sampling_stats: dict[str, float] = field(default_factory=dict)

    def __len__(self) -> int:
        return self.input_ids.shape[0]

    @property
    def response_ids(self) -> Tensor:
        return self.input_ids[:, self.prompt_len:]

    def select(self, rows: Tensor | list[int]) -> "Experience":
        """A sub-batch of rows, trimmed to the longest response among them (less padding)."""
        rows = torch.as_tensor(rows, dtype=torch.long)
        resp = self.response_mask[rows]
        r = int(resp.sum(-1).max().item()) if len(rows) else 0
        r = max(r, 1)
        cut = self.prompt_len + r
        idx = rows.tolist()
        return Experience(
            input_ids=self.input_ids[rows, :cut], attention_mask=self.attention_mask[rows, :cut],
            response_mask=resp[:, :r], prompt_len=self.prompt_len, rewards=self.rewards[rows],
            group_ids=self.group_ids[rows], truncated=self.truncated[rows], correct=self.correct[rows],
            components={k: v[rows] for k, v in self.components.items()},
            response_texts=[self.response_texts[i] for i in idx] if self.response_texts else [],
            prompt_texts=[self.prompt_texts[i] for i in idx] if self.prompt_texts else [],
            metas=[self.metas[i] for i in idx] if self.metas else [],
            engine_logprobs=None if self.engine_logprobs is None else self.engine_logprobs[rows, :r],
        )


def pad_prompt_response(prompts: list[list[int]], responses: list[list[int]], pad_id: int
                        ) -> tuple[Tensor, Tensor, Tensor, int]:
    """``[prompt | response]`` rows: prompts left-padded to P, responses right-padded to R.

    Returns ``(input_ids [B, P+R], attention_mask [B, P+R], response_mask [B, R] float, P)``.
    """
    p = max(len(x) for x in prompts)
    r = max(1, max(len(x) for x in responses))
    b = len(prompts)
    input_ids = torch.full((b, p + r), pad_id, dtype=torch.long)
    attn = torch.zeros((b, p + r), dtype=torch.long)
    resp_mask = torch.zeros((b, r), dtype=torch.float32)
    for row, (ids, out) in enumerate(zip(prompts, responses)):
        input_ids[row, p - len(ids):p] = torch.tensor(ids, dtype=torch.long)
        attn[row, p - len(ids):p] = 1
        if out:
            input_ids[row, p:p + len(out)] = torch.tensor(out, dtype=torch.long)
            attn[row, p:p + len(out)] = 1
            resp_mask[row, :len(out)] = 1
    return input_ids, attn, resp_mask, p


def build_experience(prompt_ids: list[list[int]], completions: list[list[Completion]],
                     results: list[RewardResult], pad_id: int, group_offset: int = 0,
                     prompt_texts: list[str] | None = None, metas: list[dict] | None = None) -> Experience:
    """Pad prompts left and responses right into one ``[B, P + R]`` batch (B = prompts × G).

    ``results`` is flat, in the order prompt 0 sample 0, prompt 0 sample 1, …; group ids are
    ``group_offset + prompt index`` so ranks can keep them globally unique.
    """
    flat = [(i, c) for i, cs in enumerate(completions) for c in cs]
    if len(flat) != len(results):
        raise ValueError(f"{len(flat)} completions but {len(results)} reward results")
    input_ids, attn, resp_mask, p = pad_prompt_response([prompt_ids[i] for i, _ in flat],
                                                        [c.token_ids for _, c in flat], pad_id)
    eng_lp = None
    if all(c.logprobs is not None for _, c in flat):
        eng_lp = torch.zeros_like(resp_mask)
        for row, (_, c) in enumerate(flat):
            eng_lp[row, :len(c.token_ids)] = torch.tensor(c.logprobs[:len(c.token_ids)])
    b = len(flat)
    comps: dict[str, list[float]] = {}
    for res in results:
        for k, v in res.components.items():
            comps.setdefault(k, []).append(float(v))
    return Experience(
        input_ids=input_ids, attention_mask=attn, response_mask=resp_mask, prompt_len=p,
        rewards=torch.tensor([res.reward for res in results], dtype=torch.float32),
        group_ids=torch.tensor([group_offset + i for i, _ in flat], dtype=torch.long),
        truncated=torch.tensor([c.truncated for _, c in flat], dtype=torch.bool),
        correct=torch.tensor([res.correct for res in results], dtype=torch.bool),
        components={k: torch.tensor(v) for k, v in comps.items() if len(v) == b},
        response_texts=[c.text for _, c in flat],
        prompt_texts=[prompt_texts[i] for i, _ in flat] if prompt_texts else [],
        metas=[metas[i] for i, _ in flat] if metas else [],
        engine_logprobs=eng_lp,
    )


def experience_of(batch) -> Experience:
    """The experience the rollout callback attached to ``batch``."""
    exp: Experience | None = getattr(batch, "experience", None)
    if exp is None:
        raise RuntimeError("the batch carries no experience: the learner's RolloutCallback "
                           "(arlopti.train.attach_rollout_callback) attaches it before each step")
    return exp


def without_truncated(exp: Experience) -> Experience:
    """DAPO's truncation masking (``algorithm.dapo.mask_truncated``): the same experience with the
    responses cut at ``rollout.max_new_tokens`` masked out of the loss (their tokens leave every
    normaliser too); the step's rollout metrics still describe every sampled response."""
    keep = (~exp.truncated).to(exp.response_mask.dtype).unsqueeze(-1)
    return replace(exp, response_mask=exp.response_mask * keep)


def to_device(exp: Experience, device) -> Experience:
    """Move the tensors the learner reads to ``device`` (in place; a no-op when already there)."""
    if exp.input_ids.device == torch.device(device):
        return exp
    for name in ("input_ids", "attention_mask", "response_mask", "rewards", "group_ids", "truncated", "correct",
                 "engine_logprobs"):
        if getattr(exp, name) is not None:
            setattr(exp, name, getattr(exp, name).to(device))
    return exp
