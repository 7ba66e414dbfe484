"""Knights and Knaves with feedback: the model proposes an assignment, the environment names the
statements it violates, and the model may revise within ``rollout.max_turns``.

:class:`KKFeedbackEnv` (text contract, :mod:`arlopti.tasks.env.base`) reads the official puzzle from
the prompt record (:meth:`arlopti.tasks.kk.puzzle.Puzzle.from_record` on the row's ``quiz``,
``names``, ``solution``, ``statements`` and gold text (:func:`puzzle_of`), re-solved: the stored solution
must be the only consistent assignment). Each model turn is read with the official scorer's own rules
(:func:`arlopti.tasks.kk.reward.score_response_detailed` on ``"<think>" + turn``: the format check,
the last ``<answer>``, the name-by-name parse):

* correct: the episode ends (no reply);
* format broken or answer unreadable: the reply says what the scorer needs, and the episode goes on;
* read but wrong: the reply lists every statement that does not fit its speaker under the proposed
  assignment (a knight's statement that is false, a knave's that is true), each statement in English
  (:func:`arlopti.tasks.kk.render.render_statement` of the puzzle's logical form, the generator's own
  wording of leaves and connectives). The puzzles have exactly one consistent assignment, so a wrong
  one always violates at least one statement.

The reward is the official scorer on the final turn: run with ``task=kk`` (the K&K task scores the
episode's last model turn); the environment adds no reward of its own. Every later model turn opens
with ``<think>`` (:attr:`KKFeedbackEnv.turn_prefix`, environment text), as the official prompt opens
the first, so the scorer applies to the final turn unchanged whichever turn it is.

The row needs the official record's fields: ``data=prompts`` over the K&K JSONL files hands every
column to the row (``configs/experiment/kk_feedback_ar_lopti.yaml``; the gold text arrives as the row's
``ground_truth``). ``data=kk`` does not (its records carry ``n_people``, ``split`` and ``index`` only):
:meth:`KKFeedbackEnv.reset` then stops the run with an error naming the missing fields.

The environment reads turns with ``official_cut=False`` (``tasks.kk.official_cut``'s default; it is
built with no argument): under ``fidelity=official`` a turn that itself writes "Assistant:" may end the
episode as correct here and still be scored on its tail by the task (:mod:`arlopti.tasks.kk.reward`).
"""

from __future__ import annotations

from arlopti.tasks.env.base import TextEnv
from arlopti.tasks.kk.logic import evaluate
from arlopti.tasks.kk.puzzle import Puzzle
from arlopti.tasks.kk.render import render_statement, role_word
from arlopti.tasks.kk.reward import THINK_OPEN, score_response_detailed

#: The record fields the environment reads (module docstring).
PUZZLE_FIELDS = ("quiz", "names", "solution", "solution_text_format", "statements")
FORMAT_HELP = ("Finish your reasoning with </think>, then give the identity of every person inside <answer> </answer> "
               "tags, one per line, e.g. <answer> (1) Zoey is a knight\n(2) Oliver is a knave </answer>.")


def puzzle_of(row: dict) -> Puzzle:
    """The official puzzle of a prompt record (module docstring); ValueError naming what is missing. The
    gold text is the row's ``solution_text_format``, else its ``ground_truth`` (the K&K answer column; a
    mapping holding ``solution_text_format`` in the verl layout)."""
    record = {k: row[k] for k in PUZZLE_FIELDS + ("solution_text",) if k in row}
    gold = row.get("ground_truth")
    if "solution_text_format" not in record and gold is not None:
        record["solution_text_format"] = gold.get("solution_text_format") if isinstance(gold, dict) else gold
    missing = [k for k in PUZZLE_FIELDS if record.get(k) is None]
    if missing:
        raise ValueError(f"K&K feedback: the prompt record has no {missing} (it has {sorted(row)[:12]}); the "
                         "environment needs the official record's fields: use data=prompts over the K&K JSONL "
                         "files (configs/experiment/kk_feedback_ar_lopti.yaml)")
    return Puzzle.from_record(record, source=f"K&K feedback, prompt {row.get('uid', '?')}", verify=True)


def violations(puzzle: Puzzle, roles: dict[str, str]) -> list[int]:
    """The people whose statement does not fit their role under ``roles`` (name -> "knight"/"knave"):
    a knight saying something false or a knave saying something true."""
    knights = tuple(roles[name] == "knight" for name in puzzle.names)
    return [i for i, stmt in enumerate(puzzle.statements) if evaluate(stmt, knights) != knights[i]]


def feedback(puzzle: Puzzle, roles: dict[str, str], violated: list[int]) -> str:
    """The reply to a wrong assignment: each violated statement, why it does not fit, and what to do."""
    knights = tuple(roles[name] == "knight" for name in puzzle.names)
    lines = ["Your answer does not fit these statements:"]
    for i in violated:
        name, role = puzzle.names[i], role_word(knights[i])
        truth = "true" if evaluate(puzzle.statements[i], knights) else "false"
        lines.append(f"- {name} says that {render_statement(puzzle.statements[i], puzzle.names)}. With your answer "
                     f"this is {truth}, but {name} is a {role} in your answer, and a {role} cannot say something "
                     f"{truth}.")
    lines.append("Think again and give your corrected answer. " + FORMAT_HELP)
    return "\n".join(lines)


class KKFeedbackEnv(TextEnv):
    """K&K with feedback on violated statements (module docstring)."""

    turn_prefix = THINK_OPEN

    def __init__(self):
        self.puzzle: Puzzle | None = None
        self.violated: list[int] = []  # how many statements each wrong turn violated

    def reset(self, row: dict) -> str | None:
        self.puzzle, self.violated = puzzle_of(row), []
        return None

    def step(self, text: str) -> tuple[str | None, bool, float | None]:
        puzzle = self.puzzle
        score = score_response_detailed(text, puzzle.solution_text_format)
        if score.correct:
            return None, True, None
        if not score.format_ok:
            return ("Your reply is not in the required format: it needs exactly one </think> and one <answer> "
                    "</answer> pair, in that order. " + FORMAT_HELP), False, None
        if score.parsed is None:
            return (f"I could not read your answer: it must name each of the {puzzle.num_people} people exactly "
                    "once as 'NAME is a knight' or 'NAME is a knave', and use the words knight and knave nowhere "
                    "else. " + FORMAT_HELP), False, None
        violated = violations(puzzle, score.parsed)
        self.violated.append(len(violated))
        return feedback(puzzle, score.parsed, violated), False, None


__all__ = ["FORMAT_HELP", "PUZZLE_FIELDS", "KKFeedbackEnv", "feedback", "puzzle_of", "violations"]
