#!/usr/bin/env python3
"""Every hand-written CUDA kernel ran on the emulated device in the kernel tests.

Reads the __global__ functions of kernels/cuda/*.cu and the launch logs the emulated kernel
tests wrote (TUTTI_EMU_LAUNCH_LOG: one kernel name per line, template arguments included),
and fails naming every kernel no test launched.
"""
import argparse
import glob
import os
import re
import sys


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--sources", required=True, help="kernels/cuda")
    parser.add_argument("--logs", required=True, help="the directory of the launch logs")
    args = parser.parse_args()
    kernels = set()
    for path in glob.glob(os.path.join(args.sources, "*.cu")):
        with open(path) as f:
            kernels.update(re.findall(r"__global__\s+void\s+(\w+)", f.read()))
    launched = set()
    logs = glob.glob(os.path.join(args.logs, "*.log"))
    for path in logs:
        with open(path) as f:
            launched.update(line.strip().split("<")[0] for line in f if line.strip())
    if not kernels:
        sys.exit("no __global__ functions found under " + args.sources)
    if not logs:
        sys.exit("no launch logs under %s: run the kernels_*_test_emu tests first" % args.logs)
    missing = sorted(kernels - launched)
    print("%d kernels in %s, %d launched by the emulated kernel tests (%d logs)" %
          (len(kernels), args.sources, len(kernels & launched), len(logs)))
    if missing:
        sys.exit("never launched on the emulated device: " + ", ".join(missing))


if __name__ == "__main__":
    main()
