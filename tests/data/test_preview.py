"""``python -m arlopti.data.preview``: the JSONL holds exactly the prompt strings and ids fed.

The official-data tests read the fixtures where the composed config's ``paths.shared_dir``
points (``ARLOPTI_SHARED``, else ``../shared`` beside the checkout) and skip when they are absent.
"""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

import pytest

from arlopti.data import preview

SMOL = "model=smollm2-135m-instruct"


def shared_fixture(rel: str) -> Path:
    """``<paths.shared_dir>/fixtures/<rel>`` as the training config resolves it, or skip."""
    shared = Path(preview.compose([]).paths.shared_dir)
    path = shared / "fixtures" / rel
    if not path.exists():
        pytest.skip(f"shared fixture {path} is absent (paths.shared_dir={shared}; set ARLOPTI_SHARED to "
                    "the folder holding fixtures/)")
    return path


def run_preview(tmp_path: Path, *argv: str) -> list[dict]:
    out = tmp_path / "preview.jsonl"
    assert preview.main([*argv, "--out", str(out)]) == 0
    return [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]


@pytest.fixture(scope="module")
def smol_tokenizer(smollm2_path):
    from arlopti.models.loading import load_tokenizer

    return load_tokenizer("smollm2-135m-instruct")


def ids_of(tokenizer, texts: list[str]) -> list[list[int]]:
    return tokenizer(texts, add_special_tokens=False)["input_ids"]


def official_kk(kk: Path, split: str) -> dict[str, dict]:
    """The fixture records by the DataModule's uid (``kk/<split>/<N>ppl/<index>``)."""
    if split == "test":
        rows = [json.loads(x) for n in range(3, 8)
                for x in (kk / f"kk_test_{n}ppl.jsonl").read_text(encoding="utf-8").splitlines()]
    else:
        with gzip.open(kk / "kk_train_34567ppl.jsonl.gz", "rt", encoding="utf-8") as fh:
            rows = [json.loads(x) for x in fh]
    return {f"kk/{split}/{r['n_people']}ppl/{r['index']}": r for r in rows}


def check_kk_official(got: list[dict], want: dict[str, dict], tokenizer, split: str,
                      max_len: int = 400) -> int:
    """Each record is its puzzle's own prompt byte for byte, tokenised without special tokens, each
    puzzle at most once; returns the longest prompt in tokens."""
    uids = [r["uid"] for r in got]
    assert len(set(uids)) == len(uids) and set(uids) <= set(want)
    expected_ids = ids_of(tokenizer, [want[r["uid"]]["prompt"] for r in got])
    for rec, ids in zip(got, expected_ids):
        row = want[rec["uid"]]
        assert rec["prompt_text"] == row["prompt"], rec["uid"]
        assert rec["prompt_ids"] == ids, rec["uid"]
        assert rec["ground_truth"] == row["solution_text_format"]
        assert rec["split"] == split and rec["task"] == "kk"
        assert rec["set"] == ("train" if split == "train" else f"kk_{row['n_people']}ppl")
    longest = max(len(r["prompt_ids"]) for r in got)
    assert longest <= max_len
    return longest


def test_kk_val_is_the_official_prompt_byte_for_byte(tmp_path, smol_tokenizer):
    kk = shared_fixture("kk")
    want = official_kk(kk, "test")
    got = run_preview(tmp_path, "data=kk", SMOL, "--split", "val")
    assert len(got) == len(want) == 500  # all 500 official test puzzles: the 400-token filter drops none
    assert [r["set"] for r in got[::100]] == [f"kk_{n}ppl" for n in range(3, 8)]
    longest = check_kk_official(got, want, smol_tokenizer, "val")
    assert longest == 343  # SmolLM2 tokens, the longest official test prompt (7 people)


def test_kk_train_is_the_official_prompt_limited(tmp_path, smol_tokenizer):
    kk = shared_fixture("kk")
    got = run_preview(tmp_path, "data=kk", SMOL, "--split", "train", "--limit", "50")
    assert [r["uid"] for r in got] == [f"kk/train/3ppl/{i}" for i in range(100, 150)]  # file order
    check_kk_official(got, official_kk(kk, "train"), smol_tokenizer, "train")


@pytest.mark.slow
def test_kk_train_is_the_official_prompt_byte_for_byte(tmp_path, smol_tokenizer):
    kk = shared_fixture("kk")
    want = official_kk(kk, "train")
    got = run_preview(tmp_path, "data=kk", SMOL, "--split", "train")
    assert len(got) == len(want) == 4500  # none dropped
    assert check_kk_official(got, want, smol_tokenizer, "train") == 349


BENCHMARK_FILES = {"aime24": "aime2024.jsonl", "amc83": "amc_2022_2023_83.jsonl", "math500": "math500.jsonl",
                   "minerva": "minerva_math.jsonl", "olympiadbench": "olympiadbench_675.jsonl"}


def official_math_problems() -> dict[str, str]:
    """uid -> the fixture's ``problem`` (untouched; the official prompt is it + SUFFIX) for the
    first 300 DSR-Uniform problems and every problem of the five validation benchmarks."""
    with gzip.open(shared_fixture("math/dsr_uniform_train_10k.jsonl.gz"), "rt", encoding="utf-8") as fh:
        problems = [json.loads(x)["problem"] for x in fh]
    assert len(problems) == 10_000
    out = {f"math/dsr_uniform/{i}": p for i, p in enumerate(problems[:300])}
    for name, file in BENCHMARK_FILES.items():
        rows = (shared_fixture("math") / file).read_text(encoding="utf-8").splitlines()
        out.update({f"math/{name}/{i}": json.loads(x)["problem"] for i, x in enumerate(rows)})
    return out


@pytest.fixture(scope="module")
def dsr_preview(tmp_path_factory, smol_tokenizer):
    shared_fixture("math/dsr_uniform_train_10k.jsonl.gz")  # skip, with the reason, when the fixtures are absent
    tmp = tmp_path_factory.mktemp("dsr")
    train = run_preview(tmp, "data=dsr_uniform", SMOL, "--split", "train", "--limit", "300")
    val = run_preview(tmp, "data=dsr_uniform", SMOL, "--split", "val")
    return train, val


def test_dsr_uniform_is_problem_plus_the_official_suffix(dsr_preview, smol_tokenizer):
    from arlopti.tasks.math.prompts import SUFFIX

    train, val = dsr_preview
    problems = official_math_problems()
    assert [r["uid"] for r in train] == [f"math/dsr_uniform/{i}" for i in range(300)]  # none over 1,024
    assert {(r["split"], r["set"]) for r in train} == {("train", "train")}
    sets = [r["set"] for r in val]
    assert sorted(set(sets), key=sets.index) == list(BENCHMARK_FILES) and {r["split"] for r in val} == {"val"}
    # Every prompt is fed as the tokenizer's ids of its text, nothing added.
    for recs in (train, val):
        assert [r["prompt_ids"] for r in recs] == ids_of(smol_tokenizer, [r["prompt_text"] for r in recs])
    # Validation: exactly the prompts of at most 1,024 tokens, in benchmark order.
    val_uids = [u for u in problems if not u.startswith("math/dsr_uniform/")]
    lengths = dict(zip(val_uids, map(len, ids_of(smol_tokenizer, [problems[u].strip() + SUFFIX
                                                                   for u in val_uids]))))
    assert [r["uid"] for r in val] == [u for u in val_uids if lengths[u] <= 1024]
    # The text is the problem + the official suffix, byte for byte (whitespace included)
    for r in train + val:
        assert r["prompt_text"] == problems[r["uid"]] + SUFFIX, r["uid"]
    assert any(p != p.strip() for p in problems.values())  # the cases that once were stripped are covered


def test_dsr_uniform_prompts_are_byte_for_byte_official(dsr_preview):
    from arlopti.tasks.math.prompts import SUFFIX

    problems = official_math_problems()
    train, val = dsr_preview
    assert [r["prompt_text"] for r in train + val] == [problems[r["uid"]] + SUFFIX for r in train + val]


def test_tiny_model_generated_kk_to_stdout(capsys, tiny_tokenizer):
    """No fixtures: our generator's puzzles in our qwen-instruct template, the tiny tokenizer."""
    argv = ["data=kk_generated", "model=tiny", "data.max_prompt_length=4096", "--limit", "3"]
    assert preview.main(argv) == 0
    out, err = capsys.readouterr()
    got = [json.loads(line) for line in out.splitlines()]
    assert [(r["split"], r["set"]) for r in got] == [("train", "train")] * 3 + [
        ("val", f"kk_{n}ppl") for n in (3, 4, 5) for _ in range(3)]
    assert [r["uid"] for r in got[:3]] == ["kk/train/3ppl/100", "kk/train/3ppl/101", "kk/train/3ppl/102"]
    for r in got:
        assert r["prompt_text"].endswith("<|im_start|>assistant\n<think>")
        assert r["prompt_ids"] == tiny_tokenizer(r["prompt_text"], add_special_tokens=False)["input_ids"]
        assert set(r) == {"uid", "split", "set", "prompt_text", "prompt_ids", "ground_truth", "task", "meta"}
        if r["split"] == "val":
            assert r["meta"]["n_people"] == int(r["set"][3])
    assert "wrote 12 prompts" in err


def test_every_prompt_over_the_limit_warns_instead_of_failing(capsys):
    # K&K prompts are hundreds of tokens: at 100 every one is dropped, and the
    # run would stop at its first step. Preview says so and writes what is left (nothing).
    argv = ["data=kk_generated", "model=tiny", "data.max_prompt_length=100", "--split", "val"]
    assert preview.main(argv) == 0
    out, err = capsys.readouterr()
    assert out == "" and "training would stop here" in err and "dropped over max_prompt_length" in err


def test_missing_official_prompt_is_a_clear_error(tmp_path, capsys):
    row = json.loads(shared_fixture("kk/kk_test_3ppl.jsonl").read_text().splitlines()[0])
    del row["prompt"]
    data = tmp_path / "kk"
    data.mkdir()
    for name in ("train.jsonl", "test_3ppl.jsonl"):
        (data / name).write_text(json.dumps(row) + "\n")
    argv = ["data=kk", "model=tiny", f"data.data_dir={data}", "data.train_people=[3]", "data.val_people=[3]"]
    assert preview.main([*argv, "--split", "val"]) == 2
    err = capsys.readouterr().err
    assert f"{data / 'train.jsonl'}:1 (record 0)" in err and "data.template=qwen-instruct" in err
    assert preview.main([*argv, "data.template=qwen-instruct", "data.max_prompt_length=4096",
                         "data.prompts_per_step=1", "--split", "val"]) == 0
    assert "<|im_start|>system" in capsys.readouterr().out


@pytest.mark.process


def test_help_and_bad_arguments(capsys):
    done = subprocess.run([sys.executable, "-m", "arlopti.data.preview", "--help"], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0
    for needle in ("--split", "--limit", "--out", "prompt_ids", "data=kk"):
        assert needle in done.stdout
    assert preview.main(["data=no_such_data"]) == 2
    assert "no_such_data" in capsys.readouterr().err
    assert preview.main(["--limit", "-1"]) == 2
