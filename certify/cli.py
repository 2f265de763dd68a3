"""The certify command line: parse, call the library, map errors to exit codes.

Exit codes, the same for every command (the one table is ``certify.errors.EXIT_CODES``):

0    OK: run: every check PASS or INFO; demo: the card was written, whatever its verdict;
     verify, verify-bundle: valid; compare: no resolved regression; other commands: done
1    FAIL: run: a check failed (card written); verify, verify-bundle: invalid or tampered;
     compare: a resolved regression on a threat model or check with a threshold
2    usage, suite or data error
3    the model could not be loaded, reached or used
4    not comparable: compare's two runs differ in suite, data, threat model, reference model
     or results schema (compare: 0 no resolved regression, 1 a resolved regression on a
     threat model or check with a threshold)
5    run: a check ERRORed (card written)
6    run: a check is INCONCLUSIVE (card written)
7    run: a check passed with a WARNing (card written)
8    verify: the signature and the signed payload are intact but the visible layer was not
     compared (a card from another renderer, or a card.pdf from before PDF signatures)
9    untrusted: compare --pubkey, runs fetch/watch and submit met a card (or a service's
     answer) that cannot be trusted: unsigned, tampered, another key's, not in the log
70   internal error (a bug: rerun with --debug, or CERTIFY_DEBUG=1, and report it)
130  interrupted (records kept, rerun with --resume)

A run's verdict, and so its code, is the most severe of its checks' verdicts:
ERROR > FAIL > INCONCLUSIVE > WARN > PASS. SKIPPED checks (not evaluated on this model) are
listed and counted but left out of the verdict; a suite whose every check is skipped is
refused (2).
"""

from __future__ import annotations

import contextlib
import functools
import io
import logging
import os
import re
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import click

from certify.device import DEVICE_CHOICES
from certify.errors import (
    EXIT_CODES,
    EXIT_INTERNAL,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_USAGE,
    EXIT_VISIBLE_NOT_COMPARED,
    VERDICT_PRECEDENCE,
    CertifyError,
    UsageError,
    exit_code_for_verdict,
)
from certify.model_card import model_card_from, model_card_options
from certify.redact import install_log_filters, redact
from certify.tolerance import TOLERANCE_RULE
from certify.version import __version__

if TYPE_CHECKING:
    from rich.console import Console


@functools.cache
def _err() -> Console:
    """The console certify's messages go to (stderr), made on first use: rich is imported
    only by commands that print through it (``verify`` and ``keygen`` print plain lines)."""
    from rich.console import Console

    return Console(stderr=True)


def escape(text: str) -> str:
    """``text`` with rich markup escaped."""
    from rich.markup import escape as rich_escape

    return rich_escape(text)

log = logging.getLogger("certify")


class RichProgress:
    """The one progress reporter: a rich bar per task, with samples per second.

    Without a terminal (a CI log) rich draws the bars only when they end, so a plain line with
    the task's progress, rate and ETA is printed instead when a task starts and at least every
    :attr:`LINE_EVERY_S` seconds while it runs (from a timer, so a long batch does not silence
    it). A resumed run's records (:meth:`reuse`) count as done and are named as reused; the
    rate counts only the samples evaluated in this process.
    """

    #: Seconds between plain progress lines without a terminal.
    LINE_EVERY_S = 30.0

    def __init__(self, console: Console, enabled: bool) -> None:
        self._console = console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TaskProgressColumn,
            TextColumn,
            TimeElapsedColumn,
        )

        self._plain = enabled and not console.is_terminal
        self._progress = Progress(
            TextColumn("[bold]{task.description:<14}"),
            BarColumn(),
            MofNCompleteColumn(),
            TaskProgressColumn(),
            TextColumn("{task.fields[rate]}"),
            TimeElapsedColumn(),
            console=console,
            disable=not enabled or self._plain,
        )
        self._task: Any = None
        self._label = ""
        self._total = 0
        self._t0 = 0.0
        self._done = 0
        self._reused = 0  # of _done: records of an earlier run, outside the rate
        self._shown = -1  # _done as the last plain line gave it
        self._step = ""  # the running step of the task (until it advances)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._ticker: threading.Thread | None = None

    def __enter__(self) -> RichProgress:
        self._progress.start()
        if self._plain:
            self._ticker = threading.Thread(target=self._tick, name="certify-progress",
                                            daemon=True)
            self._ticker.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._ticker is not None:
            self._ticker.join(timeout=5)
        self._progress.stop()

    def _tick(self) -> None:
        last = time.perf_counter()
        while not self._stop.wait(min(1.0, self.LINE_EVERY_S)):
            if time.perf_counter() - last >= self.LINE_EVERY_S:
                last = time.perf_counter()
                self._line()

    def _line(self) -> None:
        """One plain line: task, samples done of total, share, reused records, rate and ETA."""
        with self._lock:
            if not self._label:
                return
            label, done, total, old = self._label, self._done, self._total, self._reused
            step = self._step
            elapsed = time.perf_counter() - self._t0
            self._shown = done
        rate = (done - old) / elapsed if elapsed > 0 else 0.0
        eta = ("done" if total and done >= total else
               f"ETA {(total - done) / rate:,.0f} s" if rate > 0 and total else "ETA unknown")
        share = f"{100 * done / total:.0f}%" if total else "-"
        parts = [f"{label}: {done:,}/{total:,} samples ({share})"]
        if step:
            parts.append(step)
        if old:
            parts.append(f"{old:,} reused from the earlier run")
        if done > old:  # a rate only over the samples evaluated in this process
            parts.append(f"{rate:,.1f} samples/s")
        self._console.print(", ".join([*parts, f"{elapsed:,.0f} s elapsed", eta]),
                            markup=False, highlight=False, soft_wrap=True)

    def start(self, label: str, total: int) -> None:  # noqa: D102
        self._task = self._progress.add_task(label, total=total, rate="")
        with self._lock:
            self._label, self._total = label, total
            self._t0 = time.perf_counter()
            self._done = self._reused = 0
            self._step = ""
        if self._plain:
            self._line()

    def step(self, text: str) -> None:
        """Name the running step of the task (a check's binarization test, k of n) beside
        its bar, and on a plain line at once, until the task advances."""
        if self._task is None:
            return
        with self._lock:
            self._step = text
        self._progress.update(self._task, rate=text)
        if self._plain:
            self._line()

    def reuse(self, n: int) -> None:
        """``n`` samples of the task were recorded by an earlier run (``--resume``): shown
        as done and as reused, and kept out of the rate."""
        if self._task is None or n <= 0:
            return
        with self._lock:
            self._done += n
            self._reused += n
        self._progress.update(self._task, advance=n, rate=f"{n:,} reused")
        if self._plain:
            self._line()

    def advance(self, n: int) -> None:  # noqa: D102
        if self._task is None:
            return
        with self._lock:
            self._done += n
            self._step = ""
            new, old = self._done - self._reused, self._reused
        elapsed = time.perf_counter() - self._t0
        rate = f"{new / elapsed:,.0f} samples/s" if elapsed > 0 and new > 0 else ""
        if old:
            rate = ", ".join(filter(None, (rate, f"{old:,} reused")))
        self._progress.update(self._task, advance=n, rate=rate)

    def finish(self) -> None:  # noqa: D102
        if self._plain and self._label and self._done != self._shown:  # else said already
            self._line()
        with self._lock:
            self._label = ""
        self._task = None


def _setup_logging(debug: bool, quiet: bool) -> None:
    level = logging.DEBUG if debug else logging.WARNING if quiet else logging.INFO
    from rich.logging import RichHandler

    handler = RichHandler(console=_err(), show_time=False, show_path=False,
                          markup=False, rich_tracebacks=debug)
    handler.setFormatter(logging.Formatter("%(message)s"))
    install_log_filters(handler)
    log.handlers[:] = [handler]
    log.setLevel(level)
    log.propagate = False


def _fail(exc: CertifyError, debug: bool) -> int:
    if debug:
        import traceback

        _err().print(escape(redact(traceback.format_exc())), highlight=False)
    hint = f" [dim](hint: {escape(exc.hint)})[/]" if exc.hint else ""
    _err().print(f"[bold red]error:[/] {escape(exc.message)}{hint}", highlight=False,
                      soft_wrap=True)
    return exc.exit_code


class _ReaderGone(io.TextIOBase):
    """stdout that lets a command finish when its reader has gone (``certify verify … | true``,
    ``certify suites show | head``): after a broken pipe, output is dropped and file descriptor 1
    points at /dev/null, so the exit code stays the command's own, not an error's."""

    def __init__(self, raw: Any) -> None:
        super().__init__()
        self._raw = raw
        self._gone = False

    def _drop(self) -> None:
        self._gone = True
        try:
            null = os.open(os.devnull, os.O_WRONLY)
            os.dup2(null, self._raw.fileno())  # the interpreter's last flush must not fail
            os.close(null)
        except (OSError, ValueError, io.UnsupportedOperation):
            pass

    def write(self, s: str) -> int:  # noqa: D102
        if not self._gone:
            try:
                return int(self._raw.write(s))
            except BrokenPipeError:
                self._drop()
        return len(s)

    def flush(self) -> None:  # noqa: D102
        if not self._gone:
            try:
                self._raw.flush()
            except BrokenPipeError:
                self._drop()

    def isatty(self) -> bool:  # noqa: D102
        return bool(self._raw.isatty())

    def fileno(self) -> int:  # noqa: D102
        return int(self._raw.fileno())

    @property
    def encoding(self) -> str:  # type: ignore[override]  # noqa: D102
        return str(getattr(self._raw, "encoding", None) or "utf-8")

    @property
    def buffer(self) -> Any:  # noqa: D102
        return getattr(self._raw, "buffer", None)


class _Group(click.Group):
    """Maps certify errors to exit codes and one clear line, with no traceback."""

    def main(self, *args: Any, **kwargs: Any) -> Any:  # noqa: D102
        kwargs["standalone_mode"] = False
        argv = kwargs.get("args", args[0] if args else None)
        words = sys.argv[1:] if argv is None else [str(a) for a in argv]
        debug = "--debug" in words or bool(os.environ.get("CERTIFY_DEBUG"))
        self._debug_flag = self._has_debug_option(words)
        stdout = sys.stdout
        sys.stdout = _ReaderGone(stdout)
        try:
            return self._main(debug, *args, **kwargs)
        finally:
            sys.stdout = stdout

    def _has_debug_option(self, words: list[str]) -> bool:
        """Whether the command these arguments name takes ``--debug`` (``sign`` does not):
        an internal error's hint must name a way to the traceback that exists."""
        cmd: click.Command = self
        for w in words:
            if isinstance(cmd, click.Group) and w in cmd.commands:
                cmd = cmd.commands[w]
        return any(p.name == "debug" for p in cmd.params)

    def _main(self, debug: bool, *args: Any, **kwargs: Any) -> Any:
        try:
            rv = super().main(*args, **kwargs)
        except click.exceptions.Exit as e:
            sys.exit(e.exit_code)
        except click.ClickException as e:
            e.show()
            sys.exit(EXIT_USAGE)
        except CertifyError as e:
            sys.exit(_fail(e, debug))
        except (KeyboardInterrupt, click.exceptions.Abort):
            # click turns Ctrl-C into Abort; records already on disk are durable.
            _err().print("[yellow]interrupted[/]: what a run recorded is kept; where "
                              "its --out folder was made, the same command with --resume "
                              "continues it")
            sys.exit(EXIT_INTERRUPTED)
        except Exception as e:  # noqa: BLE001 - last resort: one line, not a traceback
            if debug:  # the traceback, redacted like every other line certify prints
                import traceback

                sys.stderr.write(redact(traceback.format_exc()))
                sys.exit(EXIT_INTERNAL)
            how = ("--debug" if getattr(self, "_debug_flag", False)
                   else "CERTIFY_DEBUG=1 in the environment")
            _err().print(f"[bold red]internal error:[/] {escape(type(e).__name__)}: "
                              f"{escape(redact(str(e)))} [dim](hint: rerun with {how} for the "
                              "traceback, and report it)[/]", highlight=False, soft_wrap=True)
            sys.exit(EXIT_INTERNAL)
        sys.exit(rv if isinstance(rv, int) else EXIT_OK)


def _exit_code_epilog() -> str:
    rows = "\n".join(f"  {code:<4} {meaning}" for code, meaning in EXIT_CODES.items())
    return (f"\b\nExit codes (every command; a run's verdict is the most severe of its "
            f"evaluated checks': {' > '.join(VERDICT_PRECEDENCE)}; SKIPPED checks are "
            f"listed, never passed):\n{rows}")



class _SamplesParam(click.ParamType):
    """``--samples``: a whole number of at least 1, or ``all``."""

    name = "N|all"

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> int | Literal["all"]:
        """The number, or ``"all"``; a usage error for anything else."""
        if isinstance(value, int) and not isinstance(value, bool):
            number = value
        elif str(value).strip().lower() == "all":
            return "all"
        else:
            try:
                number = int(str(value))
            except ValueError:
                self.fail(f"{value!r} is neither a whole number nor all", param, ctx)
        if number < 1:
            self.fail(f"{number} is below 1 (a whole number of at least 1, or all)", param, ctx)
        return number

@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]},
             epilog=_exit_code_epilog())
@click.version_option(__version__, prog_name="certify")
def main() -> None:
    """certify: robustness model cards for image classifiers.

    \b
    Examples:
      certify run model.onnx --suite gtsrb --data GTSRB/Final_Test/Images
      certify run model.onnx --suite my-suite.yaml --data test.npz --samples 200
      certify run model.onnx --suite gtsrb --data Test.csv --out run1 --resume
      certify suites list
      certify demo --out demo-card
    """


def _executor_options(f: Any) -> Any:
    f = click.option("--threads", type=click.IntRange(min=1), default=1, show_default=True,
                     help="Ray: CPU threads per worker.")(f)
    f = click.option("--workers", type=click.IntRange(min=1), default=2, show_default=True,
                     help="Ray: number of workers (one GPU each where the cluster has GPUs).")(f)
    f = click.option("--ray-address", metavar="ADDRESS",
                     help="Ray: an existing cluster (e.g. ray://head:10001); default: start a "
                          "local one on 127.0.0.1.")(f)
    return click.option("--executor", type=click.Choice(["local", "ray"]), default="local",
                        show_default=True,
                        help="Where checks run: this process, or Ray workers "
                             '(the extra certify[ray]: pip install ".[ray]").')(f)


def _refuse_idle_ray_flags(executor: str) -> None:
    """--workers, --threads and --ray-address given without --executor ray are a mistake."""
    if executor == "ray":
        return
    ctx = click.get_current_context()
    given = [f"--{name.replace('_', '-')}" for name in ("ray_address", "workers", "threads")
             if ctx.get_parameter_source(name) == click.core.ParameterSource.COMMANDLINE]
    if given:
        raise UsageError(f"{', '.join(given)} only apply with --executor ray",
                         hint="add --executor ray, or drop those options")


def _common_logging(f: Any) -> Any:
    f = click.option("--debug", is_flag=True, help="Show tracebacks and debug logs.")(f)
    return click.option("--quiet", "-q", is_flag=True, help="Only warnings and errors.")(f)


@main.command()
@click.argument("model")
@click.option("--suite", "suite_name", required=True, metavar="NAME|PATH",
              help="A packaged suite name (see `certify suites list`) or a YAML file.")
@click.option("--data", "data_path", metavar="PATH",
              help="Evaluation data: GTSRB folder or CSV, image folder, or .npz.")
@click.option("--labels", "labels_path", type=click.Path(dir_okay=False, path_type=Path),
              metavar="FILE",
              help="Class names, one per line in class-id order (before the suite's, the "
                   "data's folder names or class_names, and the model's metadata).")
@click.option("--out", "out_dir", default="certify-run", show_default=True,
              type=click.Path(file_okay=False, path_type=Path), help="Run directory.")
@click.option("--samples", type=_SamplesParam(), metavar="N|all",
              help="Class-stratified, seeded subset of this size; all: every sample, and "
                   "every check on all of them (the suite's per-check samples lifted).")
@click.option("--time-budget", metavar="DURATION",
              help="Let certify choose how many samples each attack check attacks so that the "
                   "checks' model time (queries and gradient evaluations, priced by a short "
                   "calibration on this device; the binarization tests included) fits this "
                   "time (e.g. 10m, 600s, 1.5h); the checks' own work comes on top, so the "
                   "run takes longer. The card states the choice.")
@click.option("--estimate/--no-estimate", default=None,
              help="Estimate the run's time before the main pass (every check runs on a few "
                   "samples first, their records kept where they can be) and log its expected "
                   "and at-most time [default: where the plan's model time may pass 2 min, or "
                   "an endpoint's queries 200,000].")
@click.option("--sample-offset", type=click.IntRange(min=0), default=0,
              help="Skip this many samples of the seeded order first: --samples N "
                   "--sample-offset N evaluates samples disjoint from --samples N.")
@click.option("--seed", type=click.IntRange(min=0, max=2**63 - 1), help="Override the suite seed.")
@click.option("--device", type=click.Choice(DEVICE_CHOICES), default="auto", show_default=True,
              help="Where the model and attacks run: auto takes a CUDA GPU when there is one "
                   "and falls back to the CPU with one log line.")
@click.option("--batch-size", type=click.IntRange(min=1), default=256, show_default=True,
              help="Samples per batch handed to a check (smaller on the CPU for large images; "
                   "results do not depend on it).")
@click.option("--resume", is_flag=True, help="Continue an interrupted run in --out.")
@click.option("--input-scale", type=click.FloatRange(min=0, min_open=True),
              help="Model input range: 1 for [0,1], 255 for [0,255] (overrides the suite).")
@click.option("--mean", type=float, nargs=3, help="Per-channel mean (overrides the suite).")
@click.option("--std", type=float, nargs=3, help="Per-channel std (overrides the suite).")
@click.option("--channel-order", type=click.Choice(["RGB", "BGR"]),
              help="Channel order the model expects (overrides the suite).")
@click.option("--no-pdf", is_flag=True, help="Skip card.pdf.")
@click.option("--reference", metavar="MODEL",
              help="A reference model to compare against (brittle score R.I.).")
@click.option("--surrogate", metavar="MODEL.onnx",
              help="HTTP: a local ONNX model of the endpoint's task; the white-box attacks "
                   "take its gradients and the endpoint judges every candidate (a transfer "
                   "attack: its breaks count, it never supports a PASS).")
@click.option("--sign-key", type=click.Path(dir_okay=False, path_type=Path),
              help="Sign the results with this private key (from `certify keygen`).")
@click.option("--passphrase-env", metavar="VAR",
              help="Environment variable holding the signing key's passphrase.")
@click.option("--query-budget", type=click.IntRange(min=1),
              help="Most model queries for the whole run (resumed records included).")
@click.option("--auth-env", metavar="VAR",
              help="HTTP: environment variable holding the auth header's value.")
@click.option("--auth-header", metavar="NAME",
              help="HTTP: header the --auth-env value is sent in [default: Authorization].")
@click.option("--timeout", type=click.FloatRange(min=0, min_open=True),
              help="HTTP: the longest an attempt waits for an answer; after warm-up the "
                   "deadline follows the observed latency [default: 30].")
@click.option("--no-hedge", "hedge", flag_value=False, default=None,
              help="HTTP: never send a duplicate of a slow request (hedging is on by default, "
                   "at most 5% of requests, never after a 429 or 503).")
@click.option("--breaker-wait", type=click.FloatRange(min=0),
              help="HTTP: seconds the circuit breaker probes a failing endpoint's health "
                   "before the run ends with exit 3 [default: 60].")
@click.option("--max-requests", type=click.IntRange(min=1),
              help="HTTP: most requests this invocation may send, retries included (model "
                   "queries are capped by --query-budget).")
@click.option("--retries", type=click.IntRange(min=0),
              help="HTTP: retries on connection errors, timeouts, 5xx and 429 [default: 5].")
@click.option("--concurrency", type=click.IntRange(min=1),
              help="HTTP: requests in flight at once, besides a hedge at most for each "
                   "(hedges are at most 5% of requests) [default: 4].")
@click.option("--http-batch", type=click.IntRange(min=1),
              help="HTTP: images per request [default: 64].")
@click.option("--input-size", type=click.IntRange(min=1), nargs=2, metavar="H W",
              help="Model input size, when the model does not state it (overrides the suite).")
@click.option("--input-layout", type=click.Choice(["NCHW", "NHWC"]),
              help="HTTP v1: the layout the endpoint expects [default: NHWC].")
@click.option("--provenance", type=click.Choice(["public", "full"]), default="public",
              show_default=True,
              help="public: no host name and no absolute local path in the signed card; "
                   "full: the paths as given and the host name.")
@model_card_options
@_executor_options
@_common_logging
def run(model: str, suite_name: str, data_path: str | None, out_dir: Path,
        samples: int | Literal["all"] | None, time_budget: str | None, estimate: bool | None,
        sample_offset: int, seed: int | None, device: str, batch_size: int, resume: bool,
        input_scale: float | None, mean: tuple[float, float, float] | None,
        std: tuple[float, float, float] | None, channel_order: str | None, no_pdf: bool,
        reference: str | None, surrogate: str | None, sign_key: Path | None,
        passphrase_env: str | None, query_budget: int | None,
        input_size: tuple[int, int] | None, executor: str, ray_address: str | None,
        workers: int, threads: int, debug: bool, quiet: bool, provenance: str,
        model_name: str | None, model_version: str | None, owner: str | None,
        license: str | None, intended_use: str | None, labels_path: Path | None,
        **http: Any) -> int:
    """Certify MODEL with a suite and write results.json, card.html, card.pdf.

    MODEL is an .onnx file, a PyTorch program (a .pt2 archive saved by torch.export.save, or a
    TorchScript file saved by torch.jit.save; give --input-size for TorchScript), or an
    inference endpoint: http://HOST:PORT/v2/models/NAME (KServe v2: Triton, MLServer, KServe)
    or http://HOST:PORT/v1/models/NAME (TF-Serving). A pickled checkpoint (torch.save of a
    state dict) is refused: it holds no program and unpickling can run code. PyTorch files
    are checked member by member before torch reads them.

    \b
    Examples:
      certify run traffic.onnx --suite gtsrb --data GTSRB/Final_Test/Images --out card1
      TOKEN="Bearer abc" certify run https://api.example.com/v2/models/signs \\
          --suite gtsrb --data Test.csv --auth-env TOKEN --model-version 3 --query-budget 2000000
      certify run http://localhost:8080/v2/models/signs --suite gtsrb --data Test.csv \\
          --surrogate local-copy.onnx
    """
    _setup_logging(debug, quiet)
    _refuse_idle_ray_flags(executor)
    from certify.api import RunOptions, certify_model

    card = model_card_from(model_name=model_name, model_version=model_version, owner=owner,
                           license=license, intended_use=intended_use)
    from certify.models.registry import is_endpoint

    if model_version is not None and is_endpoint(model):
        http["model_version"] = model_version  # an endpoint's declared version: its identity
    opts = RunOptions(
        model=model, suite=suite_name, data=data_path, out=out_dir, samples=samples,
        sample_offset=sample_offset, seed=seed,
        device=device, batch_size=batch_size, resume=resume, input_scale=input_scale,
        mean=mean, std=std, channel_order=channel_order, pdf=not no_pdf, reference=reference,
        sign_key=sign_key, passphrase=_passphrase(passphrase_env),
        http=_http_options(model, reference, http), query_budget=query_budget,
        input_size=input_size or None, executor=executor, ray_address=ray_address,
        workers=workers, threads=threads, surrogate=surrogate, model_card=card,
        provenance=provenance, labels=labels_path,
        time_budget=_duration(time_budget), estimate=estimate,
    )
    with _records_hint(out_dir), RichProgress(_err(), enabled=not quiet) as progress:
        result, paths = certify_model(opts, progress)
    _print_summary(result, paths)
    _note_missing_pdf(paths, not no_pdf, "rerun the same certify run with --resume")
    return exit_code_for_verdict(result.measurement.verdict)


def _duration(text: str | None) -> float | None:
    """``--time-budget`` in seconds (a usage error for anything but a positive duration)."""
    if text is None:
        return None
    from certify.engine.plan import parse_duration

    return parse_duration(text)


def _http_options(model: str, reference: str | None, given: dict[str, Any]) -> Any:
    """HttpOptions from the HTTP flags, refused when no model is an endpoint."""
    names = {"auth_env": "auth_env", "auth_header": "auth_header", "timeout": "timeout",
             "retries": "retries", "concurrency": "concurrency", "http_batch": "batch",
             "max_requests": "max_requests", "hedge": "hedge", "breaker_wait": "breaker_wait",
             "model_version": "version", "input_layout": "layout"}
    set_ = {names[k]: v for k, v in given.items() if v is not None}
    from certify.models.registry import is_endpoint

    remote = any(m and is_endpoint(m) for m in (model, reference))
    if set_ and not remote:
        flags = ", ".join("--" + k.replace("_", "-") for k, v in given.items() if v is not None)
        raise UsageError(f"{flags} only apply to endpoints (HTTP or gRPC)",
                         hint="MODEL is a file; drop those options or pass an http(s):// or "
                              "grpc:// URL")
    if not remote:
        return None
    from certify.models.http import HttpOptions

    return HttpOptions(**set_)


def _print_summary(result: Any, paths: dict[str, Path]) -> None:
    """The end of a run: a line per check and per threat model, the verdict with the counts
    of the rows that decide it, the records a resumed run reused, every row's warnings (the
    card's appendix lists the same) and the files written."""
    from rich.console import Console
    from rich.text import Text

    from certify.report.card import COUNT_WORDS, deciding_counts, headline, row_warnings
    from certify.report.glance import threat_name

    out = Console()

    def say(line: str | Text) -> None:  # the texts are data, never rich markup
        out.print(line, markup=False, highlight=False, soft_wrap=True)

    m = result.measurement
    for c in result.checks:
        say(f"{c.status:<12} {c.id:<22} {headline(c)}")
    for w in m.attack_worst_case:
        say(f"{w.status:<12} {threat_name(w.norm, w.epsilon):<22} threat model: {w.decision}")
    counts, evidence = deciding_counts(result.checks, m.attack_worst_case)
    words = [f"{counts[k]} {word}" for k, word in COUNT_WORDS if counts[k] and k != "skipped"]
    if counts["skipped"]:
        words.append(f"{counts['skipped']} check(s) skipped: not evaluated")
    shown = ", ".join(words)
    if evidence:
        n = len(m.attack_worst_case)
        shown += (f"; {n} threat model{'s' if n != 1 else ''} counted in place of the "
                  f"{evidence} attack rows {'they decide' if n != 1 else 'it decides'}")
    warned = row_warnings(result.checks, m.attack_worst_case)
    if warned:  # the card's header gives the same count
        shown += f"{'; ' if shown else ''}{len(warned)} warning{'s' if len(warned) != 1 else ''}"
        shown += " on the rows (below)"
    say(f"verdict: {m.verdict}" + (f" ({shown})" if shown else ""))
    reused = result.provenance.timings.get("resumed_records")
    if reused:
        say(f"resumed: reused {reused:,} records from the earlier run")
    for label, text in warned:
        say(Text.assemble(("warning:", "bold yellow"), f" {label}: {text}"))
    for name, p in paths.items():
        say(f"{name}: {p}")


#: How an error's hint says that a rerun can continue from the records on disk.
_KEPT_HINT = re.compile(r"records are kept[;,] rerun with --resume")


@contextlib.contextmanager
def _records_hint(out_dir: Path) -> Iterator[None]:
    """Make a failure's "records are kept, rerun with --resume" true of ``out_dir``: kept
    where it holds records; where it does not (the model failed before the run folder was
    made, or before the first record), the hint says what was written instead."""
    from certify.rundir import RECORDS_FILE, RUN_FILE

    try:
        yield
    except CertifyError as exc:
        if exc.hint and _KEPT_HINT.search(exc.hint):
            records = out_dir / RECORDS_FILE
            if not (records.is_file() and records.stat().st_size > 0):
                instead = (f"no sample was recorded in {out_dir} yet; rerun with --resume"
                           if (out_dir / RUN_FILE).exists() else
                           f"nothing was written to {out_dir}; rerun the same command")
                exc.hint = _KEPT_HINT.sub(instead, exc.hint)
        raise


def _note_missing_pdf(paths: dict[str, Path], wanted: bool, again: str) -> None:
    """One line on stderr when card.pdf was asked for but WeasyPrint could not load its system
    libraries (the HTML card and results were written; the exit code stays the command's)."""
    if wanted and "pdf" not in paths:
        from certify.report.weasy import pdf_hint

        click.echo(pdf_hint(again), err=True)


@main.command("init")
@click.argument("model")
@click.option("--data", "data_path", required=True, metavar="PATH",
              help="Labelled images: an image folder (a subfolder per class), an .npz file "
                   "or a GTSRB layout.")
@click.option("--out", "out_path", default="suite.yaml", show_default=True,
              type=click.Path(dir_okay=False, path_type=Path), help="The suite file to write.")
@click.option("--labels", "labels_path", type=click.Path(dir_okay=False, path_type=Path),
              metavar="FILE", help="Class names, one per line in class-id order.")
@click.option("--samples", type=click.IntRange(min=2), default=64, show_default=True,
              help="Labelled samples to probe, class-stratified and seeded.")
@click.option("--input-size", type=click.IntRange(min=1), nargs=2, metavar="H W",
              help="Model input size, when the model does not state it [default: the data's].")
@click.option("--device", type=click.Choice(DEVICE_CHOICES), default="auto", show_default=True,
              help="Where the model runs.")
@click.option("--force", is_flag=True, help="Overwrite --out if it exists.")
@click.option("--auth-env", metavar="VAR",
              help="HTTP: environment variable holding the auth header's value.")
@click.option("--auth-header", metavar="NAME",
              help="HTTP: header the --auth-env value is sent in [default: Authorization].")
@_common_logging
def init_cmd(model: str, data_path: str, out_path: Path, labels_path: Path | None,
             samples: int, input_size: tuple[int, int] | None, device: str, force: bool,
             debug: bool, quiet: bool, **http: Any) -> None:
    """Probe MODEL's preprocessing on labelled data and write a suite to edit.

    MODEL is an .onnx file, a PyTorch program (.pt2 or TorchScript) or an endpoint URL.
    Every candidate preprocessing (0-1 or 0-255,
    mean/std none, ImageNet or 0.5, RGB or BGR; the layout where the model does not state it)
    is tried on the same samples; the one with the best clean accuracy goes into a copy of
    the packaged image-classification suite, with the class names and, if needed, the input
    size.

    \b
    Example:
      certify init model.onnx --data test-images/ --out my-suite.yaml
      certify run model.onnx --suite my-suite.yaml --data test-images/
    """
    _setup_logging(debug, quiet)
    from certify.init_suite import InitOptions, init_suite
    from certify.probe import pct

    opts = InitOptions(model=model, data=data_path, out=out_path, labels=labels_path,
                       samples=samples, input_size=input_size or None, device=device,
                       http=_http_options(model, None, http), force=force)
    with RichProgress(_err(), enabled=not quiet) as progress:
        found = init_suite(opts, progress)
    from rich.console import Console

    out = Console()
    out.print(f"{'preprocessing':<44} {'log-lik':>8} {'accuracy':>9} {'correct':>9}",
              highlight=False)
    for sc in found.report.scores:
        mark = "  <- chosen" if sc is found.report.best else ""
        note = f"  ({sc.error})" if sc.error else ""
        ll = "-" if sc.mean_loglik is None else f"{sc.mean_loglik:.3f}"
        out.print(f"{sc.candidate.label():<44} {ll:>8} {pct(sc.accuracy):>9} "
                  f"{sc.correct:>4}/{sc.n:<4}{mark}{note}", highlight=False)
    for line in found.summary():
        out.print(line, highlight=False, soft_wrap=True)
    out.print(f"suite: {found.path}", highlight=False)
    from certify.rundir import free_sibling

    run_dir = Path(f"certify-run-{_stem(model)}")
    if run_dir.exists():
        run_dir = free_sibling(run_dir)
    out.print(f"next: certify run {model} --suite {found.path} --data {data_path}"
              + (f" --labels {labels_path}" if labels_path else "") + f" --out {run_dir}",
              highlight=False, soft_wrap=True)


def _stem(model: str) -> str:
    """A folder-name-safe short name of a model file or endpoint URL."""
    from certify.models.registry import is_endpoint

    name = model.rstrip("/").rsplit("/", 1)[-1] if is_endpoint(model) else Path(model).stem
    return re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-.") or "model"


@main.command()
@click.option("--out", "out_dir", default="demo-card", show_default=True,
              type=click.Path(file_okay=False, path_type=Path), help="Run directory.")
@click.option("--resume", is_flag=True, help="Continue an interrupted demo run in --out.")
@click.option("--no-pdf", is_flag=True, help="Skip card.pdf.")
@click.option("--suite", "suite", default="gtsrb", show_default=True,
              help="Packaged suite name or YAML path over the 43 GTSRB classes (a short suite "
                   "tries an executor or an install in seconds).")
@_executor_options
@_common_logging
def demo(out_dir: Path, resume: bool, no_pdf: bool, suite: str, executor: str,
         ray_address: str | None, workers: int, threads: int, debug: bool, quiet: bool) -> int:
    """Certify the bundled traffic-sign model on generated signs: no data or model needed.

    Exits 0 once the card is written, whatever its verdict (the verdict is the finding).

    \b
    Example:
      certify demo --out demo-card   # then open demo-card/card.html
    """
    _setup_logging(debug, quiet)
    _refuse_idle_ray_flags(executor)
    from certify.api import run_demo

    with RichProgress(_err(), enabled=not quiet) as progress:
        result, paths = run_demo(out_dir, progress, pdf=not no_pdf, resume=resume,
                                 suite=suite, executor=executor, ray_address=ray_address,
                                 workers=workers, threads=threads)
    _print_summary(result, paths)
    import shlex

    again = " ".join(["certify demo --out", shlex.quote(str(out_dir)),
                      *(["--suite", shlex.quote(suite)] if suite != "gtsrb" else []), "--resume"])
    _note_missing_pdf(paths, not no_pdf, f"rerun {again}")
    # The demo's job is to produce the card; the verdict inside it is the finding, not an error.
    return EXIT_OK


@main.command("contact-sheet")
@click.argument("path", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--seed", type=click.IntRange(min=0, max=2**63 - 1), default=0, show_default=True,
              help="Seed of the generated signs.")
@click.option("--per-class", type=click.IntRange(min=1, max=64), default=8, show_default=True,
              help="Signs per class (one row per class).")
@click.option("--size", type=click.IntRange(min=8, max=256), default=32, show_default=True,
              help="Side of each generated sign in pixels.")
@click.option("--scale", type=click.IntRange(min=1, max=8), default=2, show_default=True,
              help="Each sign is drawn this many times larger in the sheet.")
def contact_sheet_cmd(path: Path, seed: int, per_class: int, size: int, scale: int) -> None:
    """Write a PNG of generated signs, one row per class, to check them by eye."""
    from certify.demo.synthetic import contact_sheet

    if path.suffix.lower() != ".png":
        raise UsageError(f"{path} does not end in .png", hint="e.g. certify contact-sheet s.png")
    contact_sheet(path, seed=seed, per_class=per_class, size=size, scale=scale)
    click.echo(f"contact sheet: {path}")


def _passphrase(var: str | None) -> bytes | None:
    if var is None:
        return None
    import os

    value = os.environ.get(var)
    if value is None:
        raise UsageError(f"environment variable {var} is not set",
                         hint="export it, or drop --passphrase-env")
    return value.encode()


@main.command()
@click.option("--out", "out_dir", default=".", show_default=True,
              type=click.Path(file_okay=False, path_type=Path), help="Folder for the keys.")
@click.option("--name", default="certify", show_default=True, help="File name stem.")
@click.option("--passphrase-env", metavar="VAR",
              help="Encrypt the private key with the passphrase in this variable.")
def keygen(out_dir: Path, name: str, passphrase_env: str | None) -> None:
    """Create an ECDSA P-256 key pair: NAME.key (mode 0600) and NAME.pub, and NAME.crt, the
    key's self-issued certificate (its own CA) that card.pdf's PDF signature names.

    \b
    Example:
      certify keygen --out keys && certify sign demo-card --key keys/certify.key
    """
    from certify.report.pades import certificate_path
    from certify.report.sign import fingerprint, load_public_key
    from certify.report.sign import keygen as make_keys

    key, pub = make_keys(out_dir, name, _passphrase(passphrase_env))
    click.echo(f"private key: {key}\npublic key:  {pub}\ncertificate: "
               f"{certificate_path(key)}\nfingerprint: {fingerprint(load_public_key(pub))}")


@main.command("sign")
@click.argument("run_dir", type=click.Path(file_okay=False, path_type=Path))
@click.option("--key", "key_path", required=True, type=click.Path(dir_okay=False,
              path_type=Path), help="Private key from `certify keygen`.")
@click.option("--passphrase-env", metavar="VAR", help="Variable holding the passphrase.")
@click.option("--no-pdf", is_flag=True, help="Skip card.pdf.")
def sign_cmd(run_dir: Path, key_path: Path, passphrase_env: str | None, no_pdf: bool) -> None:
    """Sign a finished run: results.json.sig, and the card re-rendered with the signature."""
    from certify.api import sign_run

    paths = sign_run(run_dir, key_path, _passphrase(passphrase_env), pdf=not no_pdf)
    for name, p in paths.items():
        click.echo(f"{name}: {p}")
    _note_missing_pdf(paths, not no_pdf, "run certify sign again")


@main.command("verify")
@click.argument("path", type=click.Path(path_type=Path))
@click.option("--pubkey", type=click.Path(dir_okay=False, path_type=Path),
              help="The signer's public key (required without --log; with --log, the log's "
                   "own key is fetched and pinned on first use).")
@click.option("--log", "log_url", metavar="URL",
              help="A certify service: also check the card is in its transparency log, and "
                   "that the log only grew since it was last seen from here.")
@click.option("--log-state", type=click.Path(dir_okay=False, path_type=Path),
              help="Where the last tree head seen is kept [default: $CERTIFY_LOG_STATE or "
                   "~/.config/certify/logs.json].")
def verify_cmd(path: Path, pubkey: Path | None, log_url: str | None,
               log_state: Path | None) -> int:
    """Verify card.html, card.pdf or results.json against a public key (exit 0 only if valid;
    8 when the signature and payload are intact but the visible layer was not compared).

    \b
    Examples:
      certify verify demo-card/card.pdf --pubkey keys/certify.pub
      certify verify card/card.pdf --log https://certify.example.com
    """
    from certify.report.sign import fingerprint, load_public_key, verify_file

    client = None
    if log_url is not None:
        from certify.service.logclient import LogClient, log_key

        client = LogClient(log_url)
        key = log_key(client, pubkey)
    elif pubkey is None:
        raise UsageError("--pubkey is required without --log",
                         hint="pass the signer's public key, or --log URL of the service")
    else:
        key = load_public_key(pubkey)
    v = verify_file(path, key)
    if v.visible_compared is False:
        click.echo(f"{path}: the signature and the signed payload are intact (signed by "
                   f"{fingerprint(key)})")
    else:
        click.echo(f"OK: {path} is intact and signed by {fingerprint(key)}")
    click.echo(f"measurement: intact ({v.signature.signed['measurement']})")
    click.echo(f"provenance:  intact ({v.signature.signed['provenance']})")
    if "payload" in v.signature.signed:
        click.echo(f"payload:     intact ({v.signature.signed['payload']})")
    if v.visible is not None:
        click.echo(f"visible content: {v.visible}")
    note = v.format_note()
    if note is not None:
        click.echo(note)
    if client is not None:
        from certify.service.logclient import check_in_log, default_state_path

        service = ({} if v.result is None else
                   (v.result.provenance.model_extra or {}).get("service") or {})
        for line in check_in_log(v.signature.signed, client, key,
                                 log_state or default_state_path(),
                                 run_id=service.get("run_id")):
            click.echo(line)
    if v.result is not None:
        m = v.result.measurement
        click.echo(f"model: {m.model.name} {m.model.identity}")
        click.echo(f"verdict: {m.verdict}")
        for c in m.checks:
            click.echo(f"  {c.status:<12} {c.id}")
    if v.visible_compared is False:
        click.echo(f"exit {EXIT_VISIBLE_NOT_COMPARED}: the visible layer was not compared with "
                   "the signed payload; what this card shows is not verified")
        return EXIT_VISIBLE_NOT_COMPARED
    return EXIT_OK


@main.command("compare")
@click.argument("old", type=click.Path(path_type=Path))
@click.argument("new", type=click.Path(path_type=Path))
@click.option("--tolerance", type=click.FloatRange(min=0), default=None,
              help="The largest drop a release may take per gating row: percentage points "
                   f"for rates, percent of OLD's value for scores. {TOLERANCE_RULE}")
@click.option("--pubkey", type=click.Path(dir_okay=False, path_type=Path),
              help="Verify both signatures with this public key before comparing (a card "
                   "that does not verify: exit 9, untrusted).")
@click.option("--json", "json_out", metavar="FILE|-", help="Write the comparison as JSON.")
@click.option("--html", "html_out", type=click.Path(dir_okay=False, path_type=Path),
              help="Write a comparison card (HTML).")
@click.option("--pdf", "pdf_out", type=click.Path(dir_okay=False, path_type=Path),
              help="Write the comparison card as PDF.")
def compare_cmd(old: Path, new: Path, tolerance: float | None, pubkey: Path | None,
                json_out: str | None, html_out: Path | None, pdf_out: Path | None) -> int:
    """Did NEW get less robust than OLD? Compare two runs on the rows that decide their cards.

    OLD and NEW are run folders, results.json files or cards (card.html, card.pdf) of the same
    suite on the same data. One row per threat model (robust to every attack of it) and one
    per check; attack rows are evidence for their threat model's row, not gating. Paired tests
    (McNemar exact, paired bootstrap) where both runs used the same samples and seeds,
    unpaired otherwise; Holm's correction across the gating rows. A terminal of 80 columns or
    fewer gets one block per row.

    \b
    Exit codes: 0 no change or non-inferior within the tolerance on every comparable threat
    model and check; 1 a resolved regression beyond the tolerance on one with a threshold; 6
    inconclusive (neither a regression nor non-inferiority shown: the row says how many
    samples would decide it); 2 usage; 4 not comparable at all (the message says what
    differs); 9 untrusted: with --pubkey, a card that is unsigned, tampered or signed by
    another key (nothing is compared). A row one run SKIPPED is listed as not compared and
    does not block.

    \b
    Example:
      certify compare release-1.2/card.pdf release-1.3/card.pdf --pubkey keys/certify.pub \\
          --tolerance 1 --html compare.html
    """
    import json

    from certify.report import comparison as view
    from certify.report.compare import compare_paths
    from certify.rundir import atomic_write

    result = compare_paths(old, new, tolerance, pubkey)
    doc = json.dumps(result.to_json(), indent=2)
    if json_out == "-":
        click.echo(doc)
    else:
        from rich.console import Console

        view.print_table(result, Console())
        if json_out:
            atomic_write(Path(json_out), doc.encode())
    if html_out or pdf_out:
        html = view.render_html(result)
        if html_out:
            atomic_write(html_out, html.encode())
        if pdf_out:
            atomic_write(pdf_out, view.render_pdf(html))
    return result.exit_code


@main.command("bundle")
@click.argument("run_dir", type=click.Path(file_okay=False, path_type=Path))
@click.option("--model", "model_path", required=True,
              type=click.Path(dir_okay=False, path_type=Path), help="The certified model file.")
@click.option("--key", "key_path", required=True, type=click.Path(dir_okay=False,
              path_type=Path), help="Private key from `certify keygen`.")
@click.option("--out", "out_dir", required=True, type=click.Path(path_type=Path),
              help="Folder to create for the bundle.")
@click.option("--passphrase-env", metavar="VAR", help="Variable holding the passphrase.")
def bundle_cmd(run_dir: Path, model_path: Path, key_path: Path, out_dir: Path,
               passphrase_env: str | None) -> None:
    """Sign the model and its card together as an OpenSSF model-signing bundle."""
    from certify.report.bundle import make_bundle

    pw = _passphrase(passphrase_env)
    sig = make_bundle(run_dir, model_path, key_path, out_dir, None if pw is None else pw.decode())
    click.echo(f"bundle: {out_dir}\nsignature: {sig}")


@main.command("verify-bundle")
@click.argument("bundle_dir", type=click.Path(path_type=Path))
@click.option("--signature", required=True, type=click.Path(path_type=Path),
              help="The bundle's signature file, as `certify bundle` printed it.")
@click.option("--pubkey", required=True, type=click.Path(dir_okay=False, path_type=Path),
              help="The signer's public key (PEM).")
def verify_bundle_cmd(bundle_dir: Path, signature: Path, pubkey: Path) -> None:
    """Verify a model-signing bundle made by `certify bundle` (exit 0 only if intact)."""
    from certify.report.bundle import verify_bundle

    verify_bundle(bundle_dir, signature, pubkey)
    click.echo(f"OK: {bundle_dir} matches {signature}")


@main.command("export")
@click.argument("run_dir", type=click.Path(file_okay=False, path_type=Path))
@click.option("--dataset-id", metavar="ID",
              help="The Hugging Face dataset the data is (e.g. a GTSRB test set's id); "
                   "without it the data is named as local data, never as a Hub dataset.")
@click.option("--dataset-split", metavar="SPLIT", help="Its split, e.g. test.")
@click.option("--source-url", metavar="URL",
              help="Where the signed card is published (e.g. the release's card.pdf): "
                   "written as the results' source.")
def export_cmd(run_dir: Path, dataset_id: str | None, dataset_split: str | None,
               source_url: str | None) -> None:
    """Write model-index.md (Hugging Face model card front matter) and summary.md.

    model-index.md loads with huggingface_hub's ModelCard.load; the results digest is under
    its front matter's `certify` key.
    """
    import json

    from certify.report.export import markdown_summary, model_index
    from certify.results import parse_result
    from certify.rundir import atomic_write

    path = run_dir / "results.json"
    try:
        results = parse_result(json.loads(path.read_text(encoding="utf-8")))
    except FileNotFoundError:
        raise UsageError(f"{path} not found", hint="export the --out folder of a run") from None
    except ValueError:
        raise UsageError(f"{path} is not valid JSON", hint="was it edited?") from None
    if source_url is not None and not source_url.startswith(("https://", "http://")):
        raise UsageError(f"--source-url {source_url!r} is not an http(s) URL",
                         hint="e.g. https://github.com/OWNER/REPO/releases/download/v1/card.pdf")
    if dataset_split and not dataset_id:
        raise UsageError("--dataset-split needs --dataset-id", hint="name the Hub dataset")
    index = model_index(results, dataset_id=dataset_id, split=dataset_split,
                        source_url=source_url)
    atomic_write(run_dir / "model-index.md", index.encode())
    atomic_write(run_dir / "summary.md", markdown_summary(results).encode())
    click.echo(f"model-index: {run_dir / 'model-index.md'}\nsummary: {run_dir / 'summary.md'}")


@main.command("schema")
def schema_cmd() -> None:
    """Print the JSON Schema of results.json (its version is in `$id` and `schema`)."""
    import json

    from certify.results import json_schema

    click.echo(json.dumps(json_schema(), indent=2, sort_keys=True))


@main.group()
def suites() -> None:
    """List and show packaged suites."""


@suites.command("list")
def suites_list() -> None:
    """List the packaged suites."""
    from certify.suite import load_suite, packaged_suites

    for name in sorted(packaged_suites()):
        s = load_suite(name)
        click.echo(f"{name:<20} {len(s.checks)} checks  {s.description.splitlines()[0]}")


@suites.command("show")
@click.argument("name")
def suites_show(name: str) -> None:
    """Print a suite's YAML (a packaged name or a path)."""
    from certify.suite import load_suite, resolve_suite_path

    load_suite(name)  # validate first: never show a suite that would not load
    click.echo(resolve_suite_path(name).read_text(encoding="utf-8"), nl=False)


from certify.service.cli import runs, serve, submit, worker  # noqa: E402 - the service's commands

main.add_command(serve)
main.add_command(submit)
main.add_command(runs)
main.add_command(worker)
from certify.service.store_cli import store  # noqa: E402 - `certify store migrate`

main.add_command(store)

if __name__ == "__main__":  # pragma: no cover
    main()

__all__ = ["main", "UsageError"]
