#!/usr/bin/env python3
"""Runs a test script with the Python reference environment's interpreter (tutti_add_ref_test in
cmake/TuttiTesting.cmake):  ref_python.py PYTHON SCRIPT [ARGS...]

Offline: HF_HUB_OFFLINE=1 and TRANSFORMERS_OFFLINE=1, so that nothing is downloaded. Where PYTHON
is missing, exits 77 (ctest: skipped) saying how to make it, or 1 where TUTTI_REQUIRE_REF_PYTHON=1
(scripts/test.sh, CI: the environment was to be made, so a missing one is an error).
"""
import os
import sys


def main():
    if len(sys.argv) < 3:
        sys.exit("usage: ref_python.py PYTHON SCRIPT [ARGS...]")
    python, script, args = sys.argv[1], sys.argv[2], sys.argv[3:]
    if not os.access(python, os.X_OK):
        what = ("the Python reference environment's interpreter %s is missing: `bash scripts/setup.sh` makes it "
                "(Hugging Face transformers on Debian's torch, docs/development.md)" % python)
        if os.environ.get("TUTTI_REQUIRE_REF_PYTHON") == "1":
            print("error: %s (TUTTI_REQUIRE_REF_PYTHON=1)" % what, file=sys.stderr)
            return 1
        print("skipped: " + what)
        return 77
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    sys.stdout.flush()
    os.execve(python, [python, script, *args], env)


if __name__ == "__main__":
    sys.exit(main())
