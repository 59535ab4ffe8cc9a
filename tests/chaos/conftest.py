"""One `radixmesh serve` (tiny model, CPU, two executors) for the whole chaos suite.

The suite kills its parts one after the other under load; each test leaves the mesh
whole again (every service serving, no lease held) for the next.
"""

from __future__ import annotations

import pytest

from mesh.faults import ServeProcess


@pytest.fixture(scope="session")
def mesh(tmp_path_factory):
    serve = ServeProcess.start(
        tmp_path_factory.mktemp("chaos"),
        *("--executors", "2", "--num-pages", "256", "--grace", "20"),
        *("--max-restarts", "3", "--restart-window-s", "600", "--max-queue-wait-s", "3"),
    )
    yield serve
    serve.stop()
