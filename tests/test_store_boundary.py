"""Issue 39: no local path crosses the store protocol. The service reaches what it keeps
outside its database only through :class:`certify.service.store.Store` (keys and streams), so
that the local folder and an S3-compatible store are interchangeable."""

from __future__ import annotations

import ast
import inspect
import os
import typing
from pathlib import Path, PurePath

import pytest

import certify.service
from certify.service import store as store_mod

pytestmark = pytest.mark.unit

SERVICE = Path(certify.service.__file__).parent
#: The store's own modules, which alone know where objects live.
STORES = {"store.py", "store_s3.py", "store_url.py"}


def _mentions_path(hint: object) -> bool:
    if hint in (Path, PurePath, os.PathLike) or (isinstance(hint, type)
                                                  and issubclass(hint, (PurePath, os.PathLike))):
        return True
    return any(_mentions_path(arg) for arg in typing.get_args(hint))


def test_the_store_protocol_takes_and_gives_no_local_path() -> None:
    methods = [name for name, member in inspect.getmembers(store_mod.Store)
               if inspect.isfunction(member) and not name.startswith("_")]
    assert set(methods) >= {"put", "open", "size", "list", "delete", "download_url", "ping"}
    for name in methods:
        hints = typing.get_type_hints(getattr(store_mod.Store, name))
        assert hints, name
        for arg, hint in hints.items():
            assert not _mentions_path(hint), f"Store.{name}: {arg} is {hint}"
    # both stores implement it, with the same method names and no extra public way in
    from certify.service.store_s3 import S3Store

    for cls in (store_mod.LocalStore, S3Store):
        public = {n for n, m in inspect.getmembers(cls) if inspect.isfunction(m)
                  and not n.startswith("_")} - {"from_url"}
        assert public == set(methods), (cls.__name__, public ^ set(methods))


def _attributes(tree: ast.AST) -> set[str]:
    return {node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute)}


def test_no_service_module_reaches_past_the_store_to_a_path() -> None:
    """Outside the stores, nothing reads a store's folder, a run's folder in it, or the old
    path-returning calls; the default local store's folder is named only where it is made."""
    offenders = []
    for path in sorted(SERVICE.rglob("*.py")):
        if path.name in STORES:
            continue
        attrs = _attributes(ast.parse(path.read_text(encoding="utf-8")))
        for banned in ("_root", "run_dir", "put_stream", "root_path"):
            if banned in attrs:
                offenders.append(f"{path.name}: .{banned}")
        if "store_root" in attrs and path.name not in ("app.py", "config.py"):
            offenders.append(f"{path.name}: .store_root")
        # `certify store migrate` reads a local home's store by definition
        if "LocalStore" in path.read_text(encoding="utf-8") and path.name != "store_cli.py":
            offenders.append(f"{path.name}: builds a LocalStore itself")
    assert offenders == []


def test_the_store_module_keeps_its_paths_inside_the_local_store() -> None:
    """In store.py, local paths appear only in the local store, the node-local helpers that
    copy objects to a worker's scratch folder and the upload spool."""
    tree = ast.parse(Path(store_mod.__file__).read_text(encoding="utf-8"))
    allowed = {"LocalStore", "fetch_tree", "fetch_file", "spool_upload", "Spooled"}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name not in allowed:
            names = {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
            assert "Path" not in names, node.name
