"""The LightningDataModules that feed prompts to a run (K&K, math, any table) and the commands that
write and preview the prompt sets (``arlopti prepare``, ``arlopti preview``).

Read first: :mod:`arlopti.data.prompt_datamodule` (tokenise, filter, shard, resume: what every DataModule
shares), then the one your ``data=`` group names.
"""
