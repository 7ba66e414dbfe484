"""Which LoRA settings a vLLM engine can serve as an adapter (``rollout.lora_sync=adapter``).

With ``lora_sync=adapter`` the adapter itself is handed to vLLM (a colocated ``rollout=vllm``
engine; ``rollout.placement=server`` refuses ``lora_sync=adapter`` itself, :mod:`arlopti.config.rules`,
and would meet the same limit), and vLLM refuses an adapter whose
``modules_to_save`` are anything but a classification model's heads, ``classifier`` and ``score``
(vllm/lora/peft_helper.py, ``PEFTHelper._validate_features``), when the first sync arrives: after the
models loaded and the engine started. :func:`check_adapter_servable` refuses it at start-up instead,
naming the key and the two ways out (``lora_sync=merged``, or no ``modules_to_save``).
"""

from __future__ import annotations

from arlopti.config import ConfigError, LoraConfig, RolloutConfig

#: The only ``modules_to_save`` vLLM loads with an adapter.
VLLM_MODULES_TO_SAVE = ("classifier", "score")


def check_adapter_servable(lora: LoraConfig, rollout: RolloutConfig) -> None:
    """Raise :class:`ConfigError` when ``rollout.lora_sync=adapter`` would hand vLLM an adapter it refuses."""
    if not lora.r or rollout.lora_sync != "adapter":
        return
    if rollout.backend != "vllm" and rollout.placement != "server":
        return  # the HF engine runs the live PeftModel: nothing is handed over
    unservable = [m for m in lora.modules_to_save if m not in VLLM_MODULES_TO_SAVE]
    if unservable:
        raise ConfigError(
            f"model.lora.modules_to_save={list(lora.modules_to_save)} with rollout.lora_sync=adapter: vLLM serves an "
            f"adapter's modules_to_save only as {list(VLLM_MODULES_TO_SAVE)} (a classifier's heads), not "
            f"{unservable}; use rollout.lora_sync=merged (the trained weights are merged and sent), or "
            "model.lora.modules_to_save=[]")


__all__ = ["VLLM_MODULES_TO_SAVE", "check_adapter_servable"]
