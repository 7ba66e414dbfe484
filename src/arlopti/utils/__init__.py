"""Small helpers below everything else: the console set-up, dtype names, FSDP2 unsharding for generation,
``trainer.precision=auto`` and the RNG state for exact resume.

Read first: whichever the importing module names; none of them depends on another.
"""
