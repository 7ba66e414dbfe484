"""Prompts before a model sees them: the record of one prompt, how it is rendered with a tokenizer, the
file readers, and the batch a DataModule hands to the rollout callback. No Lightning here.

Read first: :mod:`arlopti.prompts.records`.
"""
