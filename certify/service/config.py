"""What ``certify serve`` is told by its operator: one frozen object, built by the CLI."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

#: What the processes a node starts (runs, card verifications) never inherit: the node's keys,
#: and the store's and the database's credentials (a run reads only its scratch folder).
NODE_SECRETS = frozenset({"CERTIFY_SECRETS_KEY", "CERTIFY_SIGN_KEY", "CERTIFY_SIGN_CERT",
                          "CERTIFY_SESSION_SECRET", "PGPASSWORD", "PGPASSFILE"})


def child_env() -> dict[str, str]:
    """This process's environment without :data:`NODE_SECRETS` and the S3 store's
    variables (``AWS_*``, ``CERTIFY_S3_*``)."""
    return {k: v for k, v in os.environ.items()
            if k not in NODE_SECRETS and not k.startswith(("AWS_", "CERTIFY_S3_"))}


@dataclass(frozen=True)
class ServeConfig:
    """The service's settings; every field has a ``certify serve`` option of the same name."""

    #: The service's folder: the SQLite database, the artefact store.
    home: Path
    #: SQLAlchemy URL; None means SQLite in ``home``.
    db: str | None = None
    #: Where uploads, suites and run folders live (:func:`certify.service.store_url.open_store`):
    #: ``s3://BUCKET[/PREFIX]?endpoint=URL`` or a folder; None means ``home/store``.
    store: str | None = None
    #: Answer card downloads with a redirect to the store's presigned URL (S3) instead of
    #: streaming them through the API.
    presigned_downloads: bool = False
    #: The session-cookie key, shared by every API node: a file (mode 0600); None means
    #: ``CERTIFY_SESSION_SECRET`` (hex) if set, else ``home/keys/session.key``.
    session_secret: Path | None = None
    #: The device this process's workers advertise (``auto``: CUDA where the driver answers).
    device: str = "auto"
    host: str = "127.0.0.1"
    port: int = 8470
    workers: int = 2
    #: The service's signing key (ECDSA P-256 PEM, mode 0600) and the variable holding its
    #: passphrase, if it is encrypted.
    sign_key: Path | None = None
    passphrase_env: str | None = None
    #: The key that encrypts endpoint secrets at rest (file, mode 0600; or CERTIFY_SECRETS_KEY).
    secrets_key: Path | None = None
    #: Registered datasets: name -> path of a folder or .npz.
    datasets: dict[str, Path] = field(default_factory=dict)
    #: Endpoint hosts runs may reach, "HOST" or "HOST:PORT".
    allow_endpoints: tuple[str, ...] = ()
    #: Custom ONNX operator domains uploads may use.
    allow_domains: tuple[str, ...] = ()
    max_upload_mb: int = 200
    max_dataset_mb: int = 64
    #: Limits of one run's process (a child of its worker slot's job host).
    run_timeout_s: float = 4 * 3600.0
    run_memory_mb: int = 16 * 1024
    #: Lease on a claimed run, renewed every heartbeat; an expired lease is reclaimed.
    lease_s: float = 30.0
    heartbeat_s: float = 5.0
    #: Uploads no run refers to are deleted after this many days.
    retention_days: int = 30
    executor: str = "local"
    ray_address: str | None = None
    #: Samples a submission may ask for at most.
    max_samples: int = 5000
    #: A card uploaded to be verified (``POST /api/v1/verify``, the UI's verify page).
    max_verify_mb: int = 16
    #: Verifications a minute per client address for callers without a token.
    verify_per_minute: int = 30
    #: Each verification runs in a child process (:mod:`certify.service.verify_sandbox`): its
    #: address space beyond the verifier's own code, its wall-clock and CPU seconds, how many
    #: run at once, and how long an upload waits for a free one (then 503).
    verify_memory_mb: int = 1024
    verify_timeout_s: float = 30.0
    verify_concurrency: int = 2
    verify_wait_s: float = 10.0
    #: Reverse proxies whose ``X-Forwarded-For`` names the client (rate limits).
    trusted_proxies: tuple[str, ...] = ()
    #: Per token: the most its stored uploads may take, and uploads an hour.
    token_storage_mb: int = 2048
    token_uploads_per_hour: int = 60
    #: Connection deadlines (:class:`certify.service.conn.Deadlines`): a request's headers
    #: within this many seconds of the connection's start or the previous response; a body at
    #: this many KB/s at least once the grace has passed (0: no minimum); connections at once
    #: per client address (``trusted_proxies`` are not limited).
    header_timeout_s: float = 10.0
    min_body_rate_kb: int = 64
    body_grace_s: float = 5.0
    max_connections_per_client: int = 32

    @property
    def db_url(self) -> str:
        """The database URL in use."""
        from certify.service.db import sqlite_url

        return self.db or sqlite_url(self.home)

    @property
    def store_root(self) -> Path:
        """The default local store's folder (``home/store``)."""
        return self.home / "store"

    @property
    def scratch(self) -> Path:
        """This node's own working folder: uploads being checked, runs being computed."""
        return self.home / "work"
