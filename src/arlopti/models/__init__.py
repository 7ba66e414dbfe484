"""Loading every policy the project trains or evaluates (a hub name, a local folder, the SmolLM2 GGUF,
tiny random test models) and the LoRA adapters on it.

Read first: :mod:`arlopti.models.loading`.
"""
