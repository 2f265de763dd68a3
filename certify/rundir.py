"""The run directory: fingerprint, streamed per-sample records, atomic output files.

``records.jsonl`` is appended one batch at a time and flushed to the kernel, so a run killed at
any moment loses at most the batch in flight (fsync follows at most once a second, and on close);
a torn last line (SIGKILL mid-write) is dropped on resume.
"""

from __future__ import annotations

import json
import os
import time
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import TypedDict

from certify.canonical import JSONLike
from certify.errors import UsageError

RUN_FILE = "run.json"
RECORDS_FILE = "records.jsonl"
FSYNC_INTERVAL_S = 1.0


def atomic_write(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` via a temporary file and rename: never a half-written file."""
    tmp = path.with_name(f".{path.name}.tmp")
    with tmp.open("wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


class SampleRecord(TypedDict, total=False):
    """One sample's line of ``records.jsonl``: the part every check kind shares.

    The runner owns ``check`` (the round's record key), ``i`` (dataset index) and ``id`` (the
    sample's id) and sets them; the check reports ``queries`` (and ``ref_queries``) images sent
    for the sample, which the runner holds against the query counters, and its ``outcome``. A
    sample whose model answer was not finite has ``outcome: "error"`` and ``error``; the
    queries of an abandoned batch attempt are charged in ``batch_queries``
    (:mod:`certify.engine.guards`). Each check kind extends this type with its own fields
    (``AttackRecord``, ``CorruptionRecord``, ...); the file format is these keys, unchanged.
    """

    check: str
    i: int
    id: str
    queries: int
    ref_queries: int
    outcome: str
    error: str
    batch_queries: int
    batch_ref_queries: int


DEMO_DATA = "demo-data"  # what `certify demo` writes before the run starts


def free_sibling(path: Path) -> Path:
    """The first of ``PATH-2``, ``PATH-3``, … that does not exist: a folder to suggest when
    ``path`` holds another run."""
    k = 2
    while path.with_name(f"{path.name}-{k}").exists():
        k += 1
    return path.with_name(f"{path.name}-{k}")


def check_out_dir(path: Path, resume: bool) -> None:
    """Refuse an ``--out`` where a run would overwrite something, before anything is written.

    Accepted: a missing or empty folder (a folder holding only ``demo-data/`` counts as empty),
    and a folder holding a run when ``resume`` is set. Refused with :class:`UsageError`: a file,
    a run without ``resume``, and a non-empty folder that is not a certify run (its
    ``card.html`` or ``results.json`` would be overwritten).
    """
    if not path.exists():
        return
    if not path.is_dir():
        raise UsageError(f"--out {path} is a file", hint="choose a folder for --out")
    if (path / RUN_FILE).exists() or (path / RECORDS_FILE).exists():
        if not resume:
            raise UsageError(
                f"{path} already holds a run",
                hint=f"--resume continues it (the same model, suite and data); for another "
                     f"model or suite, choose a new folder, e.g. --out {free_sibling(path)}",
            )
        return
    try:
        entries = sorted(p.name for p in path.iterdir()
                         if not (p.name == DEMO_DATA and p.is_dir()))
    except OSError as exc:
        raise UsageError(f"cannot read output folder {path}: {exc.strerror}",
                         hint="choose another --out") from None
    if entries:
        shown = ", ".join(entries[:3]) + (", …" if len(entries) > 3 else "")
        raise UsageError(
            f"{path} is not empty ({shown}) and holds no certify run",
            hint="choose a new or empty folder for --out; certify does not overwrite "
                 "other files",
        )


class RunDir:
    """A run's output folder; ``records`` maps check id to {sample index: record}."""

    def __init__(self, path: Path, fingerprint: dict[str, JSONLike], resume: bool) -> None:
        self.path = path
        self.records: dict[str, dict[int, SampleRecord]] = defaultdict(dict)
        check_out_dir(path, resume)
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise UsageError(f"cannot create output folder {path}: {exc.strerror}",
                             hint="choose another --out") from None
        run_file = path / RUN_FILE
        rec_file = path / RECORDS_FILE
        if run_file.exists() or rec_file.exists():  # check_out_dir: only with resume
            self._check_fingerprint(run_file, fingerprint)
            self._load_records(rec_file)
        self._resumed = sum(len(v) for v in self.records.values())
        atomic_write(run_file, json.dumps({"fingerprint": fingerprint}, indent=2,
                                          sort_keys=True).encode())
        self._out = rec_file.open("a", encoding="utf-8")
        self._synced = time.monotonic()

    @property
    def resumed_records(self) -> int:
        """How many records were found on disk when the run directory was opened (records
        appended by this run are not counted)."""
        return self._resumed

    def _check_fingerprint(self, run_file: Path, fingerprint: dict[str, JSONLike]) -> None:
        try:
            old = json.loads(run_file.read_text(encoding="utf-8"))["fingerprint"]
        except (OSError, ValueError, KeyError, TypeError):
            raise UsageError(f"{run_file} is unreadable, so the run cannot be resumed",
                             hint="start again with another --out") from None
        diff = sorted(k for k in set(old) | set(fingerprint) if old.get(k) != fingerprint.get(k))
        if diff:
            raise UsageError(
                f"cannot resume {self.path}: {', '.join(diff)} differ from the interrupted run",
                hint="resume with the same model, suite, data, samples and seed, or start "
                f"this one in a new folder, e.g. --out {free_sibling(self.path)}",
            )

    def _load_records(self, rec_file: Path) -> None:
        if not rec_file.exists():
            return
        raw = rec_file.read_bytes()
        lines = raw.split(b"\n")
        good = 0  # bytes of complete, parseable lines
        for lineno, line in enumerate(lines, start=1):
            last = lineno == len(lines)
            if not line.strip():
                good += len(line) + (0 if last else 1)
                continue
            try:
                rec = json.loads(line)
                if last:
                    raise ValueError("no newline: torn write")
            except ValueError:
                if lineno >= len(lines) - 1:  # the torn tail of a killed run: drop it
                    break
                raise UsageError(f"{rec_file}:{lineno} is corrupt", hint="use another --out") \
                    from None
            self.records[str(rec["check"])].setdefault(int(rec["i"]), rec)
            good += len(line) + 1
        if good < len(raw):
            with rec_file.open("r+b") as f:
                f.truncate(good)

    def append(self, check_id: str, rows: Sequence[SampleRecord]) -> None:
        """Append one batch of records and make it durable."""
        buf = "".join(json.dumps(r, sort_keys=True, separators=(",", ":")) + "\n" for r in rows)
        self._out.write(buf)
        # flush() hands the batch to the kernel: it survives SIGINT and SIGKILL of this process.
        # fsync() also survives a machine crash but costs milliseconds, so at most once a second.
        self._out.flush()
        now = time.monotonic()
        if now - self._synced >= FSYNC_INTERVAL_S:
            os.fsync(self._out.fileno())
            self._synced = now
        for r in rows:
            self.records[check_id][int(r["i"])] = r

    def close(self) -> None:
        """Make every record durable and close the records file."""
        if not self._out.closed:
            self._out.flush()
            os.fsync(self._out.fileno())
            self._out.close()
