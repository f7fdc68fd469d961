"""Tasks and request checks of the SpectraFlow MONAI Label app (MONAI Label's ``lib/`` app layout), one concern a
module; main.py wires them into the app (docs/monailabel.md, "What the app adds to MONAI Label's monaibundle app").

- :mod:`lib.conf`: the app's ``--conf`` settings, each checked once at start.
- :mod:`lib.options`: the options an inference or training request may set.
- :mod:`lib.policy`: what a request is answered before it runs (unknown models, tasks, data that cannot train).
- :mod:`lib.checks`, :mod:`lib.uploads`: what the app accepts from a client (ids, uploads) and the MONAI Label
  endpoint helpers it replaces so that a refused request is a 4xx before anything runs.
- :mod:`lib.infers`: ``SpectraFlowInferTask`` (``BundleInferTask`` writing integer label maps in lossless formats).
- :mod:`lib.trainers`: ``SpectraFlowTrainTask`` (``BundleTrainTask`` running the bundle's ``train.yaml`` whole).
- :mod:`lib.runs`: the folder of each training run, its owner and heartbeat, and its best model becoming the served one.
- :mod:`lib.served`: the server's own copy of each bundle and its served model pair.
- :mod:`lib.weights`: the checks of a weight file and of a model pair before it is served.
- :mod:`lib.datastore`, :mod:`lib.dicomweb`, :mod:`lib.dicomseg`, :mod:`lib.labels`: the checked local and PACS
  datastores, DICOM SEG and label files.
- :mod:`lib.sessions`, :mod:`lib.scoring`, :mod:`lib.scoring_runs`: capped sessions, uncertainty scoring and its runs.
"""
