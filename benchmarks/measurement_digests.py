"""The measurement of the packaged suites on the demo models, one digest per check.

Runs each packaged suite on each bundled demo model (the demo's seeded synthetic signs, the
robust model as the standard one's reference) and writes, per run, the sha256 of every
check's canonical measurement JSON and of the measurement without its checks. A refactoring
that must not change a card figure compares these digests before and after::

    python benchmarks/measurement_digests.py --out digests.json      # before
    python benchmarks/measurement_digests.py --check tests/data/measurement_digests.json

``--check`` exits 1 listing every check whose digest changed. Checks of a norm the stored
file does not know (an L1 row a suite added later) are listed as new, not as changed.
``tests/test_measurement_digests.py`` compares the test suite's own demo run against the
stored gtsrb/standard digests at no extra cost.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

from certify.canonical import canonical_json

RUNS = (("gtsrb", "standard"), ("image-classification", "standard"),
        ("gtsrb", "robust"), ("image-classification", "robust"))


def digests(measurement: dict[str, Any]) -> dict[str, str]:
    """sha256 of each check's canonical JSON (keyed by its id), and of the rest (``*``)."""
    def sha(value: Any) -> str:
        return hashlib.sha256(canonical_json(value)).hexdigest()

    out = {c["id"]: sha(c) for c in measurement["checks"]}
    out["*"] = sha({k: v for k, v in measurement.items() if k != "checks"})
    return out


def run(suite: str, model: str, out: Path) -> dict[str, str]:
    """One run of ``suite`` on the demo's ``model`` and its digests."""
    import numpy as np

    from certify.api import (
        DEMO_MODEL_CARD,
        DEMO_PER_CLASS,
        DEMO_SEED,
        RunOptions,
        certify_model,
        demo_model_path,
    )
    from certify.demo.synthetic import generate

    out.mkdir(parents=True, exist_ok=True)
    x, y = generate(DEMO_PER_CLASS, seed=DEMO_SEED)
    # the demo's own file name: sample ids (and so every check's records) carry it
    npz = out / "synthetic-gtsrb-test.npz"
    np.savez(npz, x=x, y=y)
    opts = RunOptions(model=str(demo_model_path(model)), suite=suite, data=str(npz),
                      out=out / "card", samples=len(y), pdf=False, model_card=DEMO_MODEL_CARD,
                      reference=str(demo_model_path("robust")) if model == "standard" else None)
    certify_model(opts, None)
    doc = json.loads((out / "card" / "results.json").read_text())
    return digests(doc["measurement"])


def compare(stored: dict[str, dict[str, str]], got: dict[str, dict[str, str]]) -> list[str]:
    """Lines naming every changed or missing check; new checks are reported apart."""
    lines = []
    for key, want in stored.items():
        have = got.get(key)
        if have is None:
            continue
        for cid, digest in want.items():
            if have.get(cid) != digest:
                lines.append(f"{key}: {cid} {'missing' if cid not in have else 'changed'}")
        for cid in sorted(set(have) - set(want)):
            print(f"{key}: {cid} new (not in the stored digests)")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="Write the digests here.")
    parser.add_argument("--check", type=Path, help="Compare with these stored digests.")
    parser.add_argument("--only", help="suite/model of one run, e.g. gtsrb/standard")
    args = parser.parse_args()
    got = {}
    with tempfile.TemporaryDirectory() as tmp:
        for suite, model in RUNS:
            key = f"{suite}/{model}"
            if args.only and key != args.only:
                continue
            print(f"running {key}", flush=True)
            got[key] = run(suite, model, Path(tmp) / key.replace("/", "-"))
            if args.out:  # as it goes: a later run's failure keeps the earlier ones
                args.out.write_text(json.dumps(got, indent=1, sort_keys=True) + "\n")
    if args.out:
        args.out.write_text(json.dumps(got, indent=1, sort_keys=True) + "\n")
    if args.check:
        bad = compare(json.loads(args.check.read_text()), got)
        print("\n".join(bad) or f"all {sum(len(v) for v in got.values())} digests unchanged")
        return 1 if bad else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
