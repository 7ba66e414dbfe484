"""arlopti: GRPO + Advantage Reweighting + Low-Probability Token Isolation (arXiv 2505.12929)."""

__version__ = "0.1.0"
