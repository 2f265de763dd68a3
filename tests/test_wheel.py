"""The built wheel, installed non-editable into a fresh venv, works outside the source tree.

The wheel is built with build isolation (``pip wheel``, setuptools fetched by pip) from a copy
of the source tree, so stale ``build/`` folders or the editable install cannot hide a missing
package or data file. The venv is fresh (no ``--system-site-packages``) and every command runs
from a temporary directory with ``PYTHONPATH`` unset, so the repository is not on ``sys.path``.
The wheel and the venv are built once per session; the extras (``[ray]``, ``[bundle]``) are
installed into the same venv by the last test, after the base install has been exercised
without them: ``pip check`` passes and no test extra is importable before then, so the demo and
the runs below need nothing that scripts/setup.sh adds for the tests. The demo runs where
WeasyPrint cannot load its system libraries (a shadowing ``weasyprint`` on ``PYTHONPATH`` fails
its import with cffi's real ``OSError``, as on a machine without Pango): the HTML card is
written, one line says how to get the PDF, and it exits 0.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import yaml

import builders

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[1]
# Repository folders shipped as data packages inside certify (see setup.py).
MAPPED = {"templates": "certify/_templates", "suites": "certify/_suites"}
# Never part of a build's input: caches, virtual environments, build outputs, run folders.
_JUNK = re.compile(r"^(\.venv.*|\.git|build|dist|.*\.egg-info|__pycache__|\.\w+_cache|"
                   r"\.hypothesis|certify-run|demo-card|tmp)$")
PIP_TIMEOUT = 1200
#: Import names of the [test] extra's packages (pyproject.toml): not installed with the wheel.
TEST_EXTRAS = ("pytest", "xdist", "hypothesis", "lime", "model_signing", "OpenSSL", "ray",
               "psutil", "jsonschema", "huggingface_hub", "psycopg", "playwright", "mypy")
#: A ``weasyprint`` that fails to import as the real one does without libgobject/libpango
#: (``weasyprint/text/ffi.py``: cffi's ``dlopen`` raises OSError).
NO_PANGO = ("import cffi\n"
            "cffi.FFI().dlopen('libgobject-2.0-0-absent-for-certify-tests')\n")


def _source_files(folder: Path) -> list[Path]:
    """Files under ``folder`` that a wheel must ship (no caches, hidden files or backups)."""
    return [p for p in folder.rglob("*")
            if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"
            and not p.name.startswith(".") and not p.name.endswith("~")]


def _expected_wheel_files() -> set[str]:
    expected = {p.relative_to(ROOT).as_posix() for p in _source_files(ROOT / "certify")}
    for folder, target in MAPPED.items():
        expected |= {f"{target}/{p.relative_to(ROOT / folder).as_posix()}"
                     for p in _source_files(ROOT / folder)}
    return expected


def _clean_env(venv: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PYTHONSTARTUP")}
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    env["COLUMNS"] = "200"
    return env


def _pip(venv: Path, *args: str) -> None:
    # --no-compile: pip's byte-compiling of every installed module (torch, ray ...) is about
    # half of the install; the interpreter compiles what the commands import, as it would
    proc = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q",
                           "--disable-pip-version-check", "--no-compile", *args],
                          capture_output=True, text=True, timeout=PIP_TIMEOUT,
                          env=_clean_env(venv))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]


def _certify(venv: Path, cwd: Path, *args: str | Path, timeout: float = 300,
             pythonpath: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = _clean_env(venv)
    if pythonpath is not None:  # a folder of shadowing modules (never the repository)
        env["PYTHONPATH"] = str(pythonpath)
    return subprocess.run([str(venv / "bin" / "certify"), *map(str, args)], cwd=cwd,
                          capture_output=True, text=True, timeout=timeout, env=env)


def _build_wheel(src: Path, dist: Path) -> Path:
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q",
                           "--disable-pip-version-check", "--wheel-dir", str(dist), str(src)],
                          capture_output=True, text=True, timeout=PIP_TIMEOUT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (built,) = dist.glob("certify-*.whl")
    return built


@pytest.fixture(scope="session")
def wheel(tmp_path_factory) -> Path:
    """certify's wheel, built with build isolation from a clean copy of the source tree."""
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    shutil.copytree(ROOT, src, ignore=lambda _d, names: [n for n in names if _JUNK.match(n)])
    return _build_wheel(src, tmp / "dist")


@pytest.fixture(scope="session")
def wheel_venv(wheel, tmp_path_factory) -> Path:
    """A fresh venv with the wheel (and its dependencies, no extras) installed non-editable."""
    venv = tmp_path_factory.mktemp("wheel-venv") / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    _pip(venv, str(wheel))
    return venv


@pytest.fixture(scope="session")
def workdir(tmp_path_factory) -> Path:
    """A cwd outside the source tree for the wheel's commands."""
    return tmp_path_factory.mktemp("outside")


@pytest.fixture(scope="session")
def tiny_inputs(net, model_path, tmp_path_factory) -> dict[str, Path]:
    """A tiny model, 40 generated images as .npz and a one-check suite that passes."""
    folder = tmp_path_factory.mktemp("wheel-inputs")
    data = builders.write_labelled_npz(net, folder / "d.npz", 40, seed=11)
    suite = folder / "tiny.yaml"
    suite.write_text(yaml.safe_dump({
        "name": "tiny", "classes": [f"c{i}" for i in range(builders.NUM_CLASSES)], "seed": 1,
        "checks": [{"id": "clean", "kind": "clean_accuracy",
                    "threshold": {"metric": "accuracy", "min": 0.0}}]}))
    return {"model": model_path, "data": data, "suite": suite}


@pytest.fixture(scope="session")
def signed_run(wheel_venv, workdir, tiny_inputs) -> Path:
    """A signed tiny run (card.pdf included) made by the wheel's certify, and its keys."""
    assert _certify(wheel_venv, workdir, "keygen", "--out", "keys").returncode == 0
    t = tiny_inputs
    proc = _certify(wheel_venv, workdir, "run", t["model"], "--suite", t["suite"], "--data",
                    t["data"], "--out", "tiny", "--sign-key", "keys/certify.key")
    assert proc.returncode == 0, proc.stderr
    return workdir / "tiny"


def test_wheel_ships_every_package_and_data_file(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    missing = sorted(_expected_wheel_files() - names)
    assert not missing, f"missing from the wheel: {missing}"
    # every package of the source tree is a package in the wheel (the check above covers it;
    # this states the rule the discovery must keep)
    packages = {p.parent.relative_to(ROOT).as_posix()
                for p in (ROOT / "certify").rglob("__init__.py")}
    assert {"certify/attacks", "certify/perturbations"} <= packages
    assert all(f"{p}/__init__.py" in names for p in packages)
    # nothing but the package and its metadata: no tests, benchmarks or scripts
    assert {n.split("/")[0] for n in names} == {"certify", wheel.name.split("-py")[0]
                                                + ".dist-info"}


def test_dockerfile_builds_the_same_wheel_and_installs_it(wheel, tmp_path):
    """The Dockerfile's wheel stage copies everything the build reads; the runtime installs it.

    (No Docker engine here: the wheel stage's COPY lines are replayed into a folder.)
    """
    text = (ROOT / "Dockerfile").read_text()
    stages = re.split(r"^FROM ", text, flags=re.M)[1:]
    assert len(stages) == 2 and stages[0].startswith("ubuntu") and " AS wheel" in stages[0]
    src = tmp_path / "src"
    src.mkdir()
    for line in re.findall(r"^COPY (.+)$", stages[0], flags=re.M):
        *sources, dest = line.split()
        for name in sources:  # COPY a b ./  or  COPY folder ./folder
            target = src / name if dest == "./" else src / dest
            if (ROOT / name).is_dir():
                shutil.copytree(ROOT / name, target, dirs_exist_ok=True,
                                ignore=shutil.ignore_patterns("__pycache__"))
            else:
                shutil.copy(ROOT / name, target)
    assert "pip wheel" in stages[0] and "--no-deps" in stages[0]
    rebuilt = _build_wheel(src, tmp_path / "dist")
    assert sorted(zipfile.ZipFile(rebuilt).namelist()) == sorted(zipfile.ZipFile(wheel).namelist())
    runtime = stages[1]
    assert "COPY --from=wheel /dist/" in runtime
    assert re.search(r"pip install [^\n]*certify-\*\.whl", runtime)
    assert "COPY certify" not in runtime and "pip install ." not in runtime


def test_wheel_runs_outside_the_source_tree(wheel_venv, workdir, tiny_inputs, signed_run):
    py = subprocess.run([str(wheel_venv / "bin" / "python"), "-c",
                         "import certify, sys; print(certify.__file__); print(sys.path)"],
                        cwd=workdir, capture_output=True, text=True, check=True,
                        env=_clean_env(wheel_venv))
    location, path = py.stdout.splitlines()
    assert Path(location).is_relative_to(wheel_venv), location
    assert str(ROOT) not in path

    # the wheel's dependencies are complete and consistent, and nothing of the [test] extra
    # (which scripts/setup.sh --test adds) came with it
    py = wheel_venv / "bin" / "python"
    check = subprocess.run([str(py), "-m", "pip", "check", "--disable-pip-version-check"],
                           cwd=workdir, capture_output=True, text=True, timeout=120,
                           env=_clean_env(wheel_venv))
    assert check.returncode == 0, check.stdout + check.stderr
    found = subprocess.run([str(py), "-c", "import importlib.util, sys; print(' '.join(m for m "
                            "in sys.argv[1:] if importlib.util.find_spec(m)))", *TEST_EXTRAS],
                           cwd=workdir, capture_output=True, text=True, check=True,
                           env=_clean_env(wheel_venv))
    assert found.stdout.split() == [], found.stdout

    proc = _certify(wheel_venv, workdir, "suites", "list")
    assert proc.returncode == 0 and "gtsrb" in proc.stdout, proc.stderr

    assert {"card.html", "card.pdf", "results.json", "results.json.sig"} <= {
        p.name for p in signed_run.iterdir()}
    proc = _certify(wheel_venv, workdir, "verify", "tiny/card.pdf", "--pubkey",
                    "keys/certify.pub")
    assert proc.returncode == 0, proc.stderr

    # without the extras, their commands are refused with the install hint
    t = tiny_inputs
    proc = _certify(wheel_venv, workdir, "bundle", signed_run, "--model", t["model"], "--key",
                    "keys/certify.key", "--out", "no-bundle")
    assert proc.returncode == 2 and "certify[bundle]" in proc.stderr, proc.stderr
    proc = _certify(wheel_venv, workdir, "run", t["model"], "--suite", t["suite"], "--data",
                    t["data"], "--out", "no-ray", "--no-pdf", "--executor", "ray")
    assert proc.returncode == 2 and "certify[ray]" in proc.stderr, proc.stderr
    proc = _certify(wheel_venv, workdir, "run", "grpc://127.0.0.1:9/v2/models/m", "--suite",
                    t["suite"], "--data", t["data"], "--out", "no-grpc", "--no-pdf")
    assert proc.returncode == 2 and "certify[grpc]" in proc.stderr, proc.stderr


def test_wheel_demo_runs_to_the_end(wheel_venv, workdir, demo_small_suite, demo_small_run,
                                    tmp_path):
    """The installed demo (bundled models, sign generator, packaged suite) on a small suite of
    every check kind gives the source tree's measurement byte for byte, where WeasyPrint
    cannot load its system libraries: card.html, one line on the PDF, exit 0."""
    shadow = tmp_path / "no-pango"
    (shadow / "weasyprint").mkdir(parents=True)
    (shadow / "weasyprint" / "__init__.py").write_text(NO_PANGO)
    proc = _certify(wheel_venv, workdir, "demo", "--suite", demo_small_suite, "--out", "demo",
                    timeout=600, pythonpath=shadow)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (workdir / "demo" / "card.html").is_file()
    assert not (workdir / "demo" / "card.pdf").exists()
    hints = [line for line in proc.stderr.splitlines() if "card.pdf" in line]
    assert len(hints) == 1 and hints[0].startswith(
        "card.pdf not written: WeasyPrint cannot load its system libraries (OSError: cannot "
        "load library 'libgobject-2.0-0-absent-for-certify-tests')"), proc.stderr[-3000:]
    assert "libpango-1.0-0" in hints[0] and hints[0].endswith("--resume")
    assert "verdict:" in proc.stdout
    assert builders.measurement(workdir / "demo") == builders.measurement(demo_small_run)
    proc = _certify(wheel_venv, workdir, "suites", "show", "gtsrb")
    assert proc.returncode == 0 and "square_linf" in proc.stdout, proc.stderr


def test_wheel_extras(wheel, wheel_venv, workdir, tiny_inputs, signed_run):
    """[ray] and [bundle] from the same wheel: their commands work (runs after the base tests)."""
    _pip(wheel_venv, f"{wheel}[ray,bundle]")
    t = tiny_inputs
    proc = _certify(wheel_venv, workdir, "run", t["model"], "--suite", t["suite"], "--data",
                    t["data"], "--out", "ray", "--no-pdf", "--executor", "ray", "--workers",
                    "1", timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (workdir / "ray" / "results.json").is_file()

    proc = _certify(wheel_venv, workdir, "bundle", signed_run, "--model", t["model"], "--key",
                    "keys/certify.key", "--out", "bundle")
    assert proc.returncode == 0, proc.stderr
    (signature,) = re.findall(r"^signature: (.+)$", proc.stdout, flags=re.M)
    proc = _certify(wheel_venv, workdir, "verify-bundle", "bundle", "--signature", signature,
                    "--pubkey", "keys/certify.pub")
    assert proc.returncode == 0, proc.stderr
