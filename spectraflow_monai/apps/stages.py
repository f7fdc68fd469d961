"""The training stages both bundles run, written once in Python (Chen et al., Sec. 4 and 5.2).

A bundle's ``configs/train.yaml`` keeps the values, its data, transforms, ``network_def`` and references; the
settings objects are MONAI components of those values (``model_settings: {_target_: ...ModelSettings, image_size:
224, ...}``), and each stage is a program object built from them, the only reader of them:

- :class:`Stage2Program`: Stage-2 (Dice + (B)CE + boundary fine-tuning). The ids MONAI's tools and MONAI Label read
  (``train#dataset``, ``train#trainer``, ``train#handlers``, ``validate#evaluator``, ...) stay config keys whose
  values come from the program: its datasets, loaders, inferer, optimizer, loss, metrics, handlers, the run record,
  the encoder's start and the resumable training (:func:`run_stage2`);
- :class:`Stage2TrainHandlers` and :class:`Stage2ValidationHandlers`: the Stage-2 trainer's and evaluator's
  handlers beyond MONAI's ``ValidationHandler`` (loss terms and the boundary-weight ramp, logs, progress, the
  learning-rate plateau, early stopping, the best model with its settings beside it);
- :func:`stage2_optimizer` and :func:`stage2_loss`: Stage-2's AdamW and its loss of the settings (a value a config
  sets on the component itself, e.g. ``train#optimizer#lr``, is refused naming the setting to give instead: the run
  record holds what trains);
- :class:`Stage1Program`: all of Stage-1 (Mixed-Domain MeanFlow + dispersive, or mixed-domain MAE), which
  ``configs/train_stage1.yaml`` runs over the same ``train.yaml``: its data, transforms and settings objects.

The run record is the settings objects written whole.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn
from ignite.engine import Engine, Events
from monai.engines import SupervisedEvaluator, SupervisedTrainer
from monai.data import DistributedSampler
from monai.handlers import (
    LrScheduleHandler,
    TensorBoardStatsHandler,
    from_engine,
    stopping_fn_from_metric,
)
from monai.data import DataLoader
from monai.inferers import SimpleInferer
from monai.transforms import Compose, Identity
from torch.utils.data import RandomSampler

from spectraflow_monai.apps.encoder_init import initialize_encoder, resolve_encoder_start
from spectraflow_monai.apps.workflow import (
    bundle_dataset,
    prepare_run,
    pretrainer_checkpoint,
    segmentation_metrics,
    start_training,
    total_iterations,
    trainable_parameters,
    training_loader,
)
from spectraflow_monai.engines import (
    DispersiveConfig,
    EMAConfig,
    GradientConfig,
    MAEConfig,
    MAEPretrainer,
    MeanFlowConfig,
    MeanFlowPretrainer,
)
from spectraflow_monai.handlers import (
    EncoderExportHandler,
    EpochSummaryHandler,
    GradScalerState,
    LossTermsHandler,
    ProgressBarHandler,
    RandomStateHandler,
    ResumableEarlyStopHandler,
    RunStatsHandler,
    SafeCheckpointSaver,
    StopOnNonFiniteLoss,
)
from spectraflow_monai.losses import DiceBCEBoundaryLoss, DispersiveLoss, MAELoss, MeanFlowLoss
from spectraflow_monai.networks import DINOv2Encoder, MAEDecoder, MeanFlowHead
from spectraflow_monai.optimizers import linear_lr_schedule
from spectraflow_monai.transforms import MixedDomainCollate, RandMixedDomainBatchd
from spectraflow_monai.networks.weights import normalize_weights_source
from spectraflow_monai.utils.checkpoint import RestartDecision, resume_checkpoint
from spectraflow_monai.utils.errors import SettingError
from spectraflow_monai.utils.precision import AutocastInferer, Precision, resolve_precision
from spectraflow_monai.utils.fingerprint import file_digest
from spectraflow_monai.utils.run_record import RecordedModel, record_components, record_finished, record_run
from spectraflow_monai.utils.settings import DataSettings, ModelSettings, RunSettings, Stage1Settings, Stage2Settings

__all__ = [
    "Stage1Program",
    "Stage2Program",
    "Stage2TrainHandlers",
    "Stage2ValidationHandlers",
    "run_stage2",
    "stage2_dataset",
    "stage2_evaluator",
    "stage2_trainer",
    "stage2_loss",
    "stage2_optimizer",
]

#: the validation metric that selects the model, steps the learning-rate plateau and stops early
KEY_METRIC = "val_mean_dice"


#: the settings behind the arguments of Stage-2's optimizer and loss (``train#optimizer#<argument>``,
#: ``train#loss#<argument>``)
_SETTING_OF_ARGUMENT = {
    "lr": "learning_rate",
    "weight_decay": "weight_decay",
    "beta": "boundary_beta",
    "beta_max": "boundary_beta_max",
    "ramp_epochs": "boundary_ramp_epochs",
}


def _refuse_component_values(component: str, given: dict[str, Any]) -> None:
    """A value set on a Stage-2 component beside its settings would train unrecorded: one line naming it."""
    if given:
        named = ", ".join(
            f"{component}#{k}={v!r} (give --stage2_settings#{_SETTING_OF_ARGUMENT.get(k, '<setting>')} instead)"
            for k, v in given.items()
        )
        raise SettingError(
            f"{named}: Stage-2 builds {component} from stage2_settings, so that the run record holds what trains."
        )


def stage2_optimizer(program: Stage2Program, network: nn.Module, **given: Any) -> torch.optim.AdamW:
    """Stage-2's AdamW (Chen et al., Sec. 5.2) over the trainable parameters of ``network`` (frozen encoder blocks
    left out), with the ``learning_rate`` and ``weight_decay`` of the program's settings (``train#optimizer``).

    Raises:
        SettingError: any other argument (a config key such as ``train#optimizer#lr``), naming the setting to give.
    """
    _refuse_component_values("train#optimizer", given)
    settings = program.settings
    return torch.optim.AdamW(
        trainable_parameters(network), lr=settings.learning_rate, weight_decay=settings.weight_decay
    )


def stage2_loss(program: Stage2Program, **given: Any) -> DiceBCEBoundaryLoss:
    """Stage-2's loss, Dice + (B)CE + beta * boundary (eq. 7), with the boundary weight ramp of the program's
    settings (``boundary_beta`` to ``boundary_beta_max`` over ``boundary_ramp_epochs``) and its distance backend
    (``train#loss``): the 2D bundle's label setup (binary masks: sigmoid Dice + BCE; label classes: softmax Dice +
    CE), else softmax Dice + CE over one-hot classes (the Synapse organs).

    Raises:
        SettingError: any other argument (a config key such as ``train#loss#beta``), naming the setting to give.
    """
    _refuse_component_values("train#loss", given)
    settings = program.settings
    weights = dict(
        beta=settings.boundary_beta, beta_max=settings.boundary_beta_max, ramp_epochs=settings.boundary_ramp_epochs,
        distance_backend=program.run_settings.distance_backend,
    )  # fmt: skip
    if program.label_setup is not None:
        return program.label_setup.loss(**weights)
    return DiceBCEBoundaryLoss(sigmoid=False, softmax=True, to_onehot_y=True, **weights)


def _check_settings_objects(settings: Any, kind: type, model: Any, data: Any, run: Any) -> None:
    """A stage program's inputs are the run's settings objects (a ValueError naming the argument otherwise)."""
    for name, value, expected in (
        ("settings", settings, kind), ("model", model, ModelSettings), ("data", data, DataSettings),
        ("run", run, RunSettings),
    ):  # fmt: skip
        if not isinstance(value, expected):
            raise ValueError(f"{name} must be a {expected.__name__}, got {type(value).__name__}.")


class _HandlerGroup:
    """Handlers attached together, in order (``attach(engine)`` as one ignite handler)."""

    handlers: list[Any]

    def attach(self, engine: Engine) -> None:
        """Attach every handler of the group to ``engine``, in order."""
        for handler in self.handlers:
            handler.attach(engine)


class Stage2TrainHandlers(_HandlerGroup):
    """The Stage-2 trainer's handlers after MONAI's ``ValidationHandler``: stop on a non-finite loss before the
    weights change, ramp beta and report the Dice / (B)CE / boundary terms (eq. 7) per epoch, log the loss (console
    errors, TensorBoard per iteration), one summary line per epoch after validation, and the progress bar.

    Args:
        loss: the Stage-2 loss (:class:`~spectraflow_monai.losses.DiceBCEBoundaryLoss`).
        validator: the evaluator (for the epoch summary's validation metrics).
        run: the run's :class:`~spectraflow_monai.utils.settings.RunSettings`: its ``log_dir`` (TensorBoard),
            ``progress_bar`` and ``log_every`` (iterations between the reads of the loss on the host: the
            non-finite check, the TensorBoard curve, the progress bar; epoch means are exact. On a GPU a larger value
            keeps the trainer from waiting for the device every step; a non-finite loss is then reported up to
            ``log_every - 1`` iterations late, before any checkpoint).
        title: the stage's name in the console. Defaults to ``"Stage-2"``.
    """

    def __init__(self, loss: Any, validator: Any, run: RunSettings, title: str = "Stage-2") -> None:
        loss_value = from_engine(["loss"], first=True)
        self.handlers = [
            StopOnNonFiniteLoss(every=run.log_every),
            LossTermsHandler(loss=loss),
            RunStatsHandler(iteration_log=False, epoch_log=False, tag_name="train_loss", output_transform=loss_value),
            TensorBoardStatsHandler(
                log_dir=run.log_dir, tag_name="train_loss", output_transform=loss_value, iteration_log=run.log_every
            ),
            EpochSummaryHandler(title=title, output_prefix="train_", validator=validator),
            ProgressBarHandler(enabled=run.progress_bar, desc=title, every=run.log_every),
        ]


class Stage2ValidationHandlers(_HandlerGroup):
    """The Stage-2 evaluator's handlers: logs, the learning rate multiplied by ``lr_factor`` on a validation-Dice
    plateau of ``lr_patience`` epochs down to ``min_learning_rate``, early stopping after ``early_stop_patience``
    epochs without improvement, and the best model to ``model_path`` (atomically, never a non-finite one) with its
    :class:`~spectraflow_monai.utils.settings.ModelSettings` written whole beside it (``model.json``).

    Attributes:
        lr_scheduler, early_stop, model_saver: the stateful parts a resumable checkpoint holds (:func:`run_stage2`).

    Args:
        network: the network whose weights are saved.
        optimizer: the Stage-2 optimizer.
        settings: the run's :class:`~spectraflow_monai.utils.settings.Stage2Settings`.
        model: the run's :class:`~spectraflow_monai.utils.settings.ModelSettings`.
        run: the run's :class:`~spectraflow_monai.utils.settings.RunSettings` (``model_path``,
            ``early_stop_patience``, ``log_dir``).
        encoder_start: where the encoder started (:attr:`Stage2Program.encoder_origin`), recorded in ``model.json``
            beside the settings; None: a network without an encoder, nothing recorded. Defaults to None.
    """

    def __init__(
        self,
        network: nn.Module,
        optimizer: torch.optim.Optimizer,
        settings: Stage2Settings,
        model: ModelSettings,
        run: RunSettings,
        encoder_start: dict[str, Any] | None = None,
    ) -> None:
        score = stopping_fn_from_metric(KEY_METRIC)
        self.lr_scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(
            optimizer,
            mode="max",
            factor=settings.lr_factor,
            patience=settings.lr_patience,
            min_lr=settings.min_learning_rate,
        )
        self.early_stop = ResumableEarlyStopHandler(patience=run.early_stop_patience, score_function=score)
        self.model_saver = SafeCheckpointSaver(
            save_dir=os.path.dirname(run.model_path) or ".",
            save_dict={"model": network},
            save_key_metric=True,
            key_metric_filename=os.path.basename(run.model_path),
            model_settings=RecordedModel(model, encoder_start),
        )
        self.handlers = [
            RunStatsHandler(iteration_log=False, epoch_log=False),
            TensorBoardStatsHandler(log_dir=run.log_dir, iteration_log=False),
            LrScheduleHandler(lr_scheduler=self.lr_scheduler, step_transform=score, print_lr=False),
            self.early_stop,
            self.model_saver,
        ]


class Stage2Program:
    """SpectraFlow Stage-2, whole (Chen et al., Sec. 4.2 and 5.2): the decoder from scratch, the encoder from its
    start (``encoder_init``), its last ``trainable_blocks`` trained; Dice + (B)CE + beta * boundary loss (eq. 7)
    with beta ramped; AdamW; the learning rate multiplied by ``lr_factor`` on a validation-Dice plateau; early
    stopping; the best model with its settings beside it.

    Built from the run's settings objects and the only reader of them: a bundle's ``train.yaml`` names it once
    (``stage2``) and takes every Stage-2 component from it, under the ids MONAI's tools and MONAI Label read
    (``train#dataset``, ``train#dataloader``, ``train#inferer``, ``train#optimizer``, ``train#loss``,
    ``train#handlers``, ``train#trainer``, ``validate#...``; MONAI Label replaces ``train#dataset#data``,
    ``validate#dataset#data``, ``train#trainer#max_epochs`` and ``train#handlers``). A value travels one path: its
    top-level line, its settings object, this program, the component; the run record is the same objects written
    whole.

    Args:
        settings: the :class:`~spectraflow_monai.utils.settings.Stage2Settings`.
        model: the :class:`~spectraflow_monai.utils.settings.ModelSettings` (written beside the model).
        data: the :class:`~spectraflow_monai.utils.settings.DataSettings` (data path and seed; recorded).
        run: the :class:`~spectraflow_monai.utils.settings.RunSettings` (device and precision, loading, logging,
            folders, budget).
        label_setup: the 2D bundle's :class:`~spectraflow_monai.apps.seg2d.LabelSetup` (binary masks or label
            classes: the loss, post-processing and metrics of it); None: softmax Dice + CE over one-hot classes (the
            Synapse organs). Defaults to None.
    """

    def __init__(
        self,
        settings: Stage2Settings,
        model: ModelSettings,
        data: DataSettings,
        run: RunSettings,
        label_setup: Any = None,
    ) -> None:
        _check_settings_objects(settings, Stage2Settings, model, data, run)
        self.settings, self.model, self.data, self.run_settings = settings, model, data, run
        self.label_setup = label_setup
        self.device = torch.device(run.device)
        #: the run's precision on its device (``run.precision`` resolved once, here: checked and logged before any
        #: data is read)
        self.precision: Precision = resolve_precision(run.precision, self.device)
        #: the network under the autocast of the precision (CPU and CUDA), outputs in float32
        self.inferer = AutocastInferer(SimpleInferer(), precision=self.precision)

    def dataset(self, data: Sequence[dict], transform: Compose, training: bool = True, prepare: Any = None) -> Any:
        """A Stage-2 dataset (``train#dataset``, ``validate#dataset``; MONAI Label replaces their ``data``):
        training follows ``data_path`` (:func:`~spectraflow_monai.apps.workflow.bundle_dataset`), validation is
        always MONAI's ``CacheDataset``. ``prepare``: see ``bundle_dataset``."""
        data_path = self.data.data_path if training else "monai"
        r = self.run_settings
        return bundle_dataset(data, transform, data_path, r.cache_rate, r.num_workers, r.progress_bar, prepare)

    def train_loader(self, dataset: Any, sampler: Any = None) -> Any:
        """The training loader of ``data_path`` with ``batch_size`` (:func:`~spectraflow_monai.apps.workflow.
        training_loader`: lowered to the number of pairs when there are fewer, with a warning)."""
        return training_loader(
            dataset, self.settings.batch_size, self.data.data_path, sampler=sampler,
            num_workers=self.run_settings.num_workers, cache_device=self.run_settings.cache_device, device=self.device,
            seed=self.data.data_seed,
        )  # fmt: skip

    def val_loader(self, dataset: Any, sampler: Any = None) -> DataLoader:
        """The validation loader, in order, ``val_batch_size`` a batch."""
        return DataLoader(
            dataset, batch_size=self.run_settings.val_batch_size, sampler=sampler, shuffle=False,
            num_workers=self.run_settings.num_workers,
        )

    def metrics(self, prefix: str, which: str = "key", hd95: bool = True) -> dict[str, Any]:
        """The metric handlers ``<prefix>_*`` (:func:`~spectraflow_monai.apps.workflow.segmentation_metrics`)."""
        return segmentation_metrics(prefix, which=which, label_setup=self.label_setup, hd95=hd95)

    def validation_handlers(self, network: nn.Module, optimizer: torch.optim.Optimizer) -> Stage2ValidationHandlers:
        """The evaluator's handlers (:class:`Stage2ValidationHandlers`)."""
        return Stage2ValidationHandlers(
            network, optimizer, self.settings, self.model, self.run_settings, encoder_start=self.encoder_origin
        )

    @property
    def amp(self) -> bool:
        """MONAI's ``amp`` of the trainer and evaluator: float16 with a gradient scaler, on CUDA only."""
        return self.precision.use_grad_scaler

    @property
    def amp_kwargs(self) -> dict[str, Any]:
        """MONAI's ``amp_kwargs`` of the trainer and evaluator."""
        return self.precision.amp_kwargs

    @functools.cached_property
    def encoder_start(self) -> str | None:
        """Where the encoder starts: ``encoder_init`` resolved once, when the run first asks (its record), as
        ``"stage1"``, ``"pretrained"`` or ``"random"`` (``auto``: the Stage-1 export when it exists, else
        ``pretrained_weights``, with a warning naming the paper's row it then trains;
        :func:`~spectraflow_monai.apps.encoder_init.resolve_encoder_start`); None for a network without an encoder
        (the baselines: :attr:`~spectraflow_monai.utils.settings.ModelSettings.has_encoder`)."""
        if not self.model.has_encoder:
            return None
        return resolve_encoder_start(self.settings.encoder_init, self.run_settings.stage1_encoder)

    @functools.cached_property
    def encoder_origin(self) -> dict[str, Any] | None:
        """Where the encoder starts, as ``models/model.json`` records it (``encoder_start``): :attr:`encoder_start`
        as ``start``, the ``encoder_init`` setting, the ``weights`` (the Stage-1 export, ``"timm"``, a file, or None:
        random initialisation) and the SHA-256 of a weights file (``weights_sha256``); None for a network without an
        encoder (nothing recorded)."""
        start = self.encoder_start
        if start is None:
            return None
        weights = {"stage1": self.run_settings.stage1_encoder, "random": None}.get(
            start, normalize_weights_source(self.settings.pretrained_weights) if start == "pretrained" else None
        )
        origin = {"start": start, "encoder_init": self.settings.encoder_init, "weights": weights}
        if weights not in (None, "timm") and os.path.isfile(weights):
            origin["weights_sha256"] = file_digest(weights)
        return origin

    def initialize_encoder(self, network: nn.Module) -> str | None:
        """Load the encoder's starting weights (:attr:`encoder_start`: ``pretrained_weights`` or the Stage-1 export;
        :func:`~spectraflow_monai.apps.encoder_init.initialize_encoder`). Before any data is read: a missing file or
        an unreachable hub stops the run here. A network without an encoder (the architecture's ``has_encoder``: the
        baselines) has nothing to load: None."""
        if not self.model.has_encoder:
            return None
        return initialize_encoder(
            network, encoder_init=self.encoder_start, pretrained_weights=self.settings.pretrained_weights,
            stage1_export=self.run_settings.stage1_encoder, model_settings=self.model.encoder(),
        )  # fmt: skip

    def setup(self) -> None:
        """The first step of the run, before any data is read: the image size checked by the architecture's rule,
        determinism (``data_seed``), the models folders (of ``model_path`` and of the Stage-1 export)."""
        r = self.run_settings
        folders = {os.path.dirname(r.model_path) or ".", os.path.dirname(r.stage1_encoder) or "."}
        prepare_run(self.data.data_seed, folders=sorted(folders), model=self.model)

    def record(self, train: Sequence[dict], val: Sequence[dict], data_source: Any, max_epochs: int) -> dict:
        """Write the run record (``<stage2_dir>/run_record.json``): the settings objects whole, the data's
        fingerprints and where the encoder starts (:attr:`encoder_start`; none for a network without an encoder); a
        restart that would continue an unfinished run recorded with other settings or data stops here, naming each
        difference, and a finished run with no epoch left to train is replaced by a new one
        (:func:`~spectraflow_monai.utils.run_record.record_run`; ``train`` and ``val`` are what the datasets read).
        The run settings and ``max_epochs`` are recorded, not compared. The restart decision taken here
        (:attr:`restart`) is the one training follows (:meth:`train`)."""
        self.restart = record_run(
            self.run_settings.stage2_dir,
            settings=self.settings,
            data_settings=self.data,
            model=self.model,
            data={"train": list(train), "val": list(val)},
            data_source=data_source,
            # what the labels are: the 2D bundle's label setup, or the classes (the Synapse organs)
            label_setup=self.label_setup if self.label_setup is not None else self.model.class_names,
            seed=self.data.data_seed,
            precision=self.precision,
            resume=self.run_settings.resume,
            not_compared={**self.run_settings.to_dict(), "max_epochs": max_epochs},
            resolved=None if self.encoder_start is None else {"encoder_start": self.encoder_start},
            max_epochs=max_epochs,
        )
        return self.restart.record

    def train(self, trainer: Engine, validation: Stage2ValidationHandlers, preprocessing: Compose) -> None:
        """Train, resumably: the optimizer and the loss function the trainer holds recorded in the run record (a
        continued run must hold the ones it recorded;
        :func:`~spectraflow_monai.utils.run_record.record_components`), then
        :func:`run_stage2` following the restart decision of :meth:`record`, with the run's folders and device.

        Raises:
            SettingError: the run record was not written first (``run_record`` before ``train#run`` in ``run``).
        """
        restart = getattr(self, "restart", None)
        if restart is None:
            raise SettingError("Stage-2 trains after its run record decides how it starts: list '@run_record' before "
                               "'@train#run' in the config's `run`.")  # fmt: skip
        record_components(restart, optimizer=trainer.optimizer, loss_function=trainer.loss_function)
        r = self.run_settings
        run_stage2(trainer, validation, preprocessing, restart, r.model_path, r.stage2_checkpoints_kept, self.device)


def run_stage2(
    trainer: Engine,
    validation: Stage2ValidationHandlers,
    preprocessing: Compose,
    restart: RestartDecision,
    model_path: str | os.PathLike,
    checkpoints_kept: int = 2,
    device: str | torch.device | None = None,
) -> None:
    """The ``run`` of Stage-2: a resumable checkpoint in ``run_dir`` at the end of every epoch (after validation)
    holding everything a restart needs to continue exactly (network, optimizer, learning-rate plateau, early
    stopping, the best model's score, the gradient scaler, the augmentation's random state, the epoch), the restart
    decision followed (:func:`~spectraflow_monai.utils.checkpoint.resume_checkpoint`: its checkpoint, or a new run
    with ``model_path`` kept aside as ``*.bak-<time>``), then training; at its end the run record notes the last
    epoch (:func:`~spectraflow_monai.utils.run_record.record_finished`).

    Args:
        trainer: the Stage-2 ``SupervisedTrainer`` (its ``network`` and ``optimizer`` are checkpointed).
        validation: the evaluator's :class:`Stage2ValidationHandlers`.
        preprocessing: the training transforms (their random state is checkpointed).
        restart: the run's restart decision (:func:`~spectraflow_monai.utils.run_record.record_run`), of its
            checkpoint folder (``models/stage2``).
        model_path: the best model's file, never overwritten by a new run.
        checkpoints_kept: checkpoints kept while the run goes on. Defaults to 2.
        device: where a checkpoint's tensors are loaded. Defaults to None.
    """
    checkpoint = {
        "model": trainer.network,
        "optimizer": trainer.optimizer,
        "lr_scheduler": validation.lr_scheduler,
        "early_stop": validation.early_stop,
        "best_model": validation.model_saver,  # the score of model_path: only a better model replaces it
        "grad_scaler": GradScalerState(trainer),
        "random_state": RandomStateHandler(transforms=[preprocessing]),
        "trainer": trainer,
    }
    _checkpoint_loader_state(trainer, checkpoint)
    run_dir = restart.run_dir
    saver = SafeCheckpointSaver(save_dir=run_dir, save_dict=checkpoint, save_interval=1, n_saved=checkpoints_kept)
    # the record notes the end (its last epoch; early stopping or max_epochs): a later start trains a new run
    # unless this one is given more epochs (record_run)
    trainer.add_event_handler(
        Events.COMPLETED, lambda engine: record_finished(run_dir, engine.state.epoch, engine.state.max_epochs)
    )
    start_training(
        trainer,
        saver,
        checkpoint=checkpoint,
        resume_path=resume_checkpoint(restart, protect=[model_path]),
        early_stop=validation.early_stop,
        map_location=device,
    )


def _checkpoint_loader_state(trainer: Engine, checkpoint: dict[str, Any]) -> None:
    """A loader with a state (the device data path's order and augmentation generator) joins the checkpoint and
    follows the trainer's epochs, so that a resumed run continues the same data sequence."""
    loader = getattr(trainer, "data_loader", None)
    if hasattr(loader, "state_dict") and hasattr(loader, "attach"):
        loader.attach(trainer)
        checkpoint["data_loader"] = loader


def stage2_dataset(
    program: Stage2Program, data: Sequence[dict], transform: Compose, training: bool = True, prepare: Any = None
) -> Any:
    """``program.dataset(...)`` as a config component (``train#dataset``, ``validate#dataset``), whose ``data``
    MONAI Label's bundle trainer replaces (:meth:`Stage2Program.dataset`)."""
    return program.dataset(data, transform, training=training, prepare=prepare)


def stage2_trainer(program: Stage2Program, **components: Any) -> SupervisedTrainer:
    """MONAI's ``SupervisedTrainer`` of the config's ``train#trainer`` ``components`` (``max_epochs``, which MONAI
    Label sets, the network, loader, optimizer, loss, inferer, post-processing, metric and handlers) on the program's
    device and precision (``amp`` / ``amp_kwargs``: float16 with a gradient scaler on CUDA only)."""
    return SupervisedTrainer(device=program.device, amp=program.amp, amp_kwargs=program.amp_kwargs, **components)


def stage2_evaluator(program: Stage2Program, **components: Any) -> SupervisedEvaluator:
    """MONAI's ``SupervisedEvaluator`` of the config's ``validate#evaluator`` ``components`` on the program's device
    and precision."""
    return SupervisedEvaluator(device=program.device, amp=program.amp, amp_kwargs=program.amp_kwargs, **components)


class Stage1Program:
    """SpectraFlow Stage-1, whole (Chen et al., Sec. 4.1 and 5.2): Mixed-Domain MeanFlow latent transport
    regression with the dispersive loss (L = L_MF + lambda * L_Disp, eqs. 1-5), or the mixed-domain MAE of the
    Table 2 ablation (``stage1_objective: mae``).

    Mini-batches mix the training images and their masks (label maps merged into one foreground, shown as 3-channel
    images normalised like the images, never a target): each holds exactly round(mask_ratio * batch) masks. AdamW
    with a linear decay from ``start_lr`` to ``end_lr``; gradient accumulation to the global batch; an EMA of the
    encoder, exported every epoch to ``export_path`` (Stage-2's start) with the model settings beside it; a
    resumable checkpoint every ``checkpoint_interval`` epochs (a completed run keeps ``checkpoint_final.pt`` only).

    :meth:`run` does, in order: the run folder and determinism, the run record (a restart of a different run stops
    here), the encoder's starting weights (a missing file or an unreachable hub stops here), the data, training.

    Args:
        settings: the :class:`~spectraflow_monai.utils.settings.Stage1Settings`.
        model: the run's :class:`~spectraflow_monai.utils.settings.ModelSettings` (encoder, image size, the
            normalisation of images and masks).
        data: the run's :class:`~spectraflow_monai.utils.settings.DataSettings` (recorded; its seed makes the run
            deterministic).
        run: the run's :class:`~spectraflow_monai.utils.settings.RunSettings`: ``stage1_epochs`` (not compared on
            restart: a finished run given more epochs trains on), the device, data loading (``num_workers``,
            ``cache_rate``, ``cache_device``), ``progress_bar``, ``log_every`` (as :class:`Stage2TrainHandlers`;
            above 1 the trainer keeps its outputs on the device), ``resume`` / ``resume_from``, the folders
            (``stage1_dir``: checkpoints and record; ``stage1_encoder``: the EMA encoder export; ``log_dir``:
            TensorBoard under ``<log_dir>/stage1``), ``stage1_checkpoint_interval`` and ``stage1_checkpoints_kept``.
        datalist: the training datalist (the same, possibly low-data, subset as Stage-2).
        preprocessing: the training transforms (load, augment, normalise), cached up to the first random one.
        data_source, label_setup: recorded by ``repr`` (what the data are). Defaults to None.
        prune_on_completion: a completed run keeps ``checkpoint_final.pt`` only (all a restart needs). Defaults to
            True.
        dispersive_loss: a callable that replaces the dispersive loss the settings describe (a research hook; the
            run record still holds the settings). Defaults to None: ``DispersiveLoss`` of the settings.
    """

    def __init__(
        self,
        settings: Stage1Settings,
        model: ModelSettings,
        data: DataSettings,
        run: RunSettings,
        datalist: Sequence[dict],
        preprocessing: Compose,
        data_source: Any = None,
        label_setup: Any = None,
        prune_on_completion: bool = True,
        dispersive_loss: Any = None,
    ) -> None:
        _check_settings_objects(settings, Stage1Settings, model, data, run)
        if not model.has_encoder:
            raise SettingError(f"architecture {model.architecture!r} has no encoder: Stage-1 pretrains SpectraFlow's "
                               "DINOv2 encoder (train_stage1.yaml with architecture spectraflow).")  # fmt: skip
        self.settings, self.model, self.data, self.run_settings = settings, model, data, run
        self.datalist, self.preprocessing, self.epochs = datalist, preprocessing, run.stage1_epochs
        self.device = torch.device(run.device)
        #: ``run.precision`` resolved on the device, once (checked and logged before any data is read)
        self.precision: Precision = resolve_precision(run.precision, self.device)
        self.run_dir, self.export_path = run.stage1_dir, run.stage1_encoder
        self.log_dir = run.log_dir
        self.data_source, self.label_setup = data_source, label_setup
        self.prune_on_completion = prune_on_completion
        self.custom_dispersive_loss = dispersive_loss
        self.log_every = run.log_every

    def _encoder(self, trainable: Any) -> DINOv2Encoder:
        return DINOv2Encoder(
            model_name=self.model.encoder_name,
            img_size=self.model.image_size,
            trainable_blocks=trainable,
            model_kwargs=self.model.encoder_kwargs,
        )

    def meanflow_loss(self) -> MeanFlowLoss:
        """The MeanFlow regression of eqs. 1-3 with the settings' time sampling (``meanflow_ratio_unequal``: the
        share of rows with s < t) and adaptive weight."""
        s = self.settings
        return MeanFlowLoss(
            ratio_unequal=s.meanflow_ratio_unequal, adaptive_p=s.meanflow_adaptive_p, adaptive_c=s.meanflow_adaptive_c
        )

    def mixed_domain_collate(self) -> MixedDomainCollate:
        """The collate that forms Stage-1's mini-batches: exactly round(mask_ratio * B) masks in each, shown as
        3-channel images normalised like the images (label maps merged into one foreground)."""
        return MixedDomainCollate(**self._mixed_domain_args())

    def _mixed_domain_args(self) -> dict[str, Any]:
        s = self.settings
        return dict(
            mask_ratio=s.mask_ratio,
            views=s.stage1_views,
            keys="image",
            mask_key="label",
            domain_key="domain",
            mean=list(self.model.image_mean),
            std=list(self.model.image_std),
            binarize=True,  # label maps (Synapse organs, 2D label_classes) -> one foreground mask
        )

    def _data_loader(self) -> Any:
        """The Stage-1 loader of ``data.data_path`` (:func:`~spectraflow_monai.apps.workflow.training_loader`): MONAI's
        loader with the mixed-domain collate, or the device cache with the batched augmentation and the device
        mixed-domain rendering."""
        s = self.settings
        device_path = self.data.data_path == "device"
        r = self.run_settings
        self.dataset = bundle_dataset(
            list(self.datalist), self.preprocessing, self.data.data_path, r.cache_rate, r.num_workers, r.progress_bar
        )
        self.mixed_domain = self.mixed_domain_collate()
        if device_path:
            sampler = None
        elif dist.is_available() and dist.is_initialized():  # torchrun: each process reads its own shard
            sampler = DistributedSampler(self.dataset, even_divisible=True, shuffle=True)
        else:
            sampler = RandomSampler(self.dataset)
        return training_loader(
            self.dataset, s.stage1_batch_size, self.data.data_path, sampler=sampler, num_workers=r.num_workers,
            cache_device=r.cache_device, device=self.device, seed=self.data.data_seed,
            extra_transforms=[RandMixedDomainBatchd(**self._mixed_domain_args())] if device_path else (),
            collate_fn=None if device_path else self.mixed_domain,
        )  # fmt: skip

    def _trainer(self, loader: Any, encoder: nn.Module, ema: nn.Module, head: nn.Module, optimizer: Any,
                 handlers: list) -> Any:
        s = self.settings
        self.dispersive_loss = dispersive = self.custom_dispersive_loss or DispersiveLoss(
            variant=s.dispersive_variant, tau=s.dispersive_tau, normalize=s.dispersive_normalize
        )
        common = dict(
            device=self.device, max_epochs=self.epochs, train_data_loader=loader, encoder=encoder,
            optimizer=optimizer, ema=EMAConfig(decay=s.ema_decay, encoder=ema),
            gradients=GradientConfig(accumulation_steps=s.stage1_accumulation_steps), train_handlers=handlers,
            precision=self.precision, output_on_device=self.log_every > 1,
        )
        if s.stage1_objective == "mae":
            return MAEPretrainer(
                decoder=head,
                mae=MAEConfig(
                    loss=MAELoss(patch_size=encoder.patch_size, norm_pix_loss=s.mae_norm_pix_loss),
                    mask_ratio=s.mae_mask_ratio,
                ),
                dispersive=DispersiveConfig(weight=s.mae_dispersive_weight, loss=dispersive),
                **common,
            )
        return MeanFlowPretrainer(
            head=head,
            meanflow=MeanFlowConfig(
                loss=self.meanflow_loss(), latent_norm=s.latent_norm, condition_on_domain=s.head_condition_on_domain
            ),
            dispersive=DispersiveConfig(weight=s.dispersive_weight, loss=dispersive),
            **common,
        )

    def _head(self, encoder: DINOv2Encoder) -> nn.Module:
        """The MeanFlow head h(z_t, t, s) of eq. 2, or the MAE decoder."""
        s = self.settings
        if s.stage1_objective == "mae":
            return MAEDecoder(
                in_channels=encoder.embed_dim,
                patch_size=encoder.patch_size,
                out_channels=3,
                hidden_size=s.mae_decoder_hidden_size,
                num_layers=s.mae_decoder_num_layers,
                num_heads=s.mae_decoder_num_heads,
            )
        return MeanFlowHead(
            in_channels=encoder.embed_dim,
            hidden_channels=s.head_hidden_channels,
            num_blocks=s.head_num_blocks,
            num_domains=2 if s.head_condition_on_domain else 0,
        )

    def setup(self) -> None:
        """The run folder and determinism, the run record (a restart of a different run stops here) and nothing
        else: no weight is loaded and no data is read before it."""
        prepare_run(self.data.data_seed, folders=[self.run_dir], image_size=self.model.image_size)
        #: the restart decision (continue / new run; a different run stops here) that training follows
        self.restart = record_run(
            self.run_dir,
            settings=self.settings,
            data_settings=self.data,
            model=self.model.encoder(),
            data={"train": list(self.datalist)},
            data_source=self.data_source,
            label_setup=self.label_setup,
            seed=self.data.data_seed,
            precision=self.precision,
            resume=self.run_settings.resume,
            resume_from=self.run_settings.resume_from,
            not_compared=self.run_settings.to_dict(),
        )

    def build(self, load_weights: bool = True) -> Any:
        """Build the stage: encoder (its starting weights loaded from ``pretrained_weights`` when
        ``load_weights``), EMA encoder, head, data, optimizer and schedule, handlers, trainer and the contents of a
        resumable checkpoint; each is kept as an attribute of the same name (``encoder``, ``ema_encoder``,
        ``head``, ``dataset``, ``mixed_domain``, ``data_loader``, ``optimizer``, ``lr_scheduler``,
        ``dispersive_loss``, ``trainer``, ``checkpoint``). Returns the trainer."""
        s = self.settings
        self.encoder, self.ema_encoder = self._encoder("all"), self._encoder(0)
        if load_weights:
            initialize_encoder(self.encoder, encoder_init="pretrained", pretrained_weights=s.pretrained_weights)
        self.head = self._head(self.encoder)
        self.data_loader = self._data_loader()
        self.optimizer = torch.optim.AdamW(
            trainable_parameters([self.encoder, self.head]), lr=s.stage1_start_lr, weight_decay=s.stage1_weight_decay
        )
        self.lr_scheduler = linear_lr_schedule(
            self.optimizer, total_steps=total_iterations(self.epochs, self.data_loader), start_lr=s.stage1_start_lr,
            end_lr=s.stage1_end_lr,
        )
        title = "Stage-1"
        handlers = [
            StopOnNonFiniteLoss(every=self.log_every),
            LrScheduleHandler(lr_scheduler=self.lr_scheduler, epoch_level=False, print_lr=False),
            RunStatsHandler(name="stage1", iteration_log=False, output_transform=Identity()),
            TensorBoardStatsHandler(
                log_dir=os.path.join(self.log_dir, "stage1"), output_transform=Identity(),
                iteration_log=self.log_every,
            ),  # fmt: skip
            EncoderExportHandler(
                encoder=self.ema_encoder, path=self.export_path, epoch_level=True,
                settings=self.model.encoder(),
            ),
            EpochSummaryHandler(title=title),
            ProgressBarHandler(
                enabled=self.run_settings.progress_bar, desc=title, keys=["meanflow_error", "loss_mae"],
                every=self.log_every,
            ),
        ]
        self.trainer = self._trainer(
            self.data_loader, self.encoder, self.ema_encoder, self.head, self.optimizer, handlers
        )
        self.checkpoint = pretrainer_checkpoint(
            self.trainer, self.lr_scheduler, RandomStateHandler(transforms=[self.preprocessing])
        )
        _checkpoint_loader_state(self.trainer, self.checkpoint)
        return self.trainer

    def run(self) -> None:
        """Set up and record the run, build it and train, continuing from a checkpoint when one is chosen (see the
        class notes)."""
        self.setup()
        self.build()
        saver = SafeCheckpointSaver(
            save_dir=self.run_dir,
            save_dict=self.checkpoint,
            save_final=True,
            final_filename="checkpoint_final.pt",
            save_interval=self.run_settings.stage1_checkpoint_interval,
            n_saved=self.run_settings.stage1_checkpoints_kept,
            prune_on_completion=self.prune_on_completion,
        )
        record_components(self.restart, optimizer=self.optimizer)
        resume_path = resume_checkpoint(self.restart, protect=[self.export_path])
        start_training(
            self.trainer, saver, checkpoint=self.checkpoint, resume_path=resume_path, map_location=self.device
        )
