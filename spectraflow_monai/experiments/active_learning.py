"""Simulated labelling (active learning): which images should an annotator label next?

Not an experiment of the SpectraFlow paper (Chen et al.): it measures the uncertainty strategy of the project's MONAI
Label app (``bundles/monailabel_app``, docs/monailabel.md "Next sample by uncertainty") against random selection, in
the shape of MONAI's tutorial study ``active_learning/tool_tracking_al`` (an initial labelled pool, rounds of
queries, Dice against the number of labelled images).

Every arm starts from the same ``initial`` labelled images of the training split (drawn with the arm's seed), then for
``rounds`` rounds: train the 2D bundle's Stage-2 on the labelled images, evaluate it on the test split, and reveal the
ground truth of ``query`` more images of the unlabelled pool, chosen

- ``random``: uniformly at random (the seed's generator);
- ``uncertainty``: the ``query`` images of highest :class:`~spectraflow_monai.metrics.FlipEntropy` score under the
  round's model (the predictive entropy under test-time flips, the score the MONAI Label app writes), computed on
  the images as the bundle's validation loads them.

Each round is a run of the bundle (``<output>/active_learning/<strategy>_seed<s>_round<r>/``) on a Decathlon datalist
it writes there (``datalist-<content hash>.json``; ``training``: the labelled images; ``validation`` and ``test``:
the data set's own splits), trained from ``pretrained_weights`` (``encoder_init: pretrained``: no Stage-1 per round,
the same for both strategies) with the scale's settings. The images a round chose are kept in ``selection.json``
beside it, so a second call retrains nothing that finished and chooses the same images. A run's validation split
picks its checkpoint, as the bundle does; for Kvasir-SEG it is the test split (the preset's 880/120 split has no
third part).
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import textwrap
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from spectraflow_monai.experiments.runner import (
    SCALES,
    ExperimentRunner,
    experiment_settings,
    experiment_title,
    settings_text,
    write_csv,
)
from spectraflow_monai.utils.bundles import bundle_parser
from spectraflow_monai.utils.errors import SettingError
from spectraflow_monai.utils.files import write_text_atomic
from spectraflow_monai.visualize.utils import save_figure

__all__ = [
    "ACTIVE_LEARNING_SCALES",
    "ACTIVE_LEARNING_STRATEGIES",
    "ACTIVE_LEARNING_TITLE",
    "active_learning_markdown",
    "run_active_learning",
    "select_images",
]

ACTIVE_LEARNING_TITLE = "Simulated labelling: uncertainty against random selection"
#: the selection strategies an arm may use (the MONAI Label app's ``uncertainty`` strategy and ``random``)
ACTIVE_LEARNING_STRATEGIES: tuple[str, ...] = ("random", "uncertainty")
#: the bundle overrides and the labelling budget of each scale. ``small`` (the default) keeps a run to minutes on two
#: CPU cores: 112 px, Stage-2 up to 8 epochs, a pool of 160 training images, 40 validation images, 8 + 3 x 8 labels.
#: ``full`` keeps the bundle's settings and the whole training split: 20 + 5 x 20 labels.
ACTIVE_LEARNING_SCALES: dict[str, dict[str, Any]] = {
    "small": {
        "overrides": {"image_size": SCALES["small"]["image_size"], "max_epochs": SCALES["small"]["max_epochs"]},
        "initial": 8,
        "query": 8,
        "rounds": 3,
        "pool_size": 160,
        "val_size": 40,
    },
    "full": {"overrides": {}, "initial": 20, "query": 20, "rounds": 5, "pool_size": None, "val_size": None},
}
_BUDGET = ("initial", "query", "rounds", "pool_size", "val_size")


def select_images(
    strategy: str, pool: Sequence[str], k: int, seed: int, scores: Mapping[str, float] | None = None
) -> list[str]:
    """The ``k`` names of ``pool`` that ``strategy`` labels next.

    Args:
        strategy: ``"random"`` (a seeded uniform draw) or ``"uncertainty"`` (the highest ``scores``, ties in pool
            order).
        pool: the names of the unlabelled images.
        k: how many to choose (all of the pool when it holds fewer).
        seed: the random draw's seed.
        scores: name -> uncertainty, for ``"uncertainty"``.

    Raises:
        ValueError: an unknown strategy, ``k`` < 1, or ``"uncertainty"`` without a score for every image of ``pool``.
    """
    if strategy not in ACTIVE_LEARNING_STRATEGIES:
        raise ValueError(f"strategy must be one of {list(ACTIVE_LEARNING_STRATEGIES)}, got {strategy!r}.")
    if isinstance(k, bool) or int(k) < 1:
        raise ValueError(f"k must be an integer >= 1, got {k!r}.")
    k = min(int(k), len(pool))
    if strategy == "random":
        return random.Random(seed).sample(list(pool), k)
    missing = [name for name in pool if name not in (scores or {})]
    if missing:
        raise ValueError(f"uncertainty selection needs a score for every pool image; {len(missing)} have none.")
    order = sorted(range(len(pool)), key=lambda i: (-float(scores[pool[i]]), i))  # type: ignore[index]
    return [pool[i] for i in order[:k]]


def _name(entry: Mapping[str, Any]) -> str:
    return str(entry.get("name") or os.path.splitext(os.path.basename(str(entry["image"])))[0])


def _plain_entry(entry: Mapping[str, Any]) -> dict[str, Any]:
    """A datalist entry as a JSON datalist holds it: absolute image and label paths, the other keys as they are."""
    out = dict(entry)
    for key in ("image", "label"):
        if key in out:
            out[key] = os.path.abspath(os.fspath(out[key]))
    return json.loads(json.dumps(out, default=str))


def _subset(entries: list[dict], size: int | None, seed: int) -> list[dict]:
    if size is None or size >= len(entries):
        return entries
    keep = sorted(random.Random(seed).sample(range(len(entries)), int(size)))
    return [entries[i] for i in keep]


def _score_pool(runner: ExperimentRunner, run: str, settings: Mapping[str, Any], pool: Sequence[dict]) -> dict:
    """name -> :class:`~spectraflow_monai.metrics.FlipEntropy` score of each ``pool`` image under ``run``'s model,
    the images loaded as the bundle's validation loads them."""
    import torch
    from ignite.handlers import Checkpoint

    from spectraflow_monai.metrics.uncertainty import FlipEntropy

    run_dir = runner.run_dir(run)
    parser = bundle_parser(runner.bundle, ["train.yaml"], {**runner.common, **settings, "bundle_root": str(run_dir)})
    network = parser.get_parsed_content("network_def", lazy=False).eval()
    state = torch.load(run_dir / "models" / "model.pt", map_location="cpu", weights_only=True)
    Checkpoint.load_objects({"model": network}, state)
    preprocessing = parser.get_parsed_content("validate#preprocessing", lazy=False)
    sigmoid = parser.get_parsed_content("label_setup", lazy=False).out_channels == 1
    score = FlipEntropy(network, sigmoid=sigmoid, batch_size=8)
    names, scores, batch = [], [], []
    for i, entry in enumerate(pool):
        batch.append(torch.as_tensor(preprocessing(dict(entry))["image"]).float())
        names.append(_name(entry))
        if len(batch) == 8 or i == len(pool) - 1:
            scores += score(torch.stack(batch)).tolist()
            batch = []
    return dict(zip(names, scores))


def run_active_learning(
    output: str | os.PathLike,
    data: Mapping[str, Any],
    scale: str = "small",
    strategies: Sequence[str] = ACTIVE_LEARNING_STRATEGIES,
    seeds: Sequence[int] = (0, 1),
    budget: Mapping[str, Any] | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """Run every strategy and seed for all rounds; write ``active_learning.csv``, ``.png`` and ``.md``.

    Args:
        output: the experiment folder.
        data: the data settings of the bundle (``dataset``, ``dataset_dir``, ``data_list_file_path``, ...).
        scale: ``"small"`` or ``"full"`` (:data:`ACTIVE_LEARNING_SCALES`). Defaults to ``"small"``.
        strategies: the arms (:data:`ACTIVE_LEARNING_STRATEGIES`). Defaults to both.
        seeds: one arm per strategy and seed (the initial images, the random draws and the training seed). Defaults
            to ``(0, 1)``.
        budget: replaces the scale's ``initial``, ``query``, ``rounds``, ``pool_size`` (None: the whole training
            split) and ``val_size`` (None: the whole validation split).
        overrides: more bundle overrides of every run (they win over the scale's).

    Returns:
        One row per strategy, seed and round: ``strategy``, ``seed``, ``round``, ``labelled`` and the metrics.

    Raises:
        ValueError: an unknown scale, strategy or seed; :class:`~spectraflow_monai.utils.errors.SettingError` (a
            ``ValueError``) for a budget the pool cannot meet or a budget value out of range, before any training.
    """
    if scale not in ACTIVE_LEARNING_SCALES:
        raise ValueError(f"scale must be one of {list(ACTIVE_LEARNING_SCALES)}, got {scale!r}.")
    unknown = [s for s in strategies if s not in ACTIVE_LEARNING_STRATEGIES]
    if not strategies or unknown:
        raise ValueError(f"strategies must be among {list(ACTIVE_LEARNING_STRATEGIES)}, got {list(strategies)!r}.")
    if not seeds or any(isinstance(s, bool) or not isinstance(s, int) for s in seeds):
        raise ValueError(f"seeds must be integers (at least one), got {list(seeds)!r}.")
    preset = ACTIVE_LEARNING_SCALES[scale]
    wrong = sorted(set(budget or {}) - set(_BUDGET))
    if wrong:
        raise SettingError(f"budget may set {list(_BUDGET)}, got {wrong}.")
    plan = {key: preset[key] for key in _BUDGET} | dict(budget or {})
    for key in ("initial", "query", "rounds", "pool_size", "val_size"):
        value = plan[key]
        low = 0 if key == "rounds" else 1
        if (value is None and key in ("pool_size", "val_size")) or (
            isinstance(value, int) and not isinstance(value, bool) and value >= low
        ):
            continue
        raise SettingError(f"{key} must be an integer >= {low}{' or None' if key.endswith('_size') else ''}, "
                         f"got {value!r}.")  # fmt: skip

    common = experiment_settings(data, {**preset["overrides"], "encoder_init": "pretrained"}, overrides)
    runner = ExperimentRunner(output, "active_learning", common)
    source = bundle_parser(runner.bundle, ["train.yaml"], {**common, "bundle_root": str(runner.root)})
    source = source.get_parsed_content("data_source", lazy=False)
    pool_all = _subset([_plain_entry(e) for e in source.datalist("train")], plan["pool_size"], seed=0)
    validation = _subset([_plain_entry(e) for e in source.datalist("val")], plan["val_size"], seed=0)
    test = [_plain_entry(e) for e in source.datalist("test")]
    by_name = {_name(e): e for e in pool_all}
    if len(by_name) != len(pool_all):
        raise ValueError("the training split repeats image names: active learning needs one name per image.")
    needed = plan["initial"] + plan["query"] * plan["rounds"]
    if needed > len(by_name):
        raise SettingError(
            f"initial {plan['initial']} + rounds {plan['rounds']} x query {plan['query']} = {needed} labels, but the "
            f"pool holds {len(by_name)} images: lower the budget or raise pool_size."
        )

    rows: list[dict[str, Any]] = []
    for seed in seeds:
        initial = select_images("random", list(by_name), plan["initial"], seed=1000 + seed)
        for strategy in strategies:
            labelled = list(initial)
            for rnd in range(plan["rounds"] + 1):
                run = f"{strategy}_seed{seed}_round{rnd}"
                run_dir = runner.run_dir(run)
                content = {"training": [by_name[n] for n in labelled], "validation": validation, "test": test}
                text = json.dumps(content, indent=1) + "\n"
                # named by its content: other labelled images are another run (the runner starts it over)
                datalist = run_dir / f"datalist-{hashlib.sha256(text.encode()).hexdigest()[:12]}.json"
                run_dir.mkdir(parents=True, exist_ok=True)
                write_text_atomic(datalist, text)
                settings = {"data_list_file_path": str(datalist), "data_seed": seed}
                runner.step(run, "stage2", ["train.yaml"], settings)
                metrics = runner.evaluate(run, ["train.yaml"], "clean", settings)
                rows.append({"strategy": strategy, "seed": seed, "round": rnd, "labelled": len(labelled), **metrics})
                if rnd == plan["rounds"]:
                    break
                labelled += _next_images(runner, run, settings, strategy, by_name, labelled, plan["query"], seed, rnd)
    out = Path(output)
    write_csv(out / "active_learning.csv", rows)
    title = experiment_title(ACTIVE_LEARNING_TITLE, common)
    _plot(out / "active_learning.png", rows, title)
    write_text_atomic(out / "active_learning.md", active_learning_markdown(rows, scale, common, plan))
    return rows


def _next_images(
    runner: ExperimentRunner,
    run: str,
    settings: Mapping[str, Any],
    strategy: str,
    by_name: Mapping[str, dict],
    labelled: Sequence[str],
    k: int,
    seed: int,
    rnd: int,
) -> list[str]:
    """The images ``run``'s round labels next (read back from its ``selection.json`` when it chose before)."""
    path = runner.run_dir(run) / "selection.json"
    pool = [n for n in by_name if n not in set(labelled)]
    if path.is_file():
        chosen = json.loads(path.read_text()).get("chosen", [])
        if len(chosen) == min(k, len(pool)) and all(n in pool for n in chosen):
            return list(chosen)
    scores = _score_pool(runner, run, settings, [by_name[n] for n in pool]) if strategy == "uncertainty" else None
    chosen = select_images(strategy, pool, k, seed=10_000 * seed + rnd, scores=scores)
    record = {"strategy": strategy, "chosen": chosen}
    if scores is not None:
        record["scores"] = {n: scores[n] for n in chosen}
        record["pool_mean_score"] = sum(scores.values()) / max(len(scores), 1)
    write_text_atomic(path, json.dumps(record, indent=1) + "\n")
    return chosen


def _mean_by(rows: Sequence[Mapping[str, Any]], metric: str) -> dict[tuple[str, int], list[float]]:
    groups: dict[tuple[str, int], list[float]] = {}
    for r in rows:
        groups.setdefault((r["strategy"], r["labelled"]), []).append(float(r[metric]))
    return groups


def _plot(path: Path, rows: Sequence[Mapping[str, Any]], title: str) -> None:
    """mDSC against the labelled images, one line per strategy (the mean over seeds; the band: their range)."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(4.2, 3.2))
    ax = fig.subplots()
    groups = _mean_by(rows, "mDSC")
    for strategy in dict.fromkeys(r["strategy"] for r in rows):
        keys = sorted(n for s, n in groups if s == strategy)
        values = [groups[(strategy, n)] for n in keys]
        mean = [100 * sum(v) / len(v) for v in values]
        ax.plot(keys, mean, marker="o", label=strategy)
        ax.fill_between(keys, [100 * min(v) for v in values], [100 * max(v) for v in values], alpha=0.2)
    ax.set_xlabel("labelled images")
    ax.set_ylabel("mDSC (%)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.suptitle(textwrap.fill(title, 64), fontsize=8)  # the random-initialisation note makes it long
    fig.tight_layout()
    save_figure(fig, path)


def active_learning_markdown(
    rows: Sequence[Mapping[str, Any]], scale: str, settings: Mapping[str, Any], plan: Mapping[str, Any]
) -> str:
    """The report section: mDSC and mIoU (mean and range over the seeds) per strategy and number of labelled
    images."""
    seeds = sorted({r["seed"] for r in rows})
    lines = [
        f"## {experiment_title(ACTIVE_LEARNING_TITLE, settings)}",
        "",
        settings_text(scale, settings),
        f"Budget: {plan['initial']} initial labels, {plan['rounds']} rounds of {plan['query']}; pool "
        f"{plan['pool_size'] or 'the whole training split'}; validation {plan['val_size'] or 'the whole split'}; "
        f"seeds {', '.join(map(str, seeds))} (mean, [min, max]).",
        "",
        "| labelled images | strategy | mDSC (%) | mIoU (%) |",
        "| ---: | --- | ---: | ---: |",
    ]
    dice, iou = _mean_by(rows, "mDSC"), _mean_by(rows, "mIoU")
    for key in sorted(dice, key=lambda k: (k[1], k[0])):
        cells = []
        for groups in (dice, iou):
            v = [100 * x for x in groups[key]]
            cells.append(f"{sum(v) / len(v):.2f} [{min(v):.2f}, {max(v):.2f}]")
        lines.append(f"| {key[1]} | {key[0]} | " + " | ".join(cells) + " |")
    return "\n".join([*lines, "", "![active learning](active_learning.png)", ""])
