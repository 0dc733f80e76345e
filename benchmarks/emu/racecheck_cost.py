#!/usr/bin/env python3
"""What the emulated device's hazard detector (emu/src/racecheck.cc) costs the kernels' tests.

Runs each kernels_*_test_emu binary of a build with the detector off (TUTTI_EMU_RACECHECK=0:
the instrumented kernels' hooks return at once) and on, alternating, and prints the median time
of each and their ratio. With --plain BUILD (a build configured with -DTUTTI_EMU_RACECHECK=OFF,
whose emu libraries need not hold the tests: only tutti_emu and tutti_cuda_emu are used), the
same binaries also run on that build's uninstrumented libraries, so the ratio covers the
instrumentation too. Each run holds /tmp/tutti-cpu.lock, as every benchmark on the shared
machine does.

  python3 benchmarks/emu/racecheck_cost.py --rounds 5 --plain build-norc
"""
import argparse
import fcntl
import os
import pathlib
import statistics
import subprocess
import sys
import time


def run_once(binary, env):
    """Seconds of one run of `binary`, holding the CPU lock."""
    with open("/tmp/tutti-cpu.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        start = time.monotonic()
        result = subprocess.run([str(binary)], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        elapsed = time.monotonic() - start
    if result.returncode != 0:
        sys.exit(f"racecheck_cost: {binary.name} failed (exit {result.returncode}), "
                 f"TUTTI_EMU_RACECHECK={env.get('TUTTI_EMU_RACECHECK')}")
    return elapsed


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--build", default="build", help="the build whose tests run (default: build)")
    parser.add_argument("--plain", help="a build with -DTUTTI_EMU_RACECHECK=OFF: also run uninstrumented")
    parser.add_argument("--rounds", type=int, default=5, help="alternating runs of each variant (default: 5)")
    parser.add_argument("tests", nargs="*", help="families (e.g. reduce optimizer); default: every kernels_*_test_emu")
    args = parser.parse_args()

    folder = pathlib.Path(args.build) / "tests" / "kernels"
    binaries = sorted(folder.glob("kernels_*_test_emu"))
    if args.tests:
        binaries = [folder / f"kernels_{t}_test_emu" for t in args.tests]
    missing = [b for b in binaries if not b.exists()]
    if not binaries or missing:
        sys.exit(f"racecheck_cost: no test binaries {[str(b) for b in missing] or str(folder)}: build first")

    variants = {"off": {"TUTTI_EMU_RACECHECK": "0"}, "on": {"TUTTI_EMU_RACECHECK": "1"}}
    if args.plain:
        libs = pathlib.Path(args.plain).resolve() / "emu"
        if not (libs / "libtutti_cuda_emu.so.0").exists():
            sys.exit(f"racecheck_cost: {libs} holds no libtutti_cuda_emu.so.0 (build tutti_emu tutti_cuda_emu there)")
        variants = {"plain": {"TUTTI_EMU_RACECHECK": "0", "LD_LIBRARY_PATH": str(libs)}, **variants}

    header = f"{'test':16}" + "".join(f"{k:>8}" for k in variants) + f"{'on/off':>8}"
    if args.plain:
        header += f"{'on/plain':>10}"
    print(header, flush=True)
    totals = {k: 0.0 for k in variants}
    for binary in binaries:
        times = {k: [] for k in variants}
        for _ in range(args.rounds):
            for name, extra in variants.items():
                times[name].append(run_once(binary, {**os.environ, **extra}))
        med = {k: statistics.median(v) for k, v in times.items()}
        for k in totals:
            totals[k] += med[k]
        family = binary.name.removeprefix("kernels_").removesuffix("_test_emu")
        line = f"{family:16}" + "".join(f"{med[k]:8.2f}" for k in variants) + f"{med['on'] / med['off']:8.2f}"
        if args.plain:
            line += f"{med['on'] / med['plain']:10.2f}"
        print(line, flush=True)
    line = f"{'sum of medians':16}" + "".join(f"{totals[k]:8.2f}" for k in variants)
    line += f"{totals['on'] / totals['off']:8.2f}"
    if args.plain:
        line += f"{totals['on'] / totals['plain']:10.2f}"
    print(line)


if __name__ == "__main__":
    main()
