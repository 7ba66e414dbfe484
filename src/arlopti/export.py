"""``python -m arlopti.export``, round 4's command, kept working: the export is now ``arlopti export``
(:mod:`arlopti.checkpoints.export`). It says so in one line and runs that command with the same arguments."""

import sys

if __name__ == "__main__":
    from arlopti.entry.command import main

    print("note: `python -m arlopti.export` is now `arlopti export` (the same arguments)", file=sys.stderr)
    sys.exit(main(["export", *sys.argv[1:]]))
