"""What TensorFlow's or JAX's default test run leaves of the library's lines
and branch arcs, against torch's, which runs every row (`covering_off_torch`
and `slow_off_torch` in tests/testing.py mark the rest `slow` off torch).

Measured with coverage.py on torch, one context per test (pytest-cov), and
the test ids each run collects on the other backend:

    KERAS_BACKEND=torch COVERAGE_FILE=/tmp/torch.cov pytest \
        --cov=keras_svr_attention --cov-branch --cov-context=test \
        --cov-report=
    KERAS_BACKEND=jax pytest --collect-only -q > /tmp/jax_default.txt
    KERAS_BACKEND=jax pytest --collect-only -q -m "" > /tmp/jax_every.txt
    python tests/scripts/covering.py /tmp/torch.cov /tmp/jax_default.txt \
        /tmp/jax_every.txt

"Reached" is what torch's tests that also exist on the backend reach;
"left" is what the backend's default tests reach (measured on torch: the
library's Python runs the same branches whichever backend computes the
ops). Each arc reached but not left is printed with the tests that reach
it: those run on the backend in `nox -s slow` only.
"""

import argparse
import collections
import re

import coverage


def ids(path):
    with open(path) as f:
        return {line.strip() for line in f if "::" in line}


def arcs_by_test(paths):
    """{test id: {(library file, from line, to line)}}, from coverage
    files with pytest-cov's test contexts (`id|run`, `id|setup`)."""
    found = collections.defaultdict(set)
    for path in paths:
        data = coverage.CoverageData(basename=path)
        data.read()
        files = data.measured_files()
        for context in data.measured_contexts():
            data.set_query_contexts(["^" + re.escape(context) + "$"])
            test = context.split("|")[0]
            for file in files:
                name = file.split("keras_svr_attention/")[-1]
                for start, end in data.arcs(file) or ():
                    found[test].add((name, start, end))
    return found


def lines(arcs):
    return {(name, n) for name, a, b in arcs for n in (a, b) if n > 0}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("coverage", help="torch's coverage file(s), comma-split")
    p.add_argument("default", help="the backend's default test ids")
    p.add_argument("every", help="the backend's test ids under -m ''")
    args = p.parse_args()
    found = arcs_by_test(args.coverage.split(","))
    # "": what runs while pytest imports the library, before any test.
    default, every = ids(args.default) | {""}, ids(args.every) | {""}
    reached = set().union(*(v for t, v in found.items() if t in every))
    left = set().union(*(v for t, v in found.items() if t in default))
    print(
        f"reached: {len(lines(reached))} lines, {len(reached)} arcs; "
        f"left: {len(lines(left))} lines, {len(left)} arcs"
    )
    for arc in sorted(reached - left):
        tests = sorted(t for t, v in found.items() if arc in v and t in every)
        print("  not left:", *arc, "reached by", ", ".join(tests[:3]))


if __name__ == "__main__":
    main()
