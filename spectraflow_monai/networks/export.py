"""Deployment exports of the SpectraFlow networks: ONNX (with the frequency transforms as real matrix products and
FDConv's per-sample convolution in a batch-free form), and :class:`OnnxNetwork`, which runs an exported model with
onnxruntime as a ``torch.nn.Module`` (MONAI inferers and evaluators take it in place of the network).

An export of a bundle's model carries what it was exported from: the SHA-256 of ``model.pt`` and of the
``model.json`` beside it, as ONNX ``metadata_props`` (:data:`ONNX_MODEL_DIGEST`, :data:`ONNX_RECORD_DIGEST`,
:func:`export_digests`); :class:`OnnxNetwork` given the model file refuses an export whose digests differ from the
files beside it, or that carries none (:func:`check_export_digests`).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

import torch
import torch.nn as nn

from spectraflow_monai.utils.errors import DataError, SettingError
from spectraflow_monai.utils.files import atomic_path
from spectraflow_monai.utils.fingerprint import file_digest
from spectraflow_monai.utils.settings import model_settings_path

__all__ = [
    "ONNX_MODEL_DIGEST",
    "ONNX_RECORD_DIGEST",
    "OnnxNetwork",
    "check_export_digests",
    "export_command",
    "export_digests",
    "export_onnx",
    "quantize_encoder_linear",
    "set_batch_free_conv",
    "set_real_dft",
]

#: the install hint of the ``onnx`` extra
ONNX_EXTRA_HINT = 'install the onnx extra: pip install -e ".[onnx]" (onnx, onnxscript, onnxruntime)'
#: onnxruntime's graph optimisation levels by name (``OnnxNetwork(optimization=...)``)
OPTIMIZATION_LEVELS = ("disable", "basic", "extended", "all")

#: the ONNX metadata key of the SHA-256 of the model file (``model.pt``) an export was made from
ONNX_MODEL_DIGEST = "spectraflow.model_sha256"
#: the ONNX metadata key of the SHA-256 of the model record (``model.json``, the file) beside that model file
ONNX_RECORD_DIGEST = "spectraflow.record_sha256"

logger = logging.getLogger(__name__)


def export_command(model_file: str | os.PathLike, onnx_file: str | os.PathLike | None = None) -> str:
    """The command that writes the export of ``model_file`` (to ``onnx_file`` when it is not the default
    ``<stem>.onnx``), paths relative to the working folder when under it (``--model models/model.pt`` from a bundle
    folder)."""

    def shown(path: str | os.PathLike) -> str:
        relative = os.path.relpath(os.path.abspath(os.fspath(path)))
        return relative if not relative.startswith("..") else os.fspath(path)

    command = f"python -m spectraflow_monai export-onnx --model {shown(model_file)}"
    default = os.path.splitext(os.path.abspath(os.fspath(model_file)))[0] + ".onnx"
    if onnx_file is not None and os.path.abspath(os.fspath(onnx_file)) != default:
        command += f" --output {shown(onnx_file)}"
    return command


def export_digests(model_file: str | os.PathLike) -> dict[str, str]:
    """The ONNX metadata of an export of ``model_file``: ``{ONNX_MODEL_DIGEST: SHA-256 of model_file,
    ONNX_RECORD_DIGEST: SHA-256 of the record file beside it}`` (``model.pt`` -> ``model.json``).

    Raises:
        DataError: ``model_file`` or its record is not a file.
    """
    record = model_settings_path(model_file)
    for path in (os.fspath(model_file), record):
        if not os.path.isfile(path):
            raise DataError(f"{path}: no such file (an export records the digests of the model and of its record).")
    return {ONNX_MODEL_DIGEST: file_digest(model_file), ONNX_RECORD_DIGEST: file_digest(record)}


def check_export_digests(
    metadata: Mapping[str, str], onnx_file: str | os.PathLike, model_file: str | os.PathLike
) -> None:
    """Refuse an export that was not made from ``model_file`` and the record beside it.

    The record (``model.json``) must be there and its SHA-256 equal the export's :data:`ONNX_RECORD_DIGEST`; the
    model file's SHA-256 must equal :data:`ONNX_MODEL_DIGEST` when the model file is there (inference through ONNX
    does not need ``model.pt``: without it only the record is checked, with a log line saying so).

    Args:
        metadata: the export's ONNX metadata (onnxruntime's ``get_modelmeta().custom_metadata_map``).
        onnx_file: the export, for the messages.
        model_file: the model file the export must be of (``models/model.pt``).

    Raises:
        DataError: no record beside ``model_file``.
        SettingError: the export carries no digests, or one differs: in one line naming the files and the command
            that exports the model again (:func:`export_command`).
    """
    onnx_file, model_file = os.fspath(onnx_file), os.fspath(model_file)
    record = model_settings_path(model_file)
    again = f"export it again: {export_command(model_file, onnx_file)}"
    if not os.path.isfile(record):
        raise DataError(f"{record}: no model record beside {model_file}; the ONNX model {onnx_file} is served with "
                        "the settings training wrote there: put back the model.json its training wrote.")  # fmt: skip
    if ONNX_RECORD_DIGEST not in metadata:
        raise SettingError(f"{onnx_file} carries no digests of the model it was exported from (an export of an "
                           f"earlier version, or of another tool): {again}.")  # fmt: skip
    checked = [(record, ONNX_RECORD_DIGEST)]
    if os.path.isfile(model_file):
        checked.append((model_file, ONNX_MODEL_DIGEST))
    else:
        logger.info(f"{onnx_file}: {model_file} is not beside it, only its record {record} is checked.")
    for path, key in checked:
        if metadata.get(key) != file_digest(path):
            raise SettingError(f"{onnx_file} was not exported from {path} (a stale export: the model was trained "
                               f"again, or another model put there): {again}.")  # fmt: skip


def _write_metadata(onnx_file: str | os.PathLike, metadata: Mapping[str, str]) -> None:
    """Set ``metadata`` (keys and values as text) in the ``metadata_props`` of the ONNX file, in place."""
    import onnx

    model = onnx.load(os.fspath(onnx_file))
    props = {p.key: p for p in model.metadata_props}
    for key, value in metadata.items():
        entry = props.get(str(key)) or model.metadata_props.add()
        entry.key, entry.value = str(key), str(value)
    onnx.save(model, os.fspath(onnx_file))


def set_real_dft(network: nn.Module, enabled: bool = True) -> nn.Module:
    """Switch the frequency transforms of every ``FDConv2d`` and FBM in ``network`` to real matrix products.

    FDConv's kernels (``irfft2`` of the frequency weights) and FBM's low-pass bands (FFTs of the feature map) are
    computed with complex FFTs by default. ONNX exporters (and TensorRT) do not take complex tensors; with
    ``enabled`` the same transforms run as products with real DFT matrices (equal within float32 round-off, about
    1e-6 relative; tested). Returns ``network``.
    """
    for module in network.modules():
        if hasattr(module, "real_dft"):
            module.real_dft = bool(enabled)
    return network


def set_batch_free_conv(network: nn.Module, enabled: bool = True) -> nn.Module:
    """Switch FDConv's per-sample convolution in every ``FDConv2d`` of ``network`` to its batch-free form.

    FDConv convolves every sample with its own kernel; PyTorch does it with one grouped convolution whose group count
    is the batch size, which an export records as a constant (ONNX's ``Conv`` takes ``group`` as an attribute). With
    ``enabled`` the same sums are computed from the ``k * k`` shifted slices of the padded input and one batched
    matrix product (equal within float32 round-off; tested), so an exported model takes any batch size. Returns
    ``network``.
    """
    for module in network.modules():
        if hasattr(module, "batch_free_conv"):
            module.batch_free_conv = bool(enabled)
    return network


def export_onnx(
    network: nn.Module,
    path: str | os.PathLike,
    image_size: int | tuple[int, int] = 224,
    in_channels: int | None = None,
    batch_size: int | None = None,
    verify: bool = True,
    atol: float = 1e-4,
    verify_batch_sizes: Sequence[int] = (1, 3),
    int8_encoder: bool = False,
    metadata: Mapping[str, str] | None = None,
) -> Path:
    """Export ``network`` (``SpectraFlowNet``, MONAI's ``UNet``, ``UNetPlusPlus``, ...) to ONNX at a fixed image size,
    and check it with onnxruntime.

    A copy of the network in ``eval`` mode with :func:`set_real_dft` (no complex tensor) and
    :func:`set_batch_free_conv` (no batch-sized group count) is exported with ``torch.onnx.export(..., dynamo=True)``
    (needs the ``onnx`` and ``onnxscript`` packages: the ``onnx`` extra, ``pip install -e ".[onnx]"``) into one
    self-contained file (weights inside); input ``image`` ``(batch, C, H, W)``, output ``logits``. The batch axis is
    free unless ``batch_size`` fixes it; ``H`` and ``W`` are fixed (the ViT's position embedding is resized to them
    at build time). With ``verify`` and onnxruntime installed, the ONNX model's logits on random batches of each of
    ``verify_batch_sizes`` (``batch_size`` when given) must equal the network's own (eager, complex FFTs, grouped
    convolution) within ``atol``. The file is written under a temporary name and moved to ``path`` only after the
    check, so a failed export leaves any earlier ``path`` as it was. ``metadata`` is written into the file's
    ``metadata_props`` (:func:`export_digests`: what the export was made from).

    Args:
        network: the network; it is not modified.
        path: the ``.onnx`` file written.
        image_size: ``H`` (= ``W``) or ``(H, W)``, multiples of the patch size. Defaults to 224.
        in_channels: input channels. Defaults to ``network.in_channels`` (a network without that attribute, such as
            ``UNetPlusPlus``, needs it given).
        batch_size: None for a free batch axis, or the one batch size the model takes (>= 1). Defaults to None.
        verify: run the check with onnxruntime (skipped with a log line where it is not installed). Defaults to True.
        atol: the largest absolute difference of the logits the check accepts. Defaults to 1e-4.
        verify_batch_sizes: the batch sizes checked when the batch axis is free. Defaults to ``(1, 3)``.
        int8_encoder: quantise the ViT encoder's linear layers to int8 (:func:`quantize_encoder_linear`; faster on
            the CPU, no longer equal to the network within float round-off: give an ``atol`` that suits the model
            and compare the masks on own images). Defaults to False.
        metadata: ONNX metadata written into the file (kept by the int8 quantisation). Defaults to None.

    Returns:
        the path written.

    Raises:
        ValueError: ``batch_size`` or ``verify_batch_sizes`` not positive integers, ``in_channels`` not given for a
            network without an ``in_channels`` attribute, or the exported model's logits differ from the network's by
            more than ``atol``.
        ImportError: the ``onnx`` extra is not installed.
    """
    import copy

    def positive(value: object) -> bool:
        return not isinstance(value, bool) and isinstance(value, int) and value >= 1

    if batch_size is not None and not positive(batch_size):
        raise ValueError(f"batch_size must be None (a free batch axis) or a positive integer, got {batch_size!r}.")
    checked = [batch_size] if batch_size is not None else list(verify_batch_sizes)
    if not checked or not all(positive(b) for b in checked):
        raise ValueError(f"verify_batch_sizes must be positive integers, got {verify_batch_sizes!r}.")
    if in_channels is None and not isinstance(getattr(network, "in_channels", None), int):
        raise ValueError(f"in_channels must be given for a {type(network).__name__}: it has no in_channels attribute "
                         "(spectraflow export-onnx gives the model record's).")  # fmt: skip
    try:
        import onnxscript  # noqa: F401  (the dynamo exporter's translator)
    except ImportError as err:
        raise ImportError(f"the ONNX export needs onnx and onnxscript: {ONNX_EXTRA_HINT}.") from err
    size = (image_size, image_size) if isinstance(image_size, int) else tuple(image_size)
    channels = int(in_channels if in_channels is not None else network.in_channels)
    model = set_batch_free_conv(set_real_dft(copy.deepcopy(network).eval()))
    device = next(network.parameters()).device
    # a free axis is traced at batch 2: torch.export specialises an example size of 1
    example = torch.randn(batch_size or 2, channels, *size, device=device)
    dynamic_shapes = None if batch_size is not None else ({0: torch.export.Dim("batch", min=1)},)
    path = Path(path)
    with atomic_path(path, suffix=".tmp") as temp_name:  # moved to `path` only when the block ends without error
        with torch.no_grad():
            torch.onnx.export(
                model, (example,), temp_name, input_names=["image"], output_names=["logits"], dynamo=True,
                dynamic_shapes=dynamic_shapes, external_data=False, verbose=False,
            )  # fmt: skip
        if metadata:
            _write_metadata(temp_name, metadata)
        if int8_encoder:
            quantize_encoder_linear(temp_name, temp_name)
        if verify:
            _check_export(network, temp_name, path, [(b, channels, *size) for b in checked], device, atol)
    return path


def quantize_encoder_linear(source: str | os.PathLike, target: str | os.PathLike, per_channel: bool = True) -> Path:
    """Quantise the ViT encoder's linear layers of an exported SpectraFlowNet to int8 (dynamic quantisation).

    onnxruntime's ``quantize_dynamic`` (int8 weights, activations quantised per call) is applied to the ``MatMul`` /
    ``Gemm`` nodes that the exporter's node metadata names as an ``aten.linear`` of the ``encoder`` module (the
    attention and MLP projections, about two thirds of SpectraFlowNet-S's CPU time) and to the encoder's fused
    onnxruntime ``Attention`` nodes (their ``qkv`` projection; :mod:`spectraflow_monai.networks.onnx_runtime`); the
    decoder, FDConv and the real DFT matrix products stay float32. Each weight has one scale per output channel
    by default: on a phantom Synapse model this kept 99.996 % of the voxels and every organ's Dice >= 0.999 against
    float32, where one scale per matrix kept 99.93 % and a spleen Dice of 0.981, in the same time per volume
    (docs/benchmarks.md, "Synapse CT volumes on a CPU server"). ``target`` may be ``source``. The ``metadata_props``
    of ``source`` (what it was exported from, :func:`export_digests`) are kept.

    Args:
        source: the float32 ONNX file written by :func:`export_onnx`.
        target: the ONNX file written.
        per_channel: one int8 scale and zero point per output channel of each weight (the exports' choice); False:
            one per weight matrix (onnxruntime's default, kept for comparison). Defaults to True.

    Returns:
        the path written.

    Raises:
        ValueError: ``source`` has no such linear layer (not an export of a network with an ``encoder``).
    """
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    def meta(node: object, key: str) -> str:
        return next((p.value for p in node.metadata_props if p.key == key), "")

    source_model = onnx.load(os.fspath(source), load_external_data=False)
    graph = source_model.graph
    metadata = {p.key: p.value for p in source_model.metadata_props}
    nodes = [
        n.name for n in graph.node
        if (n.op_type in ("MatMul", "Gemm") and "aten.linear" in meta(n, "pkg.torch.onnx.fx_node")
            or n.op_type == "Attention" and n.domain == "com.microsoft")  # a fused attention: its qkv projection
        and "/encoder" in meta(n, "namespace")
    ]  # fmt: skip
    if not nodes:
        raise ValueError(f"{source}: no linear layer of an encoder found to quantise.")
    target = Path(target)
    with atomic_path(target, suffix=".tmp") as temp_name:
        quantize_dynamic(
            os.fspath(source), temp_name, nodes_to_quantize=nodes, weight_type=QuantType.QInt8, per_channel=per_channel
        )
        if metadata:
            _write_metadata(temp_name, metadata)
    logger.info("%d linear layers of the encoder quantised to int8", len(nodes))
    return target


def _check_export(
    network: nn.Module,
    onnx_file: str,
    path: Path,
    shapes: Sequence[tuple[int, ...]],
    device: torch.device,
    atol: float,
) -> None:
    """Compare the logits of the exported model ``onnx_file`` with ``network``'s on a random batch of each shape."""
    try:
        import onnxruntime
    except ImportError:
        logger.info("onnxruntime is not installed: the ONNX export %s was not checked", path)
        return
    session = onnxruntime.InferenceSession(onnx_file, providers=["CPUExecutionProvider"])
    was_training = network.training
    network.eval()
    largest = 0.0
    try:
        for shape in shapes:
            example = torch.randn(*shape, device=device)
            got = torch.from_numpy(session.run(None, {"image": example.cpu().numpy()})[0])
            with torch.no_grad():
                want = network(example).float().cpu()
            diff = float((got - want).abs().max())
            if not diff <= atol:
                raise ValueError(
                    f"the ONNX export {path} differs from the network by {diff:.3g} at batch {shape[0]} (atol={atol})."
                )
            largest = max(largest, diff)
    finally:
        network.train(was_training)
    batches = ", ".join(str(shape[0]) for shape in shapes)
    logger.info("ONNX export %s: logits within %.3g of the network's at batch %s", path, largest, batches)


class OnnxNetwork(nn.Module):
    """An exported ONNX model run by onnxruntime, as a ``torch.nn.Module`` (input and output torch tensors).

    MONAI's inferers and evaluators take it in place of the network (the bundles' ``configs/inference_onnx.yaml``):
    the input is sent to onnxruntime as float32 and the output comes back as a float32 tensor on the input's device.
    It has no parameters and ignores ``torch.autocast`` (onnxruntime runs the graph as exported, float32). The model's
    input shape is read from the file; an input whose channels or spatial size differ from it is refused naming the
    file and both shapes (a free batch axis takes any batch size).

    Given ``model_file`` (a bundle's ``models/model.pt``), the export must be of that model: the digests it carries
    (:func:`export_digests`) must match the record beside it (``model.json``, needed) and the model file when it is
    there (:func:`check_export_digests`); a stale export, or one without digests, is refused in one line naming the
    command that exports the model again.

    Args:
        path: the ``.onnx`` file (:func:`export_onnx`).
        threads: onnxruntime's intra-op threads; None or 0: onnxruntime's default (one per physical core).
            Defaults to None.
        optimization: onnxruntime's graph optimisation level, one of ``"disable"``, ``"basic"``, ``"extended"``,
            ``"all"``. Defaults to ``"all"``.
        providers: onnxruntime execution providers, in order of preference. Defaults to ``("CPUExecutionProvider",)``.
        image_size: the spatial size ``H`` (= ``W``) or ``(H, W)`` the model must take (e.g. the model record's
            ``image_size``), checked here; None: not checked. Defaults to None.
        session_config: onnxruntime session configuration entries, e.g.
            ``{"session.intra_op.allow_spinning": "0"}`` (threads that sleep instead of spinning between runs).
            Defaults to None.
        model_file: the model file the export must be of (see above); None: not checked. Defaults to None.

    Raises:
        ImportError: onnxruntime is not installed (naming the ``onnx`` extra).
        DataError: (a ``ValueError``) ``path`` is not a file, or not an ONNX model onnxruntime reads (a truncated
            file); no record beside ``model_file``.
        SettingError: (a ``ValueError``) the export is not of ``model_file`` and its record, or it takes another
            spatial size than ``image_size``.
        ValueError: ``threads`` or ``optimization`` is not valid.
    """

    def __init__(
        self,
        path: str | os.PathLike,
        threads: int | None = None,
        optimization: str = "all",
        providers: Sequence[str] = ("CPUExecutionProvider",),
        image_size: int | Sequence[int] | None = None,
        session_config: Mapping[str, str] | None = None,
        model_file: str | os.PathLike | None = None,
    ) -> None:
        super().__init__()
        if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int) or threads < 0):
            raise ValueError(f"threads must be None or a non-negative integer, got {threads!r}.")
        if optimization not in OPTIMIZATION_LEVELS:
            raise ValueError(f"optimization must be one of {OPTIMIZATION_LEVELS}, got {optimization!r}.")
        try:
            import onnxruntime
        except ImportError as err:
            raise ImportError(f"running an ONNX model needs onnxruntime: {ONNX_EXTRA_HINT}.") from err
        self.path = os.fspath(path)
        write = f": write it with {export_command(model_file, self.path)}" if model_file is not None else ""
        if not os.path.isfile(self.path):
            raise DataError(f"{self.path}: no such ONNX model file{write}.")
        options = onnxruntime.SessionOptions()
        options.graph_optimization_level = {
            "disable": onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL,
            "basic": onnxruntime.GraphOptimizationLevel.ORT_ENABLE_BASIC,
            "extended": onnxruntime.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
            "all": onnxruntime.GraphOptimizationLevel.ORT_ENABLE_ALL,
        }[optimization]
        if threads:
            options.intra_op_num_threads = threads
        for key, value in (session_config or {}).items():
            options.add_session_config_entry(str(key), str(value))
        try:
            self.session = onnxruntime.InferenceSession(self.path, options, providers=list(providers))
        except Exception as err:  # onnxruntime raises its own exception types for unreadable models
            first = str(err).strip().splitlines()[0][:200] if str(err).strip() else type(err).__name__
            raise DataError(f"{self.path}: not an ONNX model onnxruntime can run ({first}){write}.") from err
        if model_file is not None:
            check_export_digests(self.session.get_modelmeta().custom_metadata_map, self.path, model_file)
        model_input = self.session.get_inputs()[0]
        self.input_name = model_input.name
        self.input_shape = tuple(model_input.shape)  # the batch axis a name (free) or an int
        if image_size is not None:
            size = [image_size] * 2 if isinstance(image_size, int) else [int(n) for n in image_size]
            if list(self.input_shape[-2:]) != size:
                raise SettingError(
                    f"{self.path} takes {'x'.join(str(n) for n in self.input_shape[-2:])} images, the model settings "
                    f"say image_size {image_size}: export the model again (spectraflow export-onnx)."
                )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        expected = self.input_shape
        fixed = [(i, n) for i, n in enumerate(expected) if isinstance(n, int)]
        if x.dim() != len(expected) or any(x.shape[i] != n for i, n in fixed):
            raise ValueError(
                f"{self.path} takes input of shape {list(expected)} (a name: any size), got {list(x.shape)}."
            )
        array = x.detach().to(device="cpu", dtype=torch.float32).contiguous().numpy()
        out = self.session.run(None, {self.input_name: array})[0]
        return torch.from_numpy(out).to(x.device)

    def extra_repr(self) -> str:
        return f"path={self.path!r}, input_shape={list(self.input_shape)}"
