"""A reward that varies inside each group on the tiny random model, for ``train.py``-level runs.

The tiny random model scores -3 on every K&K response (and 0 on math), so a ``debug=smoke`` run of
those tasks has every advantage 0 and trains nothing (issue 38): a resume, sync or export check on
it compares weights that never moved. :func:`score` (the rule of :class:`helpers.toy.ToyTask`:
distinct characters of the response, mod 4) gives a random model's responses different rewards
within a group; :func:`varied_task` turns it into the overrides of a ``task=custom`` run on a few
prompts (``data=prompts``), for ``compose_train`` or a ``python train.py`` command line.
"""

from __future__ import annotations

import json
from pathlib import Path


def score(response: str, ground_truth, meta: dict) -> float:
    """Distinct characters of ``response``, mod 4 (0..3)."""
    return float(len(set(response)) % 4)


PROMPTS = ("Zoey said that Oliver is a knight.", "Emma says: Liam is a knave.", "Who is a knight here?",
           "Noah said that Ava is a knave.", "Mia: I am a knight.", "Lucas says Mia lies.",
           "Sofia tells the truth.", "Ethan said Sofia is a knave.")


def varied_task(folder: Path, n: int = 8) -> list[str]:
    """Overrides for a ``task=custom`` run scored by :func:`score` on ``n`` prompts (written to
    ``folder/prompts.jsonl``, also the validation set), with one reward worker."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "prompts.jsonl"
    path.write_text("".join(json.dumps({"prompt": PROMPTS[i % len(PROMPTS)] + f" ({i})", "answer": None}) + "\n"
                            for i in range(n)))
    return ["task=custom", f"task.reward_fn={Path(__file__).resolve()}:score", "task.num_workers=1",
            "data=prompts", f"data.train_file={path}", f"data.val_file={path}", "data.answer_key=null"]


def varied_kk_score(self, responses, ground_truths, metas):
    """A stand-in for ``KKTask.score`` (monkeypatched on the class) whose rewards differ inside a group on the
    tiny model, with the K&K components the loggers and cards read (``format_ok``, ``parsed``, ``answer_score``)."""
    from arlopti.tasks.base import RewardResult

    return [RewardResult(float(len(set(r)) % 3), len(r) % 2 == 0,
                         {"format_ok": float(len(r) % 2), "parsed": 0.0, "answer_score": -2.0})
            for r in responses]
