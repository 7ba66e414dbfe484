"""Start-up checks of the sharding configuration (one process, no process group).

* the FSDP2 decoder-layer class is inferred for the tiny Qwen2 and Llama models, can be named
  explicitly, and a model with none gets an error that names ``model.decoder_layer_class``;
* ``trainer=fsdp`` / ``trainer=ddp`` compose and build; ``trainer.devices`` that does not divide
  ``sizes.prompts_per_step`` is refused when the Trainer is built (before any process starts);
* bad sharding options name their key.

The 2-process behaviour is in test_data_parallel.py and test_train_cli.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from torch import nn

from arlopti.learner.sharding import (FSDP2Strategy, FSDPOptions, ShardingError, decoder_layer_class, decoder_layers)

REPO = Path(__file__).resolve().parents[2]


def test_decoder_layers_are_inferred(tiny_model, tiny_llama):
    assert decoder_layer_class(tiny_model).__name__ == "Qwen2DecoderLayer"
    assert len(decoder_layers(tiny_model, decoder_layer_class(tiny_model))) == 2
    assert decoder_layer_class(tiny_llama).__name__ == "LlamaDecoderLayer"
    named = decoder_layer_class(tiny_model, "transformers.models.qwen2.modeling_qwen2.Qwen2DecoderLayer")
    assert named.__name__ == "Qwen2DecoderLayer"
    assert decoder_layer_class(tiny_model, "Qwen2MLP").__name__ == "Qwen2MLP"


def test_unknown_decoder_layer_says_how_to_name_it(tiny_model):
    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(2, 2)

    class Custom(nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = nn.ModuleList([Block(), Block()])

    with pytest.raises(ShardingError, match=r"model\.decoder_layer_class=<ClassName>.*'Block'"):
        decoder_layer_class(Custom())
    assert decoder_layer_class(Custom(), "Block").__name__ == "Block"
    with pytest.raises(ShardingError, match=r"model\.decoder_layer_class='Nope'.*Qwen2DecoderLayer"):
        decoder_layer_class(tiny_model, "Nope")


def test_bad_sharding_options_name_the_key():
    with pytest.raises(ShardingError, match="trainer.strategy.mixed_precision='int8'"):
        FSDPOptions(mixed_precision="int8")
    s = FSDP2Strategy(mixed_precision="bf16", activation_checkpointing=True)
    assert s.fsdp_options.mixed_precision == "bf16" and s._tensor_parallel_size == 1


def compose(tmp_path, *overrides: str):
    from arlopti.config.compose import compose

    return compose(["debug=smoke", "data=kk_generated", "data.train_count_per_n=4", "data.val_count_per_n=1",
                    "logger=none", f"paths.output_dir={tmp_path}", f"paths.log_dir={tmp_path}", *overrides],
                   config_dir=REPO / "configs")


@pytest.mark.parametrize("trainer", ["fsdp", "ddp"])
def test_devices_that_do_not_divide_prompts_are_refused_at_build(tmp_path, trainer, monkeypatch):
    import arlopti.entry.train as train_mod
    from arlopti.config import ConfigError

    cfg = compose(tmp_path, f"trainer={trainer}", "trainer.accelerator=cpu", "trainer.devices=3")
    msg = "prompts_per_step=2 is not divisible by the 3 data-parallel ranks"
    with pytest.raises(ConfigError, match=msg):
        train_mod.build(cfg)
    # devices the config alone cannot count (auto, -1 on GPUs): the built Trainer's number is checked
    monkeypatch.setattr(train_mod, "world_size", lambda cfg: 1)
    with pytest.raises(ConfigError, match=msg):
        train_mod.build(cfg)


def test_fsdp_build_checks_the_decoder_layer_class(tmp_path):
    from arlopti.entry.train import build

    cfg = compose(tmp_path, "trainer=fsdp", "trainer.accelerator=cpu", "trainer.devices=2")
    trainer, module, _ = build(cfg)
    assert isinstance(trainer.strategy, FSDP2Strategy) and trainer.num_devices == 2
    cfg = compose(tmp_path, "trainer=fsdp", "trainer.accelerator=cpu", "trainer.devices=2",
                  "model.decoder_layer_class=NoSuchLayer")
    with pytest.raises(ShardingError, match="model.decoder_layer_class='NoSuchLayer'"):
        build(cfg)
