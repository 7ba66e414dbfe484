"""Evaluation: running a policy on prompt sets through a rollout engine (validation and ``eval.py``), and
comparing two evaluations item by item.

Read first: :mod:`arlopti.eval.runner`.
"""
