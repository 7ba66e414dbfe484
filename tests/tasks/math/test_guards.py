"""Pre-symbolic guards: which answers are kept away from sympy."""

import pytest

from arlopti.tasks.math.guards import symbolic_risk


@pytest.mark.parametrize("answer, reason", [
    ("9^{9^{9^{9}}}", "power_tower"),
    ("10^{10^{10}}", "power_tower"),
    ("2^2^2", "power_tower"),
    ("10**10**10", "power_tower"),
    ("9^{999999999}", "huge_exponent"),
    ("1000000!", "huge_factorial"),
    ("1" * 1001, "too_long"),
])
def test_risky(answer, reason):
    assert symbolic_risk(answer) == reason


@pytest.mark.parametrize("answer", [
    "2^{2024}", "x^2+2x+1", "(x^2+1)^2", "e^{i\\pi}", "10!", "\\frac{1}{2}", "3^{99999}"])
def test_allowed(answer):
    assert symbolic_risk(answer) is None
