"""``certify submit`` and ``certify runs``: send a model to a certify service, follow a run,
download its signed card, and trust none of it until it is checked.

The client needs only ``requests`` (and ``onnx`` to find an uploaded model's external data):
CI pipelines can submit without running the suite themselves. The token comes from an
environment variable (``CERTIFY_TOKEN`` by default), never from the command line.

The server is not trusted (it may be compromised, or not certify at all): every answer is read
within a byte cap and a total deadline (:mod:`certify.service.bounded`); every run id, the one
the user typed and the one ``submit`` gets back, must be in the service's format
(:mod:`certify.service.runids`), and an answer about another run than the one asked is refused;
folders are named after the id the user asked for. A downloaded card is verified
(:func:`verify_download`) with the service's key, given or pinned on first use, and its
inclusion in the service's transparency log, before anything of it is printed; its verdict and
exit code are read from the verified results, never from the server's answer. Strings from the
server are printed through :func:`certify.safetext.printable`. A card or answer that does not
check out is :class:`~certify.errors.UntrustedError` (exit 9); otherwise exit codes are those
of ``certify run``.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

from certify.errors import (
    CARD_WRITTEN_CODES,
    EXIT_INTERRUPTED,
    CertifyError,
    ModelError,
    UntrustedError,
    UsageError,
)
from certify.safetext import printable
from certify.service.bounded import MAX_JSON_BYTES, Answer, Bounds, bounded_request, session
from certify.service.runids import RUN_ID_FORMAT, is_run_id

FILES = ("card.html", "card.pdf", "results.json", "results.json.sig")
#: The files without which a downloaded card cannot be verified.
REQUIRED_FILES = ("results.json", "results.json.sig")


class ServiceError(CertifyError):
    """The service refused a request (``status``: its HTTP status), could not be reached, or
    sent an answer past a bound (``status`` None)."""

    exit_code = 2

    def __init__(self, message: str, hint: str | None = None, status: int | None = None
                 ) -> None:
        super().__init__(message, hint)
        self.status = status


class RunNotFound(ServiceError):
    """The service has no run of that id that this token may read. Another token's private
    run answers exactly like a missing one (the service's 404), and so does this message."""

    def __init__(self, run_id: str, server: str) -> None:
        super().__init__(f"no run {printable(run_id, 80)!r} on {printable(server)} for this "
                         "token", hint="`certify runs list` shows this token's runs", status=404)


class WatchInterrupted(CertifyError):
    """Ctrl-C, or ``--timeout``, while following a run: the client stops, the run goes on on
    the service (exit 130)."""

    exit_code = EXIT_INTERRUPTED


#: States in which a run has ended.
FINAL_STATES = ("done", "error", "cancelled")
#: Every state a run can be in.
STATES = ("queued", "running", *FINAL_STATES)


def check_run_id(run_id: str, given_by: str = "you") -> str:
    """``run_id`` if it is in the service's format; a usage error for an id the user typed, an
    untrusted answer for one the server sent (``given_by`` "the service")."""
    if is_run_id(run_id):
        return run_id
    said = f"{printable(run_id, 80)!r} is not a run id ({RUN_ID_FORMAT})"
    if given_by == "you":
        raise UsageError(said, hint="`certify runs list` shows this token's runs")
    raise UntrustedError(f"the service sent a run id that is not one: {said}",
                         hint="do not trust this server")


class Client:
    """A client of the service's ``/api/v1`` that reads every answer within ``bounds``."""

    def __init__(self, server: str, token: str, bounds: Bounds | None = None) -> None:
        self.server = server.rstrip("/")
        self.base = self.server + "/api/v1"
        self.http = session()
        self.http.headers["Authorization"] = f"Bearer {token}"
        self.bounds = bounds or Bounds()

    def _error(self, message: str, hint: str | None) -> ServiceError:
        return ServiceError(message, hint)

    def _call(self, method: str, path: str, run_id: str | None = None, *,
              dest: Path | None = None, **kw: Any) -> Answer:
        """One request, its answer read within the bounds (into ``dest`` when given, else
        memory, at most :data:`MAX_JSON_BYTES`); a 404 on a run's route (``run_id``) is
        :class:`RunNotFound`, another status of 300 or more a :class:`ServiceError`."""
        what = f"{method} {printable(self.base + path, 200)}"
        a = bounded_request(self.http, method, self.base + path, self.bounds, self._error,
                            what=what, dest=dest, cap=None if dest else MAX_JSON_BYTES,
                            redirects=3 if dest is not None else 0,
                            where=f"the certify service at {printable(self.base)}",
                            unreachable_hint="check --server and that the service is running",
                            **kw)
        if a.status == 404 and run_id is not None:
            if dest is not None:
                dest.unlink(missing_ok=True)
            raise RunNotFound(run_id, self.server)
        if a.status >= 300:
            if dest is not None:
                detail = ""
                dest.unlink(missing_ok=True)
            else:
                detail = _detail(a)
            hint = {401: "set a valid token in the token variable (certify serve token "
                         "create)", 403: "ask the service's operator for a token with that "
                                         "role"}.get(a.status)
            raise ServiceError(f"the service refused the request ({a.status}): {detail}",
                               hint=hint, status=a.status)
        return a

    def _json(self, a: Answer, what: str) -> Any:
        try:
            return a.json()
        except ValueError:
            raise UntrustedError(f"the service's answer to {what} is not JSON",
                                 hint="is this a certify service?") from None

    def submit(self, model: str, suite: str, dataset: str, samples: int | None = None,
               seed: int | None = None, reference: Path | None = None,
               extra_files: tuple[Path, ...] = (), endpoint_secret: str | None = None,
               endpoint_header: str | None = None, model_version: str | None = None,
               surrogate: Path | None = None,
               card: dict[str, str] | None = None, device: str | None = None
               ) -> dict[str, Any]:
        """POST /runs; returns the queued run, whose id is checked to be in the service's
        format. ``card``: the model-card fields stated (model_name, owner, license,
        intended_use; the version is ``model_version``). ``device``: ``cuda`` for a run only a
        GPU worker may take."""
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
            run = self._json(self._call("POST", "/runs", data=data, files=files or None),
                             "the submission")
        if not isinstance(run, dict):
            raise UntrustedError("the service's answer to the submission is not a run",
                                 hint="is this a certify service?")
        check_run_id(run.get("id"), given_by="the service")  # type: ignore[arg-type]
        return run

    def run(self, run_id: str) -> dict[str, Any]:
        """GET /runs/{id}: the run, checked to be the one asked (its id) in a known state;
        :class:`RunNotFound` for a missing id and for another token's private run alike."""
        check_run_id(run_id)
        doc = self._json(self._call("GET", f"/runs/{quote(run_id, safe='')}", run_id=run_id),
                         f"run {run_id}")
        return checked_run(doc, run_id)

    def runs(self, limit: int = 20, state: str | None = None, model: str | None = None,
             suite: str | None = None) -> dict[str, Any]:
        """GET /runs: this token's runs (an admin token's: every run), newest first, at most
        ``limit``, of ``state``, whose model name contains ``model``, of ``suite``;
        ``{"total": N, "runs": [...]}``, each run a mapping."""
        params: dict[str, Any] = {"limit": limit}
        for key, value in (("state", state), ("model", model), ("suite", suite)):
            if value:
                params[key] = value
        page = self._json(self._call("GET", "/runs", params=params), "the list of runs")
        if not (isinstance(page, dict) and isinstance(page.get("runs"), list)
                and all(isinstance(r, dict) for r in page["runs"])):
            raise UntrustedError("the service's list of runs is malformed",
                                 hint="is this a certify service?")
        return page

    def wait(self, run_id: str, on_update: Callable[[dict[str, Any]], None],
             poll_s: float = 1.0, timeout_s: float | None = None) -> dict[str, Any]:
        """Poll until the run ends; ``on_update`` sees every state. ``timeout_s``: stop
        following after that many seconds (:class:`WatchInterrupted`; the run goes on)."""
        start = time.monotonic()
        while True:
            run = self.run(run_id)
            on_update(run)
            if run["state"] in FINAL_STATES:
                return run
            waited = time.monotonic() - start
            if timeout_s is not None and waited + poll_s > timeout_s:
                raise WatchInterrupted(
                    f"run {run_id} is still {run['state']} after {timeout_s:g} s (--timeout); "
                    "it goes on running on the service",
                    hint=f"follow it again with `certify runs watch {run_id} --server "
                         f"{printable(self.server)}`")
            time.sleep(poll_s)

    def download(self, run_id: str, out: Path, run: dict[str, Any] | None = None
                 ) -> list[Path]:
        """Fetch the finished run's card and results into ``out`` (those the run links: no
        card.pdf where the service's WeasyPrint could not load its libraries; results.json and
        its signature always), each within the byte cap and the deadline. ``run``: the run
        as just read, to save a request. Nothing here is verified: see
        :func:`fetch_verified`."""
        check_run_id(run_id)
        out.mkdir(parents=True, exist_ok=True)
        links = (run or self.run(run_id)).get("links") or {}
        names = [f for f in FILES if f in REQUIRED_FILES or
                 (isinstance(links, dict) and f in links)]
        written = []
        for name in names:
            self._call("GET", f"/runs/{quote(run_id, safe='')}/{name}", run_id=run_id,
                       dest=out / name)
            written.append(out / name)
        return written


def _detail(a: Answer) -> str:
    """A refusal's reason, as the service words it (FastAPI's ``detail``), made printable."""
    try:
        detail = a.json().get("detail")
    except (ValueError, AttributeError):
        detail = (a.body or b"")[:300].decode("utf-8", "replace")
    if isinstance(detail, list):  # FastAPI's validation errors
        detail = "; ".join(f"{'.'.join(map(str, d.get('loc', [])))}: {d.get('msg')}"
                           for d in detail if isinstance(d, dict))
    return printable(detail if isinstance(detail, str) else "", 300)


def checked_run(doc: Any, run_id: str) -> dict[str, Any]:
    """The service's answer about run ``run_id``, if it is one: a mapping whose ``id`` is
    exactly the id asked and whose ``state`` is a known one. :class:`UntrustedError`
    otherwise (an answer about another run is not this run's)."""
    if not isinstance(doc, dict):
        raise UntrustedError(f"the service's answer about run {run_id} is not a run",
                             hint="is this a certify service?")
    if doc.get("id") != run_id:
        raise UntrustedError(f"asked for run {run_id}, the service answered about run "
                             f"{printable(doc.get('id'), 80)!r}",
                             hint="do not trust this server's answers")
    if doc.get("state") not in STATES:
        raise UntrustedError(f"the service says run {run_id} is in state "
                             f"{printable(doc.get('state'), 40)!r}, which is none of "
                             f"{', '.join(STATES)}", hint="is this a certify service?")
    return doc


@dataclass
class FetchedCard:
    """A downloaded card that verified: where its files are, and what was established."""

    files: list[Path]
    #: What was checked, one line each (signatures, the log, the run and model identity).
    checked: list[str]
    verdict: str
    exit_code: int
    log_index: int | None


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
        raise VerificationError(f"the card downloaded for run {run_id} names run "
                                f"{printable(named, 80)}",
                                hint="the service served another run's card; report it")
    said = f"the card is run {run_id}'s"
    if model is not None:
        from certify.onnx_files import model_identity

        mine = model_identity(model)
        if identity != mine:
            raise VerificationError(
                f"the card of run {run_id} measured model {printable(identity, 120)}, not the "
                f"file uploaded "
                f"({model.name}, {mine})", hint="the service served another model's card")
        said += f" and measured {model.name} ({mine})"
    return said


def exit_code_of(run: dict[str, Any]) -> int:
    """The exit code ``certify run`` would have given for a run that ended without a card
    (``error`` or ``cancelled``; a ``done`` run's code comes from its verified card,
    :func:`fetch_verified`). A server that claims a failed run exited as if it wrote a card
    (0, 1, 5, 6 or 7) is not believed: :class:`UntrustedError`."""
    if run["state"] == "cancelled":
        return EXIT_INTERRUPTED
    code = run.get("exit_code")
    if not isinstance(code, int) or isinstance(code, bool):
        raise ModelError(f"run {run['id']} ended {run['state']} without an exit code")
    if run["state"] != "done" and (code in CARD_WRITTEN_CODES or not 0 <= code <= 255):
        raise UntrustedError(f"the service says run {run['id']} ended {run['state']} with exit "
                             f"code {code}, the code of a run that wrote a card",
                             hint="do not trust this server's answers")
    return code


def fetch_verified(client: Client, run: dict[str, Any], out: Path, model: Path | None = None,
                   pubkey: Path | None = None, state_path: Path | None = None) -> FetchedCard:
    """Download the done ``run``'s card into ``out`` and verify it before it is kept:

    1. the service's key: ``pubkey``, or the one the service sends, pinned on first use in
       ``state_path`` (a key other than the pinned one is refused);
    2. every file downloaded (results.json with its signature, card.html, card.pdf) verifies
       with that key (:func:`certify.report.sign.verify_file`: signature, payload, the sealed
       visible layer) and all seal the same results;
    3. the card is run ``run["id"]``'s (its signed provenance), measured ``model`` where the
       upload was that file, and its statement is in the service's transparency log under a
       signed tree head consistent with the last one seen from here, in an entry of that run.

    The files are downloaded into a hidden folder inside ``out`` and moved into ``out`` only
    once all of this holds; otherwise they are deleted (and ``out`` too, where this call made
    it and it is empty) and :class:`UntrustedError` says what failed (exit 9). The verdict and
    exit code are the verified results'."""
    from certify.service.logclient import LogClient, default_state_path, pinned_key
    from certify.service.merkle import LogError

    run_id = check_run_id(run["id"])
    state = state_path or default_state_path()
    log = LogClient(client.server, bounds=client.bounds)
    try:
        key, key_line = pinned_key(log, pubkey, state)
    except LogError as exc:
        raise UntrustedError.from_error(exc, f"the card of run {run_id} is not fetched: ") \
            from None
    made = not out.exists()
    out.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".certify-download-", dir=out))
    try:
        names = [p.name for p in client.download(run_id, staging, run)]
        checked, verdict, index = verify_download(staging, run_id, key, log, state, model)
        files = []
        for name in names:
            (staging / name).replace(out / name)
            files.append(out / name)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        if made and not any(out.iterdir()):
            out.rmdir()
        raise
    shutil.rmtree(staging, ignore_errors=True)
    from certify.errors import exit_code_for_verdict

    return FetchedCard(files, [key_line, *checked], verdict, exit_code_for_verdict(verdict),
                       index)


def verify_download(folder: Path, run_id: str, key: Any, log: Any, state_path: Path,
                    model: Path | None) -> tuple[list[str], str, int]:
    """Verify the card files in ``folder`` (see :func:`fetch_verified`); returns what was
    established (one line each), the verified verdict and the log entry's index.
    :class:`UntrustedError` otherwise."""
    from certify.report.sign import verify_file
    from certify.service.logclient import LogUnreachable, log_inclusion
    from certify.service.merkle import LogError

    def untrusted(exc: CertifyError, what: str) -> UntrustedError:
        return UntrustedError.from_error(exc, f"the card of run {run_id} is not trusted: {what}"
                                              ": ")

    statement = None
    verified = None
    names = [n for n in ("results.json", "card.html", "card.pdf") if (folder / n).is_file()]
    for name in names:
        try:
            v = verify_file(folder / name, key)
        except CertifyError as exc:
            raise untrusted(exc, f"{name} does not verify") from None
        if v.visible_compared is False:
            raise UntrustedError(f"the card of run {run_id} is not trusted: what {name} shows "
                                 f"was not compared with its signed results ({v.visible})",
                                 hint="verify it with the certify that made it")
        if statement is None:
            statement, verified = v.signature.signed, v
        elif v.signature.signed != statement:
            raise UntrustedError(f"the card of run {run_id} is not trusted: {name} seals other "
                                 "results than results.json", hint="do not trust this server")
    if statement is None or verified is None or verified.result is None:
        raise UntrustedError(f"the card of run {run_id} is not trusted: its results are in a "
                             "format this certify does not read",
                             hint="fetch it with the certify the service runs")
    from certify.errors import VerificationError

    try:
        said = check_downloaded(folder, run_id, model)
    except VerificationError as exc:
        raise untrusted(exc, "it is not this run's") from None
    try:
        lines, index = log_inclusion(statement, log, key, state_path, run_id=run_id)
    except (LogError, LogUnreachable) as exc:
        raise untrusted(exc, "its transparency log entry does not check out") from None
    signed = ", ".join(names)
    return ([f"signatures: {signed} verify and seal the same results", said, *lines],
            verified.result.measurement.verdict, index)
