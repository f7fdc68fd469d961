from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from spectraflow_monai.cli import COMMANDS, main


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_command_has_help(name, capsys):
    argv = [name, "robustness", "--help"] if name == "experiment" else [name, "--help"]
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert f"spectraflow {name}" in out and "--output" in out


@pytest.mark.parametrize("name", ["demo", "report", "synthetic-2d", "synthetic-ct", "experiment", "export-onnx"])
def test_help_loads_neither_torch_nor_monai(name):
    """``spectraflow <command> --help`` answers without importing torch or MONAI (lazy package exports), so it takes
    a fraction of a second instead of the 10+ s their import takes on a loaded machine."""
    argv = [name, "robustness", "--help"] if name == "experiment" else [name, "--help"]
    code = (
        "import sys\n"
        "from spectraflow_monai.cli import main\n"
        "try:\n"
        f"    main({argv!r})\n"
        "except SystemExit:\n"
        "    pass\n"
        "print('HEAVY', sorted(m for m in ('torch', 'monai') if m in sys.modules))\n"
    )
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([repo, os.environ.get("PYTHONPATH", "")]))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "HEAVY []" in out.stdout and f"spectraflow {name}" in out.stdout


@pytest.mark.parametrize("argv", [[], ["--help"], ["-h"]])
def test_usage_lists_the_commands(argv, capsys):
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in COMMANDS)


def test_unknown_command_exits_2(capsys):
    assert main(["no-such-command"]) == 2
    assert "unknown command 'no-such-command'" in capsys.readouterr().err


@pytest.mark.parametrize(
    "output_flag,size_flag", [("--output", "--image-size"), ("--root", "--size")]  # the former names still work
)
def test_synthetic_2d_writes_a_set(tmp_path, output_flag, size_flag):
    out = tmp_path / "set"
    assert main(["synthetic-2d", output_flag, str(out), "--num-train", "2", "--num-val", "1", size_flag, "28"]) == 0
    assert len(os.listdir(out / "images")) == 3 and len(os.listdir(out / "masks")) == 3


def test_synthetic_ct_writes_a_phantom(tmp_path):
    out = tmp_path / "ct"
    assert main(["synthetic-ct", "--output", str(out), "--cases", "7", "--shape", "16", "16", "4"]) == 0
    assert (out / "RawData" / "Training" / "img" / "img0007.nii.gz").is_file()
    assert json.loads((out / "synthetic_ct.json").read_text())["shape"] == [16, 16, 4]


def test_python_m_runs_the_same_command_line(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "spectraflow_monai", "synthetic-2d", "--help"], capture_output=True, text=True
    )
    assert result.returncode == 0 and "spectraflow synthetic-2d" in result.stdout
