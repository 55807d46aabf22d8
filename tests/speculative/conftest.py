"""Fixtures the speculative tests share: a tiny four-layer Llama target (deep enough for an EAGLE-3 head's default
layers), loaded once per session."""
import pytest

from tests.engine.real_models import SharedModel, save_tiny_llama


@pytest.fixture(scope="session")
def target_path(tmp_path_factory):
    return save_tiny_llama(str(tmp_path_factory.mktemp("tiny-target")), num_layers=4)


@pytest.fixture(scope="session")
def target(target_path):
    return SharedModel(target_path)
