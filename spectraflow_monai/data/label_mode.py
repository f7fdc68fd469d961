"""What the masks of a 2D data set mean: binary masks, or label maps of named classes (``label_classes``).

SpectraFlow's 2D benchmarks (Chen et al., "SpectraFlow: Unifying Structural Pretraining and Frequency Adaptation for
Medical Image Segmentation") are binary; its Synapse experiment is multi-class. The ``spectraflow_2d_segmentation``
bundle serves both with one setting, ``label_classes``, read once by :func:`label_mode`:

- ``null``: binary masks, one output channel, sigmoid Dice + BCE + boundary loss, threshold 0.5. A mask must be a
  0/1 or a 0/255 mask (JPEG noise tolerated, :func:`~spectraflow_monai.transforms.label.binary_mask_threshold`) unless
  the datalist sets ``label_threshold: 1`` (foreground = every non-zero value, e.g. instance label maps);
- a list of names, background first, e.g. ``[background, polyp, instrument]``: label maps whose values are the
  class indices 0..K-1;
- a mapping of source values to class indices, e.g. ``{0: 0, 128: 1, 255: 2}`` (several values may share a class;
  classes are named ``background``, ``class_1``, ...);
- a mapping of names to source values, background first, e.g. ``{background: 0, polyp: 255, tool: [100, 101]}``:
  class i is the i-th name.

A mask value outside the classes, or a colour mask, stops the run naming the file and the values. What the bundle
builds from the classes (K output channels, softmax Dice + cross entropy + boundary loss, argmax label maps, metrics
per class with background excluded) is :class:`spectraflow_monai.apps.seg2d.LabelSetup`.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, MutableMapping, Sequence
from typing import Any

from spectraflow_monai.data.label_map import MAX_CLASSES, as_label_int, inverse_label_map
from spectraflow_monai.utils.errors import DataError, SettingError, brief

__all__ = ["LabelMode", "label_mode"]

logger = logging.getLogger(__name__)


def _parse(label_classes: Any) -> tuple[dict[int, int], list[str]]:
    """``label_classes`` -> ({source value: class index}, class names with background first)."""
    bad = SettingError(
        "label_classes must be null (binary masks), a list of class names (background first), a mapping "
        f"{{source value: class index}} or a mapping {{class name: source value(s)}}, got {brief(label_classes)}."
    )
    if isinstance(label_classes, Sequence) and not isinstance(label_classes, str):
        names = [str(n) for n in label_classes]
        mapping = {i: i for i in range(len(names))}
    elif isinstance(label_classes, Mapping) and label_classes:
        keys = [as_label_int(k) for k in label_classes]
        if all(k is not None for k in keys):  # {source value: class index}
            mapping = {}
            for k, v in zip(keys, label_classes.values()):
                c = as_label_int(v)
                if c is None or not 0 <= c < MAX_CLASSES:
                    raise SettingError(f"label_classes maps the value {brief(k)} to {brief(v)}: class indices are ints >= 0.")
                mapping[int(k)] = c  # type: ignore[index]
            n = max(mapping.values()) + 1
            missing = sorted(set(range(n)) - set(mapping.values()))
            if missing:
                raise SettingError(f"label_classes {brief(label_classes)}: no value maps to class(es) {brief(missing)}.")
            names = ["background", *(f"class_{i}" for i in range(1, n))]
        else:  # {class name: source value(s)}
            mapping, names = {}, []
            for index, (name, values) in enumerate(label_classes.items()):
                vals = list(values) if isinstance(values, (list, tuple)) else [values]
                ints = [as_label_int(v) for v in vals]
                if not vals or any(v is None for v in ints):
                    raise SettingError(
                        f"label_classes: class {name!r} must list integer source values, got {brief(values)}."
                    )
                for v in ints:
                    if v in mapping:
                        raise SettingError(f"label_classes: the value {v} is listed for two classes.")
                    mapping[v] = index  # type: ignore[index]
                names.append(str(name))
    else:
        raise bad
    if not 2 <= len(names) <= MAX_CLASSES:
        raise SettingError(
            f"label_classes must name 2..{MAX_CLASSES} classes (background first), got {len(names)}: {brief(label_classes)}."
        )
    if len(set(names)) != len(names) or not all(n.strip() for n in names):
        raise SettingError(f"label_classes names must be distinct and non-empty, got {brief(names)}.")
    return mapping, names


class LabelMode:
    """What the masks of a data set are, read from ``label_classes`` (see the module docstring); made by
    :func:`label_mode`. What a bundle builds from it (output channels, loss options, postprocessing, metrics) is
    :class:`spectraflow_monai.apps.seg2d.LabelSetup`.

    Attributes:
        binary: True for binary masks.
        num_classes: classes including background (2 for binary).
        class_names: names, background first.
        label_map: ``{source value: class index}`` (None for binary).
    """

    def __init__(self, label_classes: Any = None) -> None:
        self.label_classes = label_classes
        self.binary = label_classes is None
        if self.binary:
            self.label_map, self.class_names = None, ["background", "foreground"]
        else:
            self.label_map, self.class_names = _parse(label_classes)
        self.num_classes = len(self.class_names)

    @classmethod
    def read(cls, label_classes: Any = None) -> Any:
        """``label_classes`` as given on a command line or in a config (``"null"`` / ``"none"`` / ``""``: binary
        masks) -> an instance of ``cls``, logged; an instance of ``cls`` is returned as it is."""
        if isinstance(label_classes, cls):
            return label_classes
        if isinstance(label_classes, str) and label_classes.strip().lower() in ("", "none", "null"):
            label_classes = None
        mode = cls(label_classes)
        logger.info("label_classes: %r", mode)
        return mode

    def __repr__(self) -> str:
        if self.binary:
            return "LabelMode(binary masks: 0/1 or 0/255, or label_threshold 1 = non-zero)"
        return f"LabelMode({self.num_classes} classes {self.class_names}, source values -> class {self.label_map})"

    @property
    def segment_classes(self) -> tuple[list[str], list[int]]:
        """``(class names, values)`` that a 3D Slicer segmentation's segments are read as, by name
        (:func:`~spectraflow_monai.data.volumes.read_label_volume`): binary masks: a segment named ``foreground``
        becomes 255 (a 0/255 mask); label maps: a segment named like class ``c`` becomes its first source value
        (the inverse of the map), so that the label transform gives class ``c`` back."""
        if self.binary:
            return list(self.class_names), [0, 255]
        return list(self.class_names), inverse_label_map(self.label_map, self.num_classes)

    def default_threshold(self, label_threshold: Any = None) -> int:
        """``label_threshold`` of the datalist entries: 128 (0/1 or 0/255 masks, checked) unless 1 is given; 1 for
        label maps (not used by their transform)."""
        if label_threshold is not None and (as_label_int(label_threshold) != 1):
            raise SettingError(
                f"label_threshold must be null (0/1 or 0/255 masks) or 1 (every non-zero value is foreground), "
                f"got {label_threshold!r}."
            )
        if not self.binary:
            return 1
        return 128 if label_threshold is None else 1

    def label_transform(self, keys: Any = "label") -> Any:
        """The loading transform of the masks: :class:`~spectraflow_monai.transforms.BinarizeLabeld` (values
        checked) for binary masks, :class:`~spectraflow_monai.transforms.LabelClassesd` for label maps."""
        from spectraflow_monai.transforms.label import BinarizeLabeld, LabelClassesd

        if self.binary:
            return BinarizeLabeld(keys, check_values=True)
        return LabelClassesd(keys, self.label_map, self.class_names)

    def validate(
        self,
        entries: Sequence[MutableMapping[str, Any]],
        what: str,
        check_images: bool = True,
        check_masks: bool = True,
    ) -> None:
        """Decode and check every entry (:func:`~spectraflow_monai.data.validation.validate_datalist`); label maps:
        every mask value must be a class. Raises :class:`~spectraflow_monai.data.validation.DatasetError`."""
        from spectraflow_monai.data.validation import DatasetError, validate_datalist

        if self.binary:
            validate_datalist(entries, what, check_images=check_images, check_masks=check_masks, label_mode=self)
            return
        validate_datalist(entries, what, check_images=check_images, check_masks=False, label_mode=self)
        if not check_masks:
            return
        problems = []
        for e in entries:
            try:
                self.check_mask(e["label"])
            except DataError as err:
                problems.append(str(err))
        if problems:
            raise DatasetError(f"{what}: {len(problems)} bad mask(s):\n  " + "\n  ".join(problems[:10]))

    def check_mask(self, path: str | os.PathLike) -> None:
        """Raise :class:`DataError` naming ``path`` when its mask is a colour image or holds values that are not
        classes of ``label_classes``."""
        from spectraflow_monai.data.readers import read_2d
        from spectraflow_monai.transforms.label import check_label_values

        check_label_values(read_2d(path, "label", self), self.label_map or {}, self.class_names, os.fspath(path))


def label_mode(label_classes: Any = None) -> LabelMode:
    """Read the ``label_classes`` setting once (see the module docstring) and log what it means.

    Raises:
        SettingError: naming the setting and the value when it is none of the accepted forms.
    """
    return LabelMode.read(label_classes)
