"""Serving through onnxruntime in the MONAI Label app (``--conf runtime onnx``; docs/monailabel.md): inference and
uncertainty scoring run the served model's CPU export (``export-onnx --variant cpu``), which the server writes beside
the served model and writes again when it is missing or not the export of the served pair."""

from __future__ import annotations

import json

import nibabel as nib
import numpy as np
import pytest

pytest.importorskip("monailabel", reason="MONAI Label is not installed (docs/monailabel.md)")
pytest.importorskip("onnxruntime", reason="the onnx extra is not installed")
pytest.importorskip("onnxscript", reason="the onnx extra is not installed")

from .test_monailabel_app import (
    NAME_3D,
    VOLUME_SHAPE,
    _app,
    _conf,
    _served,
    _studies_and_bundles,
    running_server,
)


@pytest.fixture(scope="module")
def onnx_served(tmp_path_factory):
    """The Synapse bundle (a 2-block encoder, 28x28 slices) and a CT study, shared by the in-process tests."""
    root = tmp_path_factory.mktemp("onnx")
    studies, bundles = _studies_and_bundles(root, names=(NAME_3D,))
    _write_record(bundles)
    return {"root": root, "studies": studies, "bundles": bundles}


def _write_record(bundles) -> None:
    """The record training writes beside model.pt (an export is built from it)."""
    from spectraflow_monai.utils.run_record import write_model_settings
    from spectraflow_monai.utils.settings import ModelSettings

    settings = ModelSettings(image_size=28, encoder_kwargs={"depth": 2}, out_channels=9, num_classes=9,
                             hu_window=[-125.0, 275.0], nonfinite="error")  # fmt: skip
    write_model_settings(bundles / NAME_3D / "models" / "model.pt", settings)


def _export_ops(path) -> set[str]:
    import onnx

    return {n.op_type for n in onnx.load(str(path)).graph.node}


@pytest.mark.parametrize("value", ["tensorrt", "torch", "1"])
def test_bad_conf_runtime_is_named(onnx_served, value):
    with pytest.raises(ValueError, match=rf"--conf runtime must be one of pytorch, onnx, got '{value}'"):
        _app(onnx_served["bundles"], onnx_served["studies"], models=NAME_3D, runtime=value)


def test_default_runtime_is_pytorch(onnx_served):
    from spectraflow_monai.networks import SpectraFlowNet

    app = _app(onnx_served["bundles"], onnx_served["studies"], models=NAME_3D)
    task = app._infers[NAME_3D]
    assert task.runtime == "pytorch" and isinstance(task._get_network("cpu", {}), SpectraFlowNet)


def test_onnx_runtime_serves_inference_and_scoring_through_the_cpu_export(onnx_served, monkeypatch):
    import lib.scoring as scoring

    from spectraflow_monai.networks.export import ONNX_MODEL_DIGEST, OnnxNetwork
    from spectraflow_monai.utils.fingerprint import file_digest

    bundles, studies = onnx_served["bundles"], onnx_served["studies"]
    pytorch = _app(bundles, studies, models=NAME_3D).infer({"model": NAME_3D, "image": "ct_a", "device": "cpu"})
    expected = np.asarray(nib.load(pytorch["file"]).dataobj)
    app = _app(bundles, studies, models=NAME_3D, runtime="ONNX")
    task = app._infers[NAME_3D]
    network = task._get_network("cpu", {})
    models = _served(bundles, NAME_3D) / "models"
    export = models / "model.onnx"
    assert isinstance(network, OnnxNetwork) and network.path == str(export)
    assert {"QAttention", "MatMulInteger"} <= _export_ops(export)  # the cpu variant
    assert network.session.get_modelmeta().custom_metadata_map[ONNX_MODEL_DIGEST] == file_digest(models / "model.pt")
    assert task._get_network("cpu", {}) is network  # kept while the served model stays the same
    assert isinstance(task.network, type(app._network(NAME_3D)))  # the start's weight check: the PyTorch network

    result = app.infer({"model": NAME_3D, "image": "ct_a", "device": "cpu"})
    label = np.asarray(nib.load(result["file"]).dataobj)
    assert label.shape == VOLUME_SHAPE and set(np.unique(label).tolist()) <= set(range(9))
    assert (label == expected).mean() >= 0.99  # the int8 encoder's labels: PyTorch's but for a few voxels

    seen = []
    original = scoring.image_uncertainty
    monkeypatch.setattr(scoring, "image_uncertainty", lambda i, n, b: seen.append(n) or original(i, n, b))
    method = scoring.UncertaintyScoring(lambda: app._infers, "cpu")
    score = method._score(task, str(studies / "ct_a.nii.gz"))
    assert np.isfinite(score) and seen == [network]


def test_a_model_without_its_record_is_refused_at_start(tmp_path):
    studies, bundles = _studies_and_bundles(tmp_path, names=(NAME_3D,))  # model.pt alone
    message = r"--conf runtime onnx: the served model of .* cannot be exported: .*model.json"
    with pytest.raises(ValueError, match=message):
        _app(bundles, studies, models=NAME_3D, runtime="onnx")


def test_a_stale_or_broken_export_is_written_again(onnx_served):
    from spectraflow_monai.networks.export import OnnxNetwork

    app = _app(onnx_served["bundles"], onnx_served["studies"], models=NAME_3D, runtime="onnx")
    task = app._infers[NAME_3D]
    export = _served(onnx_served["bundles"], NAME_3D) / "models" / "model.onnx"
    task._get_network("cpu", {})
    for broken in (b"not an onnx model", None):
        if broken is None:  # the fp32 export of another model: no digests of the served pair
            from spectraflow_monai.networks.onnx_runtime import export_variant

            export_variant(task.network, export, "fp32", image_size=28, verify=False)
        else:
            export.write_bytes(broken)
        task._onnx_networks.clear()  # as a restarted server
        network = task._get_network("cpu", {})
        assert isinstance(network, OnnxNetwork) and "QAttention" in _export_ops(export)


def test_onnx_runtime_over_http(tmp_path):
    """A started server with ``--conf runtime onnx``: the CT volume's label comes back on the input's grid, and the
    served copy holds the export the server wrote."""
    requests = pytest.importorskip("requests")
    studies, bundles = _studies_and_bundles(tmp_path, names=(NAME_3D,))
    _write_record(bundles)
    params = {"params": (None, json.dumps({"device": "cpu"}))}
    with running_server(tmp_path, studies, bundles, _conf(models=NAME_3D, runtime="onnx")) as (base, log):
        r = requests.post(f"{base}/infer/{NAME_3D}", params={"image": "ct_a", "output": "image"}, files=params,
                          timeout=300)  # fmt: skip
        assert r.status_code == 200, r.text
        (tmp_path / "pred.nii.gz").write_bytes(r.content)
        label = np.asarray(nib.load(str(tmp_path / "pred.nii.gz")).dataobj)
        assert label.shape == VOLUME_SHAPE and set(np.unique(label).tolist()) <= set(range(9))
    assert "QAttention" in _export_ops(_served(bundles, NAME_3D) / "models" / "model.onnx")
    assert "exporting the served model (cpu variant)" in log.read_text(errors="replace")


def test_concurrent_requests_export_once_and_keep_the_earlier_file_aside(onnx_served, monkeypatch):
    """An inference request and a scoring run asking together for a stale export: one export, every caller served
    by it; the file that was there (not the served pair's export) is kept aside, not overwritten."""
    import threading

    import lib.served as served

    import spectraflow_monai.apps.onnx_export as onnx_export
    from spectraflow_monai.networks.export import OnnxNetwork

    _app(onnx_served["bundles"], onnx_served["studies"], models=NAME_3D, runtime="onnx")  # the export exists
    models = _served(onnx_served["bundles"], NAME_3D) / "models"
    (models / "model.onnx").write_bytes(b"someone's file")
    calls, original = [], onnx_export.export_model_file
    monkeypatch.setattr(onnx_export, "export_model_file", lambda *a, **k: calls.append(a) or original(*a, **k))
    results, errors = [], []

    def ask() -> None:
        try:
            results.append(served.served_onnx(str(models / "model.pt")))
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=ask) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(calls) == 1 and len(results) == 4
    assert all(isinstance(n, OnnxNetwork) for n in results) and "QAttention" in _export_ops(models / "model.onnx")
    kept = [p for p in models.glob("model.onnx.bak-*") if p.read_bytes() == b"someone's file"]
    assert len(kept) == 1


def test_a_link_at_the_export_path_is_never_followed_over_http(tmp_path):
    """``models/model.onnx`` of the served copy is a link to a file elsewhere (not an export of the served pair): a
    started ``--conf runtime onnx`` server renames the link aside, writes its own export, serves, and the file the
    link pointed to is untouched."""
    requests = pytest.importorskip("requests")
    studies, bundles = _studies_and_bundles(tmp_path, names=(NAME_3D,))
    _write_record(bundles)
    _app(bundles, studies, models=NAME_3D)  # the served copy (PyTorch: no export yet)
    outside = tmp_path / "elsewhere" / "their.onnx"
    outside.parent.mkdir()
    outside.write_bytes(b"another run's file")
    models = _served(bundles, NAME_3D) / "models"
    (models / "model.onnx").symlink_to(outside)
    params = {"params": (None, json.dumps({"device": "cpu"}))}
    with running_server(tmp_path, studies, bundles, _conf(models=NAME_3D, runtime="onnx")) as (base, _log):
        r = requests.post(f"{base}/infer/{NAME_3D}", params={"image": "ct_a", "output": "image"}, files=params,
                          timeout=300)  # fmt: skip
        assert r.status_code == 200, r.text
    assert outside.read_bytes() == b"another run's file"
    assert not (models / "model.onnx").is_symlink() and "QAttention" in _export_ops(models / "model.onnx")
    (link,) = models.glob("model.onnx.bak-*")
    assert link.is_symlink() and link.resolve() == outside.resolve()


def test_model_filename_under_onnx_writes_no_export_of_a_file_without_its_record(tmp_path):
    """With ``--conf runtime onnx`` a request's ``model_filename`` chooses which model file's export serves (the
    server writes ``models/<stem>.onnx``): a path outside models/ and a weight file without its record are answered
    422, and no export or set-aside file is written for either."""
    import shutil

    requests = pytest.importorskip("requests")
    studies, bundles = _studies_and_bundles(tmp_path, names=(NAME_3D,))
    _write_record(bundles)
    _app(bundles, studies, models=NAME_3D)  # the served copy
    models = _served(bundles, NAME_3D) / "models"
    shutil.copy(models / "model.pt", models / "other.pt")  # weights without other.json
    before = None
    with running_server(tmp_path, studies, bundles, _conf(models=NAME_3D, runtime="onnx")) as (base, _log):
        before = sorted(p.name for p in models.iterdir())
        for name, status in (("../../../model.pt", 422), ("/etc/passwd", 422), ("other.pt", 422), ("model.pt", 200)):
            form = {"params": (None, json.dumps({"device": "cpu", "model_filename": name}))}
            r = requests.post(f"{base}/infer/{NAME_3D}", params={"image": "ct_a", "output": "json"}, files=form,
                              timeout=300)  # fmt: skip
            assert r.status_code == status, (name, r.status_code, r.text)
    assert sorted(p.name for p in models.iterdir()) == before
    assert not (models / "other.onnx").exists() and not list(models.glob("*.bak-*"))
