"""The training stages both bundles run, written once in Python (Chen et al., Sec. 4 and 5.2).

A bundle's ``configs/train.yaml`` keeps the values, its data, transforms, ``network_def`` and references; it names
these objects for everything its two bundles share:

- :class:`Stage2TrainHandlers` and :class:`Stage2ValidationHandlers`: the Stage-2 trainer's and evaluator's
  handlers beyond MONAI's ``ValidationHandler`` (loss terms and the boundary-weight ramp, logs, progress, the
  learning-rate plateau, early stopping, the best model with its settings beside it);
- :func:`stage2_optimizer` and :func:`stage2_loss`: Stage-2's AdamW and its Dice + (B)CE + boundary loss, built
  from the run's :class:`~spectraflow_monai.utils.settings.Stage2Settings` (a value a config sets on the component
  itself, e.g. ``train#optimizer#lr``, is refused naming the setting to give instead: the run record holds what
  trains);
- :func:`run_stage2`: the Stage-2 ``run`` step (resumable checkpoints, the resume decision, training);
- :class:`Stage1Program`: all of Stage-1 (Mixed-Domain MeanFlow + dispersive, or mixed-domain MAE), which
  ``configs/train_stage1.yaml`` runs over the same ``train.yaml``: its data, transforms and settings objects.

Each object is built from the run's settings objects (:mod:`spectraflow_monai.utils.settings`) and its resolved
precision, handed whole; the run record is those objects written whole.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn
from ignite.engine import Engine
from monai.data import DistributedSampler
from monai.handlers import (
    LrScheduleHandler,
    TensorBoardStatsHandler,
    from_engine,
    stopping_fn_from_metric,
)
from monai.transforms import Compose, Identity
from torch.utils.data import RandomSampler

from spectraflow_monai.apps.encoder_init import initialize_encoder
from spectraflow_monai.apps.workflow import (
    bundle_dataset,
    prepare_run,
    pretrainer_checkpoint,
    stage1_export_settings,
    start_training,
    total_iterations,
    trainable_parameters,
    training_loader,
)
from spectraflow_monai.engines import MAEPretrainer, MeanFlowPretrainer
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
from spectraflow_monai.utils.checkpoint import resume_checkpoint
from spectraflow_monai.utils.errors import SettingError
from spectraflow_monai.utils.precision import Precision
from spectraflow_monai.utils.run_record import record_run
from spectraflow_monai.utils.settings import DataSettings, ModelSettings, Stage1Settings, Stage2Settings

__all__ = [
    "Stage1Program",
    "Stage2TrainHandlers",
    "Stage2ValidationHandlers",
    "run_stage2",
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
            f"{component}#{k}={v!r} (give --{_SETTING_OF_ARGUMENT.get(k, 'the setting')} instead)"
            for k, v in given.items()
        )
        raise SettingError(
            f"{named}: Stage-2 builds {component} from stage2_settings, so that the run record holds what trains."
        )


def stage2_optimizer(network: nn.Module, settings: Stage2Settings, **given: Any) -> torch.optim.AdamW:
    """Stage-2's AdamW (Chen et al., Sec. 5.2) over the trainable parameters of ``network`` (frozen encoder blocks
    left out), with the ``learning_rate`` and ``weight_decay`` of ``settings``.

    Raises:
        SettingError: any other argument (a config key such as ``train#optimizer#lr``), naming the setting to give.
    """
    _refuse_component_values("train#optimizer", given)
    return torch.optim.AdamW(
        trainable_parameters(network), lr=settings.learning_rate, weight_decay=settings.weight_decay
    )


def stage2_loss(
    settings: Stage2Settings, distance_backend: str = "auto", label_setup: Any = None, **given: Any
) -> DiceBCEBoundaryLoss:
    """Stage-2's loss, Dice + (B)CE + beta * boundary (eq. 7), with the boundary weight ramp of ``settings``
    (``boundary_beta`` to ``boundary_beta_max`` over ``boundary_ramp_epochs``).

    Args:
        settings: the run's :class:`~spectraflow_monai.utils.settings.Stage2Settings`.
        distance_backend: the signed distance maps' backend. Defaults to ``"auto"``.
        label_setup: the 2D bundle's :class:`~spectraflow_monai.apps.seg2d.LabelSetup` (binary masks: sigmoid Dice +
            BCE; label classes: softmax Dice + CE); None: softmax Dice + CE over one-hot classes (the Synapse
            organs). Defaults to None.

    Raises:
        SettingError: any other argument (a config key such as ``train#loss#beta``), naming the setting to give.
    """
    _refuse_component_values("train#loss", given)
    weights = dict(
        beta=settings.boundary_beta, beta_max=settings.boundary_beta_max, ramp_epochs=settings.boundary_ramp_epochs,
        distance_backend=distance_backend,
    )  # fmt: skip
    if label_setup is not None:
        return label_setup.loss(**weights)
    return DiceBCEBoundaryLoss(sigmoid=False, softmax=True, to_onehot_y=True, **weights)


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
        log_dir: TensorBoard folder.
        progress_bar: attach the progress bar. Defaults to True.
        title: the stage's name in the console. Defaults to ``"Stage-2"``.
        log_every: iterations between the reads of the loss on the host (the non-finite check, the TensorBoard curve,
            the progress bar; epoch means are exact). 1 reads every iteration; on a GPU a larger value keeps the
            trainer from waiting for the device every step (a non-finite loss is then reported up to
            ``log_every - 1`` iterations late, before any checkpoint). Defaults to 1.
    """

    def __init__(
        self,
        loss: Any,
        validator: Any,
        log_dir: str | os.PathLike,
        progress_bar: bool = True,
        title: str = "Stage-2",
        log_every: int = 1,
    ) -> None:
        loss_value = from_engine(["loss"], first=True)
        self.handlers = [
            StopOnNonFiniteLoss(every=log_every),
            LossTermsHandler(loss=loss),
            RunStatsHandler(iteration_log=False, epoch_log=False, tag_name="train_loss", output_transform=loss_value),
            TensorBoardStatsHandler(
                log_dir=os.fspath(log_dir), tag_name="train_loss", output_transform=loss_value,
                iteration_log=log_every,
            ),  # fmt: skip
            EpochSummaryHandler(title=title, output_prefix="train_", validator=validator),
            ProgressBarHandler(enabled=progress_bar, desc=title, every=log_every),
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
        model_path: the best model's file (``models/model.pt``).
        early_stop_patience: epochs without a better validation Dice before training stops.
        log_dir: TensorBoard folder.
    """

    def __init__(
        self,
        network: nn.Module,
        optimizer: torch.optim.Optimizer,
        settings: Stage2Settings,
        model: ModelSettings,
        model_path: str | os.PathLike,
        early_stop_patience: int,
        log_dir: str | os.PathLike,
    ) -> None:
        score = stopping_fn_from_metric(KEY_METRIC)
        self.lr_scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(
            optimizer,
            mode="max",
            factor=settings.lr_factor,
            patience=settings.lr_patience,
            min_lr=settings.min_learning_rate,
        )
        self.early_stop = ResumableEarlyStopHandler(patience=early_stop_patience, score_function=score)
        model_path = os.fspath(model_path)
        self.model_saver = SafeCheckpointSaver(
            save_dir=os.path.dirname(model_path) or ".",
            save_dict={"model": network},
            save_key_metric=True,
            key_metric_filename=os.path.basename(model_path),
            model_settings=model,
        )
        self.handlers = [
            RunStatsHandler(iteration_log=False, epoch_log=False),
            TensorBoardStatsHandler(log_dir=os.fspath(log_dir), iteration_log=False),
            LrScheduleHandler(lr_scheduler=self.lr_scheduler, step_transform=score, print_lr=False),
            self.early_stop,
            self.model_saver,
        ]


def run_stage2(
    trainer: Engine,
    validation: Stage2ValidationHandlers,
    preprocessing: Compose,
    run_dir: str | os.PathLike,
    model_path: str | os.PathLike,
    resume: bool | str = True,
    checkpoints_kept: int = 2,
    device: str | torch.device | None = None,
) -> None:
    """The ``run`` of Stage-2: a resumable checkpoint in ``run_dir`` at the end of every epoch (after validation)
    holding everything a restart needs to continue exactly (network, optimizer, learning-rate plateau, early
    stopping, the best model's score, the gradient scaler, the augmentation's random state, the epoch), the resume
    decision (:func:`~spectraflow_monai.utils.checkpoint.resume_checkpoint`: the newest checkpoint with ``resume``
    true; else the earlier checkpoints and ``model_path`` kept aside as ``*.bak-<time>``), then training.

    Args:
        trainer: the Stage-2 ``SupervisedTrainer`` (its ``network`` and ``optimizer`` are checkpointed).
        validation: the evaluator's :class:`Stage2ValidationHandlers`.
        preprocessing: the training transforms (their random state is checkpointed).
        run_dir: the checkpoint folder (``models/stage2``).
        model_path: the best model's file, never overwritten by a new run.
        resume: continue from the newest checkpoint. Defaults to True.
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
    saver = SafeCheckpointSaver(
        save_dir=os.fspath(run_dir), save_dict=checkpoint, save_interval=1, n_saved=checkpoints_kept
    )
    start_training(
        trainer,
        saver,
        checkpoint=checkpoint,
        resume_path=resume_checkpoint(run_dir, resume=resume, protect=[model_path]),
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
        datalist: the training datalist (the same, possibly low-data, subset as Stage-2).
        preprocessing: the training transforms (load, augment, normalise), cached up to the first random one.
        epochs: the number of epochs (not compared on restart: a finished run with more epochs trains on).
        device: the training device.
        precision: the run's resolved precision.
        run_dir: the checkpoint folder (``models/stage1``).
        export_path: the EMA encoder export (``models/encoder_stage1.pt``).
        log_dir: the logs folder (TensorBoard under ``<log_dir>/stage1``).
        resume: continue from the newest checkpoint of ``run_dir``. Defaults to True.
        resume_from: an explicit checkpoint file to continue from. Defaults to None.
        checkpoint_interval: epochs between resumable checkpoints. Defaults to 1.
        checkpoints_kept: checkpoints kept while the run goes on. Defaults to 2.
        num_workers: data loading processes. Defaults to 2.
        cache_rate: share of the data cached. Defaults to 1.0.
        cache_device: with ``data.data_path`` ``device``: where the cache lives (``auto``, ``cpu``, ``cuda``).
            Defaults to ``"auto"``.
        progress_bar: show progress bars. Defaults to True.
        data_source, label_setup: recorded by ``repr`` (what the data are). Defaults to None.
        not_compared: further values recorded but free to change between restarts. Defaults to None.
        prune_on_completion: a completed run keeps ``checkpoint_final.pt`` only (all a restart needs). Defaults to
            True.
        dispersive_loss: a callable that replaces the dispersive loss the settings describe (a research hook; the
            run record still holds the settings). Defaults to None: ``DispersiveLoss`` of the settings.
        log_every: iterations between the reads of the loss terms on the host (as :class:`Stage2TrainHandlers`);
            above 1 the trainer keeps its outputs on the device (``output_on_device``). Defaults to 1.
    """

    def __init__(
        self,
        settings: Stage1Settings,
        model: ModelSettings,
        data: DataSettings,
        datalist: Sequence[dict],
        preprocessing: Compose,
        epochs: int,
        device: str | torch.device,
        precision: Precision,
        run_dir: str | os.PathLike,
        export_path: str | os.PathLike,
        log_dir: str | os.PathLike,
        resume: bool | str = True,
        resume_from: str | os.PathLike | None = None,
        checkpoint_interval: int = 1,
        checkpoints_kept: int = 2,
        num_workers: int = 2,
        cache_rate: float = 1.0,
        cache_device: str = "auto",
        progress_bar: bool = True,
        data_source: Any = None,
        label_setup: Any = None,
        not_compared: dict | None = None,
        prune_on_completion: bool = True,
        dispersive_loss: Any = None,
        log_every: int = 1,
    ) -> None:
        for name, value, kind in (
            ("settings", settings, Stage1Settings), ("model", model, ModelSettings), ("data", data, DataSettings),
            ("precision", precision, Precision),
        ):
            if not isinstance(value, kind):
                raise ValueError(f"{name} must be a {kind.__name__}, got {type(value).__name__}.")
        if isinstance(epochs, bool) or not isinstance(epochs, int) or epochs < 1:
            raise ValueError(f"stage1_epochs must be a positive int, got {epochs!r}.")
        self.settings, self.model, self.data = settings, model, data
        self.datalist, self.preprocessing, self.epochs = datalist, preprocessing, epochs
        self.device, self.precision = torch.device(device), precision
        self.run_dir, self.export_path, self.log_dir = os.fspath(run_dir), os.fspath(export_path), os.fspath(log_dir)
        self.resume, self.resume_from = resume, resume_from
        self.checkpoint_interval, self.checkpoints_kept = checkpoint_interval, checkpoints_kept
        self.num_workers, self.cache_rate, self.progress_bar = num_workers, cache_rate, progress_bar
        self.cache_device = cache_device
        self.data_source, self.label_setup = data_source, label_setup
        self.not_compared = dict(not_compared or {})
        self.prune_on_completion = prune_on_completion
        self.custom_dispersive_loss = dispersive_loss
        self.log_every = log_every

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
        self.dataset = bundle_dataset(
            list(self.datalist), self.preprocessing, self.data.data_path, self.cache_rate, self.num_workers,
            self.progress_bar,
        )  # fmt: skip
        self.mixed_domain = self.mixed_domain_collate()
        if device_path:
            sampler = None
        elif dist.is_available() and dist.is_initialized():  # torchrun: each process reads its own shard
            sampler = DistributedSampler(self.dataset, even_divisible=True, shuffle=True)
        else:
            sampler = RandomSampler(self.dataset)
        return training_loader(
            self.dataset, s.stage1_batch_size, self.data.data_path, sampler=sampler, num_workers=self.num_workers,
            cache_device=self.cache_device, device=self.device, seed=self.data.data_seed,
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
            device=self.device, max_epochs=self.epochs, train_data_loader=loader, encoder=encoder, ema_encoder=ema,
            optimizer=optimizer, dispersive_loss=dispersive, accumulation_steps=s.stage1_accumulation_steps,
            ema_decay=s.ema_decay, train_handlers=handlers, precision=self.precision,
            output_on_device=self.log_every > 1,
        )
        if s.stage1_objective == "mae":
            return MAEPretrainer(
                decoder=head,
                mae_loss=MAELoss(patch_size=encoder.patch_size, norm_pix_loss=s.mae_norm_pix_loss),
                mask_ratio=s.mae_mask_ratio,
                dispersive_weight=s.mae_dispersive_weight,
                **common,
            )
        return MeanFlowPretrainer(
            head=head,
            meanflow_loss=self.meanflow_loss(),
            condition_on_domain=s.head_condition_on_domain,
            dispersive_weight=s.dispersive_weight,
            latent_norm=s.latent_norm,
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
        record_run(
            self.run_dir,
            settings=self.settings,
            data_settings=self.data,
            model=stage1_export_settings(self.model),
            data={"train": list(self.datalist)},
            data_source=self.data_source,
            label_setup=self.label_setup,
            seed=self.data.data_seed,
            precision=self.precision,
            resume=self.resume,
            not_compared={"stage1_epochs": self.epochs, "num_workers": self.num_workers, "device": self.device,
                          **self.not_compared},
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
                settings=stage1_export_settings(self.model),
            ),
            EpochSummaryHandler(title=title),
            ProgressBarHandler(
                enabled=self.progress_bar, desc=title, keys=["meanflow_error", "loss_mae"], every=self.log_every
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
            save_interval=self.checkpoint_interval,
            n_saved=self.checkpoints_kept,
            prune_on_completion=self.prune_on_completion,
        )
        resume_path = resume_checkpoint(
            self.run_dir, resume=self.resume, resume_from=self.resume_from, protect=[self.export_path]
        )
        start_training(
            self.trainer, saver, checkpoint=self.checkpoint, resume_path=resume_path, map_location=self.device
        )
