"""What each ``certify`` command imports before it does its work (issue 53).

Each command runs in a fresh interpreter under ``python -X importtime``, as a user starts it;
the table gives the interpreter's CPU seconds (user + system, the command's own work included),
the import time Python measured (the sum of the top-level imports' cumulative microseconds, on
a shared machine a wall figure), how many modules were imported, and which heavy libraries were
(torch, onnxruntime, WeasyPrint, matplotlib, transformers). The commands that need files get
them from a small run made first (the demo model on 43 generated signs, clean accuracy only).

``.venv/bin/python benchmarks/imports.py``: prints JSON and a Markdown table.
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

HEAVY = ("torch", "onnxruntime", "weasyprint", "matplotlib", "transformers")


def measure(args: list[str]) -> dict[str, object]:
    """One command in a fresh interpreter: its CPU seconds, import time and heavy imports."""
    code = ("import sys\nfrom certify.cli import main\n"
            "try:\n    main(sys.argv[1:])\nexcept SystemExit as e:\n"
            "    print('EXIT', e.code)\n")
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = subprocess.run([sys.executable, "-X", "importtime", "-c", code, *args],
                          capture_output=True, text=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("import time:")]
    rows = []
    for ln in lines[1:]:  # the first is the header
        _, cumulative, name = (p for p in ln.removeprefix("import time:").split("|"))
        rows.append((int(cumulative), name))
    top = sum(c for c, name in rows if not name.startswith("  "))
    names = {name.strip() for _, name in rows}
    return {"command": "certify " + " ".join(a if "/" not in a else Path(a).name
                                             for a in args),
            "cpu_s": round((after.ru_utime - before.ru_utime)
                           + (after.ru_stime - before.ru_stime), 2),
            "import_s": round(top / 1e6, 2), "modules": len(rows),
            # a package counts by any of its modules (WeasyPrint's own line can be missing)
            "heavy": [h for h in HEAVY if any(n == h or n.startswith(h + ".") for n in names)],
            "exit": (proc.stdout.strip().splitlines() or ["EXIT ?"])[-1].removeprefix("EXIT ")}


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        import numpy as np
        import yaml

        from certify.api import demo_model_path
        from certify.demo.synthetic import generate

        x, y = generate(1, seed=0)
        np.savez(root / "signs.npz", x=x, y=y)
        suite = root / "clean.yaml"
        suite.write_text(yaml.safe_dump({"name": "clean", "checks": [
            {"id": "clean", "kind": "clean_accuracy",
             "threshold": {"metric": "accuracy", "min": 0.0}}]}))
        model = str(demo_model_path("standard"))
        run = root / "run"
        results = str(run / "results.json")
        signed = root / "signed"
        commands = [
            ["--version"], ["--help"], ["schema"], ["suites", "list"],
            ["keygen", "--out", str(root / "keys")],
            ["run", model, "--suite", str(suite), "--data", str(root / "signs.npz"), "--out",
             str(run), "--no-pdf", "-q"],
            ["compare", results, results],
            ["export", str(run)],
            ["run", model, "--suite", str(suite), "--data", str(root / "signs.npz"), "--out",
             str(signed), "-q", "--sign-key", str(root / "keys" / "certify.key")],
            ["verify", str(signed / "card.pdf"), "--pubkey", str(root / "keys" / "certify.pub")],
        ]
        rows = [measure(c) for c in commands]
    print(json.dumps(rows))
    print("| command | exit | CPU s | import s | modules | heavy libraries imported |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| `{r['command']}` | {r['exit']} | {r['cpu_s']} | {r['import_s']} | "
              f"{r['modules']} | {', '.join(r['heavy']) or 'none'} |")  # type: ignore[arg-type]


if __name__ == "__main__":
    main()
