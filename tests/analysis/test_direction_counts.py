"""The counts behind the Fig. 3 fractions (``arlopti.analysis.direction_counts``), by hand on a 3-response batch."""

from __future__ import annotations

import math

import torch

from arlopti.plugins.buckets import BUCKET_NAMES, bucket_index, update_direction_counts, update_direction_fractions
from arlopti.analysis.direction_counts import discordant, moved_counts, right_way, support

LOW, TOP = BUCKET_NAMES[0], BUCKET_NAMES[-1]
# three responses, three tokens each; response 2 has only two valid tokens
P_OLD = torch.tensor([[0.9, 0.9, 0.1], [0.95, 0.8, 0.2], [0.9, 0.1, 0.5]])
MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
ADV = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 1.0], [-1.0, -1.0, -1.0]]) * MASK
GROUPS = torch.tensor([0, 1, 1])
OLD = P_OLD.log()


def _new(rise: list[list[int]]) -> torch.Tensor:
    """log p after an update: +0.01 where ``rise`` is 1, −0.01 where −1, unchanged where 0."""
    return OLD + 0.01 * torch.tensor(rise, dtype=torch.float32)


GRPO = _new([[1, -1, 1], [1, 1, 1], [-1, -1, 0]])
METHOD = _new([[1, 1, 1], [-1, 1, 1], [1, -1, 0]])


def test_support_counts_tokens_responses_and_groups_per_sign_and_bucket():
    s = support(bucket_index(P_OLD), ADV, MASK, GROUPS)
    # A > 0 in (.75, 1]: (0,0), (0,1), (1,0), (1,1): 4 tokens of responses 0 and 1, groups 0 and 1
    assert (s["pos"]["tokens"][TOP], s["pos"]["responses"][TOP], s["pos"]["groups"][TOP]) == (4, 2, 2)
    # A > 0 in [0, .25]: (0,2), (1,2)
    assert (s["pos"]["tokens"][LOW], s["pos"]["responses"][LOW], s["pos"]["groups"][LOW]) == (2, 2, 2)
    # A < 0: (2,0) in the top bucket, (2,1) in the lowest; (2,2) is padding
    assert (s["neg"]["tokens"][TOP], s["neg"]["responses"][TOP], s["neg"]["groups"][TOP]) == (1, 1, 1)
    assert s["neg"]["tokens"][LOW] == 1 and sum(s["neg"]["tokens"].values()) == 2


def test_moved_counts_are_the_numerators_of_update_direction_fractions():
    idx = bucket_index(P_OLD)
    c = moved_counts(right_way(OLD, GRPO, ADV, MASK), idx, ADV, MASK)
    assert c["pos_rose"][TOP] == 3 and c["neg_fell"][TOP] == 1 and c["neg_fell"][LOW] == 1
    pos, neg = update_direction_fractions(update_direction_counts(OLD, GRPO, ADV, MASK))
    assert c["pos_rose"][TOP] / 4 == pos[-1].item() and c["neg_fell"][TOP] / 1 == neg[-1].item()


def test_discordant_tokens_and_responses_against_the_baseline():
    idx = bucket_index(P_OLD)
    d = discordant(right_way(OLD, METHOD, ADV, MASK), right_way(OLD, GRPO, ADV, MASK), idx, ADV, MASK)
    top = d["pos"][TOP]
    # response 0: the method raises (0,0),(0,1), GRPO only (0,0); response 1: the method (1,1), GRPO both
    assert (top["this_only"], top["base_only"]) == (1, 1)
    assert (top["responses_more"], top["responses_fewer"], top["responses_same"]) == (1, 1, 0)
    # A < 0 in the top bucket: (2,0) fell under GRPO, rose under the method
    assert (d["neg"][TOP]["this_only"], d["neg"][TOP]["base_only"], d["neg"][TOP]["responses_fewer"]) == (0, 1, 1)
    same = discordant(right_way(OLD, GRPO, ADV, MASK), right_way(OLD, GRPO, ADV, MASK), idx, ADV, MASK)
    assert same["pos"][TOP] == {"this_only": 0, "base_only": 0, "responses_more": 0, "responses_fewer": 0,
                                "responses_same": 2}


def test_an_unchanged_token_moved_neither_way():
    moved = right_way(OLD, OLD.clone(), ADV, MASK)
    assert not moved.any() and math.isclose(float((OLD - OLD).abs().sum()), 0.0)
