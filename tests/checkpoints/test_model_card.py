"""``arlopti export`` writes a Hugging Face model card (arlopti/checkpoints/model_card.py).

``train.py`` trains the tiny model for 2 rollout steps of AR + Lopti with validation (Hydra writes
``.hydra/config.yaml``, the summary callback ``summary.json``, the checkpoint callback
``checkpoints/last.ckpt``); the export's ``README.md`` is read back with ``huggingface_hub``'s own
parser and every value in it is compared with the run's own files: the settings with
``.hydra/config.yaml``, the evaluation with ``summary.json``'s ``eval_last``. Before the card, the
export wrote no README.md and the first test fails. Also: a checkpoint outside its run directory, a
validation of another step and a run without validation say so instead of reporting numbers; a
broken ``summary.json`` is named before anything is written; hub ids are only taken where they are ids.
"""

from __future__ import annotations

import json
import re
import shutil

import pytest
import yaml

from arlopti.checkpoints.export import export_checkpoint, main
from arlopti.checkpoints.model_card import (BIBTEX, HUB_PREFIX, card_text, data_description, front_matter,
                                            hub_datasets, hub_model_id, reward_lines, rounded, settings_in_force)
from arlopti.checkpoints.resume import load_checkpoint_metadata
from helpers.train_cli import run_train_cli

SMOKE = ("debug=smoke", "data=kk_generated", "data.train_count_per_n=4", "data.val_count_per_n=1",
         "callbacks.benchmark_eval.limit=1", "~callbacks.rich_progress_bar", "logger=none")


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    from arlopti.tasks.kk import KKTask
    from helpers.varied_reward import varied_kk_score as varied


    tmp = tmp_path_factory.mktemp("card")
    mp = pytest.MonkeyPatch()
    mp.setattr(KKTask, "score", varied)
    try:
        code, err = run_train_cli(tmp, "experiment=kk_ar_lopti", smoke=SMOKE)
    finally:
        mp.undo()
    assert code == 0, err[-2000:]
    run = tmp / "run"
    for f in (".hydra/config.yaml", "summary.json", "checkpoints/last.ckpt"):
        assert (run / f).exists(), f
    return run


def read_card(path):
    """(front matter as YAML, body, huggingface_hub's ModelCardData) of a README.md."""
    from huggingface_hub import ModelCard

    text = path.read_text()
    m = re.match(r"---\n(.*?)\n---\n(.*)", text, re.S)
    assert m, "no YAML front matter between --- lines"
    return yaml.safe_load(m.group(1)), m.group(2), ModelCard(text).data


def table(body: str) -> dict[str, object]:
    """``{key: value}`` of the card's ``| `key` | `json` |`` rows."""
    return {k: json.loads(v) for k, v in re.findall(r"^\| `([^`]+)` \| `([^`]*)` \|$", body, re.M)}


def flat(d: dict, prefix: str) -> dict:
    out = {}
    for k, v in d.items():
        out.update(flat(v, f"{prefix}.{k}") if isinstance(v, dict) else {f"{prefix}.{k}": v})
    return out


def test_card_equals_the_runs_config_and_summary(run_dir, tmp_path):
    out = export_checkpoint(run_dir, tmp_path / "kk_ar_lopti_hf")
    meta, body, data = read_card(out / "README.md")
    cfg = yaml.safe_load((run_dir / ".hydra" / "config.yaml").read_text())
    summary = json.loads((run_dir / "summary.json").read_text())
    algo = cfg["algorithm"]
    # front matter: tags from the config, no invented hub ids (the tiny model, generated puzzles)
    want_tags = ["arlopti", algo["advantage"], *(["ar"] if algo["ar_alpha"] > 0 else []),
                 *(["lopti"] if algo["lopti"]["enabled"] else []), "reinforcement-learning"]
    assert want_tags == ["arlopti", "grpo", "ar", "lopti", "reinforcement-learning"]
    assert meta["tags"] == data.tags == want_tags
    assert meta["library_name"] == "transformers" and meta["pipeline_tag"] == "text-generation"
    assert "base_model" not in meta and "datasets" not in meta
    assert f"- base model: `{cfg['model']['name_or_path']}` (not a hub id)" in body
    assert f"`data.source` = {cfg['data']['source']}, `data.generator_seed` = {cfg['data']['generator_seed']}" in body
    # the settings in force: the config's values (rounded), AR's and Lopti's on, no method that is off
    rows = table(body)
    config_values = {**flat(algo, "algorithm"), **{f"optim.{k}": cfg["optim"][k] for k in ("lr", "name")},
                     **{f"sizes.{k}": cfg["sizes"][k] for k in ("prompts_per_step", "group_size", "mini_batch_size")},
                     "rollout.temperature": cfg["rollout"]["temperature"]}
    for key, value in rows.items():
        if key in config_values:
            assert value == rounded(config_values[key]), f"{key}: card {value!r}, config {config_values[key]!r}"
    for key in ("optim.lr", "sizes.group_size", "algorithm.clip_low", "algorithm.lopti.eta"):
        assert key in rows, key
    assert rows["algorithm.ar_alpha"] > 0 and rows["algorithm.lopti.enabled"] is True  # the run's, not defaults
    assert not any(k.startswith(("algorithm.token_method.", "algorithm.loss_params.", "algorithm.dapo."))
                   for k in rows), sorted(rows)  # ppo_clip, no token method, no DAPO: all off
    # what was rewarded, the versions, the quick start; no path of this machine anywhere
    assert "## What was rewarded" in body and "- task: `kk`, its built-in reward (`tasks.kk.official_cut` = false)" in body
    assert re.search(r"^- torch: \d", body, re.M) and re.search(r"^- transformers: \d", body, re.M)
    assert 'pipeline("text-generation", model="kk_ar_lopti_hf")' in body
    export = json.loads((out / "arlopti_export.json").read_text())
    assert export["checkpoint"] == "/".join([*run_dir.resolve().parts[-3:], "checkpoints", "last.ckpt"])
    for text in ((out / "README.md").read_text(), (out / "arlopti_export.json").read_text()):
        assert str(tmp_path) not in text and str(run_dir.resolve().parent) not in text
    # the evaluation: model-index per set, the body's table for every val/* number, all = eval_last
    last = summary["eval_last"]
    assert last["rollout_step"] == summary["rollout_steps"] == 2
    assert f"at rollout step {last['rollout_step']}, {summary['optimizer_steps']} optimizer steps" in body
    per_set = {k: v for k, v in last.items() if k.startswith("val/") and k.split("/")[2] != "mean"}
    assert len(data.eval_results) == len(per_set) > 0
    for r in data.eval_results:
        task_set = r.dataset_type.removeprefix("arlopti:")
        mode, metric = r.metric_name.split(" ")
        assert r.metric_value == rounded(per_set[f"val/{task_set}/{mode}/{metric}"]), r
    assert {k: v for k, v in rows.items() if k.startswith("val/")} == {k: rounded(v) for k, v in last.items()
                                                                      if k.startswith("val/")}
    for key in ("reward/mean", "reward/accuracy"):  # the training rollouts' first and last steps
        first, final = (json.dumps(rounded(summary[part][key])) for part in ("start", "end"))
        assert re.search(rf"^\| `{key}` \| `{re.escape(first)}` \| `{re.escape(final)}` \|$", body, re.M), key
    assert BIBTEX in body and "Do Not Let Low-Probability Tokens Over-Dominate in {RL} for {LLMs}" in BIBTEX
    assert "arXiv:2505.12929" in BIBTEX


def fake_run(tmp_path, name, summary):
    """A run directory ``name`` with ``summary`` (None: none) and a placeholder checkpoint path."""
    ckpt = tmp_path / name / "checkpoints" / "last.ckpt"
    ckpt.parent.mkdir(parents=True)
    ckpt.write_bytes(b"")
    if summary is not None:
        (tmp_path / name / "summary.json").write_text(json.dumps(summary))
    return ckpt


def test_no_evaluation_is_said_not_made_up(run_dir, tmp_path):
    meta = load_checkpoint_metadata(run_dir / "checkpoints" / "last.ckpt")
    summary = json.loads((run_dir / "summary.json").read_text())
    alone = tmp_path / "elsewhere" / "last.ckpt"
    alone.parent.mkdir()
    shutil.copy(run_dir / "checkpoints" / "last.ckpt", alone)
    other_step = {**summary, "eval_last": {**summary["eval_last"], "rollout_step": 1}}
    cases = {"no `summary.json` of the run beside the checkpoint": alone,
             "the run's last validation was at rollout step 1, this checkpoint is of rollout step 2":
                 fake_run(tmp_path, "other", other_step),
             "the run wrote no validation results": fake_run(tmp_path, "noval", {**summary, "eval_last": {}})}
    for says, ckpt in cases.items():
        text = card_text(meta, ckpt, "m", adapter=False)
        assert says in text, says
        assert "model-index" not in text and "val/kk/" not in text


def test_broken_summary_is_named_before_anything_is_written(run_dir, tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(run_dir, run)
    (run / "summary.json").write_text('{"eval_last": ')
    assert main([str(run), str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and str(run / "summary.json") in err and "not valid JSON" in err
    assert not (tmp_path / "out").exists()


def test_hub_ids_only_where_they_are_ids(tmp_path, monkeypatch):
    from arlopti.data.generic_datamodule import HUB_PREFIX as DATA_HUB_PREFIX

    assert HUB_PREFIX == DATA_HUB_PREFIX
    assert hub_model_id("Qwen/Qwen2.5-3B-Instruct") == "Qwen/Qwen2.5-3B-Instruct"
    monkeypatch.chdir(tmp_path)
    (tmp_path / "my" / "model").mkdir(parents=True)
    for local in ("tiny", "smollm2-135m-instruct", "/models/qwen", "./qwen", "my/model", None):
        assert hub_model_id(local) is None, local
    assert hub_datasets({"train_file": "hub:openai/gsm8k:main@train"}) == ["openai/gsm8k"]
    assert hub_datasets({"train_file": "data/prepared/deepscaler/train.jsonl"}) == []
    run = {"model": {"name_or_path": "Qwen/Qwen2.5-3B-Instruct"}, "algorithm": {"advantage": "rloo"}}
    meta = yaml.safe_load(front_matter(run, {"train_file": "hub:openai/gsm8k@train"}, "m", {}, adapter=True))
    assert meta["base_model"] == "Qwen/Qwen2.5-3B-Instruct" and meta["datasets"] == ["openai/gsm8k"]
    assert meta["library_name"] == "peft" and meta["tags"] == ["arlopti", "rloo", "reinforcement-learning"]
    assert "model-index" not in meta


def test_the_data_line_is_one_line_without_the_machines_paths():
    data = {"_target_": "arlopti.data.generic_datamodule.GenericPromptDataModule", "train_file": "/data/train.jsonl",
            "system_prompt": "You are helpful.\n---\nmodel-index: []"}
    line = data_description(data)
    assert line == ("GenericPromptDataModule: `data.train_file` = train.jsonl, `data.system_prompt` = You are helpful. "
                    "--- model-index: []")
    meta = yaml.safe_load(front_matter({"model": {"name_or_path": "tiny"}}, data, "m", {}, adapter=False))
    assert "model-index" not in meta and "datasets" not in meta


# ---- issue 54 item 4: what was rewarded, the settings in force, rounded; the push to the hub ----------
def test_the_card_says_what_was_rewarded():
    custom = {"task": {"reward_fns": ["rewards.py:correct", "rewards.py:brevity"], "reward_weights": [1.0, 0.1, 0.5],
                       "reward_model": "/models/my-rm"}, "data": {"task": "custom"}}
    assert reward_lines(custom, {}) == ["- task: `custom`, the weighted sum of:", "  - `rewards.py:correct`, weight 1.0",
                                        "  - `rewards.py:brevity`, weight 0.1", "  - reward model `my-rm`, weight 0.5"]
    alone = reward_lines({"task": {"reward_model": "OpenAssistant/rm", "reward_fn": None}}, {})
    assert alone[1] == "  - reward model `OpenAssistant/rm`, weight 1.0"  # a hub name as it is, a folder by its name
    several = reward_lines({"task": {"reward_model": ["/models/helpful-rm", "/models/safe-rm"],
                                     "reward_weights": [1.0, 0.25]}}, {})
    assert several[1:] == ["  - reward model `helpful-rm`, weight 1.0", "  - reward model `safe-rm`, weight 0.25"]
    math = reward_lines({"task": {"env": None}, "data": {}, "tasks": {"math": {"grader": "official"}}},
                        {"_target_": "arlopti.data.math.MathDataModule"})
    assert math == ["- task: `math`, its built-in reward (`tasks.math.grader` = official)"]
    assert "Not recorded" in reward_lines(None, {})[0]


def test_only_the_settings_in_force_are_listed_rounded():
    import dataclasses

    from arlopti.config import RunConfig

    run = dataclasses.asdict(RunConfig())
    run["optim"]["lr"] = 1.23456789e-6
    grpo = settings_in_force(run)
    assert grpo["optim.lr"] == 1.23456789e-6  # the raw value; the card shows it rounded
    assert rounded(grpo["optim.lr"]) == 1.235e-6 and rounded([0.123456, 2]) == [0.1235, 2]
    assert not any(k.startswith(("algorithm.lopti", "algorithm.ar_alpha", "algorithm.token_method",
                                 "algorithm.loss_params", "algorithm.dapo", "algorithm.rollout_correction")) for k in grpo)
    run["algorithm"].update(policy_loss="sapo", token_method={**run["algorithm"]["token_method"], "name": "clip_cov"},
                            lopti={**run["algorithm"]["lopti"], "enabled": True}, kl_coef=0.0)
    on = settings_in_force(run)
    assert {k for k in on if k.startswith("algorithm.loss_params.")} == {
        "algorithm.loss_params.sapo_tau_pos", "algorithm.loss_params.sapo_tau_neg", "algorithm.loss_params.sapo_empty_rows"}
    assert {k for k in on if k.startswith("algorithm.token_method.")} == {
        "algorithm.token_method.name", "algorithm.token_method.cov_ratio", "algorithm.token_method.clip_cov_lb",
        "algorithm.token_method.clip_cov_ub"}
    assert "algorithm.lopti.eta" in on and not any(k.startswith("algorithm.kl_") for k in on)


class _StandInHub:
    """``huggingface_hub.HfApi`` that records its calls and touches no network."""

    calls: list = []

    def create_repo(self, repo_id, **kwargs):
        self.calls.append(("create_repo", repo_id, kwargs))

    def upload_folder(self, **kwargs):
        self.calls.append(("upload_folder", kwargs["repo_id"], kwargs))
        return "https://huggingface.co/me/m/commit/0"


def test_push_to_hub_uploads_the_export_with_hfapi(run_dir, tmp_path, monkeypatch, capsys):
    import huggingface_hub

    _StandInHub.calls = []
    monkeypatch.setattr(huggingface_hub, "HfApi", _StandInHub)
    out = tmp_path / "pushed"
    assert main([str(run_dir), str(out), "--push-to-hub", "me/m", "--private"]) == 0
    (create, upload) = _StandInHub.calls
    assert create == ("create_repo", "me/m", {"repo_type": "model", "private": True, "exist_ok": True})
    assert upload[1] == "me/m" and upload[2]["folder_path"] == str(out) and upload[2]["repo_type"] == "model"
    assert 'pipeline("text-generation", model="me/m")' in (out / "README.md").read_text()
    assert "pushed to https://huggingface.co/me/m" in capsys.readouterr().out


def test_private_without_a_push_is_refused():
    from arlopti.config import ConfigError

    with pytest.raises(ConfigError, match=r"^--private: .*--push-to-hub"):
        main(["a.ckpt", "out", "--private"])
