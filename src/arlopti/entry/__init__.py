"""What a user runs: ``train.py`` / ``eval.py``'s logic, ``arlopti.run`` from Python, the ``arlopti``
command, the one-line failure report, sweeps and cluster jobs.

Read first: :mod:`arlopti.entry.train` (everything a run builds, in order, then ``fit``);
:mod:`arlopti.entry.command` lists the subcommands.
"""
