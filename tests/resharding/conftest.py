import pytest

from tests.dist_utils import run_distributed
from tests.resharding.helpers import make_dirs


@pytest.fixture(scope="session")
def layout_results(tmp_path_factory):
    """Per-rank results of the one 4-process run (see tests/resharding/workers.py)."""
    from tests.resharding.workers import layouts_worker

    dirs = make_dirs(tmp_path_factory.mktemp("hf"))
    return run_distributed(layouts_worker, 4, dirs)
