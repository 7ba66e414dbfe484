"""Brute-force K&K solver over all 2^N assignments, vectorised with Python big-int bitsets.

Assignment ``a`` (an integer in ``0..2^N-1``) makes person ``i`` a knight iff bit ``i`` of ``a`` is
set. A *truth table* is an integer with 2^N bits whose bit ``a`` is the statement's value under
assignment ``a``. ``and``/``or``/``not`` are then single bitwise operations over all assignments at
once, so solving N = 12 (4096 assignments x 12 statements) takes tens of microseconds.
"""

from __future__ import annotations

from functools import lru_cache

from arlopti.tasks.kk.logic import Statement, Statements

MAX_SOLVER_PEOPLE = 16  # 65,536-bit tables; beyond this the brute force stops being "quick"


@lru_cache(maxsize=None)
def person_tables(num_people: int) -> tuple[int, tuple[int, ...]]:
    """``(full, knight)``: ``full`` has all 2^N bits set; ``knight[i]`` is "person i is a knight".

    ``knight[i]`` repeats the block "2^i zeros then 2^i ones" across the 2^N bits; it is built as
    one block times the integer whose bits start every block, so no Python loop over assignments.
    """
    if not 1 <= num_people <= MAX_SOLVER_PEOPLE:
        raise ValueError(f"num_people={num_people}: the solver handles 1..{MAX_SOLVER_PEOPLE} people")
    size = 1 << num_people
    full = (1 << size) - 1
    tables = []
    for i in range(num_people):
        half = 1 << i
        block = ((1 << half) - 1) << half  # within a block of 2*half bits: high half set
        repeat = full // ((1 << (2 * half)) - 1)  # 1 at the start of every block
        tables.append(block * repeat)
    return full, tuple(tables)


def truth_table(stmt: Statement, num_people: int) -> int:
    """The truth table of ``stmt`` (see module docstring). ``stmt`` must be well-formed."""
    full, knight = person_tables(num_people)
    return _table(stmt, full, knight)


def _table(stmt: Statement, full: int, knight: tuple[int, ...]) -> int:
    op = stmt[0]
    if op == "telling-truth":
        return knight[stmt[1]]
    if op == "lying":
        return full ^ knight[stmt[1]]
    if op == "not":
        return full ^ _table(stmt[1], full, knight)
    if op == "and":
        out = full
        for s in stmt[1:]:
            out &= _table(s, full, knight)
        return out
    if op == "or":
        out = 0
        for s in stmt[1:]:
            out |= _table(s, full, knight)
        return out
    if op == "->":
        return (full ^ _table(stmt[1], full, knight)) | _table(stmt[2], full, knight)
    if op == "<=>":
        return full ^ (_table(stmt[1], full, knight) ^ _table(stmt[2], full, knight))
    raise ValueError(f"unknown operator {op!r} in {stmt!r}")


def consistent_table(statements: Statements, num_people: int) -> int:
    """Bitset of the assignments in which, for every i, "i is a knight" <=> statement i is true."""
    full, knight = person_tables(num_people)
    ok = full
    for i, stmt in enumerate(statements):
        # XNOR of "i is a knight" with the statement's truth.
        ok &= full ^ (knight[i] ^ _table(stmt, full, knight))
        if not ok:
            break
    return ok


def count_solutions(statements: Statements, num_people: int) -> int:
    """How many assignments are consistent (what the generator's uniqueness filter needs)."""
    return consistent_table(statements, num_people).bit_count()


def solve(statements: Statements, num_people: int) -> list[tuple[bool, ...]]:
    """Every consistent knight/knave assignment, as tuples of bools (True = knight).

    Consistent means: for every person i, "i is a knight" is equivalent to statement i being true.
    The assignments are returned in increasing order of their integer code (bit i = person i),
    so the all-knave assignment, if consistent, comes first. ``statements`` must be well-formed
    (see :func:`arlopti.tasks.kk.logic.validate_statements`); ``len(statements)`` must equal
    ``num_people``.
    """
    if len(statements) != num_people:
        raise ValueError(f"solve: {len(statements)} statements for num_people={num_people}")
    ok = consistent_table(statements, num_people)
    out = []
    while ok:
        low = ok & -ok
        code = low.bit_length() - 1
        out.append(tuple(bool((code >> i) & 1) for i in range(num_people)))
        ok ^= low
    return out
