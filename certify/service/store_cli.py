"""``certify store``: the service's object store from the command line.

``certify store migrate --home HOME --to s3://BUCKET/PREFIX?endpoint=...`` copies every object
of a single-machine service's local store (``HOME/store``) to another store, e.g. before
starting the service with ``--store s3://...``. It copies object by object through the
:class:`certify.service.store.Store` protocol and skips an object the target already holds
with the same size, so an interrupted migration is finished by running the same command again.
"""

from __future__ import annotations

from pathlib import Path

import click

from certify.errors import UsageError


def _mb(n: int) -> str:
    return f"{n / 1e6:.1f} MB"


@click.group("store")
def store() -> None:
    """The service's object store (uploads, suites, runs' folders)."""


@store.command("migrate")
@click.option("--home", required=True, type=click.Path(file_okay=False, path_type=Path),
              help="The service's folder (as given to `certify serve --home`): its store "
                   "folder HOME/store is copied.")
@click.option("--to", "target_url", required=True, metavar="URL",
              help="The store to copy to: s3://BUCKET[/PREFIX]?endpoint=URL&region=NAME "
                   "(credentials from AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY), or a folder.")
@click.option("--dry-run", is_flag=True, help="List what would be copied; copy nothing.")
@click.option("--progress-every", type=click.IntRange(min=1), default=100, show_default=True,
              help="Print progress after this many objects.")
def migrate(home: Path, target_url: str, dry_run: bool, progress_every: int) -> None:
    """Copy every object of HOME/store to the store --to names.

    An object the target already holds with the same size is skipped, so running the same
    command again after an interruption copies only what is missing. Stop the service (or run
    the command again after it stopped) so that objects written meanwhile are copied too.

    \b
    Example:
      AWS_ACCESS_KEY_ID=... AWS_SECRET_ACCESS_KEY=... \\
        certify store migrate --home certify-service \\
          --to 's3://certify/prod?endpoint=https://minio.example.org'
    """
    from certify.service.store import LocalStore, NotInStore, StoreError
    from certify.service.store_url import open_store

    folder = home / "store"
    if not home.is_dir():
        raise UsageError(f"--home {home} is not a folder",
                         hint="name the folder `certify serve --home` uses")
    if not folder.is_dir():
        raise UsageError(f"{home} has no store folder ({folder}): nothing to migrate",
                         hint="name the folder `certify serve --home` uses")
    try:
        source = LocalStore(folder)
        target = open_store(target_url, home)
    except StoreError as exc:
        raise UsageError(f"--to: {exc}") from None
    if target.description == source.description:
        raise UsageError("--to names the store being copied")
    try:
        target.ping()
    except StoreError as exc:
        raise UsageError(f"the target store does not answer: {exc}",
                         hint="check --to's endpoint and bucket, and the credentials in the "
                              "environment") from None

    # a home from before issue 39 spooled uploads in store/tmp/: partial files, never objects
    keys = [k for k in source.list("") if not k.startswith("tmp/")]
    click.echo(f"{len(keys)} objects in {source.description}; copying to "
               f"{target.description}" + (" (dry run: nothing is copied)" if dry_run else ""))
    copied = copied_bytes = present = present_bytes = gone = 0
    for i, key in enumerate(keys, start=1):
        size = source.size(key)
        if size is None:  # deleted since the listing (retention)
            gone += 1
            continue
        try:
            there = target.size(key)
            if there == size:
                present += 1
                present_bytes += size
            elif dry_run:
                click.echo(f"would copy {key} ({size} bytes)")
                copied += 1
                copied_bytes += size
            else:
                try:
                    with source.open(key) as f:
                        copied_bytes += target.put(key, f)
                except NotInStore:
                    gone += 1
                    continue
                copied += 1
        except StoreError as exc:
            raise UsageError(
                f"copying {key} failed after {copied} objects ({_mb(copied_bytes)}): {exc}",
                hint="run the same command again: objects already copied are skipped") from None
        if i % progress_every == 0 and i < len(keys):
            click.echo(f"{i}/{len(keys)} objects: {copied} "
                       f"{'to copy' if dry_run else 'copied'} ({_mb(copied_bytes)}), "
                       f"{present} already there")
    verb = "would copy" if dry_run else "copied"
    click.echo(f"{verb} {copied} objects ({_mb(copied_bytes)}) to {target.description}; "
               f"{present} already there ({_mb(present_bytes)})"
               + (f"; {gone} deleted meanwhile" if gone else ""))
