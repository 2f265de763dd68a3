"""Issue 51 point 6: ``certify runs list|show|watch|fetch`` against a real ``certify serve``, and
``certify submit`` of an ONNX model whose weights live in an external-data file.

One service for the module (one worker, the clean-accuracy suite, 8 samples) and two submitting
tokens. A run submitted with ``--no-wait`` is followed twice: once interrupted (Ctrl-C, planted
as the first poll's sleep raising KeyboardInterrupt), then to its card.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
from service_fixture import Service, free_port, small_inputs

from builders import run_cli

pytestmark = pytest.mark.e2e

FILES = ("card.html", "card.pdf", "results.json", "results.json.sig")


def _demo() -> Path:
    from certify.api import demo_model_path

    return demo_model_path("standard")


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    """One SQLite service with one worker and the small demo data registered as 'small'."""
    folder = tmp_path_factory.mktemp("runs-cli")
    _, data = small_inputs(folder / "in", per_class=1)
    svc = Service(folder / "home", "--workers", "1", "--dataset", f"small={data}",
                  "--heartbeat", "0.5").start()
    try:
        yield svc
    finally:
        svc.stop()


@pytest.fixture(scope="module")
def tokens(service: Service) -> dict[str, str]:
    """Two submitting tokens: 'a' submits the runs, 'b' is another tenant."""
    return {"a": service.token("submit"), "b": service.token("submit")}


def _submit(service: Service, token: str, suite: Path, model: Path, *extra: str | Path
            ) -> subprocess.CompletedProcess[str]:
    return run_cli("submit", model, "--server", service.url, "--suite", suite, "--dataset",
                   "small", "--samples", "8", *extra, env={"CERTIFY_TOKEN": token})


def _runs(service: Service, token: str, *args: str | Path) -> subprocess.CompletedProcess[str]:
    """``certify runs ARGS --server URL`` with ``token`` (in-process)."""
    return run_cli("runs", *args, "--server", service.url, env={"CERTIFY_TOKEN": token})


@dataclass
class Followed:
    """A run submitted with --no-wait, followed (interrupted, then to its card)."""

    run_id: str
    submitted: subprocess.CompletedProcess[str]
    interrupted: subprocess.CompletedProcess[str]
    after_interrupt: dict[str, Any]
    watched: subprocess.CompletedProcess[str]
    final: dict[str, Any]
    out: Path


@pytest.fixture(scope="module")
def followed(service: Service, tokens: dict[str, str], clean_suite: Path,
             tmp_path_factory: pytest.TempPathFactory) -> Followed:
    sub = _submit(service, tokens["a"], clean_suite, _demo(), "--no-wait")
    assert sub.returncode == 0, sub.stdout + sub.stderr
    run_id = sub.stdout.strip()
    # Ctrl-C while the run is queued or running: the first poll shows it, the sleep after it
    # is interrupted
    with mock.patch("certify.service.client.time.sleep", side_effect=KeyboardInterrupt):
        interrupted = _runs(service, tokens["a"], "watch", run_id)
    after = service.get(f"/runs/{run_id}", tokens["a"]).json()
    out = tmp_path_factory.mktemp("watched") / "card"
    watched = _runs(service, tokens["a"], "watch", run_id, "--out", str(out))
    final = service.get(f"/runs/{run_id}", tokens["a"]).json()
    return Followed(run_id, sub, interrupted, after, watched, final, out)


@pytest.mark.slow
def test_runs_watch_follows_a_no_wait_run_to_its_card(followed: Followed) -> None:
    f = followed
    assert len(f.run_id) == 32 and int(f.run_id, 16) >= 0, f.submitted.stdout
    assert f"runs/{f.run_id}" in f.submitted.stderr
    assert f.final["state"] == "done", f.final
    # exit codes as submit's (those of certify run, from the run's verdict)
    assert f.watched.returncode == f.final["exit_code"], f.watched.stdout + f.watched.stderr
    assert f"verdict: {f.final['verdict']}" in f.watched.stderr
    assert f"the card is run {f.run_id}'s" in f.watched.stderr
    linked = sorted(n for n in FILES if n in f.final["links"])
    assert {"card.html", "results.json", "results.json.sig"} <= set(linked)
    assert sorted(p.name for p in f.out.iterdir()) == linked
    assert f.watched.stdout.split() == [str(f.out / n) for n in FILES if n in linked]
    doc = json.loads((f.out / "results.json").read_text())
    assert doc["provenance"]["service"]["run_id"] == f.run_id
    assert [c["id"] for c in doc["measurement"]["checks"]] == ["clean"]


@pytest.mark.slow
def test_ctrl_c_stops_following_leaves_the_run_running_and_says_how_to_resume(
        followed: Followed, service: Service) -> None:
    f = followed
    assert f.interrupted.returncode == 130, f.interrupted.stdout + f.interrupted.stderr
    said = f.interrupted.stderr.strip().splitlines()
    # what the one poll showed (a worker of this process claims a submitted run at once)
    assert said[0] in ("queued", "running")
    assert len(said) == 2 and "Traceback" not in f.interrupted.stderr
    assert f"stopped following run {f.run_id}; it goes on running on the service" in said[1]
    assert f"certify runs watch {f.run_id} --server {service.url}" in said[1]
    assert f.after_interrupt["state"] in ("queued", "running"), f.after_interrupt
    assert f.final["state"] == "done" and f.final["attempts"] == 1


@pytest.mark.slow
def test_runs_fetch_writes_the_card_files(followed: Followed, service: Service,
                                          tokens: dict[str, str], tmp_path: Path) -> None:
    r = _runs(service, tokens["a"], "fetch", followed.run_id, "--out", str(tmp_path / "c"))
    assert r.returncode == followed.final["exit_code"], r.stdout + r.stderr
    names = sorted(p.name for p in (tmp_path / "c").iterdir())
    assert names == sorted(p.name for p in followed.out.iterdir())
    for n in names:  # the same files watch downloaded
        assert (tmp_path / "c" / n).read_bytes() == (followed.out / n).read_bytes(), n
    assert f"the card is run {followed.run_id}'s" in r.stderr


@pytest.mark.slow
def test_runs_list_and_show_are_the_token_s_own(followed: Followed, service: Service,
                                                tokens: dict[str, str]) -> None:
    mine = _runs(service, tokens["a"], "list")
    assert mine.returncode == 0, mine.stderr
    row = next(line for line in mine.stdout.splitlines() if line.startswith(followed.run_id))
    assert row.split()[1:3] == ["done", followed.final["verdict"]]
    assert "gtsrb" in row and "standard" in row
    assert mine.stdout.splitlines()[0].split()[:4] == ["ID", "STATE", "VERDICT", "CREATED"]
    as_json = json.loads(_runs(service, tokens["a"], "list", "--json").stdout)
    assert followed.run_id in [x["id"] for x in as_json["runs"]]
    others = _runs(service, tokens["b"], "list", "--json")
    assert others.returncode == 0, others.stderr
    assert followed.run_id not in others.stdout
    assert all(x["id"] != followed.run_id for x in json.loads(others.stdout)["runs"])
    shown = _runs(service, tokens["a"], "show", followed.run_id)
    assert shown.returncode == 0, shown.stderr
    assert "state     done" in shown.stdout and followed.final["verdict"] in shown.stdout
    assert f"{service.url}/runs/{followed.run_id}" in shown.stdout
    doc = json.loads(_runs(service, tokens["a"], "show", followed.run_id, "--json").stdout)
    assert doc["id"] == followed.run_id and doc["state"] == "done"
    # issue 62: --model-name filters (it was ignored)
    named = _runs(service, tokens["a"], "list", "--model-name", "standard")
    assert followed.run_id in named.stdout, named.stdout + named.stderr
    other = _runs(service, tokens["a"], "list", "--model-name", "no-such-model")
    assert other.returncode == 0 and followed.run_id not in other.stdout
    assert "no runs" in other.stderr


@pytest.mark.slow
def test_another_token_s_run_answers_like_a_missing_one(
        followed: Followed, service: Service, tokens: dict[str, str], tmp_path: Path) -> None:
    missing = uuid.uuid4().hex
    for cmd in (("show",), ("watch",), ("fetch", "--out", str(tmp_path / "x"))):
        other = _runs(service, tokens["b"], cmd[0], followed.run_id, *cmd[1:])
        absent = _runs(service, tokens["b"], cmd[0], missing, *cmd[1:])
        assert other.returncode == absent.returncode == 2, other.stderr
        assert other.stderr.replace(followed.run_id, "ID") == absent.stderr.replace(missing, "ID")
        assert other.stderr.strip() == (
            f"error: no run {followed.run_id!r} on {service.url} for this token "
            "(hint: `certify runs list` shows this token's runs)")
        assert other.stdout == absent.stdout == ""
    assert not (tmp_path / "x").exists()
    # the API behind it: one 404, the same words
    a = service.get(f"/runs/{followed.run_id}", tokens["b"])
    b = service.get(f"/runs/{missing}", tokens["b"])
    assert a.status_code == b.status_code == 404
    assert a.json()["detail"].replace(followed.run_id, "ID") == \
        b.json()["detail"].replace(missing, "ID")


@pytest.fixture(scope="module")
def external_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo model saved as torch.onnx.export saves a large one: weights in a .data file."""
    import onnx

    folder = tmp_path_factory.mktemp("external")
    path = folder / "signs.onnx"
    onnx.save_model(onnx.load(str(_demo())), str(path), save_as_external_data=True,
                    all_tensors_to_one_file=True, size_threshold=0)
    assert len(list(folder.iterdir())) == 2
    return path


@pytest.mark.slow
def test_submit_uploads_the_external_data_it_finds_beside_the_model(
        service: Service, tokens: dict[str, str], clean_suite: Path, external_model: Path,
        tmp_path: Path) -> None:
    from certify.onnx_files import external_data_files, model_identity

    assert external_data_files(external_model)  # the weights are not in the graph file
    r = _submit(service, tokens["a"], clean_suite, external_model, "--out", tmp_path / "card")
    results = tmp_path / "card" / "results.json"
    assert results.is_file(), r.stdout + r.stderr
    doc = json.loads(results.read_text())
    run = service.get(f"/runs/{doc['provenance']['service']['run_id']}", tokens["a"]).json()
    assert run["state"] == "done" and r.returncode == run["exit_code"], r.stderr
    # the card measured the graph and its weights as uploaded: their manifest identity
    assert doc["measurement"]["model"]["identity"] == model_identity(external_model)
    assert f"measured {external_model.name} ({model_identity(external_model)})" in r.stderr


def test_missing_external_data_is_named_with_the_option(
        service: Service, tokens: dict[str, str], clean_suite: Path, external_model: Path,
        tmp_path: Path) -> None:
    from certify.service.client import model_files

    (data,) = [p for p in external_model.parent.iterdir() if p != external_model]
    lonely = tmp_path / "alone" / external_model.name
    lonely.parent.mkdir()
    shutil.copyfile(external_model, lonely)
    r = _submit(service, tokens["a"], clean_suite, lonely, "--no-wait")
    assert r.returncode == 2 and r.stdout == "", r.stdout + r.stderr
    assert r.stderr.strip() == (
        f"error: {lonely.name} references external data {data.name!r}, which is missing from "
        f"{lonely.parent} (hint: copy {data.name} beside the model, or name where it is with "
        "--external-data PATH)")
    # kept elsewhere and named: found by its file name, uploaded after the model
    assert model_files(lonely, (data,)) == [lonely, data]
    assert model_files(external_model) == [external_model, data]
    # the service's own refusal of the graph without its weights names the option too
    with lonely.open("rb") as m:
        refused = service.post("/runs", tokens["a"], files={"model": (lonely.name, m)},
                               data={"suite": "gtsrb", "dataset": "small"})
    assert refused.status_code == 422
    assert "not among the uploaded files" in refused.json()["detail"]
    assert "--external-data" in refused.json()["detail"]


@pytest.mark.slow
def test_watch_of_a_failed_run_says_why_in_one_line(
        service: Service, tokens: dict[str, str], clean_suite: Path, tmp_path: Path) -> None:
    """A model that passes the upload's static checks and fails in the run (its input is not
    an image): watch ends with the run's error and its exit code."""
    import onnx
    from onnx import TensorProto, helper

    g = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])])
    model = tmp_path / "flat.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(model))
    sub = _submit(service, tokens["b"], clean_suite, model, "--no-wait")
    assert sub.returncode == 0, sub.stderr
    run_id = sub.stdout.strip()
    w = _runs(service, tokens["b"], "watch", run_id)
    final = service.get(f"/runs/{run_id}", tokens["b"]).json()
    assert final["state"] == "error", final
    assert w.returncode == final["exit_code"] != 0, w.stderr
    last = w.stderr.strip().splitlines()[-1]
    assert last == f"error: run {run_id} failed: {final['error']}"
    assert "Traceback" not in w.stderr and w.stdout == ""
    f = _runs(service, tokens["b"], "fetch", run_id, "--out", str(tmp_path / "none"))
    assert f.returncode == final["exit_code"] and not (tmp_path / "none").exists()


def test_unreachable_server_bad_token_and_no_token_are_one_line_errors(
        service: Service) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    r = run_cli("runs", "list", "--server", dead, env={"CERTIFY_TOKEN": "cfy_x"})
    assert r.returncode == 2
    assert r.stderr.strip() == (f"error: cannot reach the certify service at {dead}/api/v1: "
                                "ConnectionError (hint: check --server and that the service "
                                "is running)")
    bad = _runs(service, "cfy_not-a-token", "show", uuid.uuid4().hex)
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1
    assert "(401)" in bad.stderr and "certify serve token create" in bad.stderr
    none = run_cli("runs", "watch", uuid.uuid4().hex, "--server", service.url,
                   env={"CERTIFY_TOKEN": ""})
    assert none.returncode == 2
    assert "no API token: CERTIFY_TOKEN is not set" in none.stderr
