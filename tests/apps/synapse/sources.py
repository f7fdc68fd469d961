"""The Synapse data source of a run, built in tests as the bundle builds it: from the run's three settings objects."""

from __future__ import annotations

import dataclasses
from typing import Any

from spectraflow_monai.apps.synapse import SynapseDataOptions, SynapseDataSource
from spectraflow_monai.utils.settings import DataSettings, ModelSettings, RunSettings

#: the CT model settings of the tests (a 28 px slice: the smallest SpectraFlow input)
CT_MODEL = {"image_size": 28, "num_classes": 9, "hu_window": (-125.0, 275.0), "nonfinite": "error"}


def synapse_source(dataset: str = "synthetic", dataset_dir: Any = None, **values: Any) -> SynapseDataSource:
    """The data source of ``dataset`` in ``dataset_dir``; each other value goes to the settings object that has a
    field of its name (``cache_dir`` and ``progress_bar`` to the run settings, ``label_map`` to the model settings,
    ``unmapped_labels`` to the Synapse data options, ...). The progress bar is off unless asked for."""
    fields = {kind: {f.name for f in dataclasses.fields(kind)} for kind in (SynapseDataOptions, ModelSettings,
                                                                            DataSettings, RunSettings)}
    given: dict[type, dict[str, Any]] = {kind: {} for kind in fields}
    for name, value in values.items():
        kind = next((k for k, names in fields.items() if name in names), None)
        if kind is None:
            raise TypeError(f"no settings object has a field {name!r}")
        given[kind][name] = value
    model = {**CT_MODEL, **given[ModelSettings]}
    model.setdefault("out_channels", model["num_classes"])
    options = SynapseDataOptions(**given[SynapseDataOptions])
    data = DataSettings(dataset=dataset, data_options=options, **given[DataSettings])
    run = RunSettings(dataset_dir=dataset_dir, **{"progress_bar": False, **given[RunSettings]})
    return SynapseDataSource(data, ModelSettings(**model), run)


def source_datalist(
    dataset: str, dataset_dir: Any, split: str = "train", cases: Any = None, exclude_cases: Any = None,
    slices: bool = False, **values: Any,
) -> list[dict[str, Any]]:  # fmt: skip
    """The datalist of ``split`` from :func:`synapse_source` (``values``: its settings by field name)."""
    return synapse_source(dataset, dataset_dir, **values).datalist(split, cases, exclude_cases, slices)
