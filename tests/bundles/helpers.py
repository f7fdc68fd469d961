"""Helpers shared by the bundle tests: in-process ``monai.bundle.run``, config parsing, torchrun launches."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import torch
from monai.bundle import ConfigParser
from monai.bundle import run as bundle_run

from spectraflow_monai.utils.bundles import merged_config, settings_overrides

REPO = Path(__file__).resolve().parents[2]
SCHEMA = str(REPO / "bundles" / "schema" / "meta_schema_20240725.json")


def config_paths(bundle: str) -> dict[str, str]:
    """Paths of ``bundles/<bundle>/configs/*`` by file stem (``train``, ``train_stage1``, ``evaluate``, ``metadata``,
    ...)."""
    return {p.stem: str(p) for p in (REPO / "bundles" / bundle / "configs").iterdir() if p.suffix in (".yaml", ".json")}


def layered(config_file) -> list[str]:
    """The files of a run of ``config_file`` (a bundle config path or a list of them), as a list: each bundle folder
    stands alone, ``configs/train.yaml`` first."""
    files = [config_file] if isinstance(config_file, (str, os.PathLike)) else list(config_file)
    return [str(f) for f in files]


def run_bundle(config_file, meta_file: str, **override) -> None:
    """``monai.bundle.run`` in this process (no logging config, so pytest's log capture is left alone); the configs
    layered as the runs layer them (:func:`layered`)."""
    saved_path = list(sys.path)  # ConfigWorkflow.run() prepends the bundle folder to sys.path
    try:
        files = layered(config_file)
        override = settings_overrides(merged_config(files), override)
        bundle_run(config_file=files, meta_file=meta_file, logging_file=False, **override)
    finally:
        sys.path[:] = saved_path


def missing_workflow_properties(config_file, workflow_type: str, meta_file: str, **override) -> list[str] | None:
    """MONAI's own check of a bundle workflow: ``ConfigWorkflow(...).initialize()`` then ``check_properties()``
    (required properties that are missing, optional ones whose reference does not point where MONAI expects)."""
    from monai.bundle import ConfigWorkflow

    saved_path = list(sys.path)
    try:
        override = settings_overrides(merged_config(layered(config_file)), override)
        workflow = ConfigWorkflow(
            config_file=layered(config_file),
            meta_file=meta_file,
            logging_file=False,
            workflow_type=workflow_type,
            **override,
        )
        workflow.initialize()
        return workflow.check_properties()
    finally:
        sys.path[:] = saved_path


def parse_config(config_file, **override) -> ConfigParser:
    """The parsed configs (layered as the runs layer them, :func:`layered`) with ``override`` applied."""
    parser = ConfigParser()
    parser.read_config(layered(config_file))
    parser.update(settings_overrides(parser.config, override))  # a setting by its field name: at its id
    return parser


def stage1_program(parser: ConfigParser, load_weights: bool = False):
    """The bundle's Stage-1 program (``stage1``, :class:`~spectraflow_monai.apps.stages.Stage1Program`) with its
    parts built (``encoder``, ``head``, ``data_loader``, ``mixed_domain``, ``trainer``, ...), without a run record;
    the encoder's starting weights are loaded only with ``load_weights``."""
    program = parser.get_parsed_content("stage1")
    program.build(load_weights=load_weights)
    return program


def _run_initialize(parser: ConfigParser) -> None:
    """The steps of a run before its work: the ``initialize`` list (inference), or every step of the ``run`` list
    but the last (training and evaluation: setup, run record, encoder weights; the last step trains or evaluates)."""
    if "initialize" in parser:
        steps = [f"initialize::{i}" for i in range(len(parser["initialize"]))]
    else:
        steps = [f"run::{i}" for i in range(len(parser["run"]) - 1)]
    for step in steps:
        parser.get_parsed_content(step)


def assert_evaluation_skips_encoder_weights(train_config: str, evaluate_config: str, root: Path) -> None:
    """``evaluate.yaml`` loads no encoder weights before ``model.pt`` (which holds every weight): neither the Stage-1
    export nor a DINOv2 file nor timm's hub, whatever ``pretrained_weights`` / ``encoder_init`` say, while training
    with the same settings loads them in its ``initialize`` step."""
    from unittest import mock

    from spectraflow_monai.networks import DINOv2Encoder

    models = root / "models"
    models.mkdir(parents=True, exist_ok=True)
    export, dinov2 = models / "encoder_stage1.pt", root / "dinov2_vits14_pretrain.pth"
    for path in (export, dinov2):
        path.write_bytes(b"")  # present, but not readable as weights: reading one would fail
    torch.save({}, models / "model.pt")  # a weights file (evaluation checks it before the run: require_weights)
    common = {"bundle_root": str(root), "image_size": 28, "encoder_kwargs": {"depth": 2}}
    cases = [("stage1", "timm", str(export)), ("pretrained", "timm", "timm"), ("pretrained", str(dinov2), str(dinov2))]
    for encoder_init, weights, expected in cases:
        settings = {**common, "encoder_init": encoder_init, "pretrained_weights": weights}
        loads: list = []
        record = lambda encoder, source, label=None: loads.append(source)  # noqa: E731
        with mock.patch.object(DINOv2Encoder, "load_pretrained", record):
            _run_initialize(parse_config(train_config, **settings))
            assert loads == [expected], (settings, loads)  # training: once, from the chosen source
            loads.clear()
            parser = parse_config([train_config, evaluate_config], **settings)
            _run_initialize(parser)
            parser.get_parsed_content("network")
            assert loads == [], (settings, loads)  # evaluation: nothing before model.pt


def error_text(exc: BaseException) -> str:
    """The messages of an exception and of its causes (MONAI wraps errors raised inside config expressions)."""
    texts, seen = [], set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        texts.append(f"{type(exc).__name__}: {exc}")
        exc = exc.__cause__ or exc.__context__
    return "\n".join(texts)


def load_weights(path) -> dict[str, torch.Tensor]:
    return torch.load(path, map_location="cpu", weights_only=True)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def torchrun_bundle(config_files: list[str], args: list[str], cwd: Path) -> str:
    """``torchrun --nproc_per_node=2 -m monai.bundle run ...`` on CPU (gloo); asserts success with the log tail and
    returns the output of both processes."""
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--nnodes=1", "--nproc_per_node=2",
        "--master_addr=127.0.0.1", f"--master_port={free_port()}",
        "-m", "monai.bundle", "run", "--config_file", repr(config_files), *args,
    ]  # fmt: skip
    env = dict(os.environ, OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="")
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"{' '.join(cmd)}\nrc={proc.returncode}\n{(proc.stdout + proc.stderr)[-6000:]}"
    return proc.stdout + proc.stderr


def bundle_args(override: dict) -> list[str]:
    """``--key value`` command-line arguments of ``monai.bundle run`` (non-strings as Python literals, read by fire)."""
    args: list[str] = []
    for key, value in override.items():
        args += [f"--{key}", value if isinstance(value, str) else repr(value)]
    return args


def start_bundle(config_files: list[str], override: dict, cwd: Path, log: Path) -> subprocess.Popen:
    """Start ``python -m monai.bundle run`` in a subprocess (CPU, one thread), its output going to ``log``; the
    configs (absolute paths) layered as the runs layer them (:func:`layered`)."""
    files = layered(config_files)
    override = settings_overrides(merged_config([os.path.join(cwd, f) for f in files]), override)
    cmd = [sys.executable, "-m", "monai.bundle", "run", "--config_file", repr(files), *bundle_args(override)]
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="")
    with open(log, "w") as out:
        return subprocess.Popen(cmd, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT)


def run_bundle_process(config_files: list[str], override: dict, cwd: Path, log: Path) -> tuple[int, str]:
    """Run ``python -m monai.bundle run`` to its end in a subprocess; returns its exit status and output."""
    proc = start_bundle(config_files, override, cwd, log)
    rc = proc.wait(timeout=300)
    return rc, log.read_text()


def kill_when_file_appears(proc: subprocess.Popen, path: Path, timeout: float = 300.0) -> None:
    """SIGKILL ``proc`` as soon as ``path`` exists (polled every millisecond); fails when ``proc`` ends first."""
    import signal
    import time

    deadline = time.monotonic() + timeout
    while not path.exists():
        assert proc.poll() is None, f"the run ended (status {proc.returncode}) before {path} appeared"
        assert time.monotonic() < deadline, f"{path} did not appear within {timeout} s"
        time.sleep(0.001)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=60)


CONFIGS_2D = REPO / "bundles" / "spectraflow_2d_segmentation" / "configs"
CONFIGS_3D = REPO / "bundles" / "spectraflow_synapse_segmentation" / "configs"


def tiny_2d_settings(image_size: int, device: str) -> dict:
    """2D bundle overrides of a tiny run on ``device``: a 2-block encoder at ``image_size``, 4 + 2 synthetic images,
    batches of 2, random encoder weights, no loader workers and no progress bar."""
    return {
        "image_size": image_size,
        "encoder_kwargs": {"depth": 2},
        "synthetic_size": {"num_train": 4, "num_val": 2},
        "batch_size": 2,
        "val_batch_size": 2,
        "num_workers": 0,
        "progress_bar": False,
        "pretrained_weights": "none",
        "encoder_init": "random",
        "device": f"$torch.device('{device}')",
    }


def run_workflow(parser: ConfigParser) -> None:
    """The config's ``initialize`` (when it has one) then ``run`` lists, evaluated as ``monai.bundle run`` does."""
    for section in ("initialize", "run"):
        for i in range(len(parser[section]) if section in parser else 0):
            parser.get_parsed_content(f"{section}::{i}")


def record_output_dtypes(module: torch.nn.Module) -> set[torch.dtype]:
    """The dtypes of ``module``'s outputs, collected by a forward hook from now on."""
    dtypes: set[torch.dtype] = set()

    def hook(_module, _inputs, output):
        tensors = output if isinstance(output, (tuple, list)) else [output]
        dtypes.update(t.dtype for t in tensors if isinstance(t, torch.Tensor))

    module.register_forward_hook(hook)
    return dtypes


def assert_float32_state(state: dict) -> None:
    """Every floating-point entry of a state dict is float32 (what the bundles save, whatever the precision)."""
    floats = {k: v.dtype for k, v in state.items() if v.is_floating_point()}
    assert floats and all(d == torch.float32 for d in floats.values()), floats


def synapse_model_and_volume(tmp_path: Path, net: dict, shape: tuple[int, int, int]):
    """A Synapse bundle folder ``tmp_path/bundle`` with a freshly initialised ``models/model.pt`` (seed 0, the
    network settings ``net``) and one synthetic CT volume of ``shape`` in ``tmp_path/ct/case.nii.gz``.

    Returns:
        ``(bundle root, input folder, the volume array)``.
    """
    import nibabel as nib
    import numpy as np

    from spectraflow_monai.apps.synapse import synthetic_ct_volume

    root = tmp_path / "bundle"
    (root / "models").mkdir(parents=True)
    torch.manual_seed(0)
    model = parse_config(str(CONFIGS_3D / "inference.yaml"), bundle_root=str(root), **net)
    torch.save(model.get_parsed_content("network_def").state_dict(), root / "models" / "model.pt")
    in_dir = tmp_path / "ct"
    in_dir.mkdir()
    image = synthetic_ct_volume(1, shape=shape)[0]
    nib.save(nib.Nifti1Image(image, np.diag([0.8, 0.8, 2.5, 1.0])), str(in_dir / "case.nii.gz"))
    return root, in_dir, image
