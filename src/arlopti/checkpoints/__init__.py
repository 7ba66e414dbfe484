"""Checkpoints after a run: where a run resumes from, and exporting one as a Hugging Face model.

Read first: :mod:`arlopti.checkpoints.resume` (``ckpt_path`` resolved and verified before any model
loads); :mod:`arlopti.checkpoints.export` is ``arlopti export``.
"""
