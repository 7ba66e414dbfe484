"""English rendering rules."""

from __future__ import annotations

import re

from arlopti.tasks.kk import render

NAMES = ("Emma", "Liam", "Zoe")


def test_name_list_is_safe_for_the_reward():
    assert len(render.NAMES) >= 40 and len(set(render.NAMES)) == len(render.NAMES)
    for name in render.NAMES:
        assert re.fullmatch(r"[A-Za-z]+", name)
        assert "knight" not in name.lower() and "knave" not in name.lower()


def test_at_least_ten_speech_templates_each_with_one_slot():
    assert len(set(render.SPEECH_TEMPLATES)) >= 10
    for t in render.SPEECH_TEMPLATES:
        assert t.count("{name}") == 1 and t.count("{content}") + t.count("{Content}") == 1


def test_statement_rendering():
    r = lambda s: render.render_statement(s, NAMES)  # noqa: E731
    assert r(("telling-truth", 0)) == "Emma is a knight"
    assert r(("lying", 1)) == "Liam is a knave"
    assert r(("not", ("telling-truth", 2))) == "Zoe is not a knight"
    assert r(("not", ("lying", 2))) == "Zoe is not a knave"
    assert r(("and", ("lying", 0), ("telling-truth", 1))) == "Emma is a knave and Liam is a knight"
    assert r(("or", ("lying", 0), ("lying", 1), ("lying", 2))) == \
        "Emma is a knave or Liam is a knave or Zoe is a knave"
    assert r(("->", ("lying", 0), ("telling-truth", 1))) == "if Emma is a knave then Liam is a knight"
    assert r(("<=>", ("lying", 0), ("lying", 1))) == "Emma is a knave if and only if Liam is a knave"
    # Deeper statements (depth > 2) are parenthesised so they stay unambiguous.
    assert r(("and", ("or", ("lying", 0), ("lying", 1)), ("telling-truth", 2))) == \
        "(Emma is a knave or Liam is a knave) and Zoe is a knight"
    assert r(("not", ("and", ("lying", 0), ("lying", 1)))) == \
        "it is not the case that (Emma is a knave and Liam is a knave)"


def test_speech_capitalises_quoted_content_only():
    content = "if Emma is a knave then Liam is a knight"
    assert render.render_speech("{name} says that {content}.", "Zoe", content) == \
        "Zoe says that if Emma is a knave then Liam is a knight."
    assert render.render_speech("\"{Content},\" says {name}.", "Zoe", content) == \
        "\"If Emma is a knave then Liam is a knight,\" says Zoe."


def test_quiz_and_gold_text():
    statements = (("lying", 1), ("telling-truth", 0), ("not", ("lying", 0)))
    quiz = render.render_quiz(statements, NAMES, [0, 1, 2])
    assert "You meet 3 inhabitants: Emma, Liam, and Zoe." in quiz
    assert "Knights always tell the truth, and knaves always lie." in quiz
    assert "Emma says that Liam is a knave." in quiz
    assert quiz.endswith("So who is a knight and who is a knave?")
    assert render.join_names(["A", "B"]) == "A and B"
    solution = (True, False, True)
    assert render.solution_text_format(NAMES, solution) == \
        "(1) Emma is a knight\n(2) Liam is a knave\n(3) Zoe is a knight"
    assert render.solution_text(NAMES, solution) == "Emma is a knight, Liam is a knave, and Zoe is a knight."
