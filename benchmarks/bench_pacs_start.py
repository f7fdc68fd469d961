"""How long the MONAI Label app takes to come up on a PACS, and what it retrieves, as the PACS grows.

A real Orthanc (Debian's ``orthanc`` + ``orthanc-dicomweb``, on loopback) holds ``--series`` small CT phantom series
(one patient each, written with pydicom: the test suite's ``tests/label/pacs.py``); the app (the Synapse bundle with a
tiny network) is started on it with ``monailabel start_server --studies <orthanc>/dicom-web`` until ``GET /info/``
answers, then asked for the next sample three times. For each PACS size: the seconds to ``/info/``, and the WADO-RS
retrieves Orthanc served (its request log). MONAI Label's stock behaviour converted every unlabelled series before
"Application startup complete"; the app retrieves nothing until a request names a series, so the start does not grow
with the PACS.

Usage (from the repository root; needs the ``label`` extra and Orthanc)::

    python benchmarks/bench_pacs_start.py --series 2 200

Prints a markdown table and the ratio of the start times of the largest and the smallest PACS.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import requests

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.label.pacs import running_orthanc  # noqa: E402
from tests.label.test_monailabel_app import NAME_3D, NET, SIZE, _make_bundles, running_server  # noqa: E402

CONF = {
    "models": NAME_3D,
    "overrides": json.dumps(NET),
    f"overrides.{NAME_3D}": json.dumps(SIZE[NAME_3D]),
    "pretrained_weights": "none",
}


def _measure(root: Path, series: int) -> dict:
    with running_orthanc(root / "orthanc", patients=()) as pacs:
        for i in range(series):
            pacs.add_series(f"P{i:04d}", case=1 + i % 3, shape=(32, 32, 4))
        studies = root / "unused"
        studies.mkdir()
        bundles = _make_bundles(root, studies, names=(NAME_3D,))
        started = time.monotonic()
        with running_server(root, pacs.dicomweb, bundles, CONF, env={"TMPDIR": tempfile.mkdtemp(dir=root)}) as (
            base,
            _,
        ):
            up = time.monotonic() - started
            for _ in range(3):
                r = requests.post(f"{base}/activelearning/random", json={}, timeout=120)
                assert r.status_code == 200, r.text
            time.sleep(2.0)  # what an automatic scoring run would have retrieved by now
            return {"series": series, "start_s": up, "retrieves": len(pacs.retrieves())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--series", type=int, nargs="+", default=[2, 200], help="PACS sizes (series)")
    args = parser.parse_args()
    rows = []
    for count in args.series:
        with tempfile.TemporaryDirectory() as root:
            rows.append(_measure(Path(root), count))
    print("| series in the PACS | seconds to /info/ | WADO-RS retrieves (start + 3 next samples) |")
    print("| ---: | ---: | ---: |")
    for row in rows:
        print(f"| {row['series']} | {row['start_s']:.1f} | {row['retrieves']} |")
    print(f"start time: {rows[-1]['start_s'] / rows[0]['start_s']:.2f}x from {rows[0]['series']} to "
          f"{rows[-1]['series']} series")  # fmt: skip


if __name__ == "__main__":
    main()
