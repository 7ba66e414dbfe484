"""``task.reward_model``: a sequence-classification reward model as one more entry of the custom task's reward
list (arlopti/tasks/reward_model.py, arlopti/tasks/custom.py).

The reward model here is a tiny random ``Qwen2ForSequenceClassification`` saved in the test's folder with a
tokenizer of its own: another vocabulary than the policy's and its own chat template, so that a score read
through the policy's tokenizer or template cannot pass. Each score is checked against a direct, unbatched,
unpadded forward of the saved model; the train.py runs show a non-zero gradient, weights that moved, and a
resume that is bit-exact."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import torch

from arlopti.config import ConfigError
from arlopti.tasks.custom import CustomTask, RewardFailureError
from arlopti.tasks.reward_model import forget_loaded, loaded_models, precision_dtype, render

#: The reward model's own chat template (the policy's tiny tokenizer speaks ChatML).
RM_TEMPLATE = ("{% for m in messages %}[{{ m['role'] | upper }}] {{ m['content'] }}\n{% endfor %}"
               "{% if add_generation_prompt %}[ASSISTANT] {% endif %}")


def save_reward_model(folder: Path, num_labels: int = 1, chat_template: str | None = RM_TEMPLATE,
                      causal: bool = False) -> Path:
    """A tiny random reward model and its own tokenizer (vocabulary 300, not the policy's 512) saved in
    ``folder``; ``causal``: a causal LM instead (what a reward model must not be)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM, Qwen2ForSequenceClassification

    from arlopti.models.loading import build_tiny_tokenizer

    tok = build_tiny_tokenizer(vocab_size=300)
    tok.chat_template = chat_template
    torch.manual_seed(1234)
    config = Qwen2Config(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
                         num_labels=num_labels, pad_token_id=tok.pad_token_id)
    model = (Qwen2ForCausalLM if causal else Qwen2ForSequenceClassification)(config)
    with torch.no_grad():  # a score head with a spread: the random init's is tiny
        for p in model.parameters():
            p.mul_(4.0)
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    forget_loaded()
    yield
    forget_loaded()


@pytest.fixture(scope="module")
def rm_path(tmp_path_factory) -> Path:
    return save_reward_model(tmp_path_factory.mktemp("rm"))


def direct_score(path: Path, prompt, response: str) -> float:
    """The saved model's score of one sequence, by hand: its own tokenizer and template, batch of one, no
    padding, float32."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForSequenceClassification.from_pretrained(path, dtype=torch.float32).eval()
    if isinstance(prompt, str):
        text = prompt + response
    else:
        text = tok.apply_chat_template([*prompt, {"role": "assistant", "content": response}], tokenize=False)
    ids = torch.tensor([tok(text, add_special_tokens=False)["input_ids"]])
    with torch.no_grad():
        return float(model(input_ids=ids).logits[0, 0])


CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Who is a knight?"}]
RESPONSES = ["Zoey is a knight.", "Oliver", "Both of them are knaves, and Zoey lies about it.", "no", "Zoey."]


def test_precision_dtype_follows_the_run():
    assert precision_dtype("bf16-mixed") == precision_dtype("bf16-true") == torch.bfloat16
    assert precision_dtype("bfloat16-mixed") == torch.bfloat16  # FSDP2's own mixed precision (trainer=fsdp_bf16)
    assert precision_dtype("16-mixed") == precision_dtype("fp16-mixed") == torch.float16
    assert precision_dtype("32-true") == precision_dtype(None) == torch.float32


def test_render_uses_the_reward_models_own_template(rm_path):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(rm_path)
    text = render(tok, CHAT, "Zoey.")
    assert text == "[SYSTEM] Be brief.\n[USER] Who is a knight?\n[ASSISTANT] Zoey.\n"
    assert "<|im_start|>" not in text  # not the policy's ChatML
    assert render(tok, "Q: 2+2? A:", " 4") == "Q: 2+2? A: 4"  # raw text: concatenation
    tok.chat_template = None
    assert render(tok, CHAT, "Zoey.") == "Be brief.\n\nWho is a knight?\n\nZoey."


def test_scores_equal_a_direct_forward_of_the_reward_model(rm_path):
    task = CustomTask(reward_model=str(rm_path), reward_model_batch_size=2)  # 3 batches, padded
    task.place(torch.device("cpu"), "32-true")
    metas = [{"prompt": CHAT}] * 4 + [{"prompt": "Q: who? A:"}]
    out = task.score(RESPONSES, [None] * 5, metas)
    want = [direct_score(rm_path, m["prompt"], r) for m, r in zip(metas, RESPONSES)]
    assert len(set(round(w, 4) for w in want)) == 5, f"the scores do not vary: {want}"
    assert [r.reward for r in out] == pytest.approx(want, abs=1e-5)
    assert [r.correct for r in out] == [w > 0 for w in want]  # alone: reward > task.correct_above
    assert all(set(r.components) == {"reward_model", "error", "timeout"} for r in out)
    assert [r.components["reward_model"] for r in out] == pytest.approx(want, abs=1e-5)  # its own tag, alone too
    ((name, device, dtype),) = loaded_models()
    assert (name, device, dtype) == (str(rm_path), "cpu", torch.float32)


@pytest.mark.process


def test_it_is_the_last_entry_of_the_weighted_list(rm_path, tmp_path):
    (tmp_path / "rewards.py").write_text("def length(response, ground_truth, meta):\n    return len(response)\n")
    task = CustomTask(reward_fns=[f"{tmp_path}/rewards.py:length"], reward_model=str(rm_path),
                      reward_weights=[0.5, 2.0], num_workers=1)
    task.place("cpu", "32-true")
    try:
        out = task.score(RESPONSES[:2], [None] * 2, [{"prompt": CHAT}] * 2)
    finally:
        task.close()
    rm = [direct_score(rm_path, CHAT, r) for r in RESPONSES[:2]]
    assert [r.components["reward_model"] for r in out] == pytest.approx(rm, abs=1e-5)
    assert [r.components["length"] for r in out] == [len(r) for r in RESPONSES[:2]]
    assert [r.reward for r in out] == pytest.approx([0.5 * len(r) + 2.0 * s for r, s in zip(RESPONSES, rm)], abs=1e-5)
    with pytest.raises(ConfigError, match=r"task.reward_weights=\[1.0\]: expected 2 .*task.reward_model"):
        CustomTask(reward_fns=[f"{tmp_path}/rewards.py:length"], reward_model=str(rm_path), reward_weights=[1.0])


def test_loaded_once_in_the_runs_precision(rm_path, monkeypatch):
    from transformers import AutoModelForSequenceClassification

    loads = []
    real = AutoModelForSequenceClassification.from_pretrained

    def counting(*args, **kwargs):
        loads.append(kwargs.get("dtype"))
        return real(*args, **kwargs)

    monkeypatch.setattr(AutoModelForSequenceClassification, "from_pretrained", counting)
    rng = torch.get_rng_state()
    training, validation = CustomTask(reward_model=str(rm_path)), CustomTask(reward_model=str(rm_path))
    assert loads == []  # built (and checked) without loading the weights
    for task in (training, validation):
        task.place(torch.device("cpu"), "bf16-mixed")
        out = task.score(RESPONSES[:3], [None] * 3, [{"prompt": CHAT}] * 3)
    assert loads == [torch.bfloat16]  # one load, shared by both tasks, in bf16 under bf16-mixed
    assert torch.equal(torch.get_rng_state(), rng)  # loading drew nothing from the global RNG
    explicit = CustomTask(reward_model=str(rm_path), reward_model_dtype="float32", reward_model_device="cpu")
    explicit.place(torch.device("cpu"), "bf16-mixed")
    explicit.score(RESPONSES[:1], [None], [{"prompt": CHAT}])
    assert loads == [torch.bfloat16, torch.float32]  # the keys win over the run's precision
    want = [direct_score(rm_path, CHAT, r) for r in RESPONSES[:3]]
    assert [r.reward for r in out] == pytest.approx(want, abs=0.1)  # bf16 of the same model


@pytest.mark.parametrize("make,words", [
    (lambda p: save_reward_model(p, num_labels=2), "its head gives 2 scores per sequence (num_labels=2)"),
    (lambda p: save_reward_model(p, causal=True), "a Qwen2ForCausalLM, not a sequence-classification model"),
    (lambda p: p / "missing", "cannot read its config"),
])
def test_a_model_without_one_score_per_sequence_is_refused_at_start_up(make, words, tmp_path):
    path = make(tmp_path)
    with pytest.raises(ConfigError) as err:
        CustomTask(reward_model=str(path))
    text = str(err.value)
    assert text.startswith(f"task.reward_model={path}") and words in text and "\n" not in text
    assert loaded_models() == {}


def test_bad_keys_are_named(rm_path):
    for kwargs, words in (({"reward_model_dtype": "int8"}, "task.reward_model_dtype='int8'"),
                          ({"reward_model_batch_size": 0}, "task.reward_model_batch_size=0"),
                          ({"reward_model_device": "tpu:7"}, "task.reward_model_device='tpu:7'")):
        with pytest.raises(ConfigError, match=words.replace("(", r"\(").replace("[", r"\[")):
            CustomTask(reward_model=str(rm_path), **kwargs)
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match="task.reward_model_device=cuda: no CUDA device"):
            CustomTask(reward_model=str(rm_path), reward_model_device="cuda")


def test_a_failing_forward_is_counted_and_stops_the_run(rm_path, caplog):
    task = CustomTask(reward_model=str(rm_path))
    task.place("cpu", "32-true")
    with caplog.at_level(logging.WARNING, logger="arlopti.tasks.custom"):
        with pytest.raises(RewardFailureError) as err:
            task.score(["a", "b"], [None] * 2, [{}, {}])  # no prompt: the forward cannot run
    text = str(err.value)
    assert f"the reward function task.reward_model={rm_path} failed on 2 of 2 responses" in text
    assert "has no prompt" in text and "\n" not in text
    assert task.stats["error"] == 2


# ---- through train.py ------------------------------------------------------------------------------

RECORDER = '''
import json

def record(response, ground_truth, meta):
    """Weight 0: writes what the reward model was given (the record's prompt, the response)."""
    with open(OUT, "a") as f:
        f.write(json.dumps({"prompt": meta["prompt"], "response": response}) + "\\n")
    return 0.0
'''


def _task_files(tmp_path: Path) -> tuple[Path, Path]:
    tmp_path.mkdir(parents=True, exist_ok=True)
    prompts = tmp_path / "prompts.jsonl"
    rows = [{"prompt": [{"role": "user", "content": f"Is person {i} a knight or a knave?"}]} for i in range(4)]
    prompts.write_text("".join(json.dumps(r) + "\n" for r in rows))
    recorder = tmp_path / "recorder.py"
    recorder.write_text(f"OUT = {str(tmp_path / 'seen.jsonl')!r}\n" + RECORDER)
    return prompts, recorder


def _overrides(tmp_path: Path, rm: Path, steps: int) -> list[str]:
    prompts, recorder = _task_files(tmp_path)
    return ["task=custom", f"task.reward_fns=[{recorder}:record]", f"task.reward_model={rm}",
            "task.reward_weights=[0.0,1.0]", "task.num_workers=1", "data=prompts", f"data.train_file={prompts}",
            "data.prompt_key=prompt", "data.answer_key=null", "debug=smoke", "logger=none",
            "~callbacks.benchmark_eval", "optim.lr=1e-3", f"rollout_steps={steps}", "trainer.max_epochs=4"]


def _params(module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in module.policy.named_parameters()}


@pytest.mark.slow
def test_train_run_on_the_reward_model_learns_and_resumes_bit_exact(rm_path, tmp_path):
    from helpers.compose import compose_train
    from helpers.moved import assert_moved

    from arlopti.entry.train import train

    full = train(compose_train(_overrides(tmp_path / "full", rm_path, 4), tmp_path / "full"))["module"]
    m = full.last_step_context.metrics
    assert full.rollout_step == 4
    assert float(m["reward/zero_std_group_frac"]) < 1.0 and float(m["update/grad_norm"]) > 0, m
    # the step's reward is the reward model's score of what the policy wrote, read by hand
    seen = [json.loads(line) for line in (tmp_path / "full" / "seen.jsonl").read_text().splitlines()]
    assert len(seen) == 4 * 8 and seen[0]["prompt"][0]["role"] == "user"  # the record's messages reach meta
    last = [direct_score(rm_path, s["prompt"], s["response"]) for s in seen[-8:]]
    assert float(m["reward/reward_model"]) == pytest.approx(sum(last) / 8, abs=1e-5)
    assert float(m["reward/mean"]) == pytest.approx(sum(last) / 8, abs=1e-5)

    # 2 steps, then a resume for 2 more: the same weights, bit for bit
    part = train(compose_train(_overrides(tmp_path / "part", rm_path, 2), tmp_path / "part"))["module"]
    at_two = _params(part)
    (ckpt,) = (tmp_path / "part").rglob("last.ckpt")
    resumed = train(compose_train([*_overrides(tmp_path / "part", rm_path, 4), f"ckpt_path={ckpt}"],
                                  tmp_path / "resumed"))["module"]
    assert resumed.rollout_step == 4
    print(assert_moved(at_two, resumed.policy, resumed.trainer.optimizers[0], what="steps 3-4 after the resume"))
    a, b = _params(full), _params(resumed)
    diff = {k: float((a[k] - b[k]).abs().max()) for k in a if not torch.equal(a[k], b[k])}
    assert not diff, f"the resumed run's weights differ: {diff}"
    assert float(resumed.last_step_context.metrics["reward/mean"]) == float(m["reward/mean"])


# ---- a reward model is what it claims (issue 52) -----------------------------------------------------------

def _edit_config(folder: Path, **changes) -> Path:
    """``folder``'s config.json with ``changes`` (a value of None drops the key)."""
    config = json.loads((folder / "config.json").read_text())
    for key, value in changes.items():
        if value is None:
            config.pop(key, None)
        else:
            config[key] = value
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def test_a_causal_lm_whose_config_lost_its_architectures_is_refused_at_start_up(tmp_path):
    path = _edit_config(save_reward_model(tmp_path / "lm", causal=True), architectures=None)
    with pytest.raises(ConfigError) as err:
        CustomTask(reward_model=str(path))
    text = str(err.value)
    assert text.startswith(f"task.reward_model={path}: its config.json names no architectures") and "\n" not in text
    assert loaded_models() == {}


def test_weights_without_a_trained_score_head_are_refused_naming_them(tmp_path, caplog):
    from arlopti.tasks.reward_model import RewardModel

    # a causal LM's weights under a config that claims a classifier: transformers would make the head up
    path = _edit_config(save_reward_model(tmp_path / "lm", causal=True),
                        architectures=["Qwen2ForSequenceClassification"])
    model = RewardModel(str(path), device="cpu", dtype="float32")  # the config alone reads as a reward model
    with pytest.raises(ConfigError) as err:
        model.score([CHAT], ["Zoey."])
    text = str(err.value)
    assert text.startswith(f"task.reward_model={path}: its weights have no trained score head") and "\n" not in text
    assert "score.weight" in text and loaded_models() == {}
    task = CustomTask(reward_model=str(path), max_error_frac=1.0)  # through the task: the run stops on it at once,
    task.place("cpu", "32-true")                                     # even where the stop rule tolerates errors
    with pytest.raises(ConfigError, match=r"its weights have no trained score head: .*score\.weight"):
        task.score(["a", "b"], [None] * 2, [{"prompt": CHAT}] * 2)
    assert task.stats["error"] == 0, "a setting's error, never counted as failed responses"


def test_the_task_hands_the_trust_setting_to_the_reward_model(rm_path):
    from arlopti.config.compose import compose

    assert CustomTask(reward_model=str(rm_path)).functions[-1].model.trust_remote_code is False
    trusted = CustomTask(reward_model=str(rm_path), reward_model_trust_remote_code=True)
    assert trusted.functions[-1].model.trust_remote_code is True
    cfg = compose(["task=custom", "task.reward_fn=x.py:f"])
    assert cfg.task.reward_model_trust_remote_code is False


def test_nothing_loads_with_remote_code_unless_the_setting_says_so(rm_path, monkeypatch):
    from transformers import AutoConfig, AutoModelForSequenceClassification, AutoTokenizer

    from arlopti.tasks.reward_model import RewardModel

    seen = []
    for cls in (AutoConfig, AutoTokenizer, AutoModelForSequenceClassification):
        def spy(*args, _real=cls.from_pretrained, _name=cls.__name__, **kwargs):
            seen.append((_name, kwargs.get("trust_remote_code", "unset")))
            return _real(*args, **kwargs)
        monkeypatch.setattr(cls, "from_pretrained", spy)
    RewardModel(str(rm_path), device="cpu").score([CHAT], ["Zoey."])
    # explicit False everywhere: transformers' [y/N] prompt (15 s on a terminal) needs it unset
    assert {name for name, _ in seen} == {"AutoConfig", "AutoTokenizer", "AutoModelForSequenceClassification"}
    assert all(trust is False for _, trust in seen), seen
    with pytest.raises(ConfigError, match=r"task.reward_model_trust_remote_code=1: expected true or false"):
        RewardModel(str(rm_path), trust_remote_code=1)


def test_a_folder_that_needs_its_own_code_is_refused_naming_the_setting(rm_path, tmp_path):
    import shutil

    path = tmp_path / "remote"
    shutil.copytree(rm_path, path)
    ran = tmp_path / "the_code_ran"
    (path / "configuration_rm.py").write_text(f"open({str(ran)!r}, 'w').close()\n"
                                              "from transformers import Qwen2Config\n\n"
                                              "class RMConfig(Qwen2Config):\n    model_type = 'arlopti_remote_rm'\n")
    _edit_config(path, model_type="arlopti_remote_rm", auto_map={"AutoConfig": "configuration_rm.RMConfig"})
    with pytest.raises(ConfigError) as err:
        CustomTask(reward_model=str(path))
    text = str(err.value)
    assert text.startswith(f"task.reward_model={path}: it needs its own code") and "\n" not in text
    assert "task.reward_model_trust_remote_code=true" in text
    assert not ran.exists()


def save_gpt2_reward_model(folder: Path, positions: int = 32) -> Path:
    """A tiny random GPT-2 reward model: a learned table of ``positions`` positions (a longer input indexes
    past it)."""
    from transformers import GPT2Config, GPT2ForSequenceClassification

    from arlopti.models.loading import build_tiny_tokenizer

    tok = build_tiny_tokenizer(vocab_size=300)
    torch.manual_seed(5)
    config = GPT2Config(vocab_size=len(tok), n_positions=positions, n_embd=32, n_layer=1, n_head=2, num_labels=1,
                        pad_token_id=tok.pad_token_id, bos_token_id=tok.eos_token_id, eos_token_id=tok.eos_token_id)
    GPT2ForSequenceClassification(config).save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def test_a_response_longer_than_the_models_positions_is_cut_with_one_warning(tmp_path, caplog):
    from arlopti.tasks.reward_model import RewardModel

    path = save_gpt2_reward_model(tmp_path / "gpt2")
    long, short = "Zoey is a knight " * 20, "Zoey."
    with caplog.at_level(logging.WARNING, logger="arlopti.tasks.reward_model"):
        scores = RewardModel(str(path), device="cpu", dtype="float32").score(["Q: who? A:"] * 2, [long, short])
    warnings = [r.getMessage() for r in caplog.records if r.name == "arlopti.tasks.reward_model"]
    assert len(warnings) == 1 and "1 of 2 sequences are longer than its max_position_embeddings=32" in warnings[0]
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForSequenceClassification.from_pretrained(path, dtype=torch.float32).eval()
    ids = tok("Q: who? A:" + long, add_special_tokens=False)["input_ids"]
    assert len(ids) > 32
    with torch.no_grad():
        want = float(model(input_ids=torch.tensor([ids[:32]])).logits[0, 0])  # its first 32 tokens
    assert scores[0] == pytest.approx(want, abs=1e-5) and scores[1] == pytest.approx(
        direct_score(path, "Q: who? A:", short), abs=1e-5)


def negated_head(src: Path, dst: Path) -> Path:
    """A copy of the reward model at ``src`` whose score head is negated: every score flips its sign."""
    import shutil

    from safetensors.torch import load_file, save_file

    shutil.copytree(src, dst)
    weights = load_file(dst / "model.safetensors")
    weights["score.weight"] = -weights["score.weight"]
    save_file(weights, dst / "model.safetensors", metadata={"format": "pt"})
    return dst


def test_several_reward_models_are_weighted_like_functions_each_with_its_tag(rm_path, tmp_path):
    other = negated_head(rm_path, tmp_path / "negated")
    task = CustomTask(reward_model=[str(rm_path), str(other)], reward_weights=[0.5, 2.0])
    task.place("cpu", "32-true")
    out = task.score(RESPONSES[:3], [None] * 3, [{"prompt": CHAT}] * 3)
    first = [direct_score(rm_path, CHAT, r) for r in RESPONSES[:3]]
    second = [direct_score(other, CHAT, r) for r in RESPONSES[:3]]
    assert second == pytest.approx([-s for s in first], abs=1e-5)
    assert [r.components["reward_model"] for r in out] == pytest.approx(first, abs=1e-5)
    assert [r.components["reward_model_2"] for r in out] == pytest.approx(second, abs=1e-5)
    assert [r.reward for r in out] == pytest.approx([0.5 * a + 2.0 * b for a, b in zip(first, second)], abs=1e-5)
    assert len(loaded_models()) == 2
    with pytest.raises(ConfigError, match=r"expected 2 finite number\(s\).*one per task.reward_model entry"):
        CustomTask(reward_model=[str(rm_path), str(other)], reward_weights=[1.0])
    with pytest.raises(ConfigError, match=r"^task.reward_model=\[3\]: expected a reward model's folder"):
        CustomTask(reward_model=[3])
