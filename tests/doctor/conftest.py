import pytest

from .fakeenv import FakeEnv


@pytest.fixture
def fake(tmp_path):
    return FakeEnv(tmp_path)
