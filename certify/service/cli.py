"""``certify serve`` (the service and its tokens), ``certify submit`` and ``certify runs``
(its client).

Registered on the main command group by :mod:`certify.cli`; everything heavy (FastAPI,
SQLAlchemy, uvicorn) is imported only when a command runs.
"""

from __future__ import annotations

import logging
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from certify.errors import UsageError
from certify.model_card import model_card_from, model_card_options
from certify.safetext import printable

DEFAULT_HOME = Path("certify-service")
#: ``--timeout`` of `submit` and `runs watch`: six hours, beyond the service's own default run
#: time limit (four hours), so a run that ends is followed to its end.
WATCH_TIMEOUT_S = 6 * 3600.0
log = logging.getLogger("certify.service")


def _home_options(f: Any) -> Any:
    f = click.option("--db", "--database", "db", metavar="URL",
                     help="Database URL [default: SQLite in --home]; PostgreSQL: "
                          "postgresql+psycopg://USER@HOST/DB.")(f)
    return click.option("--home", type=click.Path(file_okay=False, path_type=Path),
                        default=DEFAULT_HOME, show_default=True,
                        help="The service's folder: database, store, keys.")(f)


def _datasets(values: tuple[str, ...]) -> dict[str, Path]:
    out: dict[str, Path] = {}
    for v in values:
        name, sep, path = v.partition("=")
        if not sep or not name or not path:
            raise UsageError(f"--dataset {v!r} is not NAME=PATH", hint="e.g. gtsrb=data/gtsrb")
        if not name.replace("-", "").replace("_", "").isalnum():
            raise UsageError(f"dataset name {name!r} must be letters, digits, - and _")
        p = Path(path)
        if not p.exists():
            raise UsageError(f"--dataset {name}: {p} does not exist", hint="check the path")
        out[name] = p.resolve()
    return out


def _load_config(ctx: click.Context, _param: click.Parameter, value: Path | None) -> None:
    """``--config FILE``: a YAML mapping of option names to values, read before the other
    options, which it gives defaults (the command line wins)."""
    if value is None:
        return
    import yaml

    try:
        doc = yaml.safe_load(value.read_text(encoding="utf-8"))
    except OSError as exc:
        raise click.BadParameter(f"cannot read {value}: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise click.BadParameter(f"{value} is not YAML: {str(exc).splitlines()[0]}") from None
    if doc is None:
        return
    if not isinstance(doc, dict):
        raise click.BadParameter(f"{value} must be a mapping of option names to values")
    by_name: dict[str, str] = {}
    for p in ctx.command.params:
        if isinstance(p, click.Option) and p.name and p.name != "config":
            by_name[p.name] = p.name
            for opt in p.opts:
                by_name[opt.lstrip("-")] = p.name
    defaults = dict(ctx.default_map or {})
    for key, v in doc.items():
        if str(key) in ("new-identity", "new_identity"):  # one node, once: never configuration
            raise click.BadParameter(f"{value}: new-identity is a command-line flag only "
                                     "(start one node with it to change the service's keys)")
        name = by_name.get(str(key))
        if name is None:
            valid = sorted(k for k in by_name if "-" in k or k == by_name[k])
            raise click.BadParameter(f"{value}: unknown option {key!r}; valid: "
                                     f"{', '.join(valid)}")
        defaults[name] = v
    ctx.default_map = defaults


_SERVE_OPTIONS: list[Any] = [
    _home_options,
    click.option("--host", default="127.0.0.1", show_default=True,
                  help="Address to listen on (put a TLS reverse proxy in front for other hosts)."),
    click.option("--port", type=click.IntRange(1, 65535), default=8470, show_default=True,
                  help="Port to listen on."),
    click.option("--workers", type=click.IntRange(min=0), default=2, show_default=True,
                  help="Runs at once, each in its own process (0: accept runs, run none)."),
    click.option("--sign-key", type=click.Path(dir_okay=False, path_type=Path),
                  help="The service's signing key (mode 0600) [default: made in --home/keys]."),
    click.option("--passphrase-env", metavar="VAR", help="Variable holding its passphrase."),
    click.option("--secrets-key", type=click.Path(dir_okay=False, path_type=Path),
                  help="Key file (0600, outside --home) encrypting endpoint secrets; or set "
                       "CERTIFY_SECRETS_KEY. Without one, endpoints with secrets are refused."),
    click.option("--dataset", "datasets", multiple=True, metavar="NAME=PATH",
                  help="Register a dataset submissions may name (repeatable)."),
    click.option("--allow-endpoint", "allow_endpoints", multiple=True, metavar="HOST[:PORT]",
                  help="An endpoint host runs may reach even on a private address (repeatable)."),
    click.option("--allow-domain", "allow_domains", multiple=True, metavar="DOMAIN",
                  help="A custom ONNX operator domain uploads may use (repeatable)."),
    click.option("--max-upload-mb", type=click.IntRange(min=1), default=200, show_default=True,
                  help="Largest model upload accepted."),
    click.option("--max-dataset-mb", type=click.IntRange(min=1), default=64, show_default=True,
                  help="Largest dataset (.npz) upload accepted."),
    click.option("--max-samples", type=click.IntRange(min=1), default=5000, show_default=True,
                  help="Samples a submission may ask for at most."),
    click.option("--max-verify-mb", type=click.IntRange(min=1), default=16, show_default=True,
                  help="Largest card the public verify page and API accept."),
    click.option("--verify-per-minute", type=click.IntRange(min=1), default=30, show_default=True,
                  help="Verifications a minute per client address without a token."),
    click.option("--verify-memory-mb", type=click.IntRange(min=16), default=1024,
                  show_default=True, help="Memory one card verification may take, beyond the "
                                          "verifier's own code (its child process's address-space "
                                          "limit)."),
    click.option("--verify-timeout", "verify_timeout_s", type=click.FloatRange(min=0.1),
                  default=30.0, show_default=True,
                  help="Seconds (wall clock and CPU) one card verification may take."),
    click.option("--verify-concurrency", type=click.IntRange(min=1), default=2, show_default=True,
                  help="Card verifications at once, each in its own child process."),
    click.option("--verify-wait", "verify_wait_s", type=click.FloatRange(min=0), default=10.0,
                  show_default=True, help="Seconds an upload waits for a free verification; "
                                          "then 503 with Retry-After."),
    click.option("--token-storage-mb", type=click.IntRange(min=1), default=2048, show_default=True,
                  help="Most a token's stored uploads may take."),
    click.option("--token-uploads-per-hour", type=click.IntRange(min=1), default=60,
                  show_default=True, help="Uploads a token may store an hour."),
    click.option("--trusted-proxy", "trusted_proxies", multiple=True, metavar="ADDRESS",
                  help="A reverse proxy whose X-Forwarded-For names the client (repeatable); "
                       "from any other peer the header is ignored."),
    click.option("--header-timeout", "header_timeout_s", type=click.FloatRange(min=0.1),
                  default=10.0, show_default=True,
                  help="Seconds a request's headers may take, from the connection's start or the "
                       "previous response (idle connections are closed then)."),
    click.option("--min-body-rate", "min_body_rate_kb", type=click.IntRange(min=0), default=64,
                  show_default=True, help="KB/s a request body must arrive at, after --body-grace "
                                          "(0: no minimum)."),
    click.option("--body-grace", "body_grace_s", type=click.FloatRange(min=0), default=5.0,
                  show_default=True, help="Seconds of credit a body has before --min-body-rate."),
    click.option("--max-connections-per-client", "max_connections_per_client",
                  type=click.IntRange(min=1), default=32, show_default=True,
                  help="Connections open at once per client address (not for --trusted-proxy "
                       "peers); more are closed at once."),
    click.option("--run-timeout", type=click.FloatRange(min=1), default=4 * 3600.0,
                  show_default=True, help="Seconds one run may take."),
    click.option("--run-memory-mb", type=click.IntRange(min=256), default=16 * 1024,
                  show_default=True, help="Address-space limit of one run's process."),
    click.option("--lease", type=click.FloatRange(min=1), default=30.0, show_default=True,
                  help="Seconds a claimed run stays claimed without a heartbeat."),
    click.option("--heartbeat", type=click.FloatRange(min=0.1), default=5.0, show_default=True,
                  help="Seconds between renewals of a running run's lease."),
    click.option("--retention-days", type=click.IntRange(min=1), default=30, show_default=True,
                  help="Uploads no run refers to are deleted after this many days."),
    click.option("--executor", type=click.Choice(["local", "ray"]), default="local",
                  show_default=True, help="Where a run's checks execute."),
    click.option("--ray-address", metavar="ADDRESS", help="Ray: an existing cluster."),
    click.option("--store", "store", metavar="URL",
                  help="Where uploads and runs' files live, shared by every node: "
                       "s3://BUCKET[/PREFIX]?endpoint=URL (credentials from the environment) or "
                       "a folder [default: --home/store]."),
    click.option("--presigned-downloads", is_flag=True,
                  help="Answer card downloads with a redirect to the store's presigned URL (S3) "
                       "instead of streaming them through this node."),
    click.option("--session-secret", type=click.Path(dir_okay=False, path_type=Path),
                  help="File (0600) with the key of UI session cookies, shared by every API "
                       "node; or set CERTIFY_SESSION_SECRET (hex) [default: made in --home/keys]."),
    click.option("--device", type=click.Choice(["auto", "cpu", "cuda"]), default="auto",
                  show_default=True,
                  help="The device this node's workers advertise (auto: CUDA where a GPU "
                       "answers); runs that ask for cuda go only to a worker with one."),
    click.option("--new-identity", is_flag=True,
                  help="Accept this node's keys as the service's new ones (a deliberate key "
                       "change; without it a node with other keys than the recorded ones is "
                       "refused)."),
    click.option("--config", type=click.Path(dir_okay=False, path_type=Path), is_eager=True,
                  expose_value=False, callback=_load_config,
                  help="A YAML file of these options (their long names, e.g. store: s3://...), "
                       "read by every node: `certify serve` and `certify worker` alike. Options "
                       "given on the command line win."),
]


def _serve_options(f: Any) -> Any:
    """The options `certify serve` and `certify worker` share: one configuration, which a
    ``--config`` file may hold."""
    for deco in reversed(_SERVE_OPTIONS):
        f = deco(f)
    return f


@click.group("serve", invoke_without_command=True)
@_serve_options
@click.pass_context
def serve(ctx: click.Context, home: Path, db: str | None, host: str, port: int,
          datasets: tuple[str, ...], allow_endpoints: tuple[str, ...],
          allow_domains: tuple[str, ...], run_timeout: float, lease: float,
          heartbeat: float, **rest: Any) -> None:
    """Run certify as a service: HTTP API (/api/v1, OpenAPI at /docs) and web UI.

    \b
    Example:
      certify serve token create --role submit        # prints a token, once
      certify serve --dataset gtsrb=GTSRB/Final_Test/Images
    """
    if ctx.invoked_subcommand is not None:
        return
    import uvicorn

    from certify.service.app import create_app

    rotate = bool(rest.pop("new_identity", False))
    cfg = _config(home, db, host, port, datasets, allow_endpoints, allow_domains,
                  run_timeout, lease, heartbeat, rest)
    import socket

    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as exc:
            raise UsageError(f"cannot listen on {host}:{port}: {exc.strerror}",
                             hint="choose another --port or --host") from None
    from certify.service.private import private_umask

    private_umask()  # what the service and its children create is its user's only
    _service_logging()
    app = create_app(cfg, rotate_identity=rotate)
    svc = app.state.services
    from cryptography.hazmat.primitives import serialization

    from certify.redact import redact
    from certify.report.sign import fingerprint

    key = serialization.load_pem_public_key(svc.public_pem)
    log.info("certify serve: http://%s:%d (home %s, database %s, %d workers)", host, port,
             home, redact(cfg.db_url), cfg.workers)
    log.info("signing key %s", fingerprint(key))  # type: ignore[arg-type]
    if host not in ("127.0.0.1", "localhost", "::1"):
        log.warning("listening on %s: serve other hosts through a TLS reverse proxy", host)
    from certify.service.shared import begin_shutdown

    class Server(uvicorn.Server):
        """uvicorn, with certify's first shutdown step before its own (see begin_shutdown)."""

        def handle_exit(self, sig: int, frame: Any) -> None:
            begin_shutdown(svc)
            super().handle_exit(sig, frame)

    from certify.service.conn import Deadlines, protocol_class

    deadlines = Deadlines.of(cfg.header_timeout_s, cfg.min_body_rate_kb, cfg.body_grace_s,
                             cfg.max_connections_per_client, cfg.trusted_proxies)
    # proxy headers are read by certify alone, from --trusted-proxy peers (uvicorn's own
    # default would trust X-Forwarded-For from 127.0.0.1); connections still open after
    # --lease seconds of shutdown are closed. The HTTP protocol is named, not "auto": the
    # deadlines live in a subclass of uvicorn's h11 protocol, and "auto" would pick httptools
    # (no deadlines) wherever it happens to be installed; no WebSocket protocol, since an
    # upgraded connection would leave the deadlines (the service has no WebSocket route).
    Server(uvicorn.Config(app, host=host, port=port, log_level="warning", access_log=False,
                          proxy_headers=False, http=protocol_class(deadlines), ws="none",
                          timeout_graceful_shutdown=max(1, int(cfg.lease_s)))).run()


def _config(home: Path, db: str | None, host: str, port: int, datasets: tuple[str, ...],
            allow_endpoints: tuple[str, ...], allow_domains: tuple[str, ...],
            run_timeout: float, lease: float, heartbeat: float, rest: dict[str, Any]) -> Any:
    """The ServeConfig of `certify serve` and `certify worker` (one configuration)."""
    from certify.service.config import ServeConfig

    if rest.get("executor") == "ray" and not rest.get("ray_address"):
        raise UsageError("--executor ray needs --ray-address",
                         hint="the service sends runs to an existing Ray cluster")
    if heartbeat >= lease:
        raise UsageError(f"--heartbeat {heartbeat} must be shorter than --lease {lease}")
    return ServeConfig(home=home, db=db, host=host, port=port, datasets=_datasets(datasets),
                       allow_endpoints=tuple(allow_endpoints),
                       allow_domains=tuple(allow_domains), run_timeout_s=run_timeout,
                       lease_s=lease, heartbeat_s=heartbeat,
                       **_tuples(rest))


def _tuples(options: dict[str, Any]) -> dict[str, Any]:
    """Lists (from a --config file) as the tuples ServeConfig holds."""
    return {k: tuple(v) if isinstance(v, list) else v for k, v in options.items()}


@click.command("worker")
@_serve_options
def worker(home: Path, db: str | None, host: str, port: int, datasets: tuple[str, ...],
           allow_endpoints: tuple[str, ...], allow_domains: tuple[str, ...],
           run_timeout: float, lease: float, heartbeat: float, **rest: Any) -> None:
    """Claim and run queued runs on this machine, for a service on a shared database and store.

    Takes the same options (and --config file) as `certify serve`; the HTTP ones are not
    used. --workers is how many runs this machine computes at once; --device what it
    advertises (a run submitted with --device cuda is claimed only by a worker with a GPU).
    Stops at SIGTERM or SIGINT: its running runs go back on the queue and resume elsewhere.

    \b
    Example:
      certify worker --database postgresql+psycopg://certify@db/certify \\
          --store 's3://certify-cards?endpoint=https://minio.internal:9000' --workers 1
    """
    import signal
    import threading

    from certify.service.app import open_services
    from certify.service.workers import WorkerPool

    rotate = bool(rest.pop("new_identity", False))
    cfg = _config(home, db, host, port, datasets, allow_endpoints, allow_domains,
                  run_timeout, lease, heartbeat, rest)
    if cfg.workers < 1:
        raise UsageError("certify worker needs --workers 1 or more")
    from certify.service.private import private_umask

    private_umask()  # what the service and its children create is its user's only
    _service_logging()
    svc = open_services(cfg, rotate_identity=rotate)
    pool = WorkerPool(svc.cfg, svc.factory, svc.store, svc.tlog, svc.secrets)
    done = threading.Event()

    def stop(_sig: int, _frame: Any) -> None:
        done.set()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    from certify.redact import redact

    log.info("certify worker: database %s, store %s", redact(cfg.db_url),
             redact(svc.store.description))
    pool.start()
    while not done.wait(1.0):
        pass
    log.info("certify worker: stopping; running runs go back on the queue")
    pool.stop()


def _service_logging() -> None:
    from certify.redact import install_log_filters

    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
    install_log_filters(handler)
    for name in ("certify.service",):
        lg = logging.getLogger(name)
        lg.handlers[:] = [handler]
        lg.setLevel(logging.INFO)
        lg.propagate = False


def _factory(home: Path, db: str | None) -> Any:
    from certify.service.db import make_engine, migrate, sessions, sqlite_url
    from certify.service.private import secure_home

    secure_home(home)
    engine = make_engine(db or sqlite_url(home))
    migrate(engine)
    return sessions(engine)


@serve.group("token")
def token() -> None:
    """Create, list and revoke API tokens."""


@token.command("create")
@_home_options
@click.option("--role", type=click.Choice(["read", "submit", "admin"]), required=True,
              help="read: look at runs and cards; submit: also submit and cancel runs; "
                   "admin: everything, every token's runs.")
@click.option("--name", default="", help="Who or what the token is for.")
@click.option("--expires", default="90d", show_default=True,
              help="Lifetime: 90d, 12h, 30m; 'never' for no expiry.")
@click.option("--query-budget", type=click.IntRange(min=1),
              help="Model queries this token's runs may spend in all.")
@click.option("--max-concurrent", type=click.IntRange(min=1), default=4, show_default=True,
              help="Runs of this token queued or running at once.")
def token_create(home: Path, db: str | None, role: str, name: str, expires: str,
                 query_budget: int | None, max_concurrent: int) -> None:
    """Create a token; it is printed once and stored only hashed."""
    from certify.service.auth import create_token, parse_duration

    lifetime = None if expires == "never" else parse_duration(expires)
    with _factory(home, db)() as s:
        plain, row = create_token(s, name or role, role, lifetime, query_budget,
                                  max_concurrent)
    click.echo(plain)
    until = "never" if row.expires is None else row.expires.isoformat(timespec="minutes")
    click.echo(f"token {row.id} ({role}, expires {until}): shown once, stored hashed",
               err=True)


@token.command("list")
@_home_options
def token_list(home: Path, db: str | None) -> None:
    """List tokens (never their values)."""
    from sqlalchemy import select

    from certify.service.db import Token

    with _factory(home, db)() as s:
        for t in s.scalars(select(Token).order_by(Token.id)):
            state = "revoked" if t.revoked else "active"
            exp = "never" if t.expires is None else t.expires.isoformat(timespec="minutes")
            budget = "" if t.query_budget is None else \
                f"  queries {t.queries_used}/{t.query_budget}"
            click.echo(f"{t.id:>4}  {t.role:<7} {state:<8} expires {exp}  {t.name}{budget}")


@token.command("revoke")
@_home_options
@click.argument("token_id", type=int)
def token_revoke(home: Path, db: str | None, token_id: int) -> None:
    """Revoke a token by its id (see `token list`)."""
    from certify.service.auth import revoke

    with _factory(home, db)() as s:
        if not revoke(s, token_id):
            raise UsageError(f"no token {token_id}", hint="see `certify serve token list`")
    click.echo(f"token {token_id} revoked")


def _keep_bound(ctx: click.Context, param: click.Parameter, value: Any) -> None:
    ctx.meta[f"certify.client.{param.name}"] = value


def _client_options(f: Any) -> Any:
    """The options every client command shares: the service, where its token is, and the
    bounds on every answer the client reads (a deadline per request, a byte cap per file)."""
    from certify.service.bounded import DEFAULT_DEADLINE_S, DEFAULT_MAX_DOWNLOAD_MB

    f = click.option("--max-download-mb", type=click.FloatRange(min=0.001),
                     default=DEFAULT_MAX_DOWNLOAD_MB, show_default=True, expose_value=False,
                     callback=_keep_bound, help="The most MiB one downloaded file may have; "
                     "a larger answer is refused as it arrives (JSON answers: at most 8).")(f)
    f = click.option("--request-timeout", type=click.FloatRange(min=0.1),
                     default=DEFAULT_DEADLINE_S, show_default=True, expose_value=False,
                     callback=_keep_bound, help="Seconds one request may take in all, its "
                     "answer included (a server trickling bytes is cut off then).")(f)
    f = click.option("--token-env", default="CERTIFY_TOKEN", show_default=True, metavar="VAR",
                     help="Variable holding the API token.")(f)
    return click.option("--server", required=True, metavar="URL",
                        help="The certify service.")(f)


def _verify_options(f: Any) -> Any:
    """The options of a command that downloads a card: the key it must verify with, and where
    the pinned key and the log's last head are kept."""
    f = click.option("--log-state", type=click.Path(dir_okay=False, path_type=Path),
                     help="Where the service's pinned key and its log's last tree head are "
                          "kept [default: $CERTIFY_LOG_STATE or ~/.config/certify/logs.json]."
                     )(f)
    return click.option("--pubkey", type=click.Path(dir_okay=False, path_type=Path),
                        help="The service's public key: the card must verify with it "
                             "[default: the key the service sends, pinned on first use; a "
                             "later other key is refused].")(f)


def _client(server: str, token_env: str) -> Any:
    """A :class:`~certify.service.client.Client` of ``server`` with the token that
    ``token_env`` holds (a usage error when it is unset: tokens never go on the command
    line), bounded by the command's ``--request-timeout`` and ``--max-download-mb``."""
    from certify.service.bounded import Bounds
    from certify.service.client import Client

    tok = os.environ.get(token_env)
    if not tok:
        raise UsageError(f"no API token: {token_env} is not set",
                         hint="export it (certify serve token create prints one)")
    meta = click.get_current_context().meta
    bounds = Bounds(deadline_s=float(meta["certify.client.request_timeout"]),
                    max_bytes=int(float(meta["certify.client.max_download_mb"]) * 2**20))
    return Client(server, tok, bounds)


@click.command("submit")
@click.argument("model")
@_client_options
@click.option("--suite", required=True, metavar="NAME|FILE.yaml",
              help="A packaged suite name, or a suite file to upload.")
@click.option("--dataset", required=True, metavar="NAME|FILE.npz",
              help="A dataset the service registered, or an .npz (x, y) to upload.")
@click.option("--samples", type=click.IntRange(min=1),
              help="Evaluate at most this many samples (default: the suite's).")
@click.option("--seed", type=click.IntRange(min=0, max=2**63 - 1),
              help="Override the suite seed.")
@click.option("--reference", type=click.Path(dir_okay=False, path_type=Path),
              help="A reference model (.onnx).")
@click.option("--surrogate", type=click.Path(dir_okay=False, path_type=Path),
              help="Endpoint: a local .onnx model the white-box attacks run on; the endpoint "
                   "judges every candidate (a transfer attack).")
@click.option("--external-data", "extra", multiple=True,
              type=click.Path(dir_okay=False, path_type=Path),
              help="An external-data file of the model kept elsewhere than beside it "
                   "(repeatable; the files its graph names beside it are found and uploaded).")
@click.option("--auth-env", metavar="VAR",
              help="Endpoint: variable holding the secret the service sends to it.")
@click.option("--auth-header", metavar="NAME", help="Endpoint: header for that secret.")
@model_card_options
@click.option("--device", type=click.Choice(["auto", "cpu", "cuda"]), default="auto",
              show_default=True,
              help="Where the run computes: cuda waits in the queue for a worker with a GPU.")
@click.option("--wait/--no-wait", default=True, show_default=True,
              help="Follow the run and download its card.")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path),
              help="Where to put the card [default: card-RUNID].")
@_verify_options
@click.option("--timeout", "timeout_s", type=click.FloatRange(min=0.1), default=WATCH_TIMEOUT_S,
              show_default=True, help="Seconds to follow the run before giving up following "
                                      "(exit 130; the run goes on).")
def submit(model: str, server: str, suite: str, dataset: str, samples: int | None,
           seed: int | None, reference: Path | None, surrogate: Path | None,
           extra: tuple[Path, ...], token_env: str,
           auth_env: str | None, auth_header: str | None, model_name: str | None,
           model_version: str | None, owner: str | None, license: str | None,
           intended_use: str | None, device: str, wait: bool, out: Path | None,
           pubkey: Path | None, log_state: Path | None, timeout_s: float) -> int:
    """Submit MODEL (.onnx or endpoint URL) to a certify service; exit codes as `certify run`,
    or 9 when the card it downloads does not verify.

    An ONNX model's external-data files (torch.onnx.export's .data beside a large model) are
    found beside it and uploaded with it, as `certify run` finds them. With --no-wait it
    prints the run's id: `certify runs watch ID` follows it later. The card downloaded is
    verified before its verdict is printed: with the service's key (--pubkey, or pinned on
    first use), in its transparency log, as this run's and this model's.

    \b
    Example:
      CERTIFY_TOKEN=... certify submit model.onnx --server https://certify.example.com \\
          --suite gtsrb --dataset gtsrb --out card/
    """
    client = _client(server, token_env)
    secret = None
    if auth_env:
        secret = os.environ.get(auth_env)
        if not secret:
            raise UsageError(f"--auth-env {auth_env} is not set")
    stated = model_card_from(model_name=model_name, model_version=model_version, owner=owner,
                             license=license, intended_use=intended_use)
    card = {} if stated is None else {
        "model_name": stated.name, "owner": stated.owner, "license": stated.license,
        "intended_use": stated.intended_use}
    run = client.submit(model, suite, dataset, samples=samples, seed=seed,
                        reference=reference, extra_files=extra, endpoint_secret=secret,
                        endpoint_header=auth_header,
                        model_version=None if stated is None else stated.version,
                        surrogate=surrogate, card={k: v for k, v in card.items() if v},
                        device=device)
    run_id = run["id"]  # in the service's format: checked by the client
    click.echo(f"run {run_id} queued ({printable(client.server)}/runs/{run_id})", err=True)
    if not wait:
        click.echo(run_id)
        return 0
    # the model's identity is checked where the upload was the model file and the files
    # beside it (external data given from elsewhere is laid out otherwise on this machine)
    from certify.models.registry import is_endpoint

    local = None if is_endpoint(model) or extra else Path(model)
    return _follow(client, run_id, out or Path(f"card-{run_id}"), _Trust(pubkey, log_state),
                   timeout_s, local)


@dataclass(frozen=True)
class _Trust:
    """What a downloaded card is verified against: ``--pubkey`` and ``--log-state``."""

    pubkey: Path | None = None
    log_state: Path | None = None


def _follow(client: Any, run_id: str, out: Path | None, trust: _Trust,
            timeout_s: float | None = None, model: Path | None = None) -> int:
    """Follow run ``run_id`` to its end, printing its progress (stderr), then report it
    (:func:`_ended`); returns the exit code `certify run` would have given. Ctrl-C, or
    ``timeout_s`` passing, stops following and leaves the run running."""
    shown: dict[str, str] = {}

    def update(r: dict[str, Any]) -> None:
        line = _progress_line(r)
        if line != shown.get("last"):
            shown["last"] = line
            click.echo(line, err=True)

    from certify.service.client import WatchInterrupted

    try:
        final = client.wait(run_id, update, timeout_s=timeout_s)
    except KeyboardInterrupt:
        raise WatchInterrupted(
            f"stopped following run {run_id}; it goes on running on the service",
            hint=f"follow it again with `certify runs watch {run_id} --server "
                 f"{printable(client.server)}`") from None
    try:
        return _ended(client, final, out, trust, model)
    except KeyboardInterrupt:
        raise WatchInterrupted(
            f"stopped downloading the card of run {run_id} (it ended {final['state']})",
            hint=f"`certify runs fetch {run_id} --server {printable(client.server)} --out DIR` "
                 "downloads it") from None


def _ended(client: Any, final: dict[str, Any], out: Path | None, trust: _Trust,
           model: Path | None = None) -> int:
    """Report a run that ended: a finished one's card downloaded into ``out`` (without it, a
    temporary folder) and verified before anything of it is printed (its paths on stdout;
    what was checked, its verdict and log entry on stderr); a failed run's error. Returns the
    exit code `certify run` would have given, a finished run's from its verified card."""
    from certify.service.client import exit_code_of, fetch_verified

    run_id = final["id"]
    if final["state"] != "done":
        if final["state"] == "error":
            click.echo(f"error: run {run_id} failed: {printable(final.get('error'))}", err=True)
        else:
            click.echo(f"run {run_id} {final['state']}", err=True)
        return exit_code_of(final)
    if out is None:  # verified all the same, in a folder that is not kept
        import tempfile

        with tempfile.TemporaryDirectory(prefix="certify-watch-") as tmp:
            card = fetch_verified(client, final, Path(tmp) / "card", model, trust.pubkey,
                                  trust.log_state)
        click.echo(f"card: {printable(client.server)}/runs/{run_id} (verified, not kept: "
                   "--out DIR keeps it)", err=True)
    else:
        card = fetch_verified(client, final, out, model, trust.pubkey, trust.log_state)
        for p in card.files:
            click.echo(str(p))
    for line in card.checked:
        click.echo(line, err=True)
    said = final.get("exit_code")
    if said != card.exit_code:
        click.echo(f"warning: the service said exit code {printable(said, 20)}; the verified "
                   f"card's verdict gives {card.exit_code}, which is the one used", err=True)
    click.echo(f"verdict: {card.verdict} (verified; transparency log entry {card.log_index})",
               err=True)
    return card.exit_code


def _progress_line(r: dict[str, Any]) -> str:
    """The run's state and current step, every server string made printable."""
    p = r.get("progress")
    p = p if isinstance(p, dict) else {}
    cur = p.get("current")
    if r["state"] == "running" and cur:
        steps = p.get("steps")
        step = steps.get(cur) if isinstance(steps, dict) else None
        step = step if isinstance(step, dict) else {}
        doing = p.get("step")
        return (f"running: {printable(cur, 80)} {printable(step.get('done', 0), 12)}/"
                f"{printable(step.get('total', '?'), 12)}"
                + (f", {printable(doing, 80)}" if isinstance(doing, str) and doing else ""))
    return str(r["state"])


def _when(stamp: Any) -> str:
    """An API time (ISO 8601, UTC) to the second, as ``2026-11-28 12:52:57``."""
    return str(stamp or "")[:19].replace("T", " ")


@click.group("runs")
def runs() -> None:
    """Follow and download runs submitted to a certify service (this token's runs; another
    token's run answers like a missing one).

    \b
    Example:
      id=$(certify submit model.onnx --server URL --suite gtsrb --dataset gtsrb --no-wait)
      certify runs watch "$id" --server URL --out card/
    """


@runs.command("list")
@_client_options
@click.option("--state", type=click.Choice(["queued", "running", "done", "error",
                                            "cancelled"]), help="Only runs in this state.")
@click.option("--model-name", metavar="TEXT",
              help="Only runs whose model name contains TEXT.")
@click.option("--suite", metavar="NAME", help="Only runs of this suite.")
@click.option("--limit", type=click.IntRange(1, 500), default=20, show_default=True,
              help="Newest runs to list.")
@click.option("--json", "as_json", is_flag=True, help="The API's JSON.")
def runs_list(server: str, token_env: str, state: str | None, model_name: str | None,
              suite: str | None, limit: int, as_json: bool) -> None:
    """This token's runs, newest first (an admin token's: every run): id, state, verdict,
    created, suite, model, as the service states them (`runs fetch` verifies a card)."""
    import json

    page = _client(server, token_env).runs(limit=limit, state=state, model=model_name,
                                           suite=suite)
    if as_json:
        click.echo(json.dumps(page, indent=2))
        return
    rows = page["runs"]

    def cell(value: Any, width: int) -> str:
        return printable("-" if value in (None, "") else value, width)

    if rows:
        click.echo(f"{'ID':<32}  {'STATE':<9} {'VERDICT':<12} {'CREATED':<16}  SUITE  MODEL")
    for r in rows:
        click.echo(f"{cell(r.get('id'), 32):<32}  {cell(r.get('state'), 9):<9} "
                   f"{cell(r.get('verdict'), 12):<12} {cell(_when(r.get('created')), 16):<16}  "
                   f"{cell(r.get('suite'), 80)}  {cell(r.get('model'), 120)}")
    total = page.get("total")
    total = total if isinstance(total, int) and not isinstance(total, bool) else len(rows)
    if total > len(rows):
        click.echo(f"{len(rows)} of {total} runs (--limit for more)", err=True)
    elif not rows:
        click.echo("no runs", err=True)


@runs.command("show")
@click.argument("run_id")
@_client_options
@click.option("--json", "as_json", is_flag=True, help="The API's JSON.")
def runs_show(run_id: str, server: str, token_env: str, as_json: bool) -> None:
    """One run: its state, progress, verdict and card, as the service states them (`runs
    fetch` downloads the card and verifies it)."""
    import json

    client = _client(server, token_env)
    r = client.run(run_id)  # checked to be the run asked
    if as_json:
        click.echo(json.dumps(r, indent=2))
        return

    def said(key: str, width: int = 120) -> str:
        return printable(r.get(key), width)

    click.echo(f"run       {run_id}")
    click.echo(f"state     {_progress_line(r)}")
    click.echo(f"model     {said('model')} ({said('model_kind', 40)})")
    click.echo(f"suite     {said('suite')}   dataset {said('dataset')}")
    click.echo(f"created   {printable(_when(r.get('created')))}   updated "
               f"{printable(_when(r.get('updated')))}")
    progress = r.get("progress")
    checks = progress.get("checks") if isinstance(progress, dict) else None
    if isinstance(checks, dict) and checks:
        click.echo("checks    " + ", ".join(f"{printable(k, 80)} {printable(v, 40)}"
                                            for k, v in checks.items()))
    if r["state"] == "done":
        click.echo(f"verdict   {said('verdict', 20)} (as the service states it; exit code "
                   f"{said('exit_code', 10)}, transparency log entry {said('log_index', 20)}; "
                   "`certify runs fetch` verifies the card)")
        click.echo(f"card      {printable(client.server)}/runs/{run_id}")
    elif r["state"] == "error":
        click.echo(f"error     {said('error', 500)}")


@runs.command("watch")
@click.argument("run_id")
@_client_options
@click.option("--out", type=click.Path(file_okay=False, path_type=Path),
              help="Keep the card in this folder once the run is done (it is downloaded and "
                   "verified either way).")
@_verify_options
@click.option("--timeout", "timeout_s", type=click.FloatRange(min=0.1), default=WATCH_TIMEOUT_S,
              show_default=True, help="Seconds to follow the run before giving up following "
                                      "(exit 130; the run goes on).")
def runs_watch(run_id: str, server: str, token_env: str, out: Path | None,
               pubkey: Path | None, log_state: Path | None, timeout_s: float) -> int:
    """Follow a run to its end, as `certify submit` does; exit codes as `certify run` (from
    the verified card), 9 when its card does not verify. Ctrl-C or --timeout stops following
    (the run goes on)."""
    from certify.service.client import check_run_id

    check_run_id(run_id)
    return _follow(_client(server, token_env), run_id, out, _Trust(pubkey, log_state),
                   timeout_s)


@runs.command("fetch")
@click.argument("run_id")
@_client_options
@click.option("--out", type=click.Path(file_okay=False, path_type=Path),
              help="Where to put the card [default: card-RUNID].")
@_verify_options
def runs_fetch(run_id: str, server: str, token_env: str, out: Path | None,
               pubkey: Path | None, log_state: Path | None) -> int:
    """Download a finished run's card and results (card.html, card.pdf, results.json and its
    signature) and verify them before they are kept: with the service's key (--pubkey, or
    pinned on first use), in its transparency log, as this run's. Exit codes as `certify run`
    (from the verified card), 9 when the card does not verify (nothing is kept)."""
    from certify.service.client import FINAL_STATES, check_run_id

    check_run_id(run_id)  # the folder is named after the id asked, in the service's format
    client = _client(server, token_env)
    r = client.run(run_id)
    if r["state"] not in FINAL_STATES:
        raise UsageError(f"run {run_id} is {r['state']}: it has no card yet",
                         hint=f"`certify runs watch {run_id} --server "
                              f"{printable(client.server)} --out DIR` follows it and downloads "
                              "the card")
    return _ended(client, r, out or Path(f"card-{run_id}"), _Trust(pubkey, log_state))
