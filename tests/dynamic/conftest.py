"""Fixtures for the dynamic-sampling and multi-turn tests."""

import pytest

from grpo_hub.tasks import build_tiny_model


@pytest.fixture(scope="session")
def tiny_model_dir():
    return build_tiny_model()
