"""`python -m shardfit ARGS` and the `shardfit` command the package installs:
the CLI built with it, run with ARGS (`shardfit plan --help`, ...)."""
import os
import sys


def main():
    from . import ShardfitError, binary
    try:
        exe = binary()
    except ShardfitError as e:
        sys.stderr.write("shardfit: %s\n" % e)
        sys.exit(2)
    # The scripts the CLI runs in Python (`plan --model` through
    # transformers' own class, `calibrate --stack pytorch`) run in this
    # Python, whose torch the package was built against.
    os.environ.setdefault("SHARDFIT_PYTHON", sys.executable)
    os.execv(exe, [exe] + sys.argv[1:])


if __name__ == "__main__":
    main()
