"""The :class:`Puzzle` record and its (de)serialisation in the official mem-kk-logic / Logic-RL schema.

Official JSONL records carry ``quiz``, ``names``, ``solution`` (list of bools, True = knight),
``solution_text``, ``solution_text_format``, ``statements`` (the Python literal of the nested
tuples, as a string), ``cot_*`` fields, and in the Logic-RL files ``index`` and ``n_people``.
The AR-Lopti files (the shared fixtures) also carry ``prompt``: the exact string the official
runs feed the model (Qwen chat markup included, ending in ``<think>``), kept verbatim as
:attr:`Puzzle.prompt` and fed by the ``official`` prompt template (:mod:`arlopti.tasks.kk.prompts`).
:meth:`Puzzle.from_record` reads the fields a puzzle needs and ignores the others (``cot_*``);
:meth:`Puzzle.to_record` writes them back in the same form.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Mapping

from arlopti.tasks.kk import render
from arlopti.tasks.kk.logic import Statements, format_statements, parse_statements, validate_statements
from arlopti.tasks.kk.reward import parse_gold
from arlopti.tasks.kk.solver import MAX_SOLVER_PEOPLE, solve

_NAME = re.compile(r"[A-Za-z]+")


@dataclass(frozen=True)
class Puzzle:
    """One K&K puzzle. ``solution[i]`` is True when ``names[i]`` is a knight.

    ``index`` is the puzzle's position in its generator stream (the official ``index`` field), or
    None when unknown. ``prompt`` is the record's own official prompt string (the AR-Lopti
    ``prompt`` field), verbatim, or None when the record has none (our generator, mem-kk-logic).
    """

    names: tuple[str, ...]
    statements: Statements
    solution: tuple[bool, ...]
    quiz: str
    solution_text_format: str
    solution_text: str = ""
    index: int | None = None
    prompt: str | None = None

    @property
    def num_people(self) -> int:
        return len(self.names)

    @classmethod
    def from_record(cls, record: Mapping[str, Any], source: str | None = None,
                    verify: bool = False) -> "Puzzle":
        """Read an official record; ``source`` (e.g. "path.jsonl:12") prefixes every error.

        Raises ``ValueError`` naming the field for any missing field, wrong type or shape. With
        ``verify=True`` it also solves the puzzle and requires the stored solution to be the only
        consistent assignment.
        """
        where = f"{source}: " if source else ""
        if not isinstance(record, Mapping):
            raise ValueError(f"{where}a K&K record must be a JSON object, got {type(record).__name__}")
        read = _RecordFields(record, where)
        names = read.names()
        solution = read.solution(len(names))
        statements = read.statements(len(names))
        quiz, stf, sol_text = read.texts(names, solution)
        index, prompt = read.optional(len(names), quiz)
        puzzle = cls(names=names, statements=statements, solution=solution, quiz=quiz,
                     solution_text_format=stf, solution_text=sol_text, index=index, prompt=prompt)
        if verify:
            found = solve(statements, len(names))
            if found != [solution]:
                raise ValueError(f"{where}field 'solution': {list(solution)} but the statements have "
                                 f"{len(found)} consistent assignment(s): {found[:4]}")
        return puzzle

    def to_record(self) -> dict[str, Any]:
        """The official schema (``statements`` as the Python-literal string), plus ``n_people``
        and ``index``, and ``prompt`` when the puzzle has one. JSON-serialisable;
        ``from_record(p.to_record()) == p``."""
        record = {
            "quiz": self.quiz,
            "names": list(self.names),
            "solution": list(self.solution),
            "solution_text": self.solution_text,
            "solution_text_format": self.solution_text_format,
            "statements": format_statements(self.statements),
            "index": self.index,
            "n_people": self.num_people,
        }
        if self.prompt is not None:
            record["prompt"] = self.prompt
        return record


def _kind_name(kind) -> str:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    return " or ".join(k.__name__ for k in kinds)


def build_puzzle(statements: Statements, solution: tuple[bool, ...], names: tuple[str, ...],
                 template_ids: list[int], index: int | None = None) -> Puzzle:
    """Render a solved logical puzzle into a :class:`Puzzle` with our English templates."""
    names = tuple(names)
    return Puzzle(
        names=names,
        statements=tuple(statements),
        solution=tuple(bool(x) for x in solution),
        quiz=render.render_quiz(statements, names, template_ids),
        solution_text_format=render.solution_text_format(names, solution),
        solution_text=render.solution_text(names, solution),
        index=index,
    )


class _RecordFields:
    """Reads and checks the fields of one official K&K record; every error starts with ``where``."""

    def __init__(self, record: Mapping[str, Any], where: str):
        self.record, self.where = record, where

    def field(self, name: str, kind: type | tuple[type, ...]):
        if name not in self.record:
            raise ValueError(f"{self.where}field {name!r} is missing (fields present: {sorted(self.record)})")
        value = self.record[name]
        if not isinstance(value, kind):
            raise ValueError(f"{self.where}field {name!r}: expected {_kind_name(kind)}, "
                             f"got {type(value).__name__}")
        return value

    def names(self) -> tuple[str, ...]:
        where = self.where
        names = tuple(self.field("names", (list, tuple)))
        n = len(names)
        if not 1 <= n <= MAX_SOLVER_PEOPLE:
            raise ValueError(f"{where}field 'names': {n} names; a puzzle has 1..{MAX_SOLVER_PEOPLE} people")
        for name in names:
            # The reward's gold parser reads the first "[A-Za-z]+" word as the name and the count
            # rule counts "knight"/"knave" substrings, so any other name would break scoring.
            if not isinstance(name, str) or not _NAME.fullmatch(name):
                raise ValueError(f"{where}field 'names': {name!r} is not a word of ASCII letters")
            if "knight" in name.lower() or "knave" in name.lower():
                raise ValueError(f"{where}field 'names': {name!r} contains 'knight'/'knave'")
        if len(set(names)) != n:
            raise ValueError(f"{where}field 'names': repeated names in {list(names)}")
        return names

    def solution(self, n: int) -> tuple[bool, ...]:
        solution = tuple(self.field("solution", (list, tuple)))
        if len(solution) != n or not all(isinstance(x, bool) for x in solution):
            raise ValueError(f"{self.where}field 'solution': expected {n} booleans, got {list(solution)!r}")
        return solution

    def statements(self, n: int):
        raw = self.field("statements", (str, list, tuple))
        try:
            if isinstance(raw, str):
                return parse_statements(raw, n, where="field 'statements'")
            return validate_statements(raw, n, where="field 'statements'")
        except ValueError as err:
            raise ValueError(f"{self.where}{err}") from None

    def texts(self, names: tuple[str, ...], solution: tuple[bool, ...]) -> tuple[str, str, str]:
        """``quiz``, ``solution_text_format`` (which must agree with names/solution), ``solution_text``."""
        where = self.where
        quiz = self.field("quiz", str)
        if not quiz.strip():
            raise ValueError(f"{where}field 'quiz' is empty")
        stf = self.field("solution_text_format", str)
        try:
            gold = parse_gold(stf)
        except ValueError as err:
            raise ValueError(f"{where}field 'solution_text_format': {err}") from None
        expected = {name: render.role_word(k) for name, k in zip(names, solution)}
        if gold != expected or list(gold) != list(names):
            raise ValueError(f"{where}field 'solution_text_format' says {gold}, but 'names'/'solution' "
                             f"say {expected}")
        sol_text = self.record.get("solution_text")
        if sol_text is None:
            sol_text = render.solution_text(names, solution)
        elif not isinstance(sol_text, str):
            raise ValueError(f"{where}field 'solution_text': expected str, got {type(sol_text).__name__}")
        return quiz, stf, sol_text

    def optional(self, n: int, quiz: str) -> tuple[int | None, str | None]:
        """Checks ``n_people``; returns ``index`` and ``prompt`` (which must contain ``quiz``)."""
        where, record = self.where, self.record
        if record.get("n_people") is not None and record["n_people"] != n:
            raise ValueError(f"{where}field 'n_people' is {record['n_people']!r} but there are {n} names")
        index = record.get("index")
        if index is not None and (isinstance(index, bool) or not isinstance(index, int)):
            raise ValueError(f"{where}field 'index': expected an int, got {index!r}")
        prompt = record.get("prompt")
        if prompt is not None:
            if not isinstance(prompt, str):
                raise ValueError(f"{where}field 'prompt': expected str, got {type(prompt).__name__}")
            if quiz not in prompt:  # the prompt of another puzzle (a bad merge) would train on wrong golds
                raise ValueError(f"{where}field 'prompt' does not contain the record's 'quiz' verbatim; "
                                 "it must be this puzzle's own prompt")
        return index, prompt
