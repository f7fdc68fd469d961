"""The paper's analysis figures as one experiment: t-SNE, DAF gate maps, frequency-band errors, qualitative panel.

SpectraFlow (Chen et al.) supports its method with four pictures: a t-SNE of the Stage-1 features with and without
the dispersive loss (Fig. 3), DAF gate maps over images (Fig. 6), the frequency content of the segmentation errors of
SpectraFlow against a baseline (Fig. 1d) and several models' predictions on the same images (Fig. 7). This experiment
needs three runs of the 2D bundle (finished steps skipped):

- the Stage-1 runs of the ``stage1`` ablation's arms ``mixed_meanflow_dispersive`` (the default Stage-1) and
  ``mixed_meanflow`` (Stage-1 with ``dispersive_weight 0``) under ``<output>/stage1/``, and SpectraFlow: the first
  one's export under Stage-2 with the full DAF + FDConv decoder and its clean evaluation, the run
  ``mixed_meanflow_dispersive_full_decoder`` (the ablation's own rows train Table 2's concat + standard decoder, which
  has no DAF gate). After ``spectraflow experiment stage1`` (and ``--decoder full``) in the same folder with the same
  settings, nothing of them is trained again;
- ``baseline`` under ``<output>/figures/``: the baseline config's network (MONAI's 2D UNet by default) through the
  same Stage-2, and its evaluation;

and draws the figures on the test split: the t-SNE of the pooled penultimate-block features (the ones the dispersive
loss acts on) of the test images and their masks (the two Stage-1 input domains), for both Stage-1 exports; the
channel mean of the DAF gate ``M`` of the first (coarsest) decoder stage of the trained SpectraFlow; the radial error
spectrum of both models' saved predictions; the :class:`~spectraflow_monai.metrics.FrequencyBandError` bands and a
panel of the predictions of both models and of every other Stage-1 variant that ``experiment stage1`` evaluated in the
same folder with the same settings.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from monai.transforms import Compose, LoadImage

from spectraflow_monai.experiments.ablations import ABLATIONS, stage2_run
from spectraflow_monai.experiments.runner import (
    SCALES,
    ExperimentRunner,
    experiment_settings,
    experiment_title,
    settings_text,
)
from spectraflow_monai.metrics.frequency import DEFAULT_BAND_EDGES, compute_frequency_band_error
from spectraflow_monai.apps.encoder_init import initialize_encoder
from spectraflow_monai.transforms.mixed_domain import MaskToImage
from spectraflow_monai.utils.bundles import bundle_parser
from spectraflow_monai.utils.files import write_text_atomic
from spectraflow_monai.visualize import paper_figures as pf
from spectraflow_monai.visualize.overlays import overlay_arrays
from spectraflow_monai.visualize.predictions import find_prediction

__all__ = [
    "FIGURES_DATASET",
    "FIGURES_TITLE",
    "FIGURE_FILES",
    "NO_DISPERSIVE_ARM",
    "SPECTRAFLOW_ARM",
    "SPECTRAFLOW_DECODER",
    "error_spectrum",
    "figures_markdown",
    "run_figures",
]

#: the default data set of the figures: that of the ``stage1`` ablation (ISIC-2016), whose runs they reuse. The paper
#: names no data set for Figs. 1d, 3 and 6 and shows all three 2D data sets in Fig. 7.
FIGURES_DATASET = ABLATIONS["stage1"].dataset
FIGURES_TITLE = "Analysis figures (paper Figs. 1d, 3, 6, 7)"

#: the arms of the ``stage1`` ablation the figures use: the full Stage-1 (then Stage-2 with SpectraFlow's decoder,
#: :data:`SPECTRAFLOW_DECODER`) and Stage-1 without dispersion.
SPECTRAFLOW_ARM = "mixed_meanflow_dispersive"
NO_DISPERSIVE_ARM = "mixed_meanflow"
#: the decoder of SpectraFlow in the figures (a name of ``STAGE1_DECODERS``): the full DAF + FDConv decoder, whose DAF
#: gates Fig. 6 shows; its run is ``<output>/stage1/mixed_meanflow_dispersive_full_decoder``, the one
#: ``spectraflow experiment stage1 --decoder full`` trains.
SPECTRAFLOW_DECODER = "full"

#: figure -> its title (with the random-initialisation note when the encoder started from random weights).
FIGURE_NAMES: dict[str, str] = {
    "tsne": "Stage-1 features, t-SNE (paper Fig. 3)",
    "gates": "DAF gates (paper Fig. 6)",
    "spectra": "Error spectra (paper Fig. 1d)",
    "panel": "Predictions (paper Fig. 7)",
}
#: figure -> PNG file name in the experiment folder.
FIGURE_FILES: dict[str, str] = {
    "tsne": "figure_tsne.png",
    "gates": "figure_gates.png",
    "spectra": "figure_error_spectra.png",
    "panel": "figure_panel.png",
}


def error_spectrum(
    predictions: Sequence[np.ndarray], labels: Sequence[np.ndarray], num_bins: int = 24
) -> tuple[np.ndarray, np.ndarray]:
    """The mean radial spectrum of ``prediction - label`` over images: the error energy of
    :func:`~spectraflow_monai.metrics.compute_frequency_band_error` in ``num_bins`` equal bands over [0, 0.5]
    (the last band takes the corners), averaged over the images. Returns ``(band centres, energy per band)``."""
    if not predictions or len(predictions) != len(labels):
        raise ValueError(f"need as many predictions as labels (>= 1), got {len(predictions)} and {len(labels)}.")
    edges = np.linspace(0.0, 0.5, int(num_bins) + 1)
    pred = torch.as_tensor(np.stack(predictions)[:, None], dtype=torch.float32)
    gt = torch.as_tensor(np.stack(labels)[:, None], dtype=torch.float32)
    energy = compute_frequency_band_error(pred, gt, band_edges=edges.tolist(), mode="energy")  # (B, 1, bins)
    return (edges[:-1] + edges[1:]) / 2.0, energy[:, 0].mean(0).numpy()


def _load_model_weights(network: torch.nn.Module, path: Path) -> None:
    """Load a bundle's ``models/model.pt`` as its evaluation does (ignite's checkpoint of ``{model: network}``)."""
    from ignite.handlers import Checkpoint

    Checkpoint.load_objects({"model": network}, torch.load(path, map_location="cpu", weights_only=True))


class _Run:
    """The bundle objects of one run, built as the run built them (its settings and configs)."""

    def __init__(
        self, runner: ExperimentRunner, run: str, configs: Sequence[str], overrides: Mapping[str, Any] | None = None
    ) -> None:
        self.dir = runner.run_dir(run)
        settings = {**runner.common, **dict(overrides or {}), "bundle_root": str(self.dir)}
        self.parser = bundle_parser(runner.bundle, list(configs), settings)

    def get(self, key: str) -> Any:
        return self.parser.get_parsed_content(key, lazy=False)


def run_figures(
    output: str | os.PathLike,
    data: Mapping[str, Any],
    scale: str = "small",
    baseline_config: str = "unet_baseline.yaml",
    overrides: Mapping[str, Any] | None = None,
    num_images: int = 4,
    max_tsne_images: int = 150,
) -> dict[str, Any]:
    """Train (or reuse) the three runs and draw the four figures into ``output``; write ``figures.md``.

    Args:
        output: the experiment folder.
        data: the data settings of the bundle (``dataset``, ``dataset_dir``, ``data_list_file_path``, ...).
        scale: ``"small"`` or ``"paper"`` (:data:`~spectraflow_monai.experiments.runner.SCALES`).
        baseline_config: a config of the bundle (or a path) merged over ``train.yaml`` for the baseline.
        overrides: more bundle overrides of every step (they win over the scale's).
        num_images: test images in the gate and qualitative figures (evenly spread over the test list).
        max_tsne_images: at most this many test images (each as image and as mask) in the t-SNE.

    Returns:
        ``{"files": {figure: path}, "spread": {run: {"distance": d, "spread": s}}, "bands": {model: [low, mid,
        high]}, "scores": {model: metrics}, "num_test": n}``.
    """
    if scale not in SCALES:
        raise ValueError(f"scale must be one of {list(SCALES)}, got {scale!r}.")
    for name, value in (("num_images", num_images), ("max_tsne_images", max_tsne_images)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be an integer >= 1, got {value!r}.")
    common = {**dict(data), **SCALES[scale], **dict(overrides or {})}
    if common.get("label_classes") is not None:
        raise ValueError(
            f"label_classes={common['label_classes']!r}: the figures experiment draws binary masks (one foreground); "
            "the other experiments take label maps."
        )
    common = experiment_settings(data, SCALES[scale], overrides)
    stage1 = ABLATIONS["stage1"]
    arms = {arm.name: arm for arm in stage1.arms}
    ablation = ExperimentRunner(output, stage1.stem, common)  # the runs of `spectraflow experiment stage1`
    own = ExperimentRunner(output, "figures", common)
    for name in (SPECTRAFLOW_ARM, NO_DISPERSIVE_ARM):
        ablation.step(name, "stage1", list(arms[name].stage1), arms[name].stage1_overrides)
    # SpectraFlow: the default Stage-1 under the full DAF + FDConv decoder (`experiment stage1 --decoder full`'s run)
    sf_run, sf_settings = stage2_run(ablation, stage1, arms[SPECTRAFLOW_ARM], SPECTRAFLOW_DECODER)
    ablation.step(sf_run, "stage2", ["train.yaml"], sf_settings)
    own.step("baseline", "stage2", ["train.yaml", baseline_config])
    scores = {
        "spectraflow": ablation.evaluate(sf_run, ["train.yaml"], "clean", sf_settings),
        "baseline": own.evaluate("baseline", ["train.yaml", baseline_config]),
    }
    eval_dirs = {"spectraflow": ablation.run_dir(sf_run), "baseline": own.run_dir("baseline")}
    for arm in stage1.arms:  # the Stage-1 variants (Table 2's decoder), where `experiment stage1` evaluated them
        run, settings = stage2_run(ablation, stage1, arm)
        if ablation.evaluated(run, ["train.yaml"], "clean", settings):
            scores[arm.name] = ablation.evaluate(run, ["train.yaml"], "clean", settings)
            eval_dirs[arm.name] = ablation.run_dir(run)

    out = Path(output)
    sf = _Run(ablation, sf_run, ["train.yaml"], sf_settings)
    test = list(sf.get("data_source").datalist("test"))
    load, normalize = sf.get("load_transforms"), sf.get("normalize_transforms")
    samples = [_load_sample(load, normalize, entry) for entry in test]
    shown = _spread_indices(len(test), num_images)
    files: dict[str, str] = {}
    titles = {name: experiment_title(what, common) for name, what in FIGURE_NAMES.items()}
    tsne_idx = _spread_indices(len(test), max_tsne_images)
    files["tsne"], spread = _draw_tsne(ablation, sf, samples, tsne_idx, out, titles["tsne"])
    gates = _draw_gates(sf, samples, shown, out, titles["gates"])
    if gates is not None:
        files["gates"] = gates
    predictions = {name: _read_predictions(path / "eval" / "clean", test, samples) for name, path in eval_dirs.items()}
    labels = [s["gt"] for s in samples]
    # Fig. 1d: the error spectra of SpectraFlow and the baseline, the bands of every model
    spectra = {name: error_spectrum(predictions[name], labels) for name in ("spectraflow", "baseline")}
    files["spectra"] = pf.plot_error_spectra(spectra, out / FIGURE_FILES["spectra"], DEFAULT_BAND_EDGES,
                                             titles["spectra"])  # fmt: skip
    gt = torch.as_tensor(np.stack(labels)[:, None], dtype=torch.float32)
    bands = {
        name: compute_frequency_band_error(torch.as_tensor(np.stack(preds)[:, None], dtype=torch.float32), gt)[:, 0]
        .mean(0)
        .tolist()
        for name, preds in predictions.items()
    }
    # Fig. 7: every model's predictions on the same images
    files["panel"] = pf.plot_model_panel(
        [samples[i]["rgb"] for i in shown],
        [samples[i]["gt"] for i in shown],
        {name: [preds[i] for i in shown] for name, preds in predictions.items()},
        out / FIGURE_FILES["panel"],
        titles["panel"],
    )
    result = {"files": files, "spread": spread, "bands": bands, "scores": scores, "num_test": len(test)}
    write_text_atomic(out / "figures.md", figures_markdown(result, scale, common))
    return result


def _spread_indices(n: int, k: int) -> list[int]:
    """At most ``k`` indices evenly spread over ``range(n)``."""
    return sorted({int(round(i)) for i in np.linspace(0, n - 1, min(k, n))})


def _draw_tsne(
    ablation: ExperimentRunner, sf: _Run, samples: Sequence[Mapping], idx: Sequence[int], out: Path, title: str
) -> tuple[str, dict[str, dict[str, float]]]:
    """Fig. 3: t-SNE of the pooled penultimate features of both Stage-1 exports, for test images and their masks."""
    model = sf.get("model_settings")
    render = MaskToImage(channels=3, mean=list(model.image_mean), std=list(model.image_std))
    inputs = torch.stack([samples[i]["input"] for i in idx] + [render(samples[i]["label"]) for i in idx])
    classes = np.repeat([0, 1], len(idx))
    groups, spread = {}, {}
    for run, panel in ((SPECTRAFLOW_ARM, "MeanFlow + dispersive"), (NO_DISPERSIVE_ARM, "MeanFlow only")):
        net = _Run(ablation, run, ["train.yaml"]).get("network_def")
        initialize_encoder(net, "stage1", None, ablation.run_dir(run) / "models" / "encoder_stage1.pt")
        feats = _pooled_features(net, inputs)
        groups[panel] = (feats, classes)
        spread[run] = {"distance": pf.mean_pairwise_distance(feats), "spread": pf.feature_spread(feats)}
    return pf.plot_feature_tsne(groups, out / FIGURE_FILES["tsne"], title=title), spread


def _draw_gates(sf: _Run, samples: Sequence[Mapping], shown: Sequence[int], out: Path, title: str) -> str | None:
    """Fig. 6: the DAF gate maps of the trained SpectraFlow (float32); None for a network without DAF."""
    net = sf.get("network_def")
    _load_model_weights(net, sf.dir / "models" / "model.pt")
    net.eval()
    with torch.no_grad():
        _, gate = net(torch.stack([samples[i]["input"] for i in shown]), return_gate=True)
    if gate is None:
        return None
    gates = [g.mean(0).T.numpy() for g in gate.float()]  # channel mean, display orientation
    images, labels = [samples[i]["rgb"] for i in shown], [samples[i]["gt"] for i in shown]
    return pf.plot_gate_maps(images, gates, labels, out / FIGURE_FILES["gates"], title)


def _load_sample(load: Any, normalize: Any, entry: Mapping) -> dict[str, Any]:
    """The network input (normalised), the display image and the ground truth of one entry, as the bundle loads it."""
    item = Compose(load)(dict(entry))
    image = torch.as_tensor(item["image"]).float()  # (3, H, W) in [0, 1], MONAI's (W, H) spatial order for PNGs
    label = torch.as_tensor(item["label"]).float()
    net_in = torch.as_tensor(Compose(normalize)({"image": image.clone(), "label": label.clone()})["image"]).float()
    return {
        "input": net_in,
        "label": label,
        "rgb": image.clamp(0, 1).permute(2, 1, 0).numpy(),  # display: rows = image rows
        "gt": (label[0] > 0.5).T.numpy(),
    }


def _pooled_features(network: torch.nn.Module, inputs: torch.Tensor, batch_size: int = 16) -> np.ndarray:
    """The encoder's pooled penultimate-block features (``EncoderFeatures.pooled``) of ``inputs``."""
    encoder = network.encoder.eval()
    with torch.no_grad():
        parts = [encoder(inputs[i : i + batch_size]).pooled.float() for i in range(0, len(inputs), batch_size)]
    return torch.cat(parts).numpy()


def _read_predictions(eval_dir: Path, test: Sequence[Mapping], samples: Sequence[Mapping]) -> list[np.ndarray]:
    """The thresholded masks an evaluation saved, one per test entry, in display orientation at the GT's size."""
    loader = LoadImage(reader="PILReader", image_only=True)  # the reader the bundle saves predictions for
    preds = []
    for entry, sample in zip(test, samples):
        path = find_prediction(entry, eval_dir / "predictions")
        if path is None:
            raise FileNotFoundError(f"no saved prediction of {entry['image']} under {eval_dir / 'predictions'}.")
        preds.append(overlay_arrays(entry, path, size=sample["gt"].shape[0], loader=loader)[2])
    return preds


def figures_markdown(result: Mapping[str, Any], scale: str, settings: Mapping[str, Any]) -> str:
    """The report section: the four figures, the feature spread and the error energy per frequency band."""
    files = result["files"]
    low, mid, high = (f"{a:g}-{b:g}" for a, b in zip(DEFAULT_BAND_EDGES, DEFAULT_BAND_EDGES[1:]))
    lines = [
        f"## {experiment_title(FIGURES_TITLE, settings)}",
        "",
        f"{settings_text(scale, settings)} {result['num_test']} test images.",
        "",
        "Stage-1 features (pooled penultimate block, test images and their masks), t-SNE; distance = mean pairwise "
        "Euclidean distance, spread = distance / mean norm:",
        "",
        *(f"- `{run}`: distance {v['distance']:.4g}, spread {v['spread']:.4f}" for run, v in result["spread"].items()),
        "",
        f"![t-SNE]({Path(files['tsne']).name})",
        "",
        "Error energy per image (pixels) by radial frequency band (cycles/pixel; `FrequencyBandError`, mode `energy`):",
        "",
        f"| model | mDSC (%) | mIoU (%) | low {low} | mid {mid} | high {high} |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
        *(
            f"| {name} | {100 * result['scores'][name]['mDSC']:.2f} | {100 * result['scores'][name]['mIoU']:.2f} | "
            + " | ".join(f"{v:.1f}" for v in bands) + " |"
            for name, bands in result["bands"].items()
        ),
        "",
        f"![error spectra]({Path(files['spectra']).name})",
        "",
    ]
    if "gates" in files:
        lines += [f"![DAF gates]({Path(files['gates']).name})", ""]
    lines += [f"![predictions]({Path(files['panel']).name})", ""]
    return "\n".join(lines)
