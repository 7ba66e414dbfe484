"""Rollouts: how a step's prompts become sampled episodes, through one seam for every placement (the HF
engine on the live policy, a colocated vLLM engine, rollout server workers), multi-turn episodes with an
environment, the weight syncs and every sampling seed.

Read first: :mod:`arlopti.rollout.source` (the seam and its three implementations), then
:mod:`arlopti.rollout.episode` (what the learner receives) and :mod:`arlopti.rollout.turns` (the turn loop).
"""
