"""``spectraflow export-onnx``: write the ONNX file of a bundle's model beside it, for inference with onnxruntime.

From a bundle folder, ``python -m spectraflow_monai export-onnx`` reads ``models/model.pt`` and the model settings
recorded beside it (``models/model.json``: encoder, image size, decoder, classes), builds the network as inference
does (:func:`~spectraflow_monai.apps.workflow.recorded_network`: SpectraFlowNet, UNet or U-Net++, whichever the
record's ``architecture`` names; one whose registry entry has no export is refused in one line), loads the weights
and writes ``models/model.onnx``
with :func:`~spectraflow_monai.networks.export.export_onnx` (a free batch axis; checked with onnxruntime at batch 1
and 3). The file carries the SHA-256 of ``model.pt`` and of ``model.json``
(:func:`~spectraflow_monai.networks.export.export_digests`), so that ``configs/inference_onnx.yaml`` layered on
``configs/inference.yaml`` segments with it only beside the model it was exported from.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path

__all__ = ["CPU_ATOL", "DEFAULT_ATOL", "VARIANTS", "export_model_file", "main"]

#: the largest difference of the logits the export's check accepts by default (the issue's bound; about 1e-6 seen)
DEFAULT_ATOL = 1e-3
#: the check's default for ``--variant cpu`` (int8 encoder): the logits move by more than float round-off
CPU_ATOL = 1.0
#: ``--variant``'s choices: :data:`spectraflow_monai.networks.onnx_runtime.ONNX_VARIANTS` (named here, so that
#: ``--help`` answers without importing torch; a test keeps the two equal)
VARIANTS = ("fp32", "int8-encoder", "cpu")


def export_model_file(
    model_file: str | os.PathLike = "models/model.pt",
    output: str | os.PathLike | None = None,
    atol: float = DEFAULT_ATOL,
    int8_encoder: bool = False,
    variant: str | None = None,
) -> Path:
    """Export the model of a bundle's model file to ONNX, beside it by default (``models/model.onnx``).

    The network is built from the settings recorded beside ``model_file`` (``model.json``, which inference through
    the ONNX file reads too; a record written for another model file is refused,
    :func:`~spectraflow_monai.utils.run_record.check_model_digest`), the weights are loaded with
    ``torch.load(..., weights_only=True)``, and the export is checked against the network at batch 1 and 3 within
    ``atol``. It carries the digests of ``model_file`` and of its record
    (:func:`~spectraflow_monai.networks.export.export_digests`).

    Args:
        model_file: the trained model (``models/model.pt``). Defaults to ``"models/model.pt"``.
        output: the ONNX file written. Defaults to ``model_file`` with the extension ``.onnx``.
        atol: the largest absolute difference of the logits the check accepts. Defaults to 1e-3.
        int8_encoder: quantise the ViT encoder's linear layers to int8
            (:func:`~spectraflow_monai.networks.export.quantize_encoder_linear`): faster on the CPU, not equal to
            the network within float round-off (the check's ``atol`` may need raising; compare the masks of
            ``inference.yaml`` and ``inference_onnx.yaml`` on own images before deploying it). Defaults to False.
        variant: the export variant, one of :data:`~spectraflow_monai.networks.onnx_runtime.ONNX_VARIANTS`:
            ``"fp32"``, ``"int8-encoder"`` (= ``int8_encoder``) or ``"cpu"``, the variant for CPU servers (fused
            onnxruntime attention, int8 encoder; :func:`~spectraflow_monai.networks.onnx_runtime.export_variant`).
            None: ``"int8-encoder"`` with ``int8_encoder``, else ``"fp32"``. Defaults to None.

    Returns:
        the path written.

    Raises:
        FileNotFoundError: ``model_file`` does not exist.
        SettingError: no model settings recorded beside ``model_file``, a record written for another model file or
            edited, weights that do not fit the recorded network, an architecture without an export
            (:attr:`~spectraflow_monai.utils.architectures.Architecture.export`), or ``int8_encoder`` for a network
            without an encoder.
        ValueError: ``model_file`` is not a weights file, or the check fails.
    """
    import torch  # here, so that `spectraflow export-onnx --help` answers without importing torch or MONAI
    from ignite.handlers import Checkpoint

    from spectraflow_monai.apps.workflow import recorded_network
    from spectraflow_monai.networks.export import export_digests
    from spectraflow_monai.networks.onnx_runtime import export_variant
    from spectraflow_monai.utils.errors import SettingError
    from spectraflow_monai.utils.run_record import (
        ModelRecord,
        read_model_settings,
        weights_mismatch,
    )
    from spectraflow_monai.utils.settings import model_settings_path

    model_file = os.fspath(model_file)
    if not os.path.isfile(model_file):
        raise FileNotFoundError(f"{model_file}: no such model file (train the model first: configs/train.yaml).")
    if read_model_settings(model_file) is None:
        raise SettingError(
            f"{model_file}: no model settings recorded beside it ({model_settings_path(model_file)}, written by "
            "training); the network cannot be built without them."
        )
    record = ModelRecord(model_file)  # the record must be model_file's (check_model_digest)
    entry = record.settings.architecture_entry
    if entry.export is not None:
        raise SettingError(f"{model_file}: architecture {entry.name!r} has no ONNX export: {entry.export}")
    variant = variant if variant is not None else "int8-encoder" if int8_encoder else "fp32"
    if variant != "fp32" and not entry.has_encoder:
        raise SettingError(f"--variant {variant} quantises the ViT encoder; {model_file} is a {entry.name!r} model, "
                           "which has none: export it with --variant fp32.")  # fmt: skip
    digests = export_digests(model_file)
    network = recorded_network(record, record.out_channels)
    try:
        state = torch.load(model_file, map_location="cpu", weights_only=True)
    except (RuntimeError, TypeError, ValueError, EOFError, OSError) as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ValueError(f"{model_file}: not a weights file ({first}).") from err
    if not isinstance(state, dict):
        raise ValueError(f"{model_file}: not a weights file (it holds a {type(state).__name__}, not a dict).")
    try:
        Checkpoint.load_objects({"model": network}, state)
    except (RuntimeError, KeyError, TypeError) as err:
        raise weights_mismatch(model_file, err) from err
    output = Path(output) if output is not None else Path(os.path.splitext(model_file)[0] + ".onnx")
    return export_variant(
        network, output, variant, image_size=record.image_size, in_channels=record.in_channels, atol=atol,
        metadata=digests,
    )  # fmt: skip


def main(argv: Sequence[str] | None = None, prog: str = "spectraflow export-onnx") -> int:
    """``spectraflow export-onnx [--model models/model.pt] [--output FILE] [--atol 1e-3] [--variant VARIANT]``.

    Args:
        argv: the arguments after the command name; None reads ``sys.argv[1:]``.
        prog: program name shown in the usage and error lines. Defaults to ``"spectraflow export-onnx"``.

    Returns:
        0 on success (the path written is printed); bad input exits with status 2 and one error line.
    """
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Write the ONNX file of a bundle's model (default: models/model.pt -> models/model.onnx, beside "
        "its settings record models/model.json) for configs/inference_onnx.yaml; it carries the SHA-256 of both "
        "files, and inference refuses it beside another model (export again after training). Needs the onnx extra: "
        'pip install -e ".[onnx]".',
    )
    parser.add_argument("--model", default="models/model.pt", metavar="FILE",
                        help="the trained model, with its model.json beside it (default: models/model.pt)")
    parser.add_argument("--output", default=None, metavar="FILE",
                        help="the ONNX file written (default: the model's path with the extension .onnx)")
    parser.add_argument("--atol", type=float, default=None,
                        help="largest difference of the logits from PyTorch's the check at batch 1 and 3 accepts "
                        f"(default: {DEFAULT_ATOL}; {CPU_ATOL} for --variant cpu)")
    parser.add_argument("--int8-encoder", action="store_true",
                        help="quantise the ViT encoder's linear layers to int8: faster on the CPU, logits no longer "
                        "equal to PyTorch's (raise --atol if the check asks; compare the masks on own images)",
                        )  # fmt: skip
    parser.add_argument("--variant", choices=VARIANTS, default=None,
                        help="fp32 (default): the network as it is; int8-encoder: as --int8-encoder; cpu: the variant "
                        "for CPU servers, the ViT's attention fused into onnxruntime Attention nodes and its linear "
                        f"layers in int8 (default --atol {CPU_ATOL} then; compare the labels on own volumes)")
    args = parser.parse_args(argv)
    if args.int8_encoder and args.variant not in (None, "int8-encoder"):
        parser.error(f"--int8-encoder contradicts --variant {args.variant}: give one of them")
    variant = args.variant or ("int8-encoder" if args.int8_encoder else "fp32")
    atol = args.atol if args.atol is not None else (CPU_ATOL if variant == "cpu" else DEFAULT_ATOL)
    # the libraries' INFO lines (the exporter's passes: hundreds of lines) stay out; this package's steps are logged
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("spectraflow_monai").setLevel(logging.INFO)
    try:
        path = export_model_file(args.model, args.output, atol=atol, variant=variant)
    except (OSError, ValueError, ImportError) as e:  # bad input: one line naming the file, no traceback
        parser.exit(2, f"{parser.prog}: error: {e}\n")
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main(prog="python -m spectraflow_monai.apps.onnx_export"))
