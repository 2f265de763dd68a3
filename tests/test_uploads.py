"""Untrusted uploads: every refusal with its reason, and a valid external-data model that loads."""

from __future__ import annotations

import io
import os
import tarfile
import zipfile
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from certify.service.secrets import SecretBox, load_secret_box
from certify.service.store import LocalStore, digest_key, read_bytes, run_prefix, spool_upload
from certify.service.uploads import (
    Limits,
    UploadError,
    check_npz,
    check_onnx,
    check_suite_yaml,
    prepare_model,
)

pytestmark = pytest.mark.unit


def _model(domain: str = "", nodes: int = 1) -> onnx.ModelProto:
    w = numpy_helper.from_array(np.arange(4096, dtype=np.float32), "w")
    chain = [helper.make_node("Add", ["x", "w"], ["y0"], domain=domain)]
    chain += [helper.make_node("Identity", [f"y{i}"], [f"y{i + 1}"]) for i in range(nodes - 1)]
    chain[-1].output[0] = "y"
    g = helper.make_graph(chain, "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4096])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4096])], [w])
    opsets = [helper.make_opsetid("", 17)] + ([helper.make_opsetid(domain, 1)] if domain else [])
    return helper.make_model(g, opset_imports=opsets, ir_version=10)


def _external(folder: Path) -> tuple[Path, Path]:
    folder.mkdir()
    path = folder / "net.onnx"
    onnx.save_model(_model(), str(path), save_as_external_data=True, location="net.data",
                    size_threshold=0)
    return path, folder / "net.data"


def _refused(fn, *args, match: str, status: int = 422) -> None:  # noqa: ANN001
    with pytest.raises(UploadError, match=match) as exc:
        fn(*args)
    assert exc.value.status == status


def test_a_model_with_external_data_is_accepted_and_loads(tmp_path: Path) -> None:
    import onnxruntime as ort

    onnx_path, data = _external(tmp_path / "src")
    dest = tmp_path / "dest"
    main = prepare_model([("net.onnx", onnx_path), ("net.data", data)], dest, Limits())
    summary = check_onnx(main, Limits())
    assert summary.external_files == ["net.data"] and summary.nodes == 1
    sess = ort.InferenceSession(str(main), providers=["CPUExecutionProvider"])
    out = sess.run(None, {"x": np.ones(4096, np.float32)})[0]
    assert out[10] == 11.0


def test_the_same_model_as_an_archive_with_one_top_folder(tmp_path: Path) -> None:
    onnx_path, data = _external(tmp_path / "src")
    arc = tmp_path / "m.tar.gz"
    with tarfile.open(arc, "w:gz") as t:
        t.add(onnx_path, "model/net.onnx")
        t.add(data, "model/net.data")
    main = prepare_model([("m.tar.gz", arc)], tmp_path / "dest", Limits())
    assert check_onnx(main, Limits()).external_files == ["net.data"]


@pytest.mark.parametrize("location", ["../../etc/passwd", "/etc/passwd", "sub/net.data",
                                      "missing.data"])
def test_external_data_outside_the_upload_is_refused(tmp_path: Path, location: str) -> None:
    m = _model()
    t = m.graph.initializer[0]
    t.data_location = TensorProto.EXTERNAL
    t.ClearField("raw_data")
    del t.float_data[:]
    for k, v in (("location", location), ("offset", "0"), ("length", "16")):
        e = t.external_data.add()
        e.key, e.value = k, v
    folder = tmp_path / "up"
    folder.mkdir()
    onnx.save(m, str(folder / "evil.onnx"))
    _refused(check_onnx, folder / "evil.onnx", Limits(), match="external data")


def test_external_data_beyond_its_file_or_through_a_link_is_refused(tmp_path: Path) -> None:
    onnx_path, data = _external(tmp_path / "src")
    data.write_bytes(data.read_bytes()[:100])  # truncated: the offsets point past its end
    _refused(check_onnx, onnx_path, Limits(), match="beyond")
    onnx_path2, data2 = _external(tmp_path / "src2")
    secret = tmp_path / "secret.bin"
    secret.write_bytes(data2.read_bytes())
    data2.unlink()
    data2.symlink_to(secret)
    _refused(check_onnx, onnx_path2, Limits(), match="not among the uploaded files")


def test_junk_custom_domains_and_big_graphs_are_refused(tmp_path: Path) -> None:
    junk = tmp_path / "junk.onnx"
    junk.write_bytes(os.urandom(2000))
    _refused(check_onnx, junk, Limits(), match="not an ONNX model")
    custom = tmp_path / "custom.onnx"
    onnx.save(_model(domain="com.evil"), str(custom))
    _refused(check_onnx, custom, Limits(), match="com.evil")
    assert check_onnx(custom, Limits(allowed_domains=("", "com.evil"))).nodes == 1
    big = tmp_path / "big.onnx"
    onnx.save(_model(nodes=50), str(big))
    _refused(check_onnx, big, Limits(max_nodes=20), match="50 nodes", status=413)


def test_archive_attacks_are_refused(tmp_path: Path) -> None:
    onnx_path, _ = _external(tmp_path / "src")
    slip = tmp_path / "slip.zip"
    with zipfile.ZipFile(slip, "w") as z:
        z.write(onnx_path, "../net.onnx")
    _refused(prepare_model, [("slip.zip", slip)], tmp_path / "d1", Limits(),
             match="not a plain file name")
    link = tmp_path / "link.tar"
    with tarfile.open(link, "w") as t:
        info = tarfile.TarInfo("net.data")
        info.type, info.linkname = tarfile.SYMTYPE, "/etc/passwd"
        t.addfile(info)
    _refused(prepare_model, [("link.tar", link)], tmp_path / "d2", Limits(),
             match="link or special file")
    bomb = tmp_path / "bomb.zip"
    with zipfile.ZipFile(bomb, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("net.onnx", b"\0" * (64 * 2**20))
    assert bomb.stat().st_size < 2**20
    _refused(prepare_model, [("bomb.zip", bomb)], tmp_path / "d3",
             Limits(max_total_bytes=8 * 2**20), match="more than 8 MB", status=413)
    many = tmp_path / "many.zip"
    with zipfile.ZipFile(many, "w") as z:
        for i in range(5):
            z.writestr(f"f{i}.bin", b"x")
    _refused(prepare_model, [("many.zip", many)], tmp_path / "d4",
             Limits(max_archive_members=3), match="more than 3 files", status=413)
    _refused(prepare_model, [("../x.onnx", onnx_path)], tmp_path / "d5", Limits(),
             match="not a plain file name")
    # Nothing escaped: only the destinations were written.
    assert not (tmp_path.parent / "net.onnx").exists()


def test_npz_checks_never_unpickle_or_inflate(tmp_path: Path) -> None:
    good = tmp_path / "good.npz"
    np.savez(good, x=np.zeros((5, 32, 32, 3), np.uint8), y=np.arange(5))
    assert check_npz(good, Limits())[0] == 5
    pickled = tmp_path / "pickle.npz"
    np.savez(pickled, x=np.array([{"a": 1}], dtype=object), y=np.arange(1))
    _refused(check_npz, pickled, Limits(), match="pickles")
    bomb = tmp_path / "bomb.npz"
    np.savez_compressed(bomb, x=np.zeros((4000, 64, 64, 3), np.uint8), y=np.zeros(4000, int))
    assert bomb.stat().st_size < 2**20
    _refused(check_npz, bomb, Limits(max_dataset_array_bytes=10 * 2**20), match="inflates",
             status=413)
    bad = tmp_path / "bad.npz"
    np.savez(bad, x=np.zeros((5, 32, 32, 3), np.uint8), y=np.arange(4))
    _refused(check_npz, bad, Limits(), match="shape")
    junk = tmp_path / "junk.npz"
    junk.write_bytes(b"PK junk")
    _refused(check_npz, junk, Limits(), match="not a readable .npz")


def test_suite_yaml_is_validated_like_certify_run(tmp_path: Path) -> None:
    from builders import write_small_suite

    ok = write_small_suite(tmp_path / "s.yaml", "mine").read_bytes()
    assert check_suite_yaml(ok, Limits()) == "mine"
    _refused(check_suite_yaml, b"name: x\nchecks: [ {kind: nope\n", Limits(),
             match="not valid YAML")
    _refused(check_suite_yaml, b"name: x\nchecks: []\nbogus: 1\n", Limits(), match="bogus")
    _refused(check_suite_yaml, ok + b"data:\n  path: /etc\n", Limits(), match="data path")
    _refused(check_suite_yaml, b"#" * 300_000, Limits(), match="larger", status=413)


def test_store_limits_and_digests(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "store")
    spool = tmp_path / "spool"
    f = spool_upload(store, io.BytesIO(b"abc"), 10, spool, "model")
    assert f.digest.startswith("sha256:ba7816bf") and f.local.read_bytes() == b"abc"
    assert read_bytes(store, f.key) == b"abc" and f.key == digest_key(f.digest)
    f.local.unlink()
    with pytest.raises(UploadError) as exc:
        spool_upload(store, io.BytesIO(b"x" * 11), 10, spool, "model")
    assert exc.value.status == 413
    assert list(spool.iterdir()) == [] and store.list("") == [f.key]
    for bad in ("sha256:../../etc/passwd", "md5:abc", "sha256:" + "g" * 64,
                "sha256:" + "a" * 64 + "\n"):
        with pytest.raises(ValueError):
            digest_key(bad)
    with pytest.raises(ValueError):
        run_prefix("../x")


def test_secrets_round_trip_bound_to_their_run(tmp_path: Path) -> None:
    key = tmp_path / "k"
    key.write_bytes(os.urandom(32))
    key.chmod(0o600)
    box = load_secret_box(key, tmp_path / "home")
    blob = box.encrypt("Bearer s3cret", "run-a")
    assert b"s3cret" not in blob
    assert box.decrypt(blob, "run-a") == "Bearer s3cret"
    with pytest.raises(ValueError):
        box.decrypt(blob, "run-b")
    with pytest.raises(ValueError):
        SecretBox(os.urandom(32)).decrypt(blob, "run-a")
    from certify.errors import UsageError

    key.chmod(0o644)
    with pytest.raises(UsageError, match="readable by other users"):
        load_secret_box(key, tmp_path / "home")
    inside = tmp_path / "home" / "secrets.key"
    inside.parent.mkdir()
    inside.write_bytes(os.urandom(32))
    inside.chmod(0o600)
    with pytest.raises(UsageError, match="inside the service's home"):
        load_secret_box(inside, tmp_path / "home")
