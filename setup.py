"""Build script: the metadata is in setup.cfg; this file ships the repository's ``bundles/`` inside the package.

A regular install or a wheel gets a copy of ``bundles/`` (the MONAI bundles and the MONAI Label app) as
``spectraflow_monai/bundles``, so :func:`spectraflow_monai.bundle_path` and ``spectraflow demo`` work without a clone.
An editable install (``pip install -e .``) reads them from the clone instead.
"""

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

# run outputs that may sit inside a bundle folder (see .gitignore), and the MONAI Label app's copies of the bundles
# it serves (bundles/monailabel_app/model); never shipped
_IGNORE = shutil.ignore_patterns(
    "__pycache__", "*.pyc", "data", "logs", "cache", "eval", "predictions", "models", "model"
)


class BuildPyWithBundles(build_py):
    """``build_py`` that also copies ``bundles/`` into ``spectraflow_monai/bundles`` of the build."""

    def run(self):
        super().run()
        if getattr(self, "editable_mode", False):
            return
        source = Path(__file__).resolve().parent / "bundles"
        target = Path(self.build_lib) / "spectraflow_monai" / "bundles"
        if target.exists():
            shutil.rmtree(target)
        shutil.copytree(source, target, ignore=_IGNORE)


setup(cmdclass={"build_py": BuildPyWithBundles})
