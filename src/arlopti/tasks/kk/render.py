"""English rendering of K&K puzzles: names, the island preamble, speech templates, the gold text.

Our own wording (the official puzzles are read from their records, never re-rendered). Rules:

* a leaf is "NAME is a knight" / "NAME is a knave"; ``not`` of a leaf is "NAME is not a knight"
  / "NAME is not a knave"; ``and``/``or`` join operands with " and " / " or "; ``->`` is
  "if A then B" and ``<=>`` is "A if and only if B";
* compound operands of compound statements (only possible with ``depth > 2``) are wrapped in
  parentheses, and ``not`` of a compound is "it is not the case that (A)", so deeper statements
  stay unambiguous;
* a speech template puts the statement either mid-sentence ("Emma says that if ...") or at the
  start of a quotation ("Emma says, \"If ...\""), capitalising the first letter in the latter case.
"""

from __future__ import annotations

from arlopti.tasks.kk.logic import Statement, is_leaf

# Common English first names, single words of ASCII letters (the reward's gold parser reads
# "[A-Za-z]+" as the name), none containing "knight" or "knave".
NAMES: tuple[str, ...] = (
    "Aaron", "Abigail", "Adam", "Alice", "Amelia", "Anna", "Ava", "Benjamin", "Caleb", "Charlotte",
    "Chloe", "Daniel", "David", "Dylan", "Eleanor", "Elijah", "Ella", "Emily", "Emma", "Ethan",
    "Evelyn", "Gabriel", "Grace", "Hannah", "Harper", "Henry", "Isaac", "Isabella", "Jack", "Jacob",
    "James", "Julia", "Leo", "Liam", "Lily", "Lucas", "Lucy", "Mason", "Mia", "Nathan", "Noah",
    "Nora", "Oliver", "Olivia", "Owen", "Ruby", "Samuel", "Sarah", "Sofia", "Thomas", "Victoria",
    "William", "Zoe",
)

# "{content}" is the statement in running text; "{Content}" the same with a capital first letter.
SPEECH_TEMPLATES: tuple[str, ...] = (
    "{name} says that {content}.",
    "{name} claims that {content}.",
    "{name} tells you, \"{Content}.\"",
    "\"{Content},\" says {name}.",
    "{name} insists that {content}.",
    "When asked, {name} replies: \"{Content}.\"",
    "According to {name}, {content}.",
    "{name} declares, \"{Content}.\"",
    "{name} states: \"{Content}.\"",
    "\"{Content},\" {name} announces.",
    "{name} mentions that {content}.",
    "{name} assures you that {content}.",
    "{name} puts it this way: \"{Content}.\"",
    "You hear {name} say, \"{Content}.\"",
)

PREAMBLE = ("On a faraway island every inhabitant is either a knight or a knave. Knights always tell "
            "the truth, and knaves always lie. You meet {count} inhabitants: {names}.")
QUESTION = "So who is a knight and who is a knave?"


def join_names(names: tuple[str, ...] | list[str]) -> str:
    """"A" / "A and B" / "A, B, and C" (serial comma from three names on)."""
    names = list(names)
    if len(names) <= 2:
        return " and ".join(names)
    return ", ".join(names[:-1]) + ", and " + names[-1]


def role_word(knight: bool) -> str:
    return "knight" if knight else "knave"


def render_statement(stmt: Statement, names: tuple[str, ...] | list[str], nested: bool = False) -> str:
    """English for ``stmt``, lower-case first word ("if ..."), no final punctuation.

    ``nested`` marks an operand of a compound statement; compound operands are parenthesised.
    """
    op = stmt[0]
    if op == "telling-truth":
        return f"{names[stmt[1]]} is a knight"
    if op == "lying":
        return f"{names[stmt[1]]} is a knave"
    if op == "not" and is_leaf(stmt[1]):
        inner = stmt[1]
        return f"{names[inner[1]]} is not a {role_word(inner[0] == 'telling-truth')}"
    if op == "not":
        text = f"it is not the case that {render_statement(stmt[1], names, nested=True)}"
    elif op in ("and", "or"):
        text = f" {op} ".join(render_statement(s, names, nested=True) for s in stmt[1:])
    elif op == "->":
        text = (f"if {render_statement(stmt[1], names, nested=True)} "
                f"then {render_statement(stmt[2], names, nested=True)}")
    elif op == "<=>":
        text = (f"{render_statement(stmt[1], names, nested=True)} if and only if "
                f"{render_statement(stmt[2], names, nested=True)}")
    else:
        raise ValueError(f"unknown operator {op!r} in {stmt!r}")
    return f"({text})" if nested else text


def capitalize_first(text: str) -> str:
    return text[:1].upper() + text[1:]


def render_speech(template: str, name: str, content: str) -> str:
    """Fill one speech template with a speaker and the rendered statement."""
    return template.format(name=name, content=content, Content=capitalize_first(content))


def render_quiz(statements, names: tuple[str, ...] | list[str], template_ids: list[int]) -> str:
    """The full question: preamble, one sentence per person (``template_ids[i]`` picks the speech
    template of person i), closing question."""
    parts = [PREAMBLE.format(count=len(names), names=join_names(names))]
    for i, stmt in enumerate(statements):
        parts.append(render_speech(SPEECH_TEMPLATES[template_ids[i]], names[i],
                                   render_statement(stmt, names)))
    parts.append(QUESTION)
    return " ".join(parts)


def solution_text(names, solution) -> str:
    """One sentence: "Amelia is a knight, Penelope is a knight, and Evelyn is a knave."."""
    clauses = [f"{n} is a {role_word(k)}" for n, k in zip(names, solution)]
    return join_names(clauses) + "."


def solution_text_format(names, solution) -> str:
    """The gold answer: "(1) NAME is a knight\\n(2) NAME is a knave ...", in name order."""
    return "\n".join(f"({i + 1}) {n} is a {role_word(k)}" for i, (n, k) in enumerate(zip(names, solution)))
