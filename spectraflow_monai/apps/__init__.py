"""Task pipelines built on the package (MONAI ``apps`` style): ``seg2d`` (2D presets) and ``synapse`` (3D CT)."""
