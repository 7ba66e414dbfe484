"""The Logic-RL K&K reward: a table of hand-written responses covering every branch, plus robustness."""

from __future__ import annotations

import json
import random

import pytest
from conftest import need_fixture

from arlopti.tasks.kk.reward import (KKScore, extract_last_answer, format_ok, parse_answer, parse_gold,
                                     score_response, score_response_detailed)

GOLD = "(1) Zoey is a knight\n(2) Oliver is a knave\n(3) Emma is a knight"
RIGHT = "(1) Zoey is a knight\n(2) Oliver is a knave\n(3) Emma is a knight"


def ok(answer: str, think: str = " reasoning ") -> str:
    """A well-formed response (the prompt pre-fills <think>)."""
    return f"{think}</think>\n<answer> {answer} </answer>"


TABLE = [
    # --- 3: correct -------------------------------------------------------------------------
    ("exact gold", ok(RIGHT), 3),
    ("no spaces around tags", f"x</think><answer>{RIGHT}</answer>", 3),
    ("other order, one line", ok("Emma is a knight, Zoey is a knight, Oliver is a knave."), 3),
    ("lower-case names", ok("zoey is a knight, oliver is a knave, emma is a knight"), 3),
    ("upper-case roles", ok("Zoey is a KNIGHT; Oliver is a Knave; Emma is a kNiGhT"), 3),
    ("newlines and tabs between words", ok("Zoey\tis\na   knight\nOliver is a knave\nEmma is  a knight"), 3),
    ("knight words in the thinking are free", ok(RIGHT, think=" knights and knaves, knight knave "), 3),
    ("unicode around the answer", ok("✓ Zoey is a knight 😀 — Oliver is a knave; Emma is a knight ✨",
                                     think=" 思考：先假设 Zoey… "), 3),
    ("text after </answer>", ok(RIGHT) + " and then some text", 3),
    ("'Assistant:' inside the response is not a split point",
     " </think> Assistant: <answer> " + RIGHT + " </answer>", 3),
    ("look-alike tag <Think> is not a tag", " <Think> hmm </think><answer>" + RIGHT + "</answer>", 3),
    # --- -0.5: well-formed, parsed, wrong ---------------------------------------------------
    ("one role wrong", ok("(1) Zoey is a knave\n(2) Oliver is a knave\n(3) Emma is a knight"), -0.5),
    ("all knights", ok("Zoey is a knight, Oliver is a knight, Emma is a knight"), -0.5),
    ("all roles flipped", ok("Zoey is a knave, Oliver is a knight, Emma is a knave"), -0.5),
    # --- -1: well-formed, unparseable -------------------------------------------------------
    ("plural 'knights' changes the count", ok("Zoey and Emma are knights, Oliver is a knave"), -1),
    ("plural after 'is a' breaks the name pattern",
     ok("Zoey is a knights, Oliver is a knave, Emma is a knight"), -1),
    ("extra mention", ok(RIGHT + "\nSo there are two knight characters."), -1),
    ("extra mention of knave", ok(RIGHT + " (no knave besides Oliver)"), -1),
    ("too few mentions", ok("Zoey is a knight, Oliver is a knave"), -1),
    ("name not found", ok("Zoey is a knight, Oliver is a knave, Emily is a knight"), -1),
    ("name as part of a longer word", ok("Zoeys is a knight, Oliver is a knave, Emma is a knight"), -1),
    ("missing 'a'", ok("Zoey is knight, Oliver is a knave, Emma is a knight"), -1),
    ("'an' instead of 'a'", ok("Zoey is an knight, Oliver is a knave, Emma is a knight"), -1),
    ("accented name is another name", ok("Zoé is a knight, Oliver is a knave, Emma is a knight"), -1),
    ("empty answer", " x </think><answer></answer>", -1),
    ("whitespace-only answer", " x </think><answer> \n\t </answer>", -1),
    ("no roles at all", ok("I do not know."), -1),
    # --- -3: format failure -----------------------------------------------------------------
    ("empty response", "", -3),
    ("missing </think>", f" x <answer>{RIGHT}</answer>", -3),
    ("missing <answer>", f" x </think> {RIGHT} </answer>", -3),
    ("missing </answer>", f" x </think><answer>{RIGHT}", -3),
    ("unclosed answer at end of generation", " x </think>\n<answer> (1) Zoey is a knight\n(2) Oli", -3),
    ("model writes its own <think>", f"<think> x </think><answer>{RIGHT}</answer>", -3),
    ("duplicated </think>", f" x </think> y </think><answer>{RIGHT}</answer>", -3),
    ("two answers (last would be right)", ok("Zoey is a knave") + "<answer>" + RIGHT + "</answer>", -3),
    ("answer before </think>", f" x <answer>{RIGHT}</answer></think>", -3),
    ("</answer> before <answer>", f" x </think></answer>{RIGHT}<answer>", -3),
    ("nested answer tags", f" x </think><answer><answer>{RIGHT}</answer></answer>", -3),
    ("tag inside the answer", f" x </think><answer>{RIGHT} </think></answer>", -3),
    ("only tags of another format", f"<reasoning>x</reasoning><final>{RIGHT}</final>", -3),
]


def test_table_is_large_and_covers_every_total():
    assert len(TABLE) >= 30
    assert {expected for _, _, expected in TABLE} == {3, -0.5, -1, -3}


@pytest.mark.parametrize("name, response, expected", TABLE, ids=[t[0] for t in TABLE])
def test_reward_table(name, response, expected):
    assert score_response(response, GOLD) == expected


def test_detailed_score():
    s = score_response_detailed(ok(RIGHT), GOLD)
    assert s == KKScore(total=3.0, format_ok=True,
                        parsed={"Zoey": "knight", "Oliver": "knave", "Emma": "knight"},
                        correct=True, answer_score=2.0)
    wrong = score_response_detailed(ok("Zoey is a knave, Oliver is a knave, Emma is a knight"), GOLD)
    assert (wrong.total, wrong.format_ok, wrong.correct, wrong.answer_score) == (-0.5, True, False, -1.5)
    assert wrong.parsed["Zoey"] == "knave"
    unparsed = score_response_detailed(ok("?"), GOLD)
    assert (unparsed.total, unparsed.format_ok, unparsed.parsed) == (-1.0, True, None)
    bad = score_response_detailed("<think>" + ok(RIGHT), GOLD)
    assert (bad.total, bad.format_ok, bad.parsed, bad.correct) == (-3.0, False, None, False)


def test_gold_parsing():
    assert parse_gold(GOLD) == {"Zoey": "knight", "Oliver": "knave", "Emma": "knight"}
    assert list(parse_gold(GOLD)) == ["Zoey", "Oliver", "Emma"]
    # Blank lines are skipped; the role is the first whole word knight/knave after the name.
    assert parse_gold("\n(1) Amelia is a Knave, not a knight\n\n(2) Ben is a knight\n") == \
        {"Amelia": "knave", "Ben": "knight"}
    with pytest.raises(ValueError, match="solution_text_format"):
        parse_gold("no roles here")


def test_regex_metacharacters_in_names_are_literal():
    # Unescaped, ".*" would match any name and "[x" would not even compile.
    assert parse_answer("Zoey is a knight", [".*"]) is None
    assert parse_answer("Zoey is a knight", ["[x"]) is None
    assert parse_answer("C++ is a knight", ["C++"]) is None  # \b cannot follow '+': official behaviour
    assert parse_answer("Mr.X is a knave", ["Mr.X"]) == {"Mr.X": "knave"}
    # A gold line with punctuation: the name is the first run of letters, as in the original.
    assert score_response(ok("Zoey is a knight"), "(1) Zoey(?) is a knight") == 3


def test_last_answer_wins_in_extraction():
    text = "<answer> first </answer> middle <answer> second </answer> tail <answer> unclosed"
    assert extract_last_answer(text) == "second"
    assert extract_last_answer("<answer><answer> x </answer>") == "<answer> x"  # lazy, leftmost opener
    assert extract_last_answer("no tags") is None
    assert extract_last_answer("</answer><answer>") is None


def test_format_check_directly():
    assert format_ok("<think> a </think> <answer> b </answer>")
    assert not format_ok("<think> a </think> <answer> b </answer> </answer>")
    assert not format_ok("</think><think><answer></answer>")


def test_one_megabyte_of_garbage_and_pathological_inputs():
    rng = random.Random(0)
    garbage = "".join(chr(rng.randrange(0x20, 0x2FFF)) for _ in range(1_000_000))
    assert score_response(garbage, GOLD) == -3
    # Many unclosed openers: a lazy DOTALL regex would be quadratic here.
    openers = "<answer>" * 125_000
    assert score_response(openers, GOLD) == -3 and extract_last_answer(openers) is None
    # A megabyte of thinking, then a correct answer.
    assert score_response(" " + "knight? " * 125_000 + "</think><answer>" + RIGHT + "</answer>", GOLD) == 3
    # A megabyte inside the answer with the right count: parses, regexes stay linear.
    filler = "Zoey " + " " * 1_000_000
    assert score_response(ok(filler + RIGHT), GOLD) == 3
    assert score_response(ok("Zoey" * 250_000), GOLD) == -1
    # Lone surrogates and control characters do not raise.
    assert score_response("\ud800\x00</think><answer>\x1b" + RIGHT + "</answer>", GOLD) == 3


def test_non_string_response_does_not_raise():
    assert score_response(None, GOLD) == -3  # type: ignore[arg-type]


def test_gold_plus_official_puzzles_score_three():
    for n in (3, 4, 5, 6, 7):
        path = need_fixture(f"kk/kk_test_{n}ppl.jsonl")
        for line in path.read_text().splitlines():
            gold = json.loads(line)["solution_text_format"]
            assert score_response("...</think><answer>" + gold + "</answer>", gold) == 3


def reference_score(text: str, gold_text: str) -> float:
    """The rule written straight from its description, with the original's regexes (slow on
    adversarial input, fine for short fuzz strings)."""
    import re

    tags = ["<think>", "</think>", "<answer>", "</answer>"]
    pos = [text.find(t) for t in tags]
    fmt = all(text.count(t) == 1 for t in tags) and pos == sorted(pos)
    matches = list(re.finditer(r"<answer>(.*?)</answer>", text, re.DOTALL))
    answer = matches[-1].group(1).strip() if matches else None
    gold = {}
    for line in gold_text.split("\n"):
        m = re.search(r"\b([A-Za-z]+)\b.*?\b(knight|knave)\b", line.strip(), re.IGNORECASE)
        if m:
            gold[m.group(1)] = m.group(2).lower()
    if not (fmt and answer):
        return (1 if fmt else -1) - 2
    low = answer.lower()
    pred = None
    if low.count("knight") + low.count("knave") == len(gold):
        pred = {}
        for name in gold:
            m = re.search(rf"\b{re.escape(name)}\b\s+is\s+a\s+\b(knight|knave)\b", answer, re.IGNORECASE)
            if not m:
                pred = None
                break
            pred[name] = m.group(1).lower()
    if not pred:
        return 1 - 2
    return 1 + (2 if pred == gold else -1.5)


def test_matches_reference_rule_on_random_responses():
    rng = random.Random(1)
    pieces = ["<think>", "</think>", "<answer>", "</answer>", " ", "\n", "Zoey", "Oliver", "Emma", "zoey",
              " is a ", " is ", "knight", "knave", "knights", " and ", ",", "(1) ", "x", "Assistant:"]
    totals = set()
    for _ in range(4000):
        # Start from a well-formed skeleton half of the time so all branches get exercised.
        body = "".join(rng.choice(pieces) for _ in range(rng.randrange(0, 25)))
        if rng.random() < 0.5:
            names = ["Zoey", "Oliver", "Emma"]
            rng.shuffle(names)
            body = " t </think><answer> " + ", ".join(
                f"{n} is a {rng.choice(['knight', 'knave', 'knights'])}" for n in names[:rng.randrange(2, 4)]
            ) + rng.choice(["", " knight", " x"]) + " </answer>"
        got = score_response(body, GOLD)
        assert got == reference_score("<think>" + body, GOLD), body
        totals.add(got)
    assert totals == {3, -0.5, -1, -3}


# ---- the official "Assistant:" cut (official_cut=True) -----------------------------------------
# (name, response, default-mode total, official_cut total)
ASSISTANT_CASES = [
    ("no 'Assistant:': both modes agree", ok(RIGHT), 3, 3),
    ("'Assistant:' after the answer loses the pre-filled <think>", ok(RIGHT) + "\nAssistant: done", 3, -3),
    ("'Assistant:' inside the thinking", " x Assistant: y </think><answer>" + RIGHT + "</answer>", 3, -3),
    ("'Assistant:' before </think>, then a fresh <think>: official tail is well formed",
     " x Assistant: <think> y </think><answer>" + RIGHT + "</answer>", -3, 3),
    ("only the first 'Assistant:' cuts",
     " Assistant: <think> y </think> Assistant: <answer>" + RIGHT + "</answer>", -3, 3),
    ("a wrong answer after the cut", " Assistant: <think> y </think><answer>Zoey is a knave, Oliver is a "
     "knave, Emma is a knight</answer>", -3, -0.5),
    ("lower-case 'assistant:' does not cut", " assistant: y </think><answer>" + RIGHT + "</answer>", 3, 3),
    ("'Assistant' without a colon does not cut", " Assistant y </think><answer>" + RIGHT + "</answer>", 3, 3),
    ("chat markup in the response does not cut", " y </think><answer>" + RIGHT + "</answer><|im_end|>\n"
     "<|im_start|>assistant\n", 3, 3),
    ("'Assistant:' as the whole response", "Assistant:", -3, -3),
]


@pytest.mark.parametrize("name, response, default, official", ASSISTANT_CASES,
                         ids=[c[0] for c in ASSISTANT_CASES])
def test_assistant_cut_both_modes(name, response, default, official):
    assert score_response(response, GOLD) == default
    assert score_response(response, GOLD, official_cut=False) == default
    assert score_response(response, GOLD, official_cut=True) == official
    assert score_response_detailed(response, GOLD, official_cut=True).total == official


def test_scored_text():
    from arlopti.tasks.kk.reward import scored_text

    assert scored_text(" a Assistant: b Assistant: c") == "<think> a Assistant: b Assistant: c"
    assert scored_text(" a Assistant: b Assistant: c", official_cut=True) == " b Assistant: c"
    assert scored_text(" a assistant: b", official_cut=True) == "<think> a assistant: b"


def official_prompts() -> list[str]:
    """The ``prompt`` field of all 5,000 official fixture puzzles (500 test + 4,500 train)."""
    import gzip

    prompts = []
    for n in (3, 4, 5, 6, 7):
        for line in need_fixture(f"kk/kk_test_{n}ppl.jsonl").read_text().splitlines():
            prompts.append(json.loads(line)["prompt"])
    with gzip.open(need_fixture("kk/kk_train_34567ppl.jsonl.gz"), "rt") as fh:
        prompts.extend(json.loads(line)["prompt"] for line in fh)
    return prompts


def test_official_prompts_allow_the_response_only_cut():
    """The premises of the derivation in the reward's docstring, for every official prompt."""
    prompts = official_prompts()
    assert len(prompts) == 5000
    for p in prompts:
        assert "Assistant:" not in p
        assert p.count("<|im_start|>assistant") == 1
        assert p.endswith("<|im_start|>assistant\n<think>")


def official_compute_score(decoded: str, gold_text: str) -> float:
    """The official rule on decoded prompt+response, restated from AR-Lopti
    ``verl/utils/reward_score/kk.py`` (``extract_solution`` then ``compute_score``): isolate the
    response at the first "Assistant:", else the first "<|im_start|>assistant", else keep all;
    then the rule of :func:`reference_score`."""
    for marker in ("Assistant:", "<|im_start|>assistant"):
        if marker in decoded:
            decoded = decoded.split(marker, 1)[1]
            break
    return reference_score(decoded, gold_text)


def test_official_cut_matches_the_official_rule_on_prompt_plus_response():
    """20,000 random responses after real official prompts: scoring the response alone with
    ``official_cut=True`` equals the official rule on the decoded prompt+response."""
    prompts = official_prompts()
    rng = random.Random(2)
    pieces = ["<think>", "</think>", "<answer>", "</answer>", " ", "\n", "Zoey", "Oliver", "Emma", " is a ",
              "knight", "knave", "knights", ",", "x", "Assistant:", "Assistant", "assistant:", "Assistant: ",
              "<|im_start|>assistant\n", "<|im_end|>", "User:", ">", ":"]
    totals = {False: set(), True: set()}
    for _ in range(20_000):
        body = "".join(rng.choice(pieces) for _ in range(rng.randrange(0, 20)))
        if rng.random() < 0.6:
            names = ["Zoey", "Oliver", "Emma"]
            rng.shuffle(names)
            answer = ", ".join(f"{n} is a {rng.choice(['knight', 'knave'])}" for n in names)
            head = rng.choice(["", " t ", " Assistant: ", " Assistant: <think> ", "<|im_start|>assistant"])
            body = head + body + " </think><answer> " + answer + " </answer>" + rng.choice(
                ["", "<|im_end|>", " Assistant: bye", "Assistant:<think>"])
        prompt = rng.choice(prompts)
        official = official_compute_score(prompt + body, GOLD)
        assert score_response(body, GOLD, official_cut=True) == official, body
        totals[True].add(official)
        # the default mode is the official rule whenever the response has no "Assistant:"
        if "Assistant:" not in body:
            assert score_response(body, GOLD) == official, body
        totals[False].add(score_response(body, GOLD))
    assert totals[True] == totals[False] == {3, -0.5, -1, -3}
