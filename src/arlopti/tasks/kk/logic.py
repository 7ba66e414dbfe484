"""The logical form of Knights-and-Knaves statements, as in the original generator (mem-kk-logic).

A statement is a nested tuple:

* leaves ``('telling-truth', j)`` ("person j is a knight") and ``('lying', j)`` ("person j is a
  knave"), with ``j`` a 0-based person index;
* ``('not', s)``; ``('and', s1, s2, ...)`` and ``('or', s1, s2, ...)`` with at least two operands;
  ``('->', a, b)`` and ``('<=>', a, b)`` with exactly two.

A puzzle is a tuple of N statements, statement ``i`` being what person ``i`` says. Statements are
stored in records as the Python literal of that tuple (``repr``), which :func:`parse_statements`
reads back with :func:`ast.literal_eval` (never ``eval``).
"""

from __future__ import annotations

import ast
from typing import Any

LEAF_OPS = ("telling-truth", "lying")
NARY_OPS = ("and", "or")
BINARY_OPS = ("->", "<=>")
ALL_OPS = LEAF_OPS + ("not",) + NARY_OPS + BINARY_OPS

Statement = tuple  # ('telling-truth', 0), ('and', ('lying', 1), ('telling-truth', 2)), ...
Statements = tuple  # one Statement per person

# A statements literal longer than this is not a K&K puzzle; refuse it before parsing.
MAX_LITERAL_CHARS = 100_000


def is_leaf(stmt: Statement) -> bool:
    """True for ``('telling-truth', j)`` and ``('lying', j)``."""
    return stmt[0] in LEAF_OPS


def validate_statement(stmt: Any, num_people: int, where: str = "statement") -> Statement:
    """Check that ``stmt`` is a well-formed statement over persons ``0..num_people-1``.

    Returns ``stmt`` with every list turned into a tuple (records read from JSON may hold lists).
    Raises ``ValueError`` naming ``where`` and the offending sub-statement otherwise.
    """
    if isinstance(stmt, list):
        stmt = tuple(stmt)
    if not isinstance(stmt, tuple) or not stmt:
        raise ValueError(f"{where}: expected a non-empty tuple, got {stmt!r}")
    op = stmt[0]
    if op in LEAF_OPS:
        if len(stmt) != 2:
            raise ValueError(f"{where}: leaf {stmt!r} must be (op, person)")
        person = stmt[1]
        # bool is an int subclass; True as a person index is a data bug, not person 1.
        if isinstance(person, bool) or not isinstance(person, int) or not 0 <= person < num_people:
            raise ValueError(f"{where}: leaf {stmt!r} names person {person!r}, not an int in "
                             f"0..{num_people - 1}")
        return stmt
    if op == "not":
        arity_ok = len(stmt) == 2
    elif op in NARY_OPS:
        arity_ok = len(stmt) >= 3
    elif op in BINARY_OPS:
        arity_ok = len(stmt) == 3
    else:
        raise ValueError(f"{where}: unknown operator {op!r} in {stmt!r}; known: {list(ALL_OPS)}")
    if not arity_ok:
        raise ValueError(f"{where}: operator {op!r} has {len(stmt) - 1} operand(s) in {stmt!r}")
    return (op,) + tuple(validate_statement(s, num_people, where) for s in stmt[1:])


def validate_statements(statements: Any, num_people: int, where: str = "statements") -> Statements:
    """Check a whole puzzle: exactly ``num_people`` well-formed statements. Returns tuples."""
    if isinstance(statements, list):
        statements = tuple(statements)
    if not isinstance(statements, tuple):
        raise ValueError(f"{where}: expected a tuple of statements, got {type(statements).__name__}")
    if len(statements) != num_people:
        raise ValueError(f"{where}: {len(statements)} statements for {num_people} people")
    return tuple(validate_statement(s, num_people, f"{where}[{i}]") for i, s in enumerate(statements))


def parse_statements(text: str, num_people: int, where: str = "statements") -> Statements:
    """Parse the Python-literal form ``"(('not', ('telling-truth', 2)), ...)"`` safely.

    Uses :func:`ast.literal_eval`, which evaluates literals only. Raises ``ValueError`` (naming
    ``where``) for non-literals, syntax errors, absurdly long or deeply nested input, and for any
    shape error found by :func:`validate_statements`.
    """
    if not isinstance(text, str):
        raise ValueError(f"{where}: expected a string literal, got {type(text).__name__}")
    if len(text) > MAX_LITERAL_CHARS:
        raise ValueError(f"{where}: literal of {len(text)} characters is too long for a K&K puzzle")
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError) as err:
        raise ValueError(f"{where}: not a Python literal of nested tuples ({type(err).__name__}: "
                         f"{err})") from None
    return validate_statements(value, num_people, where)


def format_statements(statements: Statements) -> str:
    """The record form of ``statements``: the Python literal, identical to the official files."""
    return repr(tuple(statements))


def evaluate(stmt: Statement, knights: tuple[bool, ...] | list[bool]) -> bool:
    """Truth value of ``stmt`` when person ``i`` is a knight iff ``knights[i]``."""
    op = stmt[0]
    if op == "telling-truth":
        return bool(knights[stmt[1]])
    if op == "lying":
        return not knights[stmt[1]]
    if op == "not":
        return not evaluate(stmt[1], knights)
    if op == "and":
        return all(evaluate(s, knights) for s in stmt[1:])
    if op == "or":
        return any(evaluate(s, knights) for s in stmt[1:])
    if op == "->":
        return (not evaluate(stmt[1], knights)) or evaluate(stmt[2], knights)
    if op == "<=>":
        return evaluate(stmt[1], knights) == evaluate(stmt[2], knights)
    raise ValueError(f"unknown operator {op!r} in {stmt!r}")


def mentioned_people(stmt: Statement) -> list[int]:
    """Persons a statement talks about, in order of first mention, without repeats."""
    out: list[int] = []

    def walk(s: Statement) -> None:
        if is_leaf(s):
            if s[1] not in out:
                out.append(s[1])
        else:
            for sub in s[1:]:
                walk(sub)

    walk(stmt)
    return out


def depth(stmt: Statement) -> int:
    """1 for a leaf, 1 + the deepest operand otherwise (the generator's ``depth`` budget)."""
    return 1 if is_leaf(stmt) else 1 + max(depth(s) for s in stmt[1:])

