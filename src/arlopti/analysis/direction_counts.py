"""The counts behind the Fig. 3 fractions, and the units they rest on (issue 51).

A "rose" fraction is k / n over the tokens of one bucket and one sign of A. Those tokens are not
independent samples: every token of a batch moves under the same optimizer update, and the tokens of one
response share its advantage. So beside each fraction :mod:`.compare_methods` writes, per bucket and
sign of the GRPO advantage A:

* :func:`support`: the tokens (n), the responses holding at least one of them and the groups (prompts)
  those responses belong to: the independent units a fraction rests on;
* :func:`moved_counts`: k, the tokens that moved the way A asks (``pos_rose``: A > 0 and log p rose
  strictly; ``neg_fell``: A < 0 and it fell strictly; float32, as
  :func:`arlopti.plugins.buckets.update_direction_counts`, so ``k / n`` is its fraction exactly);
* :func:`discordant`: against a baseline's update of the same batch (GRPO), the tokens that moved the
  right way under one and not the other (``this_only``, ``base_only``), and per response the sign of
  (its tokens moved the right way here) − (under the baseline): ``responses_more``, ``responses_fewer``,
  ``responses_same``.

Tokens with A = 0 count nowhere. Buckets are those of p_old (:func:`~arlopti.plugins.buckets.bucket_index`).
"""

from __future__ import annotations

from torch import Tensor

from arlopti.plugins.buckets import BUCKET_NAMES, NUM_BUCKETS

SIGNS = ("pos", "neg")
#: each sign's count of tokens that moved the way A asks
MOVED_KEYS = {"pos": "pos_rose", "neg": "neg_fell"}


def sign_masks(adv: Tensor, mask: Tensor) -> dict[str, Tensor]:
    """``{"pos": A > 0, "neg": A < 0}`` over the valid tokens, bool ``[B, R]``."""
    valid = mask.bool()
    return {"pos": valid & (adv > 0), "neg": valid & (adv < 0)}


def right_way(old: Tensor, new: Tensor, adv: Tensor, mask: Tensor) -> Tensor:
    """bool ``[B, R]``: the token moved the way A asks, strictly (A > 0 and log p rose, or A < 0 and it fell)."""
    delta = new.detach().float() - old.detach().float()
    s = sign_masks(adv, mask)
    return (s["pos"] & (delta > 0)) | (s["neg"] & (delta < 0))


def support(idx: Tensor, adv: Tensor, mask: Tensor, group_ids: Tensor) -> dict:
    """``{sign: {"tokens" | "responses" | "groups": {bucket: count}}}`` (module docstring); ``idx`` the bucket
    of each token, ``group_ids`` ``[B]`` the prompt of each response."""
    out = {}
    for sign, sel in sign_masks(adv, mask).items():
        entry = {"tokens": {}, "responses": {}, "groups": {}}
        for b, name in enumerate(BUCKET_NAMES):
            here = sel & (idx == b)
            rows = here.any(dim=1)
            entry["tokens"][name] = int(here.sum())
            entry["responses"][name] = int(rows.sum())
            entry["groups"][name] = len(set(group_ids[rows.to(group_ids.device)].tolist()))
        out[sign] = entry
    return out


def moved_counts(moved: Tensor, idx: Tensor, adv: Tensor, mask: Tensor) -> dict:
    """``{"pos_rose": {bucket: k}, "neg_fell": {bucket: k}}`` from :func:`right_way`'s mask."""
    return {MOVED_KEYS[sign]: {name: int((moved & sel & (idx == b)).sum()) for b, name in enumerate(BUCKET_NAMES)}
            for sign, sel in sign_masks(adv, mask).items()}


def discordant(moved: Tensor, base: Tensor, idx: Tensor, adv: Tensor, mask: Tensor) -> dict:
    """``{sign: {bucket: {"this_only", "base_only", "responses_more", "responses_fewer", "responses_same"}}}``:
    ``moved`` against ``base`` (two :func:`right_way` masks of the same batch; module docstring). A response
    counts in a bucket and sign when it holds at least one such token."""
    out = {}
    for sign, sel in sign_masks(adv, mask).items():
        out[sign] = {}
        for b in range(NUM_BUCKETS):
            here = sel & (idx == b)
            mine, theirs = (moved & here).sum(dim=1), (base & here).sum(dim=1)
            rows = here.any(dim=1)
            out[sign][BUCKET_NAMES[b]] = {
                "this_only": int((moved & ~base & here).sum()), "base_only": int((base & ~moved & here).sum()),
                "responses_more": int((rows & (mine > theirs)).sum()),
                "responses_fewer": int((rows & (mine < theirs)).sum()),
                "responses_same": int((rows & (mine == theirs)).sum())}
    return out
