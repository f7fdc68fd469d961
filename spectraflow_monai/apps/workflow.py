"""The training program both bundles share, as functions the bundle configs call in one line each.

The configs keep the settings, ``network_def`` and short references (MONAI model-zoo style); what would otherwise
be chains of config expressions lives here, once for both bundles:

- :func:`prepare_run`: the first steps of every training run (image size check, determinism, run folders);
- :func:`segmentation_metrics`: the key and additional metric handlers of a trainer or evaluator;
- :func:`trainable_parameters`: the optimizer's parameters (frozen encoder blocks left out);
- :func:`datalist`: one split of a run's data source;
- :func:`flat_compose`: one ``Compose`` of the config's transform lists;
- :func:`total_iterations`: the length of a per-iteration learning-rate schedule;
- :func:`pretrainer_checkpoint`: what a Stage-1 checkpoint holds;
- :func:`recorded_network`: the network of a model file, built from the settings recorded beside it through the
  registered architecture (:func:`network_class`);
- :func:`bundle_dataset`, :func:`training_loader`: the datasets and the training data path of ``data_path``
  (MONAI's per-sample loader, or the cache on the training device with batched augmentation);
- :func:`start_training`: the ``run`` of both stages (early stopping bound to the trainer, the resume decision,
  checkpoints).
"""

from __future__ import annotations

import importlib
import logging
import os
from collections.abc import Callable, Sequence
from typing import Any

import monai
import torch
import torch.nn as nn
from ignite.engine import Engine
from monai.data import CacheDataset, DataLoader, Dataset
from monai.engines import SupervisedEvaluator
from monai.handlers import CheckpointLoader, MeanDice, MeanIoUHandler, from_engine
from monai.transforms import Compose, RandomizableTrait, Transform

from spectraflow_monai.data.device_cache import DeviceCache, DeviceCacheLoader
from spectraflow_monai.data.validation import check_foreground
from spectraflow_monai.handlers import HD95, HD95EmptyAsDiagonal
from spectraflow_monai.transforms.batched import BatchCompose, batched_twins
from spectraflow_monai.utils.errors import SettingError
from spectraflow_monai.utils.architectures import Architecture, architecture
from spectraflow_monai.utils.settings import DATA_PATHS, PATCH_SIZE, check_image_size

__all__ = [
    "bundle_dataset",
    "datalist",
    "flat_compose",
    "network_class",
    "prepare_run",
    "pretrainer_checkpoint",
    "recorded_network",
    "segmentation_metrics",
    "serving_evaluator",
    "split_at_random",
    "start_training",
    "total_iterations",
    "trainable_parameters",
    "training_loader",
]

logger = logging.getLogger(__name__)


def prepare_run(
    seed: int, folders: Sequence[str | os.PathLike] = (), image_size: int | None = None, model: Any = None
) -> None:
    """Check ``image_size`` (when given), make the run deterministic (``monai.utils.set_determinism(seed)``) and
    create ``folders``.

    Args:
        seed: the run's seed.
        folders: folders to create. Defaults to none.
        image_size: the image side to check, by ``model``'s rule when given (a multiple of 14 for SpectraFlow, of 16
            for U-Net++), else as a multiple of 14. Defaults to None: ``model``'s image size, if any.
        model: the run's :class:`~spectraflow_monai.utils.settings.ModelSettings` or a
            :class:`~spectraflow_monai.utils.run_record.ModelRecord` (built, it has checked its own image size).
            Defaults to None.
    """
    settings = getattr(model, "settings", model)
    if image_size is not None:
        check_image_size(image_size, multiple=settings.size_multiple() if settings is not None else PATCH_SIZE)
    monai.utils.set_determinism(seed=seed)
    for folder in folders:
        os.makedirs(folder, exist_ok=True)


def segmentation_metrics(
    prefix: str,
    which: str = "key",
    include_background: bool = False,
    output_transform: Callable | None = None,
    label_setup: Any = None,
    hd95: bool = True,
) -> dict[str, Any]:
    """The metric handlers of the bundles' trainers and evaluators (MONAI's handlers, named ``<prefix>_<metric>``).

    Args:
        prefix: ``"train"`` or ``"val"``.
        which: ``"key"``: ``{<prefix>_mean_dice: MeanDice}``; ``"additional"``: mean IoU, HD95 (MONAI's definition,
            unless ``hd95`` is False; nan when every prediction is empty, :class:`~spectraflow_monai.handlers.HD95`)
            and HD95 with a missed structure scored as the image diagonal.
        include_background: of every handler (True for a single binary channel). Defaults to False.
        output_transform: maps ``engine.state.output`` to ``(pred, label)``. Defaults to
            ``from_engine(["pred", "label"])``.
        label_setup: a :class:`~spectraflow_monai.apps.seg2d.LabelSetup`: its ``include_background`` and
            ``metric_output`` replace the two arguments above. Defaults to None.
        hd95: include MONAI's HD95 among the additional metrics. Defaults to True.
    """
    if label_setup is not None:
        include_background, output_transform = label_setup.include_background, label_setup.metric_output
    transform = output_transform or from_engine(["pred", "label"])
    if which == "key":
        return {f"{prefix}_mean_dice": MeanDice(include_background=include_background, output_transform=transform)}
    if which != "additional":
        raise ValueError(f"which must be 'key' or 'additional', got {which!r}.")
    metrics = {f"{prefix}_mean_iou": MeanIoUHandler(include_background=include_background, output_transform=transform)}
    if hd95:
        # MONAI's HD95; nan (as evaluation reports it), not 0, when every prediction is empty
        metrics[f"{prefix}_hd95"] = HD95(include_background=include_background, output_transform=transform)
    # a missed lesion (organ) scores the image (slice) diagonal instead of leaving the mean
    metrics[f"{prefix}_hd95_empty_as_diagonal"] = HD95EmptyAsDiagonal(
        include_background=include_background, output_transform=transform
    )
    return metrics


def trainable_parameters(network: nn.Module | Sequence[nn.Module]) -> list[nn.Parameter]:
    """The parameters of ``network`` (one module or several, e.g. Stage-1's encoder and head) that require gradient:
    frozen encoder blocks are left out of the optimizer."""
    modules = [network] if isinstance(network, nn.Module) else list(network)
    return [p for module in modules for p in module.parameters() if p.requires_grad]


def datalist(
    source: Any, split: str, *args: Any, role: str | None = None, allow_empty_masks: bool | None = None, **kwargs: Any
) -> list[dict]:
    """``source.datalist(split, *args, **kwargs)``: one split (``train``, ``val``, ``test``) of a run's data source
    (:class:`~spectraflow_monai.apps.seg2d.DataSource`, :class:`~spectraflow_monai.apps.synapse.SynapseDataSource`).

    Args:
        source: the run's data source.
        split: the split to list.
        args: passed to ``source.datalist``.
        role: ``"training"`` or ``"validation"``: what the run does with this datalist; its masks are then checked
            for foreground before training (:func:`~spectraflow_monai.data.validation.check_foreground`: an error
            for a training set without any, a warning for such a validation set). None: not checked. Defaults to
            None.
        allow_empty_masks: with ``role="training"``, train on masks that are all background with a warning instead
            of the error. Defaults to None: the source's ``allow_empty_masks`` (the run's ``DataSettings``).
        kwargs: passed to ``source.datalist``.
    """
    entries = source.datalist(split, *args, **kwargs)
    if role is not None:
        what = f"{getattr(source, 'name', None) or type(source).__name__} ({split} split)"
        allowed = source.allow_empty_masks if allow_empty_masks is None else allow_empty_masks
        check_foreground(entries, what, role=role, allow_empty=bool(allowed))
    return entries


def flat_compose(transforms: Sequence[Any]) -> Compose:
    """One flat ``Compose`` of ``transforms``, whose items are transforms, lists of transforms (a config's
    ``load_transforms``, ``train_augmentation``, ...) or ``Compose`` objects, in order. Flat, so that ``CacheDataset``
    caches every deterministic transform up to the first random one, and a config lists the pieces by reference."""
    flat: list[Any] = []
    for item in transforms:
        if isinstance(item, Compose):
            flat.extend(item.flatten().transforms)
        elif isinstance(item, (list, tuple)):
            flat.extend(flat_compose(item).transforms)
        else:
            flat.append(item)
    return Compose(flat)


def serving_evaluator(precision: Any, **components: Any) -> SupervisedEvaluator:
    """MONAI's ``SupervisedEvaluator`` of an evaluation or inference config (its ``components``: device, loader,
    network, inferer, postprocessing, handlers) under the run's resolved precision
    (:class:`~spectraflow_monai.utils.Precision`): ``amp`` only for float16 on CUDA, where MONAI's engine adds its
    scaler, ``amp_kwargs`` the precision's dtype; the inferer's autocast covers the other precisions."""
    return SupervisedEvaluator(amp=precision.use_grad_scaler, amp_kwargs=precision.amp_kwargs, **components)


def total_iterations(epochs: int, data_loader: Any) -> int:
    """Iterations of ``epochs`` epochs over ``data_loader`` (at least 1): the length of a per-iteration schedule."""
    return max(1, int(epochs) * len(data_loader))


def pretrainer_checkpoint(trainer: Any, lr_scheduler: Any, random_state: Any) -> dict[str, Any]:
    """What a Stage-1 checkpoint holds: the trainer's modules, optimizer and state
    (:meth:`~spectraflow_monai.engines.Stage1Trainer.checkpoint_dict`), the learning-rate schedule and the random
    state of the data pipeline (:class:`~spectraflow_monai.handlers.RandomStateHandler`)."""
    return dict(trainer.checkpoint_dict(lr_scheduler), random_state=random_state)


def recorded_network(
    record: Any,
    out_channels: int | None = None,
    image_size: int | None = None,
    in_channels: int | None = None,
    trainable_blocks: Any = None,
    **given: Any,
) -> nn.Module:
    """The network of a model file, built from the model settings of its
    :class:`~spectraflow_monai.utils.run_record.ModelRecord` (or a
    :class:`~spectraflow_monai.utils.settings.ModelSettings`), for the weights of that file (evaluation, inference,
    MONAI Label) or for training: the network class of the registered ``architecture``
    (:data:`~spectraflow_monai.utils.architectures.ARCHITECTURES`: SpectraFlowNet, MONAI's ``UNet``,
    :class:`~spectraflow_monai.networks.UNetPlusPlus`) with the arguments the entry takes from the settings (encoder,
    image size, fusion, refinement; a baseline's ``network_kwargs``).

    Args:
        record: the model settings (``architecture``, ``network_kwargs``, ``encoder_name``, ``image_size``, ...).
        out_channels: the network's output channels. Defaults to None: the record's.
        image_size: the config's value when given (it is checked against the record), else the record's.
        in_channels: image channels. Defaults to None: the record's.
        trainable_blocks: SpectraFlow's trained encoder blocks (Stage-2's ``trainable_blocks``); an architecture
            without an encoder trains all its parameters and takes none. Defaults to None: the network's default.
        given: any other argument (a config key such as ``network_def#img_size``) is refused: the network is the
            record's, so that the run record holds what trains.

    Raises:
        SettingError: an argument beside the settings, naming the setting to give instead; an unknown architecture,
            listing the registered ones; ``network_kwargs`` the network class refuses.
    """
    if given:
        named = ", ".join(f"network_def#{k}={v!r}" for k, v in given.items())
        raise SettingError(
            f"{named}: the network is built from model_settings (the run record and model.json); give the model "
            "setting instead (--model_settings#<field>: image_size, encoder_name, encoder_kwargs, fusion, refine, "
            "network_kwargs)."
        )
    entry = architecture(getattr(record, "architecture", "spectraflow"))
    arguments = entry.arguments(
        record,
        in_channels=record.in_channels if in_channels is None else in_channels,
        out_channels=record.out_channels if out_channels is None else out_channels,
        image_size=image_size,
        trainable_blocks=trainable_blocks,
    )
    try:
        return network_class(entry)(**arguments)
    except TypeError as err:  # an argument the class does not take: network_kwargs, named in one line
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise SettingError(
            f"network_kwargs {dict(getattr(record, 'network_kwargs', None) or {})!r} do not fit "
            f"{entry.network_class} (architecture {entry.name!r}): {first}."
        ) from err


def network_class(entry: Architecture) -> type[nn.Module]:
    """The network class of a registered architecture (its dotted :attr:`~Architecture.network_class`, imported)."""
    module, _, name = entry.network_class.rpartition(".")
    return getattr(importlib.import_module(module), name)


def start_training(
    trainer: Engine,
    checkpoint_saver: Any,
    checkpoint: dict[str, Any] | None = None,
    resume_path: str | None = None,
    early_stop: Any = None,
    map_location: str | torch.device | None = None,
) -> None:
    """The ``run`` of a bundle's training stage: bind early stopping to the trainer, continue from ``resume_path``
    (the checkpoint chosen by :func:`~spectraflow_monai.utils.checkpoint.resume_checkpoint`, None: a new run) by
    loading it into ``checkpoint`` (MONAI's ``CheckpointLoader``, mapped to ``map_location``), attach the
    checkpoint saver, and train.

    Args:
        trainer: the stage's trainer.
        checkpoint_saver: its :class:`~spectraflow_monai.handlers.SafeCheckpointSaver`.
        checkpoint: the objects a checkpoint holds (the saver's ``save_dict``); needed when ``resume_path`` is set.
        resume_path: the checkpoint to continue from, or None.
        early_stop: an early-stopping handler whose trainer is set here (a config reference would be circular).
        map_location: where the checkpoint's tensors go (the training device).
    """
    if early_stop is not None:
        early_stop.set_trainer(trainer)
    if resume_path:
        if not checkpoint:
            raise ValueError(f"resume_path {resume_path!r} was given without the checkpoint objects to load it into.")
        CheckpointLoader(load_path=resume_path, load_dict=checkpoint, map_location=map_location).attach(trainer)
    checkpoint_saver.attach(trainer)
    trainer.run()


def _check_data_path(data_path: Any) -> str:
    if data_path not in DATA_PATHS:
        raise SettingError(f"data_path must be one of {list(DATA_PATHS)}, got {data_path!r}.")
    return data_path


def split_at_random(transform: Compose) -> tuple[Compose, list[Any]]:
    """``transform``'s deterministic prefix and the transforms after it, split where MONAI's ``CacheDataset`` splits
    (its ``get_index_of_first`` rule: the first random transform, or the first that is not a MONAI ``Transform``)."""
    compose = transform if isinstance(transform, Compose) else Compose([transform])
    first = compose.get_index_of_first(lambda t: isinstance(t, RandomizableTrait) or not isinstance(t, Transform))
    first = len(compose.transforms) if first is None else first
    return Compose(compose.transforms[:first]), list(compose.transforms[first:])


def bundle_dataset(
    data: Sequence[dict],
    transform: Compose,
    data_path: str = "monai",
    cache_rate: float = 1.0,
    num_workers: int = 0,
    progress: bool = True,
    prepare: Callable[[Sequence[dict]], Sequence[dict]] | None = None,
) -> Dataset:
    """A bundle's training or validation dataset: MONAI's ``CacheDataset`` of ``transform`` (``data_path``
    ``"monai"``), or a plain ``Dataset`` (``"device"``, training: :func:`training_loader` caches the deterministic
    part on the training device itself, so nothing is cached twice). MONAI Label and ``check_properties`` see it as
    ``train#dataset`` / ``validate#dataset`` either way, and MONAI Label's bundle trainer replaces its ``data``.

    Args:
        prepare: turns the entries into what ``transform`` reads, before anything is cached (the Synapse bundle:
            whole volumes, e.g. from MONAI Label's datastore, into cached axial slices). Defaults to None.
    """
    data = list(data) if prepare is None else list(prepare(data))
    if _check_data_path(data_path) == "device":
        return Dataset(data=data, transform=transform)
    return CacheDataset(
        data=data, transform=transform, cache_rate=cache_rate, num_workers=num_workers, progress=progress
    )


def training_loader(
    dataset: Dataset,
    batch_size: int,
    data_path: str = "monai",
    sampler: Any = None,
    num_workers: int = 0,
    cache_device: str = "auto",
    device: str | torch.device | None = None,
    seed: int = 0,
    extra_transforms: Sequence[Any] = (),
    collate_fn: Any = None,
) -> Any:
    """The training loader of ``data_path`` (the bundle README's "Data path"), ``drop_last`` in both.

    - ``"monai"``: MONAI's ``DataLoader`` of ``dataset`` with ``sampler`` and ``num_workers`` worker processes
      (the random transforms run per sample in the workers);
    - ``"device"``: MONAI's fast-training recipe. The deterministic part of ``dataset.transform`` (loading,
      resizing) runs once into a :class:`~spectraflow_monai.data.DeviceCache` on ``cache_device`` (``auto``: the
      training device when the cache fits in half its free memory); every batch is gathered there and its random
      transforms run as one batched call each on the training device (:func:`spectraflow_monai.transforms.
      batched_twins` of the same MONAI transforms, seeded with ``seed``), followed by ``extra_transforms`` (Stage-1's
      device mixed-domain rendering). No worker processes, no per-sample work in the trainer process.

    The per-sample and the batched paths draw different random numbers (the same distributions): a run records its
    ``data_path``.

    Both drop the last incomplete batch, so ``batch_size`` larger than the number of training samples (a sampler's
    share in a distributed run) would give an empty epoch: it is then reduced to that number, with a warning. Fewer
    than two samples cannot train (batch normalisation needs two a batch): :class:`SettingError` naming
    ``batch_size`` and the count.
    """
    samples = len(sampler) if sampler is not None else len(dataset)
    if samples < 2:
        raise SettingError(
            f"batch_size: the training data has {samples} sample(s) (this process's share), at least 2 are needed for "
            "a batch (batch normalisation); add training data or lower the validation share."
        )
    if batch_size > samples:
        logger.warning(
            f"batch_size {batch_size} is larger than the {samples} training samples (this process's share): batches of "
            f"{samples} are used, else every epoch would be empty (the last incomplete batch is dropped)."
        )
        batch_size = samples
    if _check_data_path(data_path) == "monai":
        return DataLoader(
            dataset, batch_size=batch_size, sampler=sampler, drop_last=True, num_workers=num_workers,
            collate_fn=collate_fn,
        )  # fmt: skip
    deterministic, random = split_at_random(dataset.transform)
    cache = DeviceCache(dataset.data, deterministic, cache_device=cache_device, device=device)
    augment = BatchCompose([*batched_twins(random), *extra_transforms]).set_random_state(seed)
    return DeviceCacheLoader(cache, batch_size=batch_size, shuffle=True, drop_last=True, transform=augment,
                             device=device, seed=seed)  # fmt: skip
