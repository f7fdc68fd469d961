"""What the ``spectraflow_2d_segmentation`` bundle builds from its ``label_classes`` setting.

SpectraFlow's 2D benchmarks (Chen et al., "SpectraFlow: Unifying Structural Pretraining and Frequency Adaptation for
Medical Image Segmentation") are binary; its Synapse experiment is multi-class. The 2D bundle serves both with one
setting, ``label_classes``: :class:`~spectraflow_monai.data.LabelMode` reads what the masks are (data layer), and
:class:`LabelSetup` adds what the bundle makes of it:

- binary masks: one output channel, sigmoid Dice + BCE + boundary loss, threshold 0.5, predictions saved as 0/255;
- label maps of K classes: K output channels, softmax Dice + cross entropy + boundary loss (one-hot targets), argmax
  label maps saved with the source label values (the inverse of the label map, e.g. an inverted
  ``{background: 255, membrane: 0}`` map saves 255 / 0; :class:`~spectraflow_monai.transforms.SaveLabelValuesd`),
  metrics per class with background excluded.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from monai.handlers import from_engine
from monai.networks.utils import one_hot
from monai.transforms import Activationsd, AsDiscreted, Compose, EnsureChannelFirstd, LoadImaged

from spectraflow_monai.data.label_map import inverse_label_map
from spectraflow_monai.data.label_mode import LabelMode
from spectraflow_monai.handlers.metric_suite import MetricSuiteHandler
from spectraflow_monai.losses.dice_bce_boundary import DiceBCEBoundaryLoss
from spectraflow_monai.metrics.segmentation import SegmentationMetricSuite
from spectraflow_monai.transforms.label import SaveLabelValuesd
from spectraflow_monai.utils.settings import as_bool

__all__ = [
    "LabelSetup",
    "OneHotOutput",
    "label_setup",
    "label_transform",
    "metric_suite_handler",
    "postprocessing",
    "prediction_writer",
]


class OneHotOutput:
    """``output_transform`` of the bundle's metric handlers for label maps: ``engine.state.output`` (decollated
    dicts with (1, H, W) ``pred`` / ``label`` label maps) -> lists of one-hot (K, H, W) tensors."""

    def __init__(self, num_classes: int, keys: Sequence[str] = ("pred", "label")) -> None:
        self.num_classes = int(num_classes)
        self.keys = tuple(keys)

    def __call__(self, output: Any) -> tuple[list, ...]:
        values = from_engine(list(self.keys))(output)
        return tuple([one_hot(x, self.num_classes, dim=0) for x in v] for v in values)


class LabelSetup(LabelMode):
    """The bundle's choices for the masks of ``label_classes`` (see the module docstring); made by :func:`label_setup`.

    Attributes (besides those of :class:`~spectraflow_monai.data.LabelMode`):
        out_channels: network outputs (1 for binary, ``num_classes`` otherwise).
        sigmoid, softmax, to_onehot_y: arguments of :class:`spectraflow_monai.losses.DiceBCEBoundaryLoss`.
        include_background: of the Dice / IoU / HD95 handlers (True for the single binary channel).
        save_scale: ``SaveImaged`` scale of predictions (255: 0/255 masks; None: label values as they are).
        save_values: source label value of each class, the ``values`` of
            :class:`~spectraflow_monai.transforms.SaveLabelValuesd` (None for binary masks).
        save_dtype: ``SaveImaged`` ``output_dtype`` (float32 scaled to 0/255; uint8 label values, uint16 when a
            source value exceeds 255).
        metric_output: ``output_transform`` of the metric handlers.
    """

    def __init__(self, label_classes: Any = None) -> None:
        super().__init__(label_classes)
        self.out_channels = 1 if self.binary else self.num_classes
        self.sigmoid, self.softmax, self.to_onehot_y = self.binary, not self.binary, not self.binary
        self.include_background = self.binary
        self.save_scale = 255 if self.binary else None
        self.save_values = None if self.binary else inverse_label_map(self.label_map, self.num_classes)
        wide = self.save_values is not None and max(self.save_values) > 255
        self.save_dtype = np.float32 if self.binary else (np.uint16 if wide else np.uint8)
        self.metric_output = from_engine(["pred", "label"]) if self.binary else OneHotOutput(self.num_classes)

    def loss(self, **kwargs: Any) -> DiceBCEBoundaryLoss:
        """:class:`~spectraflow_monai.losses.DiceBCEBoundaryLoss` for these masks: sigmoid Dice + BCE (binary) or
        softmax Dice + cross entropy with one-hot targets (classes); ``kwargs`` are its other arguments."""
        return DiceBCEBoundaryLoss(sigmoid=self.sigmoid, softmax=self.softmax, to_onehot_y=self.to_onehot_y, **kwargs)

    def postprocessing(self, keys: Any = "pred") -> list:
        """Logits -> masks: sigmoid + threshold 0.5 (binary), argmax label map (classes)."""
        if self.binary:
            return [Activationsd(keys, sigmoid=True), AsDiscreted(keys, threshold=0.5)]
        return [AsDiscreted(keys, argmax=True)]

    def label_loader(self, keys: Any = "label") -> Any:
        """The bundle's loading of the masks without the resize: ``LoadImaged`` with
        :class:`~spectraflow_monai.data.Image2DReader`, ``EnsureChannelFirstd`` and :meth:`label_transform`; for
        scoring at each image's original size (``MetricSuiteHandler(original_size=True)``)."""
        from spectraflow_monai.data.readers import Image2DReader

        return Compose([
            LoadImaged(keys, reader=Image2DReader("label", self), image_only=True),
            EnsureChannelFirstd(keys),
            self.label_transform(keys),
        ])

    def metric_suite(self, **kwargs: Any) -> Any:
        """A :class:`~spectraflow_monai.metrics.SegmentationMetricSuite` for these masks (per class for label maps)."""
        if self.binary:
            return SegmentationMetricSuite(**kwargs)
        return SegmentationMetricSuite(num_classes=self.num_classes, class_names=self.class_names, **kwargs)


def label_setup(label_classes: Any = None) -> LabelSetup:
    """Read the ``label_classes`` setting once (:func:`spectraflow_monai.data.label_mode`) and log what it means.

    Raises:
        SettingError: naming the setting and the value when it is none of the accepted forms.
    """
    return LabelSetup.read(label_classes)


# ---------------------------------------------------------------- config entry points: one component each


def label_transform(label_setup: LabelSetup, keys: Any = "label") -> Any:
    """The mask transform of ``label_setup`` (:meth:`LabelSetup.label_transform`): ``BinarizeLabeld`` with its value
    check for binary masks, ``LabelClassesd`` (source values -> class indices) for label maps."""
    return label_setup.label_transform(keys)


def postprocessing(label_setup: LabelSetup, keys: Any = "pred", then: Sequence[Any] = ()) -> Compose:
    """``Compose`` of :meth:`LabelSetup.postprocessing` (logits -> masks) followed by the transforms ``then``
    (e.g. inverting the resize, writing the predictions)."""
    return Compose([*label_setup.postprocessing(keys), *then])


def prediction_writer(label_setup: LabelSetup, output_dir: str, keys: Any = "pred", **kwargs: Any) -> SaveLabelValuesd:
    """The writer of predicted masks: :class:`~spectraflow_monai.transforms.SaveLabelValuesd` with MONAI's
    ``PILWriter``, 0/255 masks for binary tasks, label maps with the source label values otherwise
    (``LabelSetup.save_values`` / ``save_scale`` / ``save_dtype``), ``<name>_seg<output_ext>`` directly in
    ``output_dir``; ``kwargs`` are further ``SaveLabelValuesd`` arguments (``output_ext``, ``print_log``, ...),
    replacing these (``values=None``: the class indices)."""
    options = {
        "values": label_setup.save_values, "writer": "PILWriter", "scale": label_setup.save_scale,
        "output_dtype": label_setup.save_dtype, "output_postfix": "seg", "output_ext": ".png",
        "separate_folder": False, "resample": False, **kwargs,
    }  # fmt: skip
    return SaveLabelValuesd(keys, output_dir=output_dir, **options)


def metric_suite_handler(label_setup: LabelSetup, output_dir: str, original_size: bool = False, **kwargs: Any) -> Any:
    """The paper's metric suite for the masks of ``label_setup`` (:meth:`LabelSetup.metric_suite`, per class for label
    maps) as a :class:`~spectraflow_monai.handlers.MetricSuiteHandler` writing to ``output_dir``; with
    ``original_size`` every image is scored at its own size (its ground truth read again by
    :meth:`LabelSetup.label_loader`): the bundle's ``score_at_original_size``, true or false (else a
    :class:`~spectraflow_monai.utils.errors.SettingError` naming it)."""
    return MetricSuiteHandler(
        output_dir,
        suite=label_setup.metric_suite(),
        original_size=as_bool(original_size, "score_at_original_size"),
        label_loader=label_setup.label_loader(),
        **kwargs,
    )
