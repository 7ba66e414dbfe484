"""What the trainer reads from processes that run user code (an environment's host and episodes, the math
and reward workers): plain values only (arlopti.tasks.env.calls.plain_loads / plain_value)."""

from __future__ import annotations

import fractions
import pickle

import pytest

from arlopti.tasks.env.calls import plain_loads, plain_value
from helpers.worker_envs import Payload


def test_an_object_built_to_run_code_is_refused_and_nothing_runs(tmp_path):
    marker = tmp_path / "ran"
    data = pickle.dumps(("result", 1, 2, Payload(str(marker))))
    with pytest.raises(pickle.UnpicklingError, match="posix.system is not a plain value"):
        plain_loads(data)
    assert not marker.exists()
    with pytest.raises(pickle.UnpicklingError, match="fractions.Fraction"):
        plain_loads(pickle.dumps(fractions.Fraction(1, 3)))


def test_plain_values_round_trip_exactly():
    value = ("ok", (None, True, 3, 2.5, float("nan"), 1j, "s", b"b"), [1, {"a": (2,)}], {3, 4}, frozenset({5}))
    got = plain_loads(pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL))
    assert got[0] == "ok" and got[1][4] != got[1][4] and got[1][:4] == value[1][:4] and got[2:] == value[2:]
    assert type(got[1]) is tuple and type(got[2]) is list


def test_numbers_of_other_types_become_pythons_own():
    got = plain_value(("r", fractions.Fraction(1, 4), [True, 7], {"k": fractions.Fraction(3, 1)}))
    assert got == ("r", 0.25, [True, 7], {"k": 3.0}) and type(got[1]) is float and type(got[3]["k"]) is float
