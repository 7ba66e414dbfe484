"""KKDataModule: the three sources, record fields, errors, and the base-class behaviour through it."""

from __future__ import annotations

import gzip
import json
import re
import shutil
from pathlib import Path

import pytest
from conftest import REPO_ROOT, need_fixture

from arlopti.data.kk_datamodule import KKDataModule
from arlopti.tasks.kk.logic import parse_statements
from arlopti.tasks.kk.reward import score_response

BIG = 4096  # the tiny test tokenizer (512 tokens) makes K&K prompts ~1,000 tokens long


def generated(tok, **kw):
    args = dict(tokenizer=tok, source="generated", train_people=[3, 4], train_count_per_n=12,
                val_people=[3, 5], val_count_per_n=4, prompts_per_step=4, max_prompt_length=BIG, seed=1)
    args.update(kw)
    dm = KKDataModule(**args)
    dm.setup()
    return dm


def test_generated_records(tiny_tokenizer):
    dm = generated(tiny_tokenizer)
    assert len(dm.train_samples) == 24 and dm.filtered_counts["train"] == 0
    assert sorted(dm.val_sets) == ["kk_3ppl", "kk_5ppl"]
    assert [len(v) for v in dm.val_sets.values()] == [4, 4]
    s = dm.train_samples[0]
    assert s.uid == "kk/train/3ppl/100" and s.task == "kk"
    assert s.meta == {"n_people": 3, "split": "train", "index": 100}
    assert s.prompt_text.endswith("<|im_start|>assistant\n<think>")
    assert score_response(" x </think><answer>" + s.ground_truth + "</answer>", s.ground_truth) == 3
    v = dm.val_sets["kk_5ppl"][0]
    assert v.uid == "kk/test/5ppl/112" and v.meta["split"] == "test" and v.meta["n_people"] == 5
    uids = [x.uid for x in dm.train_samples] + [x.uid for vs in dm.val_sets.values() for x in vs]
    assert len(set(uids)) == len(uids)


def test_generated_train_matches_official_logic():
    fixture = need_fixture("kk/kk_train_34567ppl.jsonl.gz")
    with gzip.open(fixture, "rt") as fh:
        first = json.loads(fh.readline())  # 3 people, index 100
    dm = KKDataModule(source="generated", train_people=[3], train_count_per_n=2, val_people=[3],
                      val_count_per_n=1)
    p = dm.train_puzzles()[0]
    assert p.index == first["index"] == 100
    assert p.statements == parse_statements(first["statements"], 3) and list(p.solution) == first["solution"]


def test_official_fixture_layout_full_size(tiny_tokenizer):
    need_fixture("kk/kk_train_34567ppl.jsonl.gz")
    dm = KKDataModule(tokenizer=tiny_tokenizer, source="official", data_dir=str(need_fixture("kk")),
                      train_people=[3, 4, 5, 6, 7], val_people=[3, 4, 5, 6, 7], max_prompt_length=BIG)
    dm.setup()
    assert len(dm.train_samples) == 4500
    assert {k: len(v) for k, v in dm.val_sets.items()} == {f"kk_{n}ppl": 100 for n in range(3, 8)}
    assert dm.train_samples[0].uid == "kk/train/3ppl/100"
    assert dm.val_sets["kk_7ppl"][-1].uid == "kk/test/7ppl/1099"


def test_official_subsets_and_default_people(tiny_tokenizer):
    dm = KKDataModule(tokenizer=tiny_tokenizer, source="official", data_dir=str(need_fixture("kk")),
                      train_people=[4], train_count_per_n=5, val_count_per_n=3, prompts_per_step=4,
                      max_prompt_length=BIG)
    dm.setup()
    assert [s.meta["n_people"] for s in dm.train_samples] == [4] * 5
    assert sorted(dm.val_sets) == [f"kk_{n}ppl" for n in range(3, 8)]  # val_people=None: all found


def test_files_source(tiny_tokenizer, tmp_path):
    src = need_fixture("kk/kk_test_3ppl.jsonl")
    dm = KKDataModule(tokenizer=tiny_tokenizer, source="files", train_file=str(src),
                      val_files={"held_out": str(need_fixture("kk/kk_test_4ppl.jsonl"))},
                      val_count_per_n=10, prompts_per_step=8, max_prompt_length=BIG)
    dm.setup()
    assert len(dm.train_samples) == 100 and list(dm.val_sets) == ["held_out"]
    assert len(dm.val_sets["held_out"]) == 10


def test_missing_files_name_the_path_and_the_prepare_command(tmp_path):
    with pytest.raises(FileNotFoundError) as err:
        KKDataModule(source="official", data_dir=str(tmp_path / "nowhere")).train_records()
    assert str(tmp_path / "nowhere") in str(err.value)
    hint = "python -m arlopti.data.prepare kk --source files --input-dir ../shared/fixtures/kk"
    assert hint in str(err.value)
    with pytest.raises(FileNotFoundError, match="missing.jsonl"):
        KKDataModule(source="files", train_file=str(tmp_path / "missing.jsonl")).train_records()
    (tmp_path / "only_train").mkdir()
    (tmp_path / "only_train" / "train.jsonl").write_text("")
    with pytest.raises(FileNotFoundError, match="test_3ppl.jsonl"):
        KKDataModule(source="official", data_dir=str(tmp_path / "only_train"), val_people=[3]).val_records()


def test_malformed_record_names_file_line_and_field(tmp_path):
    good = need_fixture("kk/kk_test_3ppl.jsonl").read_text().splitlines()
    rec = json.loads(good[1])
    rec["solution"] = "yes"
    bad = tmp_path / "bad.jsonl"
    bad.write_text("\n".join([good[0], json.dumps(rec)]) + "\n")
    with pytest.raises(ValueError) as err:
        KKDataModule(source="files", train_file=str(bad)).train_records()
    assert f"{bad}:2" in str(err.value) and "'solution'" in str(err.value)
    bad.write_text(good[0] + "\n{not json\n")
    with pytest.raises(ValueError, match=rf"{bad}:2: not valid JSON"):
        KKDataModule(source="files", train_file=str(bad)).train_records()


def test_duplicate_uids_are_refused(tmp_path):
    line = need_fixture("kk/kk_test_3ppl.jsonl").read_text().splitlines()[0]
    dup = tmp_path / "dup.jsonl"
    dup.write_text(line + "\n" + line + "\n")
    with pytest.raises(ValueError, match="share uid"):
        KKDataModule(source="files", train_file=str(dup), verify_solutions=False).train_records()


def test_bad_arguments():
    with pytest.raises(ValueError, match="known sources"):
        KKDataModule(source="hub")
    with pytest.raises(ValueError, match="known templates"):
        KKDataModule(template="chatml")
    with pytest.raises(ValueError, match="data_dir"):
        KKDataModule(source="official")
    with pytest.raises(ValueError, match="train_people"):
        KKDataModule(train_people=[1, 3])
    with pytest.raises(ValueError, match="asked for 101 puzzles per N but it has only 100"):
        KKDataModule(source="official", data_dir=str(need_fixture("kk")), val_people=[3],
                     val_count_per_n=101).val_records()


def epoch_uids(dm):
    return [tuple(b.uids) for b in dm.train_dataloader()]


def test_shuffle_is_deterministic_for_a_seed(tiny_tokenizer):
    a, b, c = (generated(tiny_tokenizer, seed=s) for s in (1, 1, 2))
    assert epoch_uids(a) == epoch_uids(b)
    assert epoch_uids(a) != epoch_uids(c)
    assert len(epoch_uids(a)) == 24 // 4
    plain = generated(tiny_tokenizer, shuffle=False)
    assert [u for batch in epoch_uids(plain) for u in batch] == [s.uid for s in plain.train_samples]


def test_state_dict_resumes_at_the_next_unseen_batch(tiny_tokenizer):
    first = generated(tiny_tokenizer)
    full = epoch_uids(first)
    batches = iter(first.train_dataloader())
    for _ in range(2):
        first.mark_consumed(next(batches))
    state = first.state_dict()
    resumed = generated(tiny_tokenizer)
    resumed.load_state_dict(state)
    assert epoch_uids(resumed) == full[2:]
    late = KKDataModule(tokenizer=tiny_tokenizer, source="generated", train_people=[3, 4],
                        train_count_per_n=12, val_people=[3], val_count_per_n=1, prompts_per_step=4,
                        max_prompt_length=BIG, seed=1)
    late.load_state_dict(state)  # before setup(): applied on setup
    late.setup()
    assert epoch_uids(late) == full[2:]


def test_long_prompts_are_filtered_and_counted_not_truncated(tiny_tokenizer):
    dm = generated(tiny_tokenizer)
    lengths = sorted(len(s.prompt_ids) for s in dm.train_samples)
    cut = lengths[len(lengths) // 2]
    short = generated(tiny_tokenizer, max_prompt_length=cut, val_max_prompt_length=BIG)  # a val set emptied: error
    kept = sum(1 for n in lengths if n <= cut)
    assert len(short.train_samples) == kept and short.filtered_counts["train"] == 24 - kept
    assert all(len(s.prompt_ids) <= cut for s in short.train_samples)
    full_by_uid = {s.uid: s.prompt_ids for s in dm.train_samples}
    assert all(s.prompt_ids == full_by_uid[s.uid] for s in short.train_samples)  # untouched


def test_official_template_feeds_each_record_prompt_verbatim(tiny_tokenizer):
    kk = need_fixture("kk")
    dm = KKDataModule(tokenizer=tiny_tokenizer, source="official", data_dir=str(kk), template="official",
                      train_people=[5], train_count_per_n=6, val_people=[3, 7], val_count_per_n=4,
                      prompts_per_step=2, max_prompt_length=BIG)
    dm.setup()
    records = {}
    for n in (3, 7):
        for line in (kk / f"kk_test_{n}ppl.jsonl").read_text().splitlines():
            r = json.loads(line)
            records[f"kk/test/{n}ppl/{r['index']}"] = r
    with gzip.open(kk / "kk_train_34567ppl.jsonl.gz", "rt") as fh:
        for line in fh:
            r = json.loads(line)
            records[f"kk/train/{r['n_people']}ppl/{r['index']}"] = r
    samples = dm.train_samples + [s for v in dm.val_sets.values() for s in v]
    assert len(samples) == 6 + 8
    for s in samples:
        prompt = records[s.uid]["prompt"]
        assert s.prompt_text == prompt and prompt.endswith("<|im_start|>assistant\n<think>")
        assert s.prompt_ids == tiny_tokenizer(prompt, add_special_tokens=False)["input_ids"]
        assert s.ground_truth == records[s.uid]["solution_text_format"]


def test_official_template_needs_the_prompt_field(tmp_path):
    lines = need_fixture("kk/kk_test_4ppl.jsonl").read_text().splitlines()
    stripped = json.loads(lines[2])
    del stripped["prompt"]
    bad = tmp_path / "no_prompt.jsonl"
    bad.write_text("\n".join([lines[0], lines[1], "", json.dumps(stripped)]) + "\n")
    with pytest.raises(ValueError) as err:
        KKDataModule(source="files", train_file=str(bad), template="official").train_records()
    text = str(err.value)
    assert f"{bad}:4 (record 2)" in text and "'prompt'" in text
    assert "data.template=qwen-instruct" in text and "official 'prompt' field" in text
    with pytest.raises(ValueError, match=r"no_prompt.jsonl:4 \(record 2\)"):
        KKDataModule(source="files", val_files={"v": str(bad)}, template="official").val_records()
    # Our own template does not need it.
    assert len(KKDataModule(source="files", train_file=str(bad)).train_records()) == 3
    with pytest.raises(ValueError, match="data.source=generated.*qwen-instruct"):
        KKDataModule(source="generated", template="official")


def test_val_max_prompt_length_filters_validation_only(tiny_tokenizer):
    # fidelity=official sets data.val_max_prompt_length (the official validation filter, 1,024).
    dm = generated(tiny_tokenizer)
    lengths = sorted(len(s.prompt_ids) for v in dm.val_sets.values() for s in v)
    cut = lengths[len(lengths) // 2]
    split = generated(tiny_tokenizer, val_max_prompt_length=cut)
    assert len(split.train_samples) == 24 and split.filtered_counts["train"] == 0
    assert sum(len(v) for v in split.val_sets.values()) == sum(1 for n in lengths if n <= cut)
    assert all(len(s.prompt_ids) <= cut for v in split.val_sets.values() for s in v)


def test_base_template(tiny_tokenizer):
    dm = generated(tiny_tokenizer, template="base")
    text = dm.train_samples[0].prompt_text
    assert "\nUser: " in text and text.endswith("Assistant: <think>") and "<|im_start|>" not in text


# ---- configs ---------------------------------------------------------------------------------
def compose(tmp_path, name: str):
    """Compose configs/data/<name>.yaml under a throwaway primary config (the lead's train.yaml
    may not exist yet) with the interpolations it needs."""
    from arlopti.config.compose import compose

    conf = tmp_path / "conf"
    shutil.copytree(REPO_ROOT / "configs" / "data", conf / "data")
    shared = Path(need_fixture("kk")).parent.parent
    (conf / "config.yaml").write_text(
        "defaults:\n  - data: kk\n  - _self_\n"
        f"paths:\n  shared_dir: {shared}\nsizes:\n  prompts_per_step: 8\nseed: 3\n")
    return compose([f"data={name}"], config_name="config", config_dir=conf)


def test_kk_config_composes_and_instantiates(tiny_tokenizer, tmp_path):
    from hydra.utils import instantiate

    cfg = compose(tmp_path, "kk")
    assert cfg.data.max_prompt_length == 400 and cfg.data.template == "official"
    assert cfg.data.val_max_prompt_length is None
    # the tiny tokenizer makes every 4-7-people validation prompt longer than 400 tokens, an error (issue 24)
    dm = instantiate(cfg.data, tokenizer=tiny_tokenizer, val_max_prompt_length=BIG)
    assert isinstance(dm, KKDataModule) and dm.prompts_per_step == 8 and dm.seed == 3
    dm.setup()
    # With the real tokenizers nothing is dropped at 400 tokens; the tiny one drops most prompts.
    assert len(dm.train_samples) + dm.filtered_counts["train"] == 4500
    assert sorted(dm.val_sets) == [f"kk_{n}ppl" for n in range(3, 8)]
    assert all(len(dm.val_sets[k]) + dm.filtered_counts[k] == 100 for k in dm.val_sets)


def test_kk_generated_config_composes_and_instantiates(tiny_tokenizer, tmp_path):
    from hydra.utils import instantiate

    cfg = compose(tmp_path, "kk_generated")
    assert cfg.data.template == "qwen-instruct"  # generated puzzles have no official prompt
    dm = instantiate(cfg.data, tokenizer=tiny_tokenizer, max_prompt_length=BIG)
    dm.setup()
    assert len(dm.train_samples) == 600 and dm.filtered_counts["train"] == 0
    assert {k: len(v) for k, v in dm.val_sets.items()} == {"kk_3ppl": 20, "kk_4ppl": 20, "kk_5ppl": 20}


def test_an_empty_or_short_validation_set_is_never_silent(tmp_path, caplog):
    """Issue 14 row 6: an empty kk_test_6ppl.jsonl used to vanish from validation, changing what
    val/kk/mean averages over. Now it is an error naming the file; a short one is logged with its size."""
    import logging

    src = need_fixture("kk")
    layout = tmp_path / "kk"
    layout.mkdir()
    for n in (3, 6):
        shutil.copy(src / f"kk_test_{n}ppl.jsonl", layout / f"kk_test_{n}ppl.jsonl")
    (layout / "kk_test_6ppl.jsonl").write_text("")
    with pytest.raises(ValueError, match=r"'kk_6ppl': .*kk_test_6ppl\.jsonl holds no puzzles"):
        KKDataModule(source="official", data_dir=str(layout), val_people=[3, 6]).val_records()
    # val_people=None: every file found
    with pytest.raises(ValueError, match=r"kk_test_6ppl\.jsonl holds no puzzles"):
        KKDataModule(source="official", data_dir=str(layout)).val_records()
    with pytest.raises(ValueError, match=r"'held_out': .*empty\.jsonl holds no puzzles"):
        (tmp_path / "empty.jsonl").write_text("")
        KKDataModule(source="files", val_files={"held_out": str(tmp_path / "empty.jsonl")}).val_records()

    lines = (src / "kk_test_6ppl.jsonl").read_text().splitlines()[:37]
    (layout / "kk_test_6ppl.jsonl").write_text("\n".join(lines) + "\n")
    with caplog.at_level(logging.INFO, logger="arlopti.data.kk_datamodule"):
        sets = KKDataModule(source="official", data_dir=str(layout), val_people=[3, 6]).val_puzzles()
    assert {k: len(v) for k, v in sets.items()} == {"kk_3ppl": 100, "kk_6ppl": 37}
    assert re.search(r"validation set kk_6ppl: 37 puzzles from .*kk_test_6ppl\.jsonl, fewer than the 100 "
                     r"asked for", caplog.text)
    assert re.search(r"validation set kk_3ppl: 100 puzzles from .*kk_test_3ppl\.jsonl", caplog.text)


def test_a_validation_set_emptied_by_the_length_filter_is_an_error_naming_it(tiny_tokenizer):
    """As an empty validation file (issue 24, §2); through train.py: tests/test_clear_failures.py."""
    with pytest.raises(ValueError, match=re.escape(
            "validation set kk_3ppl (kk): every one of its 4 prompts is longer than the validation prompt-length "
            "limit 8 (data.val_max_prompt_length)")):
        generated(tiny_tokenizer, val_max_prompt_length=8)
