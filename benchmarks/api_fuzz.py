"""The API fuzz of ``tests/test_api_fuzz.py``, randomised and longer (issue 28).

Starts the same in-process service (no workers; tokens of every role; two queued runs to find)
and sends at least ``--requests`` generated requests (default 20,000), spread evenly over every
operation of ``/openapi.json``, each checked for the property: no 5xx, every status documented,
every refusal ``{"detail": "..."}``. The peer is the derandomised CI run (2,000 requests): this
run's count of distinct statuses per operation shows what the longer run reached beyond it.
Prints a Markdown table; a failure prints the request hypothesis shrank it to.

Run: ``.venv/bin/python benchmarks/api_fuzz.py [--requests 20000] [--seed N]``
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import requests
from hypothesis import HealthCheck, given, seed, settings

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from api_fuzz import Operation, check, operations, requests_for  # noqa: E402
from test_api_fuzz import fuzz_service  # noqa: E402


def main() -> None:
    """Run the fuzz and print a Markdown table."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=20_000)
    ap.add_argument("--seed", type=int, default=int(time.time()))
    args = ap.parse_args()
    svc, tokens, ids = fuzz_service(Path(tempfile.mkdtemp(prefix="certify-fuzz-")) / "home")
    seen: Counter[tuple[str, int]] = Counter()
    failures: list[str] = []
    t0 = time.perf_counter()
    try:
        ops = operations(requests.get(f"{svc.url}/openapi.json", timeout=30).json())
        per = math.ceil(args.requests / len(ops))
        def fuzz(op: Operation) -> None:
            name = f"{op.method} {op.path}"

            @seed(args.seed)
            @settings(max_examples=per, deadline=None, database=None,
                      suppress_health_check=list(HealthCheck))
            @given(req=requests_for(op, tokens, ids))
            def run(req: dict[str, Any]) -> None:
                seen[(name, check(op, svc.url, req))] += 1

            try:
                run()
            except AssertionError as exc:
                failures.append(f"{name}: {str(exc).splitlines()[0][:300]}")

        for op in ops:
            fuzz(op)
    finally:
        svc.stop()
    took = time.perf_counter() - t0
    total = sum(seen.values())
    print(f"seed {args.seed}: {total:,} requests over {len(ops)} operations in {took:.0f} s "
          f"({total / took:.0f} requests/s); failures: {len(failures)}")
    print()
    print("| operation | requests | statuses seen |")
    print("|---|---|---|")
    for op in ops:
        name = f"{op.method} {op.path}"
        mine = {s: n for (o, s), n in seen.items() if o == name}
        print(f"| `{name}` | {sum(mine.values()):,} | "
              f"{', '.join(f'{s}×{n}' for s, n in sorted(mine.items()))} |")
    for f in failures:
        print(f"FAILED {f}")


if __name__ == "__main__":
    main()
