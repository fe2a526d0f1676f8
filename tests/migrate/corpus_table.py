"""Print the corpus results table: ``python -m tests.migrate.corpus_table`` (from the repository root).

One row per fixture: status, how many config keys came from the script, how many from a framework's
default, how many canonical keys stay at verl-bridge's defaults, unmapped hyperparameters, time.
"""

from __future__ import annotations

import time

from tests.migrate.test_fixtures import EXPECT, _migrate


def main() -> None:
    print(f"{'fixture':34} {'status':9} {'src':>4} {'fw':>3} {'dflt':>4} {'unmap':>5} {'ms':>6}")
    total = 0.0
    for name in sorted(EXPECT):
        t = time.perf_counter()
        res = _migrate(name)
        ms = (time.perf_counter() - t) * 1000
        total += ms
        fw = sum(1 for k in res.config if not res.provenance[k].split(":")[0].endswith(".py"))
        src = len(res.config) - fw
        dflt = sum(1 for v in res.defaults_used.values() if v["from"] == "verl-bridge default")
        print(f"{name:34} {res.status:9} {src:4} {fw:3} {dflt:4} {len(res.unmapped):5} {ms:6.0f}")
    print(f"{len(EXPECT)} fixtures in {total / 1000:.2f} s")


if __name__ == "__main__":
    main()
