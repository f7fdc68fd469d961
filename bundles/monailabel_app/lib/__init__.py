"""Tasks and request checks of the SpectraFlow MONAI Label app (MONAI Label's ``lib/`` app layout).

- :mod:`lib.infers`: ``SpectraFlowInferTask`` (``BundleInferTask`` writing integer label maps in lossless formats).
- :mod:`lib.trainers`: ``SpectraFlowTrainTask`` and the training options a request may set.
- :mod:`lib.checks`: what the app accepts from a client (datastore image ids, uploads of this request) and the
  server-side checks that answer a refused request with a 4xx before anything runs.
"""
