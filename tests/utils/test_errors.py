import os
import subprocess
import sys

import pytest
import torch

from spectraflow_monai.utils.errors import (
    DataError,
    SettingError,
    brief,
    error_summary,
    find_input_error,
    worker_input_error,
)


def _wrapped(inner: BaseException) -> RuntimeError:
    """An error as MONAI's bundle runner leaves it: wrapped twice, the cause chained."""
    try:
        try:
            raise inner
        except Exception as e:
            raise RuntimeError("Failed to evaluate ConfigExpression: '$build()'") from e
    except RuntimeError as outer:
        try:
            raise RuntimeError("Failed to instantiate component") from outer
        except RuntimeError as top:
            return top


def test_error_summary_is_one_line_naming_the_problem():
    inner = DataError("split x: 2 bad file(s):\n  unreadable image '/d/a.bmp': truncated\n  '/d/b.png': NaN")
    exc = _wrapped(inner)
    assert find_input_error(exc) is inner
    line = error_summary(exc)
    assert line == "error: split x: 2 bad file(s): unreadable image '/d/a.bmp': truncated; '/d/b.png': NaN"
    assert error_summary(_wrapped(SettingError("image_size must be ..., got 'abc'."))).endswith("got 'abc'.")
    assert error_summary(_wrapped(KeyError("other"))) is None
    assert issubclass(DataError, ValueError) and issubclass(SettingError, ValueError)


@pytest.mark.parametrize(
    "raised, last",
    [("DataError(\"'/d/m.png': not a binary mask\")", "error: '/d/m.png': not"), ("KeyError('k')", "RuntimeError")],
)
def test_excepthook_adds_the_last_line(raised, last):
    code = (
        "import spectraflow_monai.utils.excepthook\n"
        "import spectraflow_monai.utils.excepthook\n"  # idempotent: one report line
        "from spectraflow_monai.utils.errors import DataError\n"
        "try:\n"
        f"    raise {raised}\n"
        "except Exception as e:\n"
        "    raise RuntimeError('Failed to evaluate') from e\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 1
    assert lines[-1].startswith(last), proc.stderr
    assert sum(line.startswith("error:") for line in lines) == (1 if "DataError" in raised else 0)
    if "DataError" not in raised:  # not a user's mistake: the usual report
        assert "Traceback" in proc.stderr and "RuntimeError: Failed to evaluate" in proc.stderr
        return
    assert len(lines) == 1 and "Traceback" not in proc.stderr  # one line, no traceback on screen
    log = lines[0].rsplit("(traceback: ", 1)[1].rstrip(")")
    with open(log) as f:
        assert "RuntimeError: Failed to evaluate" in f.read()  # the full traceback is in the log file
    os.remove(log)
    env = dict(os.environ, SPECTRAFLOW_TRACEBACK="1")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert "Traceback" in proc.stderr and proc.stderr.strip().splitlines()[-1].startswith("error:")


def test_traceback_goes_to_the_runs_log_folder(tmp_path):
    code = (
        "import spectraflow_monai.utils.excepthook\n"
        "from spectraflow_monai.utils.errors import SettingError, set_error_log_dir\n"
        f"set_error_log_dir({str(tmp_path / 'logs')!r})\n"
        "raise SettingError('image_size must be a multiple of 14')\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    line = proc.stderr.strip().splitlines()[-1]
    assert line.startswith("error: image_size must be a multiple of 14 (traceback: "), proc.stderr
    log = line.rsplit("(traceback: ", 1)[1].rstrip(")")
    assert os.path.dirname(log) == str(tmp_path / "logs") and os.path.basename(log).startswith("error-")
    with open(log) as f:
        assert "SettingError: image_size must be a multiple of 14" in f.read()


class _BadItems(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 2

    def __getitem__(self, i: int):
        try:
            raise DataError(f"'/d/case{i}.nii.gz' holds 3 non-finite voxel(s)\n  listed detail")
        except DataError as e:
            raise RuntimeError("applying transform <CheckFinited>") from e  # as MONAI's Compose wraps it


def test_an_error_raised_in_a_dataloader_worker_is_found_in_its_text():
    with pytest.raises(RuntimeError) as info:
        next(iter(torch.utils.data.DataLoader(_BadItems(), num_workers=1)))
    assert "DataLoader worker process" in str(info.value) and "Original Traceback" in str(info.value)
    found = find_input_error(info.value)
    assert type(found) is DataError and str(found) == "'/d/case0.nii.gz' holds 3 non-finite voxel(s)\n  listed detail"
    assert error_summary(info.value) == "error: '/d/case0.nii.gz' holds 3 non-finite voxel(s); listed detail"
    assert worker_input_error("Caught RuntimeError in DataLoader worker process 0.\nbuiltins.KeyError: 'x'") is None
    assert worker_input_error("os.system: not an error class in a worker's text") is None


@pytest.mark.parametrize(
    "value, expected",
    [
        ([1, 2, 3], "[1, 2, 3]"),
        (list(range(100_000)), "[0, 1, 2, 3, 4, 5, 6, 7, ... and 99992 more]"),
        ({f"k{i}": i for i in range(10)}, "{" + ", ".join(f"'k{i}': {i}" for i in range(8)) + ", ... and 2 more}"),
        ((1, 2), "(1, 2)"),
        ("x" * 1000, "'" + "x" * 196 + "..."),
        (None, "None"),
    ],
)
def test_brief_bounds_what_a_message_shows(value, expected):
    assert brief(value) == expected


def test_a_100000_class_label_setting_gives_a_short_error_line():
    from spectraflow_monai.data.label_mode import label_mode

    with pytest.raises(SettingError, match=r"got 100000: \['c0', .* and 99992 more\]") as err:
        label_mode([f"c{i}" for i in range(100_000)])
    assert len(str(err.value)) < 400
