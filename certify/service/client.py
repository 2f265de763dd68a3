"""``certify submit`` and ``certify runs``: send a model to a certify service, follow a run,
download its signed card.

The client needs only ``requests`` (and ``onnx`` to find an uploaded model's external data):
CI pipelines can submit without running the suite themselves. The token comes from an
environment variable (``CERTIFY_TOKEN`` by default), never from the command line. Exit codes
are those of ``certify run``.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Any
from urllib.parse import quote

import requests

from certify.errors import (
    EXIT_INTERRUPTED,
    CertifyError,
    ModelError,
    UsageError,
)

FILES = ("card.html", "card.pdf", "results.json", "results.json.sig")


class ServiceError(CertifyError):
    """The service refused a request (``status``: its HTTP status) or could not be reached
    (``status`` None)."""

    exit_code = 2

    def __init__(self, message: str, hint: str | None = None, status: int | None = None
                 ) -> None:
        super().__init__(message, hint)
        self.status = status


class RunNotFound(ServiceError):
    """The service has no run of that id that this token may read. Another token's private
    run answers exactly like a missing one (the service's 404), and so does this message."""

    def __init__(self, run_id: str, server: str) -> None:
        super().__init__(f"no run {run_id[:80]!r} on {server} for this token",
                         hint="`certify runs list` shows this token's runs", status=404)


class WatchInterrupted(CertifyError):
    """Ctrl-C while following a run: the client stops, the run goes on on the service."""

    exit_code = EXIT_INTERRUPTED


#: States in which a run has ended.
FINAL_STATES = ("done", "error", "cancelled")


class Client:
    """A thin client of the service's ``/api/v1``."""

    def __init__(self, server: str, token: str, timeout: float = 60.0) -> None:
        self.server = server.rstrip("/")
        self.base = self.server + "/api/v1"
        self.http = requests.Session()
        self.http.headers["Authorization"] = f"Bearer {token}"
        self.timeout = timeout

    def _call(self, method: str, path: str, run_id: str | None = None, **kw: Any
              ) -> requests.Response:
        """One request; a 404 on a run's route (``run_id``) is :class:`RunNotFound`."""
        try:
            r = self.http.request(method, self.base + path, timeout=self.timeout, **kw)
        except requests.RequestException as exc:
            raise ServiceError(f"cannot reach the certify service at {self.base}: "
                               f"{type(exc).__name__}",
                               hint="check --server and that the service is running") from None
        if r.status_code == 404 and run_id is not None:
            raise RunNotFound(run_id, self.server)
        if r.status_code >= 400:
            try:
                detail = r.json().get("detail")
            except ValueError:
                detail = r.text[:300]
            if not isinstance(detail, str):  # FastAPI's validation errors are a list
                detail = "; ".join(f"{'.'.join(map(str, d.get('loc', [])))}: {d.get('msg')}"
                                   for d in detail or [] if isinstance(d, dict))
            hint = {401: "set a valid token in the token variable (certify serve token "
                         "create)", 403: "ask the service's operator for a token with that "
                                         "role"}.get(r.status_code)
            raise ServiceError(f"the service refused the request ({r.status_code}): {detail}",
                               hint=hint, status=r.status_code)
        return r

    def submit(self, model: str, suite: str, dataset: str, samples: int | None = None,
               seed: int | None = None, reference: Path | None = None,
               extra_files: tuple[Path, ...] = (), endpoint_secret: str | None = None,
               endpoint_header: str | None = None, model_version: str | None = None,
               surrogate: Path | None = None,
               card: dict[str, str] | None = None, device: str | None = None
               ) -> dict[str, Any]:
        """POST /runs; returns the queued run. ``card``: the model-card fields stated
        (model_name, owner, license, intended_use; the version is ``model_version``).
        ``device``: ``cuda`` for a run only a GPU worker may take."""
        data: dict[str, Any] = {k: v for k, v in (card or {}).items() if v}
        if device and device != "auto":
            data["device"] = device
        if model_version:
            data["model_version"] = model_version
        with ExitStack() as stack:
            files: list[tuple[str, Any]] = []

            def add(field: str, path: Path) -> None:
                if not path.is_file():
                    raise UsageError(f"{path} not found", hint="check the path")
                files.append((field, (path.name, stack.enter_context(path.open("rb")))))

            from certify.models.registry import is_endpoint

            if is_endpoint(model):
                data["endpoint"] = model
                if endpoint_secret:
                    data["endpoint_secret"] = endpoint_secret
                if endpoint_header:
                    data["endpoint_header"] = endpoint_header
            else:
                for p in model_files(Path(model), extra_files):
                    add("model", p)
            if suite.endswith((".yaml", ".yml")):
                add("suite_file", Path(suite))
            else:
                data["suite"] = suite
            if dataset.endswith(".npz"):
                add("dataset_file", Path(dataset))
            else:
                data["dataset"] = dataset
            if reference is not None:
                add("reference", reference)
            if surrogate is not None:
                add("surrogate", surrogate)
            if samples is not None:
                data["samples"] = str(samples)
            if seed is not None:
                data["seed"] = str(seed)
            return self._call("POST", "/runs", data=data, files=files or None).json()

    def run(self, run_id: str) -> dict[str, Any]:
        """GET /runs/{id}; :class:`RunNotFound` for a missing id and for another token's
        private run alike."""
        return self._call("GET", f"/runs/{quote(run_id, safe='')}", run_id=run_id).json()

    def runs(self, limit: int = 20, state: str | None = None) -> dict[str, Any]:
        """GET /runs: this token's runs (an admin token's: every run), newest first, at most
        ``limit``; ``{"total": N, "runs": [...]}``."""
        params: dict[str, Any] = {"limit": limit}
        if state:
            params["state"] = state
        return self._call("GET", "/runs", params=params).json()

    def wait(self, run_id: str, on_update: Callable[[dict[str, Any]], None],
             poll_s: float = 1.0) -> dict[str, Any]:
        """Poll until the run ends; ``on_update`` sees every state."""
        while True:
            run = self.run(run_id)
            on_update(run)
            if run["state"] in FINAL_STATES:
                return run
            time.sleep(poll_s)

    def download(self, run_id: str, out: Path, run: dict[str, Any] | None = None
                 ) -> list[Path]:
        """Fetch the finished run's card and results into ``out`` (those the run links: no
        card.pdf where the service's WeasyPrint could not load its libraries). ``run``: the
        run as just read, to save a request."""
        out.mkdir(parents=True, exist_ok=True)
        links = (run or self.run(run_id)).get("links") or {}
        written = []
        for name in (f for f in FILES if f in links):
            r = self._call("GET", f"/runs/{quote(run_id, safe='')}/{name}", run_id=run_id)
            tmp = out / f".{name}.tmp"
            tmp.write_bytes(r.content)
            os.replace(tmp, out / name)
            written.append(out / name)
        return written


def model_files(model: Path, given: tuple[Path, ...] = ()) -> list[Path]:
    """The files to upload for the ONNX ``model``: the model, then each external-data file its
    graph references, found beside it as ``certify run`` finds them, or among ``given``
    (``--external-data``, by file name) when it is elsewhere, then the rest of ``given``.

    Raises :class:`UsageError` for a referenced file found nowhere, naming it and the option,
    and for a location in a subfolder (the service takes the model's files side by side);
    :class:`ModelError` for a file that is not a readable ONNX graph.
    """
    if not model.is_file():
        raise UsageError(f"{model} not found", hint="check the path")
    if model.suffix.lower() != ".onnx":
        return [model, *given]  # an archive, or a format the service names in its refusal
    from certify.onnx_files import external_data_locations

    by_name = {p.name: p for p in given}
    files = [model]
    for loc in external_data_locations(model):
        if "/" in loc:
            raise UsageError(
                f"{model.name} keeps its external data in a subfolder ({loc}); the service takes "
                "a model's files side by side", hint="save it with the weights beside the model "
                "(onnx.save_model(..., location='NAME.data'))")
        if loc in by_name:
            files.append(by_name.pop(loc))
        elif (model.parent / loc).is_file():
            files.append(model.parent / loc)
        else:
            raise UsageError(f"{model.name} references external data {loc!r}, which is missing "
                             f"from {model.parent}", hint=f"copy {loc} beside the model, or "
                             f"name where it is with --external-data PATH")
    return files + [p for p in given if p.name in by_name]


def check_downloaded(folder: Path, run_id: str, model: Path | None) -> str:
    """Check that the card downloaded into ``folder`` is run ``run_id``'s (its signed
    provenance names the service run) and, given the ``model`` file that was uploaded, that it
    measured that file (its identity); returns what was checked, in words. Raises
    :class:`~certify.errors.VerificationError` otherwise."""
    import json

    from certify.errors import VerificationError

    try:
        doc = json.loads((folder / "results.json").read_text(encoding="utf-8"))
        named = ((doc.get("provenance") or {}).get("service") or {}).get("run_id")
        identity = doc["measurement"]["model"]["identity"]
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        raise VerificationError(f"{folder / 'results.json'} is not a certify result",
                                hint="download it again") from None
    if named != run_id:
        raise VerificationError(f"the card downloaded for run {run_id} names run {named}",
                                hint="the service served another run's card; report it")
    said = f"the card is run {run_id}'s"
    if model is not None:
        from certify.onnx_files import model_identity

        mine = model_identity(model)
        if identity != mine:
            raise VerificationError(
                f"the card of run {run_id} measured model {identity}, not the file uploaded "
                f"({model.name}, {mine})", hint="the service served another model's card")
        said += f" and measured {model.name} ({mine})"
    return said


def exit_code_of(run: dict[str, Any]) -> int:
    """The exit code ``certify run`` would have given."""
    if run["state"] == "cancelled":
        return EXIT_INTERRUPTED
    code = run.get("exit_code")
    if code is None:
        raise ModelError(f"run {run['id']} ended {run['state']} without an exit code")
    return int(code)
