"""Shared fixtures of the bundle tests."""

import pytest
import torch


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    """Bundle runs use one torch thread: the suite runs two test processes on two cores (``-n 2``)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
