"""Splits a unittest suite into shards that ctest runs side by side, of about equal length.

Each test has a weight (its seconds on 2 shared cores, measured; 1 when unknown): the heaviest
goes first, each to the shard with the least so far (longest processing time first), so that no
shard is left running alone at the end of the suite. The split depends only on the names and
the weights: every shard process computes the same one.
"""
import unittest


def shard(tests, spec, weights):
    """The tests of shard `spec` ("I/N": the I-th of N) of `tests` (a list of TestCases)."""
    index, count = (int(v) for v in spec.split("/"))
    load = [0.0] * count
    mine = []
    for t in sorted(tests, key=lambda t: (-weights.get(t.id().split(".")[-1], 1.0), t.id())):
        s = min(range(count), key=lambda i: (load[i], i))
        load[s] += weights.get(t.id().split(".")[-1], 1.0)
        if s == index:
            mine.append(t)
    return unittest.TestSuite(mine)
