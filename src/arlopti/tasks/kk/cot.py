"""A depth-first backtracking reasoning trace for a puzzle, usable as an SFT cold-start target.

The search (as in the original generator's CoT, described in our words):

* people are taken from a queue, initially ``0..N-1``; after a successful assumption about X,
  the unassigned people X's statement mentions move to the front, in order of mention;
* knight is tried before knave;
* an assumption fails when some assigned person's claim (negated for a knave) can no longer be
  true under *any* completion of the unassigned people; the trace names that person (other
  assigned people are checked first, in assignment order, then the person just assumed);
* when both roles of X fail, the search returns to the previously assigned person and tries
  their next role;
* once everyone is assigned, every claim is checked against the full assignment, so the first
  complete assignment reached is a solution (the unique one for a well-posed puzzle).

Two renderings: ``style="full"`` writes sentences that restate each claim; ``style="compact"``
lists the assumption chain tersely ("Emma knight: ok. Liam knight: contradicts Emma. ...") so
that whole SFT responses for 2-3 people stay under 200 tokens (SmolLM2 tokenizer: at most 83
for N=2 and 142 for N=3 over 200 generated puzzles each; the full style reaches 313 and 544).
"""

from __future__ import annotations

from dataclasses import dataclass

from arlopti.tasks.kk.logic import mentioned_people
from arlopti.tasks.kk.puzzle import Puzzle
from arlopti.tasks.kk.render import render_statement, role_word, solution_text
from arlopti.tasks.kk.solver import person_tables, truth_table

STYLES = ("full", "compact")


@dataclass(frozen=True)
class CotStep:
    """One step of the search.

    ``kind`` is "assume" (``person`` takes ``role`` without contradiction), "contradiction"
    (``person`` cannot take ``role`` because the claim of ``witness``, whose role is
    ``witness_role``, could no longer hold), "backtrack" (both roles of ``person`` failed; the
    search returns to ``witness``) or "solved".
    """

    kind: str
    person: int = -1
    role: bool = True
    witness: int = -1
    witness_role: bool = True


def cot_steps(puzzle: Puzzle) -> tuple[list[CotStep], tuple[bool, ...] | None]:
    """The search steps and the assignment it ends with (None if the puzzle has no solution)."""
    n = puzzle.num_people
    full, knight = person_tables(n)
    claims = [truth_table(s, n) for s in puzzle.statements]
    steps: list[CotStep] = []
    final: list[dict[int, bool]] = []

    def broken_claim(order: list[int], roles: dict[int, bool], cons: int) -> int | None:
        for j in order:
            effective = claims[j] if roles[j] else full ^ claims[j]  # a knave's claim is false
            if not effective & cons:
                return j
        return None

    def search(order: list[int], roles: dict[int, bool], cons: int, queue: list[int]) -> bool:
        # ``cons``: bitset of the full assignments that agree with ``roles``.
        if not queue:
            steps.append(CotStep("solved"))
            final.append(roles)
            return True
        x, rest = queue[0], queue[1:]
        for role in (True, False):
            new_roles = {**roles, x: role}
            new_cons = cons & (knight[x] if role else full ^ knight[x])
            # Others first, in assignment order, then the person just assumed.
            witness = broken_claim(order + [x], new_roles, new_cons)
            if witness is not None:
                steps.append(CotStep("contradiction", x, role, witness, new_roles[witness]))
                continue
            steps.append(CotStep("assume", x, role))
            front = [p for p in mentioned_people(puzzle.statements[x]) if p in rest]
            new_queue = front + [p for p in rest if p not in front]
            if search(order + [x], new_roles, new_cons, new_queue):
                return True
        if order:
            steps.append(CotStep("backtrack", x, witness=order[-1]))
        return False

    if not search([], {}, full, list(range(n))):
        return steps, None
    return steps, tuple(final[0][i] for i in range(n))


def _claim(puzzle: Puzzle, person: int) -> str:
    return render_statement(puzzle.statements[person], puzzle.names)


def _full_sentence(puzzle: Puzzle, step: CotStep) -> str:
    names = puzzle.names
    if step.kind == "assume":
        truth = "true" if step.role else "false"
        return (f"Assume {names[step.person]} is a {role_word(step.role)}. Then the claim of "
                f"{names[step.person]} that {_claim(puzzle, step.person)} is {truth}, and no "
                "contradiction is found.")
    if step.kind == "contradiction":
        false = "" if step.witness_role else "false "
        if step.witness == step.person:
            whose = f"their own {false}claim"
        else:
            whose = f"the {false}claim of {names[step.witness]}"
        return (f"{names[step.person]} cannot be a {role_word(step.role)}, because this would "
                f"contradict {whose} that {_claim(puzzle, step.witness)}.")
    if step.kind == "backtrack":
        return (f"We have exhausted all possibilities for {names[step.person]}, so let us go back "
                f"and reconsider {names[step.witness]}.")
    return f"This leads to a feasible solution: {solution_text(puzzle.names, puzzle.solution)}"


def _compact_phrase(puzzle: Puzzle, step: CotStep) -> str:
    names = puzzle.names
    if step.kind == "assume":
        return f"{names[step.person]} {role_word(step.role)}: ok."
    if step.kind == "contradiction":
        who = "own claim" if step.witness == step.person else names[step.witness]
        return f"{names[step.person]} {role_word(step.role)}: contradicts {who}."
    if step.kind == "backtrack":
        return f"Back to {names[step.witness]}."
    return "Solved."


def cot_trace(puzzle: Puzzle, style: str = "full") -> str:
    """The reasoning text (no tags). ``style`` is "full" or "compact" (see module docstring).

    Raises ``ValueError`` for an unknown style or a puzzle without a solution.
    """
    if style not in STYLES:
        raise ValueError(f"cot style {style!r}: known styles are {list(STYLES)}")
    steps, solution = cot_steps(puzzle)
    if solution is None:
        raise ValueError("cot_trace: the puzzle has no consistent assignment")
    if solution != tuple(puzzle.solution):
        raise ValueError(f"cot_trace: the search reached {solution}, not the stored solution "
                         f"{tuple(puzzle.solution)}; the puzzle has several consistent assignments")
    if style == "compact":
        return " ".join(_compact_phrase(puzzle, s) for s in steps)
    header = ("Let's think step by step, assuming a role for one person at a time and going back "
              "whenever a claim can no longer hold.")
    return "\n".join([header] + [_full_sentence(puzzle, s) for s in steps])


def sft_response(puzzle: Puzzle, style: str = "full") -> str:
    """The text a model should generate after a prompt ending in ``<think>``:
    ``" " + trace + " </think>\\n<answer> " + solution_text_format + " </answer>"``."""
    return f" {cot_trace(puzzle, style)} </think>\n<answer> {puzzle.solution_text_format} </answer>"
