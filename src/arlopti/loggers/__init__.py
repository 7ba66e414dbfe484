"""The Lightning loggers of the ``logger=`` group with this project's defaults (TensorBoard, CSV with one
row per rollout step, W&B, MLflow).

Read first: :mod:`arlopti.loggers.factories`.
"""
