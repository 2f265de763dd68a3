"""The Python API, ``certify.evaluate``: a model in memory (a torch module trained here, a
black-box ``predict`` object) and data in memory get a card from the same engine as the CLI."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

import certify
from certify.device import choose_device
from certify.errors import DataError, UsageError
from certify.models.torchprog import from_module
from certify.report.card import limitations
from certify.results import RunResult

import builders

pytestmark = pytest.mark.e2e

EXTRA = [
    {"id": "apgd", "kind": "attack", "samples": 6,
     "params": {"attack": "apgd_ce", "norm": "linf", "epsilon": 0.0314, "eps_sweep": False},
     "threshold": {"metric": "robust_accuracy", "min": 0.0}},
    {"id": "square", "kind": "attack", "samples": 6,
     "params": {"attack": "square_linf", "epsilon": 0.0314, "max_queries": 200},
     "threshold": {"metric": "robust_accuracy", "min": 0.0}},
]


@pytest.fixture(scope="module")
def api_suite(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return builders.write_small_suite(tmp_path_factory.mktemp("api") / "suite.yaml", "api",
                                      EXTRA)


def _trained(x: np.ndarray, y: np.ndarray) -> nn.Module:
    """A tiny CNN trained for a few steps on ``x`` (uint8 NHWC), as a training script would."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(4),
                        nn.Flatten(), nn.Linear(8 * 8 * 8, builders.NUM_CLASSES))
    xt = torch.from_numpy(x.transpose(0, 3, 1, 2).copy()).float() / 255
    yt = torch.from_numpy(y).long()
    opt = torch.optim.Adam(net.parameters(), lr=1e-2)
    for _ in range(30):
        opt.zero_grad()
        nn.functional.cross_entropy(net(xt), yt).backward()
        opt.step()
    return net.train()  # left in training mode: certify evaluates it in eval mode


def _rows(result: RunResult) -> dict[str, dict]:
    doc = result.to_json()
    return {c["id"]: c for c in doc["measurement"]["checks"]}


def test_a_module_trained_in_memory_gets_a_card(dataset_arrays: tuple, api_suite: Path,
                                                tmp_path: Path) -> None:
    x, y = dataset_arrays
    net = _trained(x, y)
    result = certify.evaluate(net, (x, y), suite=str(api_suite), out=tmp_path / "card",
                              pdf=False)
    assert net.training  # its mode is given back
    rows = _rows(result)
    model = result.to_json()["measurement"]["model"]
    assert model["white_box"] == "available" and model["identity"].startswith("sha256:")
    assert "in memory" in model["metadata"]["format"]
    with torch.no_grad():
        want = (net.eval()(torch.from_numpy(x.transpose(0, 3, 1, 2).copy()).float() / 255)
                .argmax(1).numpy() == y).mean()
    assert rows["clean"]["metrics"]["accuracy"] == pytest.approx(want)
    assert rows["apgd"]["status"] != "SKIPPED" and rows["apgd"]["metrics"]["gradient_evaluations"]
    assert (tmp_path / "card" / "card.html").is_file()
    assert (tmp_path / "card" / "results.json").is_file()
    # the same module again: the same identity (a digest of its exported program)
    again = from_module(net, choose_device("cpu"), None, (32, 32), None)
    assert again.info.identity == model["identity"]


class _Scores:
    """A black-box model: a torch module behind a numpy predict() that returns probabilities."""

    def __init__(self, net: nn.Module) -> None:
        self.net = net.eval()
        self.seen: list[tuple[tuple[int, ...], str]] = []

    def predict(self, batch: np.ndarray) -> np.ndarray:
        self.seen.append((batch.shape, str(batch.dtype)))
        with torch.no_grad():
            return torch.softmax(self.net(torch.from_numpy(batch)), 1).numpy()


def test_a_predict_object_gets_black_box_rows_only(net: nn.Module, dataset_arrays: tuple,
                                                   api_suite: Path) -> None:
    x, y = dataset_arrays
    floats = x.transpose(0, 3, 1, 2).astype(np.float32) / 255  # N×C×H×W in [0, 1]
    batches = [(floats[i:i + 50], y[i:i + 50]) for i in range(0, len(y), 50)]
    obj = _Scores(net)
    result = certify.evaluate(obj, iter(batches), suite=str(api_suite), output="probs")
    rows = _rows(result)
    model = result.to_json()["measurement"]["model"]
    assert model["output"] == "probs" and model["identity"].startswith("unidentified")
    assert rows["apgd"]["status"] == "SKIPPED"
    assert rows["square"]["status"] != "SKIPPED" and rows["square"]["metrics"]["n"] > 0
    assert any("unidentified" in line for line in limitations(result))
    assert all(len(s) == 4 and s[1:] == (3, 32, 32) and d == "float32" for s, d in obj.seen)


def test_bad_api_inputs_are_refused_before_any_query(net: nn.Module, api_suite: Path,
                                                     tmp_path: Path) -> None:
    x = np.zeros((4, 32, 32, 3), np.uint8)
    with pytest.raises(DataError, match="N×C×H×W"):
        certify.evaluate(net, (x.astype(np.float32), np.zeros(4, int)), suite=str(api_suite))
    with pytest.raises(DataError, match=r"\[0, 1\]"):
        certify.evaluate(net, (np.full((4, 3, 32, 32), 2.0), np.zeros(4, int)),
                         suite=str(api_suite))
    with pytest.raises(DataError, match="labels have shape"):
        certify.evaluate(net, (x, np.zeros(3, int)), suite=str(api_suite))
    with pytest.raises(UsageError, match="not a model certify can evaluate"):
        certify.evaluate(object(), (x, np.zeros(4, int)), suite=str(api_suite))
    # a list pair, and bfloat16 tensors, are data too
    from certify.api import _arrays_of
    from certify.data.loaders import images_from_python

    xs, ys = _arrays_of([torch.zeros(4, 3, 32, 32, dtype=torch.bfloat16), torch.arange(4)],
                        images_from_python)
    assert xs.shape == (4, 32, 32, 3) and xs.dtype == np.uint8 and ys.tolist() == [0, 1, 2, 3]
    with pytest.raises(UsageError, match="cannot be resumed"):
        certify.evaluate(_Scores(net), (x, np.zeros(4, int)), suite=str(api_suite),
                         out=tmp_path / "again", resume=True)
    assert not (tmp_path / "again").exists()
    with pytest.raises(UsageError, match="option it does not know"):
        certify.evaluate(net, (x, np.zeros(4, int)), suite=str(api_suite), colour="red")


def test_evaluate_shows_progress_by_default_and_is_quiet_with_none(
        model_path: Path, dataset_arrays: tuple, clean_suite: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    """A notebook run printed nothing for 29 minutes: evaluate() now shows each task's
    progress on stderr by default (one line rewritten in place where the stream is a
    terminal or a notebook), and progress=None keeps it quiet. model_card= takes a dict."""
    import io

    from certify.progress import TextProgress

    x, y = dataset_arrays
    result = certify.evaluate(str(model_path), (x[:40], y[:40]), suite=str(clean_suite),
                              model_card={"name": "signs", "version": "2"})
    err = capsys.readouterr().err
    assert "clean: 40/40 (100%)" in err and "done" in err, err
    card = result.to_json()["measurement"]["model_card"]
    assert card["name"] == "signs" and card["version"] == "2"
    certify.evaluate(str(model_path), (x[:40], y[:40]), suite=str(clean_suite), progress=None)
    assert "40/40" not in capsys.readouterr().err
    with pytest.raises(UsageError, match="progress=True"):
        certify.evaluate(str(model_path), (x[:40], y[:40]), suite=str(clean_suite),
                         progress=True)
    with pytest.raises(UsageError, match="model_card"):
        certify.evaluate(str(model_path), (x[:40], y[:40]), suite=str(clean_suite),
                         model_card={"name": 3}, progress=None)
    # in a terminal or notebook the line is rewritten in place; in a log, one line per task
    for inplace, marks in ((True, "\r"), (False, "\n")):
        stream = io.StringIO()
        p = TextProgress(stream, inplace=inplace)
        p.start("apgd", 10)
        p.advance(10)
        p.finish()
        text = stream.getvalue()
        assert text.count(marks) >= 2 and "apgd: 10/10 (100%)" in text, text
    # a shorter line drawn in place pads out the longer one before it
    stream = io.StringIO()
    p = TextProgress(stream, inplace=True)
    p.start("a-long-task-label", 10_000)
    p.REDRAW_S = 0.0
    p._label = "b"
    p.advance(1)
    first, second = stream.getvalue().split("\r")[1:3]
    assert len(second) >= len(first), (first, second)
