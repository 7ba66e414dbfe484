"""Before two runs are compared, show that there was something to compare: :func:`assert_moved`.

A resume, sync, rank or export test that compares weights which never moved cannot fail: with a
reward that is constant inside every group, every advantage is 0, the policy gradient is 0, AdamW
moves the weights by weight decay alone and a LoRA adapter's ``B`` stays exactly 0 (issue 38).
So each such test first calls :func:`assert_moved` on the run it compares:

* the weights moved: some tensor of ``after`` differs from ``before``, and for LoRA some ``lora_B``
  is no longer 0;
* the optimizer state moved (which rules out weight decay alone): AdamW's first moments (``exp_avg``) hold a non-zero value, which only
  a non-zero gradient can put there; a stateless optimizer (SGD without momentum) has nothing to
  show, and then its weight decay must be 0, so that a moved weight means a gradient.

``optimizer`` is a ``torch.optim.Optimizer``, its ``state_dict()``, a Lightning checkpoint (its
``optimizer_states[0]``), or the summary :func:`optimizer_summary` made where the optimizer lived
(a torchrun worker). :func:`snapshot` copies a module's parameters (or a state dict) for ``before``.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

#: State entries that only a non-zero gradient makes non-zero (AdamW's first moment, SGD's momentum).
GRADIENT_STATES = ("exp_avg", "momentum_buffer")


def snapshot(source) -> dict[str, torch.Tensor]:
    """A detached copy of ``source``'s tensors: a module's parameters, or a ``{name: tensor}`` mapping."""
    items = source.named_parameters() if isinstance(source, torch.nn.Module) else source.items()
    return {k: _full(v).detach().clone() for k, v in items if isinstance(v, torch.Tensor)}


def _full(t: torch.Tensor) -> torch.Tensor:
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def optimizer_summary(optimizer) -> dict:
    """What :func:`assert_moved` needs of an optimizer, as plain numbers (picklable, for a worker to save):
    how many state tensors it keeps, how many of :data:`GRADIENT_STATES` are non-zero (this rank's shard
    of a DTensor), the steps it took and the largest weight decay of its groups."""
    if isinstance(optimizer, Mapping) and "state_tensors" in optimizer:
        return dict(optimizer)
    if isinstance(optimizer, Mapping) and "optimizer_states" in optimizer:  # a Lightning checkpoint
        optimizer = optimizer["optimizer_states"][0]
    state = optimizer.state_dict() if hasattr(optimizer, "state_dict") else optimizer
    tensors = nonzero = 0
    steps = 0.0
    for entry in state["state"].values():
        for key, value in entry.items():
            if key == "step":
                steps = max(steps, float(value))
            elif isinstance(value, torch.Tensor) and value.is_floating_point():
                tensors += 1
                local = value.to_local() if hasattr(value, "to_local") else value
                nonzero += int(key in GRADIENT_STATES and bool(local.abs().sum() > 0))
    decay = max((float(g.get("weight_decay", 0.0)) for g in state["param_groups"]), default=0.0)
    return {"state_tensors": tensors, "gradient_states_nonzero": nonzero, "steps": steps, "weight_decay": decay}


def assert_moved(before: Mapping[str, torch.Tensor], after, optimizer, what: str = "the run") -> str:
    """Fail unless ``after`` (a module or a ``{name: tensor}`` mapping) moved away from ``before`` and
    ``optimizer``'s state shows a non-zero gradient (module docstring); returns a one-line account."""
    now, before = snapshot(after), snapshot(before)
    common = sorted(set(before) & set(now))
    assert common, f"{what}: no tensor names in common between before and after ({sorted(now)[:3]})"
    deltas = {k: float((now[k].double() - before[k].double()).abs().max()) for k in common}
    moved = [k for k in common if deltas[k] > 0]
    assert moved, f"{what}: no weight moved ({len(common)} tensors compared): the comparison could not fail"
    lora_b = [k for k in common if "lora_B" in k]
    if lora_b:
        assert any(float(now[k].abs().max()) > 0 for k in lora_b), \
            f"{what}: every LoRA B is still 0 ({len(lora_b)} tensors): the adapter never received a gradient"
    account = f"{what}: {len(moved)}/{len(common)} tensors moved, largest change {max(deltas.values()):.3g}"
    s = optimizer_summary(optimizer)
    if s["state_tensors"]:
        assert s["gradient_states_nonzero"] > 0, (
            f"{what}: the optimizer's {', '.join(GRADIENT_STATES)} are all 0 after {s['steps']:g} steps: "
            "every gradient was 0 (weight decay alone moved the weights)")
        account += f"; optimizer: {s['gradient_states_nonzero']} non-zero first moments, {s['steps']:g} steps"
    else:
        assert s["weight_decay"] == 0, (
            f"{what}: a stateless optimizer with weight_decay={s['weight_decay']}: a moved weight does not "
            "show a gradient; use weight_decay=0 (or an optimizer with state)")
        account += "; optimizer stateless, no weight decay: the moves are the gradient's"
    return account


def assert_learning_signal(metrics: Mapping[str, float], what: str = "the step") -> None:
    """The step's own metrics say its groups carried a signal and the gradient was not zero."""
    frac = metrics.get("reward/zero_std_group_frac")
    assert frac is not None and frac < 1.0, f"{what}: every group's rewards were equal (zero_std_group_frac={frac})"
    norm = metrics.get("update/grad_norm")
    assert norm is None or norm > 0, f"{what}: update/grad_norm={norm}"
