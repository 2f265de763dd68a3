"""Shared fixtures: a seeded tiny model and GTSRB-layout folders built per session."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent))

import builders  # noqa: E402


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
def demo_run(tmp_path_factory) -> Path:
    """One `certify demo` run shared by the tests that look at its card."""
    import builders as b

    out = tmp_path_factory.mktemp("demo") / "card"
    proc = b.run_cli("demo", "--out", out, timeout=900)
    assert proc.returncode == 0, proc.stderr
    (out / "stdout.txt").write_text(proc.stdout)
    return out
