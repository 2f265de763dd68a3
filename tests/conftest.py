"""Shared fixtures: a seeded tiny model and GTSRB-layout folders built per session.

Tiers: every test module declares ``pytestmark`` ``unit`` (library code on small inputs) or
``e2e`` (the CLI in-process, a server, a subprocess); ``slow`` marks what costs more than about
20 s on 2 cores. A test that uses the shared demo run is ``slow`` by that alone (added here).
``pytest -m "not slow"`` is the fast tier.

Parallel runs (``-n 2 --dist loadgroup``, as scripts/test.sh runs them): each module's tests run
on one worker (its module fixtures are built once), except that every test of the shared demo
run goes to one worker (``demo``: the demo runs once) and every test that starts Ray to another
group (``ray``: the Ray tests look for Ray's processes on the machine).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent))

import builders  # noqa: E402

#: Fixtures whose first use costs a full demo run.
DEMO_FIXTURES = {"demo_run", "demo_card"}
#: Modules whose tests all start Ray (the wheel's extras test runs the Ray executor).
RAY_MODULES = {"test_ray.py", "test_wheel.py"}
#: The groups that take longest, longest first (seconds in one CI run of 2026-11-27: ray 624,
#: demo 362, test_service_restart.py 287, test_convergence.py 269, test_white_box.py 243,
#: test_many_machines.py 202, test_service.py 120, test_ci_action.py 112; the architecture
#: corpus, test_architectures.py, about 90 alone on 2026-11-28). A parallel run
#: starts them first, so that it does not end with one worker in a long group and the other
#: with nothing left to do (xdist's own order is by number of tests).
LONG_GROUPS = ("ray", "demo", "test_service_restart.py", "test_convergence.py",
               "test_white_box.py", "test_many_machines.py", "test_service.py",
               "test_ci_action.py", "test_architectures.py")


def worker_group(item: pytest.Item) -> str:
    """The xdist group a test runs in: ``demo``, ``ray``, or its module's file name."""
    if DEMO_FIXTURES & set(getattr(item, "fixturenames", ())):
        return "demo"
    name = getattr(item, "originalname", item.name)
    if item.path.name in RAY_MODULES or re.search(r"(^|_)ray(_|$)", name):
        return "ray"
    return item.path.name


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark demo users ``slow``; refuse a test in no tier (``unit`` or ``e2e``).

    Runs first: pytest's ``-m`` selection and xdist's ``loadgroup`` read the markers added here
    in their own hooks of the same name (run after this one, they would not see them).
    """
    untiered = []
    parallel = config.pluginmanager.hasplugin("xdist")
    for item in items:
        if DEMO_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)
        if parallel:
            item.add_marker(pytest.mark.xdist_group(worker_group(item)))
        if item.get_closest_marker("unit") is None and item.get_closest_marker("e2e") is None:
            untiered.append(item.nodeid)
    if untiered:
        raise pytest.UsageError("tests in no tier (mark them unit or e2e): "
                                + ", ".join(untiered[:5]))
    if config.getoption("dist", None) == "loadgroup":
        # longest groups first; a group's tests keep their order
        rank = {g: k for k, g in enumerate(LONG_GROUPS)}
        items.sort(key=lambda item: rank.get(worker_group(item), len(rank)))


def pytest_configure(config: pytest.Config) -> None:
    """Refuse a parallel run whose workers would not group the tests; have xdist hand the
    groups out in the order collected (the longest first: :data:`LONG_GROUPS`).

    pytest 9.2 derives ``item.nodeid``, so the group suffix pytest-xdist 3.8 sets for
    ``--dist loadgroup`` is lost: every module's fixtures and the demo would then be built on
    every worker, and the Ray tests would run side by side (pyproject.toml pins pytest below
    9.2 for this).
    """
    if config.getoption("dist", None) != "loadgroup":
        return
    # xdist hands out the groups in the order collected (see LONG_GROUPS), not by size
    config.option.loadscopereorder = False
    if pytest.version_tuple >= (9, 2):
        raise pytest.UsageError(
            f"pytest {pytest.__version__} does not keep pytest-xdist's test groups "
            "(--dist loadgroup): install the pytest version pyproject.toml asks for "
            "(bash scripts/setup.sh does)")


@pytest.fixture(scope="session")
def net():
    return builders.make_net(seed=0)


@pytest.fixture(scope="session")
def dataset_arrays(net):
    x = builders.make_images(172, seed=3)
    y = builders.make_labels(net, x, seed=3)
    return x, y


@pytest.fixture(scope="session")
def model_path(net, tmp_path_factory) -> Path:
    return builders.export(net, tmp_path_factory.mktemp("models") / "tiny.onnx")


@pytest.fixture(scope="session")
def official_dir(dataset_arrays, tmp_path_factory) -> Path:
    x, y = dataset_arrays
    return builders.write_gtsrb_official(tmp_path_factory.mktemp("official") / "Images", x, y)


@pytest.fixture(scope="session")
def csv_dir(dataset_arrays, tmp_path_factory) -> Path:
    x, y = dataset_arrays
    return builders.write_gtsrb_csv(tmp_path_factory.mktemp("csvlayout"), x, y)


@pytest.fixture(scope="session")
def npz_path(dataset_arrays, tmp_path_factory) -> Path:
    x, y = dataset_arrays
    p = tmp_path_factory.mktemp("npz") / "data.npz"
    np.savez(p, x=x, y=y)
    return p


@pytest.fixture(scope="session")
def clean_suite(tmp_path_factory) -> Path:
    """The gtsrb suite reduced to its clean-accuracy check (fast end-to-end runs)."""
    import yaml

    from certify.suite import resolve_suite_path

    raw = yaml.safe_load(resolve_suite_path("gtsrb").read_text())
    raw["checks"] = [c for c in raw["checks"] if c["kind"] == "clean_accuracy"]
    path = tmp_path_factory.mktemp("suites") / "gtsrb-clean.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


@pytest.fixture(scope="session")
def demo_small_suite(tmp_path_factory) -> Path:
    """The packaged suite cut to one small check of each kind the demo runs."""
    return builders.write_demo_small_suite(tmp_path_factory.mktemp("suites") / "small.yaml")


@pytest.fixture(scope="session")
def demo_small_run(demo_small_suite, tmp_path_factory) -> Path:
    """`certify demo --suite <small>` in-process: the local run the Ray and wheel runs match."""
    out = tmp_path_factory.mktemp("demo-small") / "card"
    proc = builders.run_cli("demo", "--suite", demo_small_suite, "--no-pdf", "--out", out)
    assert proc.returncode == 0, proc.stderr
    return out


@pytest.fixture(scope="session")
def demo_run(tmp_path_factory) -> Path:
    """One `certify demo` run shared by the tests that look at its card."""
    import builders as b

    out = tmp_path_factory.mktemp("demo") / "card"
    proc = b.run_cli("demo", "--out", out, timeout=900)
    assert proc.returncode == 0, proc.stderr
    (out / "stdout.txt").write_text(proc.stdout)
    return out


@pytest.fixture(scope="session")
def s3_server():
    """moto's S3 server for the session (started by the first test that asks), with a bucket
    ``certify-test`` and its dummy credentials in ``os.environ`` until the session ends."""
    from s3server import create_bucket, moto_server

    with moto_server() as server, server.credentials():
        create_bucket(server, "certify-test")
        yield server


@pytest.fixture(scope="session")
def s3_url(s3_server) -> str:
    """``s3://certify-test/<fresh prefix>?endpoint=...`` on the session's moto server."""
    import uuid

    return s3_server.url("certify-test", f"session-{uuid.uuid4().hex[:12]}")
