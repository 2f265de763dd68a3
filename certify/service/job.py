"""One run, in its own process: a child of the worker slot's job host, or
``python -m certify.service.job RUN_FOLDER``.

The worker (:mod:`certify.service.workers`) writes ``job.json`` into the run's folder, has its
job host (:mod:`certify.service.jobhost`) fork a child that runs :func:`run_process` with the
endpoint secret (if any), and watches it; ``python -m certify.service.job`` runs the same
function in a fresh interpreter, with the secret on stdin. This process calls the
same library entry point as ``certify run`` (:func:`certify.api.certify_model`), reports progress
in ``progress.json`` and ends by writing ``outcome.json``: the run's state, verdict, exit code
and, on an error, the message ``certify run`` would print. It never touches the database, so a
model that crashes or hangs onnxruntime takes down only this process.

A run folder that already holds records is resumed (``certify run --resume``): a run whose
server was killed finishes with the same results as an uninterrupted one.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

from certify.errors import EXIT_INTERNAL, CertifyError, ModelError, exit_code_for_verdict
from certify.rundir import RECORDS_FILE, RUN_FILE, atomic_write

JOB_FILE, PROGRESS_FILE, OUTCOME_FILE, LOG_FILE = ("job.json", "progress.json", "outcome.json",
                                                   "job.log")
OUT_DIR = "out"
#: The environment variable the endpoint secret is put in, inside this process only.
SECRET_ENV = "CERTIFY_SERVICE_ENDPOINT_SECRET"


class FileProgress:
    """certify's Progress protocol, written to ``progress.json`` at most twice a second."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.current: str | None = None
        self.steps: dict[str, dict[str, int]] = {}
        self.step_text = ""  # the running step of the current task, until it advances
        self._last = 0.0

    def start(self, label: str, total: int) -> None:  # noqa: D102
        self.current = label
        self.steps[label] = {"done": 0, "total": int(total)}
        self.step_text = ""
        self._write(force=True)

    def step(self, text: str) -> None:
        """Name the running step of the current task (shown by ``runs watch``)."""
        self.step_text = text
        self._write()

    def advance(self, n: int) -> None:  # noqa: D102
        if self.current is not None:
            self.steps[self.current]["done"] += int(n)
        self.step_text = ""
        self._write()

    def finish(self) -> None:  # noqa: D102
        if self.current is not None:
            step = self.steps[self.current]
            step["done"] = max(step["done"], step["total"])
        self._write(force=True)

    def _write(self, force: bool = False) -> None:
        now = time.monotonic()
        if force or now - self._last >= 0.5:
            self._last = now
            atomic_write(self.path, json.dumps(
                {"current": self.current, "steps": self.steps,
                 **({"step": self.step_text} if self.step_text else {})}).encode())


def _options(spec: dict[str, Any], out: Path) -> Any:
    from certify.api import RunOptions
    from certify.models.http import HttpOptions
    from certify.results import ModelCardDoc

    http = None
    if spec["model_kind"] == "http":
        h = dict(spec.get("http") or {})
        if spec.get("has_secret"):
            h["auth_env"] = SECRET_ENV
        http = HttpOptions(**h)
    resume = (out / RUN_FILE).exists() or (out / RECORDS_FILE).exists()
    passphrase = None
    if spec.get("passphrase_env"):
        passphrase = os.environ.get(spec["passphrase_env"], "").encode() or None
    return RunOptions(
        model=spec["model"], suite=spec["suite"], data=spec["data"], out=out,
        samples=spec.get("samples"), seed=spec.get("seed"), resume=resume,
        reference=spec.get("reference"), surrogate=spec.get("surrogate"), pdf=True,
        sign_key=Path(spec["sign_key"]), passphrase=passphrase, http=http,
        query_budget=spec.get("query_budget"), executor=spec.get("executor", "local"),
        ray_address=spec.get("ray_address"), device=spec.get("device") or "auto",
        service={"run_id": spec["run_id"], **(spec.get("public") or {})},
        model_card=ModelCardDoc(**spec["model_card"]) if spec.get("model_card") else None)


def run_job(folder: Path, secret: str | None) -> dict[str, Any]:
    """Run the job described in ``folder/job.json``; returns the outcome (also written)."""
    from certify.api import certify_model
    from certify.service.secrets import unpack

    spec = json.loads((folder / JOB_FILE).read_text(encoding="utf-8"))
    out = folder / OUT_DIR
    header, url = unpack(secret) if secret is not None else (None, None)
    spec["has_secret"] = bool(header)
    if header:
        os.environ[SECRET_ENV] = header
    if url:  # job.json holds the URL redacted; the run needs its credential
        from certify.redact import register_url_secrets

        register_url_secrets(url)
        spec["model"] = url
    try:
        if spec["model_kind"] == "http":  # again: the name may resolve elsewhere by now
            from certify.service.endpoints import EndpointRefused, check_endpoint

            try:
                check_endpoint(spec["model"], tuple(spec.get("allow_endpoints") or ()))
            except EndpointRefused as exc:
                raise ModelError(f"endpoint refused: {exc}",
                                 hint="the service's operator decides which hosts runs "
                                      "may reach") from None
        result, paths = certify_model(_options(spec, out),
                                      FileProgress(folder / PROGRESS_FILE))
        verdict = result.measurement.verdict
        outcome: dict[str, Any] = {
            "state": "done", "verdict": verdict, "exit_code": exit_code_for_verdict(verdict),
            # what was written: no card.pdf where WeasyPrint cannot load its libraries
            "files": sorted(p.name for p in paths.values()),
            "checks": {c.id: c.status for c in result.measurement.checks},
            "queries": result.measurement.queries.total}
    except CertifyError as exc:
        hint = f" (hint: {exc.hint})" if exc.hint else ""
        outcome = {"state": "error", "exit_code": exc.exit_code,
                   "error": _no_server_paths(f"{exc.message}{hint}", folder, spec)}
    except Exception as exc:  # noqa: BLE001 - the run fails, the service does not
        from certify.redact import redact

        logging.getLogger("certify").exception("internal error")
        outcome = {"state": "error", "exit_code": EXIT_INTERNAL,
                   "error": _no_server_paths(
                       f"internal error: {type(exc).__name__}: {redact(str(exc))}", folder,
                       spec)}
    atomic_write(folder / OUTCOME_FILE, json.dumps(outcome).encode())
    return outcome


def _no_server_paths(text: str, folder: Path, spec: dict[str, Any]) -> str:
    """An error message without the service's own paths: a submitter sees a file's name
    (store-relative for what the store holds), never where the server keeps it.

    Redacted, in every spelling the job may meet (as configured, absolute, symlinks
    resolved): the service's home, its store, the registered datasets' folders (from
    ``server_paths`` in job.json), this run's data folder, and where Python and certify are
    installed (a packaged suite's file, a library's file in an internal error) and the
    server user's home folder.
    """
    import re

    import certify.version

    store = folder.resolve().parent.parent  # <scratch>/runs/<run id>
    given: list[str | Path] = [*spec.get("server_paths", []), store, sys.prefix,
                               sys.base_prefix, Path(certify.version.__file__).parent.parent]
    data = spec.get("data")
    if data:
        given.append(Path(data).parent)
    with contextlib.suppress(RuntimeError, KeyError):  # no resolvable home: nothing to hide
        given.append(Path.home())
    spellings: set[str] = set()
    for p in given:
        path = Path(p)
        for form in (str(path), os.path.abspath(path), str(path.resolve())):
            form = form.rstrip("/")
            if form and form != ".":
                spellings.add(form)
    for form in sorted(spellings, key=len, reverse=True):  # the store before the home
        at = r"(?<![\w.~/-])" + re.escape(form)
        text = re.sub(at + "/+", "", text)  # inside it: the path below the folder
        text = re.sub(at + r"(?![\w.~-])", Path(form).name or "folder", text)  # the folder
    return text


def run_process(folder: Path, secret: str | None) -> int:
    """What a job process does once it has its secret: log to stderr (the run's ``job.log``),
    run the job in ``folder``; its exit status (0: the run is done; 1: it ended in error).

    The process is a fresh interpreter (:func:`main`) or a child that a worker slot's job host
    forked (:mod:`certify.service.jobhost`); either way this is the whole of its work."""
    from certify.redact import install_log_filters

    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
    install_log_filters(handler)
    log = logging.getLogger("certify")
    log.handlers[:] = [handler]
    log.setLevel(logging.INFO)
    log.propagate = False
    outcome = run_job(folder, secret)
    return 0 if outcome["state"] == "done" else 1


def main(argv: list[str] | None = None) -> int:
    """Entry point of the job process: the run folder as argument, the secret (if any) on the
    first line of stdin."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        sys.stderr.write("usage: python -m certify.service.job RUN_FOLDER\n")
        return 2
    line = sys.stdin.readline().rstrip("\n")
    return run_process(Path(args[0]), line or None)


if __name__ == "__main__":
    sys.exit(main())
