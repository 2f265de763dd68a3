"""The library entry point behind ``certify run``: load, run, report."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from certify.canonical import normalize
from certify.data import load_dataset
from certify.data.classes import (
    data_class_names,
    preliminary_count,
    read_labels,
)
from certify.data.loaders import load_arrays
from certify.device import DeviceChoice, choose_device
from certify.engine import run_fingerprint, run_suite
from certify.engine.plan import TimeBudget, calibrate, choose_samples
from certify.errors import ModelError, UsageError
from certify.models import HttpOptions, Model, Preprocessing, load_model
from certify.progress import NullProgress, Progress, TextProgress
from certify.report.card import renderer_info
from certify.report.write import write_report
from certify.results import ModelCardDoc, RunResult
from certify.rundir import DEMO_DATA, RunDir, check_out_dir
from certify.suite import classes_for_run, load_suite
from certify.version import __version__

log = logging.getLogger("certify")


@dataclass(frozen=True)
class RunOptions:
    """Everything ``certify run`` takes; ``None`` means "as the suite says"."""

    model: str
    suite: str
    data: str | None = None
    out: Path = Path("certify-run")
    #: a class-stratified subset of the data of this size; ``"all"``: every sample, and every
    #: check on all of them (the suite's per-check ``samples`` lifted)
    samples: int | Literal["all"] | None = None
    sample_offset: int = 0
    seed: int | None = None
    device: str = "auto"
    batch_size: int = 256
    resume: bool = False
    input_scale: float | None = None
    mean: tuple[float, float, float] | None = None
    std: tuple[float, float, float] | None = None
    channel_order: str | None = None
    pdf: bool = True
    reference: str | None = None
    sign_key: Path | None = None
    passphrase: bytes | None = None
    http: HttpOptions | None = None
    query_budget: int | None = None
    input_size: tuple[int, int] | None = None
    executor: str = "local"
    ray_address: str | None = None
    workers: int = 2
    threads: int = 1
    #: an ONNX file whose graph the white-box attacks use on an endpoint (a transfer attack)
    surrogate: str | None = None
    #: the service run this is (``{"run_id": …}``), signed into the provenance so that a card
    #: cannot pass for another run's (``None`` outside ``certify serve``)
    service: dict[str, str] | None = None
    #: model details the model's team states (name, version, owner, license, intended use)
    model_card: ModelCardDoc | None = None
    #: "public": no host name and no absolute local path in the signed provenance (paths cut
    #: to what the reader needs: a relative path as given, else a base name); "full": as given
    provenance: str = "public"
    #: a labels file (one class name per line, in class-id order): the class names, before
    #: the suite's, the data's and the model's metadata (``--labels``)
    labels: Path | None = None
    #: seconds the run may take: certify chooses how many samples each attack check gets
    #: (``--time-budget``; :mod:`certify.engine.plan`)
    time_budget: float | None = None
    #: estimate the run's time before the main pass, from a pilot of every check on a few
    #: samples whose records the main pass keeps: ``True`` (``--estimate``), ``False``
    #: (``--no-estimate``), ``None`` where the run may be long (:mod:`certify.engine.pilot`)
    estimate: bool | None = None


#: Builds an in-memory model (the Python API): (device, preprocessing, input size, number of
#: classes the suite expects, or None) -> the model.
ModelFactory = Callable[[DeviceChoice, Preprocessing, "tuple[int, int] | None", "int | None"],
                        Model]


def certify_model(
    opts: RunOptions, progress: Progress | None = None
) -> tuple[RunResult, dict[str, Path]]:
    """Run a suite on a model and write the report; returns (result, written paths).

    Everything that can be refused is refused before the first query: the suite is validated,
    the model loaded and checked against the suite, the data loaded and checked.
    """
    return _certify(opts, progress)


def _certify(opts: RunOptions, progress: Progress | None = None,
             factory: ModelFactory | None = None,
             arrays: tuple[np.ndarray, np.ndarray] | None = None, report: bool = True
             ) -> tuple[RunResult, dict[str, Path]]:
    """:func:`certify_model`, with the model built by ``factory`` instead of loaded from
    ``opts.model`` and the data given as uint8 ``arrays`` instead of read from ``opts.data``
    (the Python API: :func:`evaluate`); ``report=False`` writes no card."""
    progress = progress or NullProgress()
    if (factory is not None or arrays is not None) and opts.executor != "local":
        raise UsageError("a model or data in memory runs on the local executor only",
                         hint="save the model and data to files for --executor ray")
    check_out_dir(opts.out, opts.resume)  # refused before any work, and before any write
    key = pdf_key = None
    if opts.sign_key is not None:  # a bad key (or certificate) is refused before any work
        from certify.report.pades import PdfSigningKey
        from certify.report.sign import load_private_key

        key = load_private_key(opts.sign_key, opts.passphrase)
        pdf_key = PdfSigningKey.for_key_file(opts.sign_key, key)
    suite = load_suite(opts.suite)
    suite.check_thresholds(reference=opts.reference is not None)
    labels = None if opts.labels is None else read_labels(opts.labels)
    data_path = opts.data if opts.data is not None else suite.data.path
    # names the data gives (folder names, an npz class_names array), when nothing before
    # them in the precedence names the classes
    data_names = None if labels is not None or suite.classes or arrays is not None \
        else data_class_names(data_path, suite.data.layout)
    device = choose_device(opts.device)
    pre = suite.preprocessing
    overrides: dict[str, Any] = {
        k: v for k, v in {
            "input_scale": opts.input_scale, "mean": opts.mean, "std": opts.std,
            "channel_order": opts.channel_order,
        }.items() if v is not None
    }
    if overrides:
        pre = dataclasses.replace(pre, **overrides)
    input_size = opts.input_size or suite.input_size
    # in-process models share the cores between the executor's lanes; Ray's workers load
    # their own copies with --threads
    threads = device.onnx_threads if opts.executor == "local" else 0
    count = preliminary_count(suite.class_count, labels, data_names)
    if factory is not None:
        model = factory(device, pre, input_size, count)
    else:
        model = load_model(opts.model, device, pre, input_size=input_size, num_classes=count,
                           http=opts.http, threads=threads, surrogate=opts.surrogate)
    try:
        if opts.resume and model.info.identity.startswith("unidentified"):
            raise UsageError(f"{model.info.name} cannot be resumed: certify cannot identify "
                             "it, so it cannot tell the earlier records are this model's",
                             hint="run it again into a new folder")
        return _run_loaded(opts, progress, suite, model, device, pre, input_size, labels,
                           data_names, data_path, threads, arrays, report, key, pdf_key)
    finally:
        model.close()


def _time_budget(opts: RunOptions, suite: Any, model: Model, data: Any) -> TimeBudget:
    """``--time-budget``'s samples per attack check: the interrupted run's when resuming with
    the same budget (so it continues with the same samples), else chosen now
    (:func:`certify.engine.plan.choose_samples`)."""
    assert opts.time_budget is not None
    skips = suite.skips(model.info)
    live = [s for s in suite.checks if s.id not in skips]
    white = any(getattr(s.check, "white_box", lambda: False)() for s in live)
    rates = calibrate(model, data, gradients=white)
    before = _recorded_budget(opts.out) if opts.resume else None
    if before is not None and before.get("seconds") == opts.time_budget:
        samples = {str(k): int(v) for k, v in before["samples"].items()}
    else:
        samples = choose_samples(live, data, rates, opts.time_budget)
    log.info("time budget %s s: %s", f"{opts.time_budget:,.0f}",
             ", ".join(f"{k} on {v:,} samples" for k, v in samples.items()) or
             "no attack checks to size")
    return TimeBudget(opts.time_budget, rates, samples)


def _recorded_budget(out: Path) -> dict[str, Any] | None:
    """The time budget an interrupted run in ``out`` recorded, if any."""
    try:
        doc = json.loads((out / "run.json").read_text(encoding="utf-8"))
        found = doc["fingerprint"].get("time_budget")
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    return found if isinstance(found, dict) and isinstance(found.get("samples"), dict) \
        else None

def _run_loaded(opts: RunOptions, progress: Progress, suite: Any, model: Model,
                device: DeviceChoice, pre: Preprocessing, input_size: tuple[int, int] | None,
                labels: list[str] | None, data_names: tuple[list[str], str] | None,
                data_path: str | None,
                threads: int, arrays: tuple[np.ndarray, np.ndarray] | None, report: bool,
                key: Any, pdf_key: Any) -> tuple[RunResult, dict[str, Path]]:
    """The run once the model is loaded: classes, reference, data, engine, report."""
    suite = classes_for_run(suite, model.info, labels=labels,
                            labels_source=f"--labels {Path(opts.labels).name}"
                            if opts.labels is not None else "--labels", data=data_names)
    suite.validate_for(model.info)
    if opts.samples == "all":
        suite = suite.every_sample()
    reference = None
    if opts.reference is not None:
        reference = load_model(opts.reference, device, pre, input_size=input_size,
                               num_classes=len(suite.classes), http=opts.http,
                               threads=threads)
        suite.validate_for(reference.info)
    seed = suite.seed if opts.seed is None else opts.seed
    spec = suite.data
    spec = dataclasses.replace(
        spec,
        path=data_path,
        samples=spec.samples if opts.samples is None else
        None if opts.samples == "all" else opts.samples,
        offset=opts.sample_offset,
    )
    if arrays is not None:
        data = load_arrays(*arrays, spec, model.info.input_shape[1:], suite.classes, seed=seed,
                           name=opts.data or "arrays")
    else:
        data = load_dataset(spec, model.info.input_shape[1:], suite.classes, seed=seed,
                            progress=progress)
    data.extra["class_names_source"] = suite.classes_source
    budget = None
    if opts.time_budget is not None:
        budget = _time_budget(opts, suite, model, data)
        suite = suite.with_samples(budget.samples)
    run: RunDir | None = None
    try:
        with contextlib.ExitStack() as stack:
            executor = None
            if opts.executor == "ray":
                executor = stack.enter_context(_ray_executor(opts, pre, input_size, suite))
            # The run directory exists only once every pre-check (suite, model, reference,
            # data, executor) has passed: a refused run leaves nothing behind.
            fingerprint = run_fingerprint(model, suite, data, seed, reference)
            if budget is not None:
                fingerprint["time_budget"] = normalize(budget.fingerprint())
            run = RunDir(opts.out, fingerprint, resume=opts.resume)
            outcome = run_suite(model, data, suite, run, device, seed=seed,
                                batch_size=opts.batch_size, progress=progress,
                                model_spec=_public_spec(opts.model), reference=reference,
                                reference_spec=None if opts.reference is None
                                else _public_spec(opts.reference),
                                query_budget=opts.query_budget, executor=executor,
                                time_budget=budget, estimate=opts.estimate)
    finally:
        if run is not None:
            run.close()
        if reference is not None:
            reference.close()
    result = outcome.result
    extra: dict[str, Any] = {"renderer": renderer_info(opts.pdf), "evaluated_at": _now_utc()}
    if opts.provenance != "full":
        extra.update(public_provenance(result.provenance, opts.out))
    if opts.service is not None:  # a service run: its id, and names instead of its paths
        extra["service"] = {"run_id": opts.service["run_id"]}
        extra.update({k: v for k, v in opts.service.items()
                      if k in ("data_source", "suite_source")})
    card = opts.model_card if opts.model_card is not None and opts.model_card.any() else None
    result = result.model_copy(update={
        "provenance": result.provenance.model_copy(update=extra),
        "measurement": result.measurement.model_copy(update={"model_card": card})})
    if not report:
        return result, {}
    signature = None
    if key is not None:
        from certify.report.sign import sign

        signature = sign(result.to_json(), key)
    paths = write_report(result, opts.out, outcome.images, pdf=opts.pdf, signature=signature,
                         key=key, pdf_signer=pdf_key)
    return result, paths


def _ray_executor(opts: RunOptions, pre: Any, input_size: tuple[int, int] | None,
                  suite: Any) -> Any:
    from certify.distributed import ModelSource, RayExecutor

    def source(spec: str, surrogate: str | None = None) -> ModelSource:
        return ModelSource(spec, opts.device, pre, input_size, len(suite.classes), opts.http,
                           surrogate)

    return RayExecutor(source(opts.model, opts.surrogate),
                       None if opts.reference is None else source(opts.reference),
                       address=opts.ray_address, workers=opts.workers, threads=opts.threads)


def _now_utc() -> str:
    """The evaluation's date and time (UTC, to the second), signed with the provenance."""
    import datetime

    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def public_path(path: str, out: Path) -> str:
    """A local path as the signed card may show it: relative to the run folder when inside it
    (the demo's data), as given when relative and inside the working folder, else its base
    name. URLs lose their credentials."""
    from certify.redact import redact

    if path.startswith(("http://", "https://")):
        return redact(path)
    p = Path(path)
    with contextlib.suppress(ValueError, OSError):
        return p.resolve().relative_to(out.resolve()).as_posix()
    if not p.is_absolute() and ".." not in p.parts:
        return p.as_posix()
    return p.name


def public_provenance(prov: Any, out: Path) -> dict[str, Any]:
    """The provenance fields that would publish this machine: the host name is left out and
    local paths are cut (:func:`public_path`); a packaged suite is named as such."""
    from certify.suite import packaged_suites

    packaged = {str(v.resolve()): k for k, v in packaged_suites().items()}
    name = None
    with contextlib.suppress(OSError):
        name = packaged.get(str(Path(prov.suite_source).resolve()))
    suite_source = (f"packaged suite {name} (certify {__version__})"
                    if name is not None else public_path(prov.suite_source, out))
    env = {k: v for k, v in prov.environment.items() if k != "host"}
    return {"data_source": public_path(prov.data_source, out), "suite_source": suite_source,
            "environment": env}


def _public_spec(spec: str) -> str:
    """The model argument as it may appear on the card: no credentials, no local folders.

    A URL loses its credentials (:func:`certify.redact.redact`); a file keeps its base name,
    so no absolute local path is signed into the results.
    """
    from certify.redact import redact

    if spec.startswith(("http://", "https://")):
        return redact(spec)
    return Path(spec).name


def sign_run(run_dir: Path, key_path: Path, passphrase: bytes | None = None,
             pdf: bool = True) -> dict[str, Path]:
    """Sign a finished run's results.json and re-render its card with the signature (card.pdf
    with a PDF signature too); the provenance's ``renderer`` becomes this certify's, which
    renders the card.

    Only results in this certify's format are signed (README, "Results formats"): an older
    format, or a file this certify cannot render, is refused with a UsageError that says so.
    """
    import json

    import jinja2

    from certify.canonical import canonical_json
    from certify.errors import UsageError
    from certify.report.pades import PdfSigningKey
    from certify.report.sign import is_older_format, load_private_key, sign
    from certify.report.write import load_images
    from certify.results import OLD_SCHEMAS, SCHEMA, SchemaError, parse_result

    key = load_private_key(key_path, passphrase)
    pdf_key = PdfSigningKey.for_key_file(key_path, key) if pdf else None
    path = run_dir / "results.json"
    try:
        raw = path.read_bytes()
        doc = json.loads(raw)
    except FileNotFoundError:
        raise UsageError(f"{path} not found", hint="sign the --out folder of a finished run") \
            from None
    except ValueError:
        raise UsageError(f"{path} is not valid JSON", hint="was it edited?") from None
    rerun = "rerun the suite with this certify, then sign that run"
    fmt = doc.get("schema") if isinstance(doc, dict) else None
    if fmt != SCHEMA:
        older = fmt in OLD_SCHEMAS or is_older_format(str(fmt))
        raise UsageError(f"{path} is in the {'older ' if older else ''}results format {fmt!r}; "
                         f"this certify signs {SCHEMA!r} only", hint=rerun)
    if raw != canonical_json(doc):
        raise UsageError(f"{path} is not in certify's canonical form",
                         hint="it was edited after the run; rerun instead of signing it")
    try:
        result = parse_result(doc)
        # the card is rendered now: its provenance names this renderer (a verifier compares
        # card.html with a fresh rendering only where the renderer is its own)
        result = result.model_copy(update={"provenance": result.provenance.model_copy(
            update={"renderer": renderer_info(pdf)})})
        return write_report(result, run_dir, load_images(run_dir), pdf=pdf,
                            signature=sign(result.to_json(), key), key=key,
                            pdf_signer=pdf_key)
    except SchemaError as exc:
        raise UsageError(f"{path} cannot be signed: {exc.message}", hint=rerun) from None
    except (jinja2.TemplateError, KeyError, AttributeError, TypeError) as exc:
        # the format's label is this certify's but its fields are an earlier release's (a
        # results.json from before issue 29 reads as certify.results/2 and lacks what the
        # card shows now): nothing was written, since the card renders before any write
        raise UsageError(f"{path} cannot be rendered by this certify ({type(exc).__name__}: "
                         f"{exc}): it was written by an earlier release of the same results "
                         "format, or edited", hint=rerun) from None


DEMO_SEED = 20_240_607  # the demo test set; training used other seeds/indices
DEMO_PER_CLASS = 10


def demo_model_path(name: str = "standard") -> Path:
    """Path of a bundled demo model (``standard`` or ``robust``)."""
    import importlib.resources

    path = Path(str(importlib.resources.files("certify.demo") / f"{name}.onnx"))
    if not path.is_file():
        raise ModelError(
            f"the bundled demo model {name}.onnx is missing from {path.parent}",
            hint="reinstall certify, or rebuild it with scripts/train_demo.py",
        )
    return path


#: What the demo's card states about its model (the flags of ``certify run`` would).
DEMO_MODEL_CARD = ModelCardDoc(
    name="certify demo traffic-sign classifier (standard training)",
    version=f"demo, certify {__version__}",
    owner="the certify project",
    license="Apache-2.0",
    intended_use="A demonstration of certify's card: a small CNN trained on generated "
                 "GTSRB-like traffic signs, evaluated on generated signs. Not for use on "
                 "roads or real images.")


def run_demo(
    out: Path, progress: Progress | None = None, pdf: bool = True, resume: bool = False,
    suite: str = "gtsrb", **run_options: Any,
) -> tuple[RunResult, dict[str, Path]]:
    """Certify the bundled standard model on a seeded synthetic GTSRB-like test set.

    ``suite``: the packaged ``gtsrb`` suite by default, or another suite (name or path) over
    the same 43 classes, e.g. a short one to try an executor or an install.
    """
    import numpy as np

    from certify.demo.synthetic import generate

    model = demo_model_path("standard")
    # Same rules as `certify run`, checked before the demo data is written: an earlier demo
    # run in `out` needs --resume, and a folder that is not a run is refused untouched.
    check_out_dir(out, resume)
    data_dir = out / DEMO_DATA
    data_dir.mkdir(parents=True, exist_ok=True)
    x, y = generate(DEMO_PER_CLASS, seed=DEMO_SEED)
    npz = data_dir / "synthetic-gtsrb-test.npz"
    np.savez(npz, x=x, y=y)
    run_options.setdefault("model_card", DEMO_MODEL_CARD)
    opts = RunOptions(model=str(model), suite=suite, data=str(npz), out=out,
                      samples=len(y), resume=resume, pdf=pdf,
                      reference=str(demo_model_path("robust")), **run_options)
    return certify_model(opts, progress)


def evaluate(model: Any, data: Any, suite: str = "gtsrb", out: str | Path | None = None, *,
             output: str | None = None,
             progress: Progress | Literal["text"] | None = "text",
             **options: Any) -> RunResult:
    """Evaluate ``model`` on ``data`` with ``suite``: the Python API, the same engine as
    ``certify run`` and ``certify serve``.

    ``model`` is one of:

    - a path or a URL, as ``certify run`` takes it (ONNX, ``.pt2``, TorchScript, an endpoint);
    - a ``torch.nn.Module`` in memory: evaluated in eval mode as a white-box model, exported
      with ``torch.export`` and identified by the digest of that program (a module that cannot
      be exported is run as it is and declared unidentified on the card);
    - an object with ``predict(batch) -> scores``: a black-box model. ``batch`` is a float32
      numpy array ``[N, C, H, W]``, the images in ``[0, 1]`` after the suite's preprocessing
      (as certify's own models receive them); it returns ``[N, K]`` logits or probabilities
      (``output="logits"`` or ``"probs"`` declares which; by default certify reads it off the
      answers) or ``[N]`` labels, as an array or a tensor. Only black-box attacks apply.

    ``data`` is a path (as ``--data``), an ``(images, labels)`` pair (``N×H×W×C`` uint8 or
    ``N×C×H×W`` float in ``[0, 1]``, labels ``[N]`` integers; both checked), or an iterable of
    such pairs (read once and kept). ``suite``: a packaged suite's name or a suite file.
    ``out``: the folder the card (``card.html``, ``card.pdf``, ``results.json``) is written
    to; without it nothing is written and only the result is returned. ``output``
    (``"logits"``, ``"probs"`` or ``"labels"``): what a ``predict`` object returns.
    ``progress``: ``"text"`` (the default) shows each task's progress on stderr, one line
    rewritten in place in a terminal or a notebook (:class:`~certify.progress.TextProgress`);
    ``None`` is quiet; any object with ``start``/``advance``/``finish``
    (:class:`~certify.progress.Progress`) receives it instead.

    Further keyword arguments are :class:`RunOptions` fields, among them:

    - ``samples`` (``int``, or ``"all"``): a class-stratified subset of the data;
      ``sample_offset`` (``int``) skips the first ones of its seeded order;
    - ``seed`` (``int``): overrides the suite's seed;
    - ``device`` (``"auto"``, ``"cpu"`` or ``"cuda"``); ``batch_size`` (``int``);
    - ``input_size`` (``(H, W)``): the model's input size, for a model in memory;
    - ``reference`` (``str``): a reference model's path, as ``--reference``;
    - ``model_card`` (:class:`~certify.results.ModelCardDoc`, or a ``dict`` of its fields
      ``name``, ``version``, ``owner``, ``license``, ``intended_use``, all ``str``): what the
      model's team states about it, shown on the card;
    - ``pdf`` (``bool``): write ``card.pdf`` too; ``sign_key`` (``Path``) and
      ``passphrase`` (``bytes``): sign the card;
    - ``time_budget`` (``float``, seconds), ``query_budget`` (``int``), ``labels``
      (``Path``), ``surrogate`` (``str``), ``mean``/``std`` (three ``float``),
      ``input_scale`` (``float``), ``channel_order`` (``"RGB"`` or ``"BGR"``).

    Returns the typed :class:`~certify.results.RunResult`. Raises certify's errors
    (:class:`~certify.errors.UsageError`, ``ModelError``, ``DataError``, ``SuiteError``) for
    anything refused, before the first query.
    """
    import tempfile

    from certify.data.loaders import images_from_python

    for reserved in ("model", "data", "suite", "out"):
        options.pop(reserved, None)
    if progress != "text" and progress is not None and not all(
            callable(getattr(progress, m, None)) for m in ("start", "advance", "finish")):
        raise UsageError(f"progress={progress!r} is not 'text', None or a Progress",
                         hint="progress=None is quiet; a Progress has start, advance and "
                              "finish")
    if isinstance(options.get("model_card"), dict):
        from pydantic import ValidationError

        try:
            options["model_card"] = ModelCardDoc(**options["model_card"])
        except ValidationError as exc:
            raise UsageError(f"model_card: {exc.errors()[0]['msg']} "
                             f"({'.'.join(map(str, exc.errors()[0]['loc']))})",
                             hint="its fields: name, version, owner, license, "
                                  "intended_use (strings)") from None
    arrays = None
    data_name: str | None = None
    if isinstance(data, (str, Path)):
        data_name = str(data)
    else:
        arrays = _arrays_of(data, images_from_python)
        data_name = f"arrays ({len(arrays[1])} images given in Python)"
    factory, name = _factory_for(model, output)
    if factory is not None and options.get("input_size") is None:
        # a model in memory states no input size: input_size=, else the suite's, else the
        # images' own (data read from a path is resized to it, as for any model)
        size = load_suite(suite).input_size
        if size is None and arrays is not None:
            size = (int(arrays[0].shape[1]), int(arrays[0].shape[2]))
        if size is None:
            raise UsageError("a model in memory does not state its input size",
                             hint="pass input_size=(H, W), or give the data as arrays")
        options["input_size"] = size
    with tempfile.TemporaryDirectory(prefix="certify-evaluate-") as tmp:
        folder = Path(out) if out is not None else Path(tmp) / "run"
        try:
            opts = RunOptions(model=name, suite=suite, data=data_name, out=folder, **options)
        except TypeError as exc:
            raise UsageError(f"evaluate() got an option it does not know ({exc})",
                             hint="the options are RunOptions' fields") from None
        shown: Progress | None = TextProgress() if progress == "text" else progress
        result, _ = _certify(opts, shown, factory=factory, arrays=arrays,
                             report=out is not None)
    return result


def _arrays_of(data: Any, convert: Callable[[Any, Any], tuple[np.ndarray, np.ndarray]]
               ) -> tuple[np.ndarray, np.ndarray]:
    """An ``(images, labels)`` pair or an iterable of them, as one uint8 array pair."""
    if isinstance(data, (tuple, list)) and len(data) == 2 \
            and getattr(data[0], "ndim", None) == 4:  # one (images, labels) pair
        return convert(*data)
    xs, ys = [], []
    try:
        for k, batch in enumerate(data):
            if not (isinstance(batch, (tuple, list)) and len(batch) == 2):
                raise UsageError(f"batch {k} of the data is not an (images, labels) pair",
                                 hint="give data as a path, (images, labels) or an iterable "
                                      "of such pairs")
            x, y = convert(*batch)
            xs.append(x)
            ys.append(y)
    except TypeError:
        raise UsageError(f"data of type {type(data).__name__} is neither a path, an (images, "
                         "labels) pair nor an iterable of them",
                         hint="give data as a path, (images, labels) or batches") from None
    if not xs:
        raise UsageError("the data iterable gave no batches", hint="give at least one batch")
    if len({x.shape[1:] for x in xs}) != 1:
        raise UsageError("the data's batches hold images of different sizes",
                         hint="give images of one size")
    return np.concatenate(xs), np.concatenate(ys)


def _factory_for(model: Any, output: str | None) -> tuple[ModelFactory | None, str]:
    """How :func:`evaluate` gets ``model``: (a factory for one in memory, or None for a path
    or URL; the name the card gives it)."""
    if isinstance(model, (str, Path)):
        if output is not None:
            raise UsageError("output= is for predict() objects",
                             hint="a model file or endpoint states its own outputs")
        return None, str(model)
    import torch

    from certify.models.torchprog import PredictModel, from_module

    if isinstance(model, torch.nn.Module):
        module = model

        def load_module(device: DeviceChoice, pre: Preprocessing,
                        size: tuple[int, int] | None, count: int | None) -> Model:
            assert size is not None  # evaluate() sets it
            return from_module(module, device, pre, size, count)

        return load_module, f"{type(model).__name__} (torch.nn.Module in memory)"
    if callable(getattr(model, "predict", None)):
        obj = model

        def load_predict(device: DeviceChoice, pre: Preprocessing,
                         size: tuple[int, int] | None, count: int | None) -> Model:
            assert size is not None  # evaluate() sets it
            return PredictModel(obj, (3, *size), pre, output, count)

        return load_predict, f"{type(model).__name__} (Python object with predict)"
    raise UsageError(f"a {type(model).__name__} is not a model certify can evaluate",
                     hint="give a path, a URL, a torch.nn.Module or an object with "
                          "predict(batch) -> scores")
