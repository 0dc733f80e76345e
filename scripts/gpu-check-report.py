#!/usr/bin/env python3
"""One-line (or short-table) readings of scripts/gpu-check.sh's logs, for its summary.txt.

    gpu-check-report.py gtest XML_OR_DIR...       passed / failed / skipped, failures named
    gpu-check-report.py sanitizer LOG             errors a compute-sanitizer run reported
    gpu-check-report.py ncu RAW_CSV [TOP]         the TOP (3) kernels by GPU time, key counters
    gpu-check-report.py peer SUMMARY_JSON         tutti vs PyTorch: samples/s, ratio, accuracy

Each prints to stdout and exits 0 when it could read its input, 1 when it could not (with one
line saying why): the summary then says so instead of inventing a result. Standard library only
(it runs under whichever python3 the GPU machine has).
"""
import csv
import glob
import json
import os
import re
import statistics
import sys
import xml.etree.ElementTree as ET


def gtest(paths):
    """Counts over GoogleTest XML reports (the *.xml files under each directory given, or the
    files given): a case counts as failed if it failed in any report, as skipped if it skipped
    in every report that ran it. Ranks of an MPI test that ctest runs all write into one
    directory, and two of them can write one file at once: such a file is left out, and said."""
    files = []
    for p in paths:
        files += sorted(glob.glob(os.path.join(p, "**", "*.xml"), recursive=True)) if os.path.isdir(p) \
            else [p] if os.path.exists(p) else []
    cases = {}  # name -> set of per-report results
    messages = {}
    unreadable = 0
    for f in files:
        try:
            root = ET.parse(f).getroot()
        except ET.ParseError:
            unreadable += 1
            continue
        for tc in root.iter("testcase"):
            name = f"{tc.get('classname')}.{tc.get('name')}"
            failure = tc.find("failure")
            if failure is not None:
                result = "failed"
                text = (failure.get("message") or failure.text or "").strip().replace("\n", " ")
                messages.setdefault(name, text[:240])
            elif tc.get("result") == "skipped" or tc.find("skipped") is not None:
                result = "skipped"
                skip = tc.find("skipped")
                text = (skip.get("message") or skip.text or "") if skip is not None else ""
                text = re.sub(r"^\S+:\d+\s+", "", text.strip())  # GoogleTest puts file:line first
                messages.setdefault(name, text.replace("\n", " ")[:160])
            elif tc.get("status") == "notrun":
                continue  # filtered out or disabled
            else:
                result = "passed"
            cases.setdefault(name, set()).add(result)
    if not cases:
        print("no GoogleTest XML report (the program did not start, or crashed before writing one)"
              + (f"; {unreadable} unreadable" if unreadable else ""))
        return 1
    failed = sorted(n for n, r in cases.items() if "failed" in r)
    skipped = sorted(n for n, r in cases.items() if r == {"skipped"})
    passed = len(cases) - len(failed) - len(skipped)
    line = f"{passed}/{len(cases)} passed, {len(failed)} failed, {len(skipped)} skipped"
    if len(files) > 1:
        line += f" (over {len(files) - unreadable} reports"
        line += f"; {unreadable} unreadable, left out: ranks wrote one file at once)" if unreadable else ")"
    print(line)
    for n in failed:
        print(f"  FAILED {n}: {messages.get(n, '')}")
    for n in skipped:
        print(f"  skipped {n}: {messages.get(n, '')}")
    return 0


def sanitizer(log):
    """'N errors' from a compute-sanitizer log, or why there is no count."""
    try:
        text = open(log, errors="replace").read()
    except OSError as e:
        print(f"no log ({e})")
        return 1
    race = re.search(r"RACECHECK SUMMARY: (\d+) hazards? displayed \((\d+) errors?, (\d+) warnings?\)", text)
    summary = re.search(r"ERROR SUMMARY: (\d+) errors?", text)
    gtest_line = re.findall(r"\[ +(PASSED|FAILED|SKIPPED) +\] (\d+) tests?", text)
    tests = ", ".join(f"{n} {w.lower()}" for w, n in gtest_line) or "no test result"
    if race:
        print(f"{race.group(2)} errors, {race.group(3)} warnings (racecheck hazards) | tests: {tests}")
    elif summary:
        print(f"{summary.group(1)} errors | tests: {tests}")
    else:
        first = next((l for l in text.splitlines() if "ERROR" in l or "rror" in l), "no ERROR SUMMARY line")
        print(f"no verdict: {first.strip()[:200]} | tests: {tests}")
        return 1
    return 0


def short_name(name):
    """A demangled kernel name without return type, parameters or namespaces, <= 70 chars."""
    n = re.sub(r"^void ", "", name.strip())
    depth = 0  # cut the parameter list: the last top-level '(...)'
    for i in range(len(n) - 1, -1, -1):
        depth += {")": 1, "(": -1}.get(n[i], 0)
        if depth == 0 and n[i] == "(":
            n = n[:i]
            break
    n = n.replace("(anonymous namespace)::", "").replace("tutti::kernels::cuda::", "")
    head, sep, tail = n.partition("<")
    n = head.split("::")[-1] + sep + tail
    return n if len(n) <= 70 else n[:67] + "..."


UNITS = {"nsecond": 1e-3, "ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3, "ms": 1e3, "second": 1e6, "s": 1e6}


def number(v):
    try:
        return float(str(v).replace(",", ""))
    except ValueError:
        return None


def ncu(raw_csv, top=3):
    """Table of the kernels with the most GPU time in an ncu report's raw page (CSV, with the
    SpeedOfLight, Occupancy and LaunchStats sections): per kernel, launches, total and longest
    duration, and the longest launch's DRAM and SM throughput (% of peak) and occupancy."""
    try:
        rows = list(csv.reader(open(raw_csv, errors="replace")))
    except OSError as e:
        print(f"no ncu CSV ({e})")
        return 1
    start = next((i for i, r in enumerate(rows) if r[:1] == ["ID"]), None)
    if start is None:
        print("ncu profiled no kernel (no table in its CSV)")
        return 1
    header, units = rows[start], rows[start + 1]
    col = {h: i for i, h in enumerate(header)}
    want = {"dur": "gpu__time_duration.sum",
            "dram": "dram__throughput.avg.pct_of_peak_sustained_elapsed",
            "sm": "sm__throughput.avg.pct_of_peak_sustained_elapsed",
            "occ": "sm__warps_active.avg.pct_of_peak_sustained_active",
            "theo": "sm__maximum_warps_per_active_cycle_pct",
            "regs": "launch__registers_per_thread"}
    if want["dur"] not in col:
        print("ncu CSV has no gpu__time_duration.sum column: the sections did not run")
        return 1
    scale = UNITS.get(units[col[want["dur"]]], None)
    if scale is None:
        print(f"unknown duration unit '{units[col[want['dur']]]}' in the ncu CSV")
        return 1
    kernels = {}
    for r in rows[start + 2:]:
        if len(r) != len(header) or number(r[col["ID"]]) is None:
            continue
        vals = {k: number(r[col[m]]) if m in col else None for k, m in want.items()}
        if vals["dur"] is None:
            continue
        vals["dur"] *= scale
        vals["block"], vals["grid"] = r[col.get("Block Size", 0)], r[col.get("Grid Size", 0)]
        name = r[col["Kernel Name"]]
        k = kernels.setdefault(name, {"n": 0, "total": 0.0, "longest": None})
        k["n"] += 1
        k["total"] += vals["dur"]
        if k["longest"] is None or vals["dur"] > k["longest"]["dur"]:
            k["longest"] = vals
    if not kernels:
        print("ncu CSV has no kernel rows")
        return 1
    total = sum(k["total"] for k in kernels.values())
    launches = sum(k["n"] for k in kernels.values())
    own = sum(k["total"] for n, k in kernels.items() if "tutti::" in n)
    print(f"{launches} launches of {len(kernels)} kernels profiled, {total:.0f} us of GPU time; tutti's hand-written "
          f"kernels (*) {100 * own / total:.0f}% of it, the rest cuBLAS/cuDNN/NCCL")

    def fmt(v, spec="{:.0f}"):
        return "-" if v is None else spec.format(v)

    print(f"  {'kernel':<60} {'calls':>5} {'total us':>9} {'share':>6} {'max us':>8} {'DRAM%':>6} {'SM%':>5} "
          f"{'occ% ach/theo':>13} {'regs':>4}  block x grid")
    ranked = sorted(kernels.items(), key=lambda kv: -kv[1]["total"])
    shown = ranked[:top]
    shown += [kv for kv in ranked[top:] if "tutti::" in kv[0]][:max(0, top - sum("tutti::" in n for n, _ in shown))]
    for i, (name, k) in enumerate(shown):
        if i == top:
            print("  ... and tutti's own slowest below them:")
        l = k["longest"]
        label = ("* " if "tutti::" in name else "  ") + short_name(name)
        print(f"  {label[:60]:<60} {k['n']:>5} {k['total']:>9.1f} {100 * k['total'] / total:>5.1f}% {l['dur']:>8.1f} "
              f"{fmt(l['dram']):>6} {fmt(l['sm']):>5} {fmt(l['occ']) + '/' + fmt(l['theo']):>13} {fmt(l['regs']):>4}"
              f"  {l['block']} x {l['grid']}")
    return 0


def peer(path):
    """'tutti X samples/s, pytorch Y: ratio R' from benchmarks/peers/compare.sh's summary.json."""
    try:
        s = json.load(open(path))
    except (OSError, ValueError) as e:
        print(f"no peer summary ({e})")
        return 1
    t, p = s.get("tutti", []), s.get("pytorch", [])

    def med(rows, key):
        vals = [r[key] for r in rows if r.get(key) is not None]
        return statistics.median(vals) if vals else None

    ts, ps = med(t, "samples_per_s"), med(p, "samples_per_s")
    ta, pa = med(t, "test_accuracy"), med(p, "test_accuracy")
    if not ts or not ps:
        print(f"incomplete: {len(t)} tutti run(s), {len(p)} pytorch run(s) finished")
        return 1
    pairs = ", ".join(f"{x:.2f}" for x in s.get("pair_ratios", []))
    print(f"tutti {ts:,.0f} samples/s, pytorch {ps:,.0f}: ratio tutti/pytorch {ts / ps:.2f}x "
          f"(medians of {len(t)}/{len(p)} runs; per pair {pairs}); test accuracy {ta:.4f} vs {pa:.4f}")
    return 0


def main(argv):
    if len(argv) < 3:
        print(__doc__)
        return 2
    cmd, args = argv[1], argv[2:]
    if cmd == "gtest":
        return gtest(args)
    if cmd == "sanitizer":
        return sanitizer(args[0])
    if cmd == "ncu":
        return ncu(args[0], int(args[1]) if len(args) > 1 else 3)
    if cmd == "peer":
        return peer(args[0])
    print(f"unknown command {cmd}\n{__doc__}")
    return 2


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv))
    except BrokenPipeError:  # a reader (head) that wanted only the first lines
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(0)
