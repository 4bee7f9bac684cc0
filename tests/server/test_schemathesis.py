"""Property-based run over the OpenAPI schema: no input the schema allows (or breaks) gets a 5xx."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

from cswap.server.app import create_app
from cswap.tuner.store import ConfigStore
from tests.server.helpers import A100, H100, make_run

# A dev dependency: a machine with only the runtime's packages (the GPU suite's) skips this file.
schemathesis = pytest.importorskip("schemathesis")
from schemathesis.checks import not_a_server_error, response_schema_conformance  # noqa: E402

# schemathesis collects the operations at import, so the app exists before any fixture runs. Its
# store is seeded with real records so that reads also answer 200, not only 404 or "default".
_DIRECTORY = tempfile.TemporaryDirectory(prefix="cswap-schemathesis-")
_STORE = ConfigStore(Path(_DIRECTORY.name) / "store.db")
for _run in (make_run(), make_run(fp=A100), make_run(time_s=float("inf"))):
    _STORE.record_run(_run)
_STORE.put_model(H100, "compress_time", {"coef": [1.0, 2.0]})

schema = schemathesis.openapi.from_asgi("/openapi.json", create_app(_STORE))


@pytest.fixture(autouse=True, scope="module")
def _remove_store() -> Iterator[None]:
    yield
    _STORE.close()
    _DIRECTORY.cleanup()


@schema.parametrize()
@settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck), database=None)
def test_no_server_errors_and_responses_match_the_schema(case: schemathesis.Case) -> None:
    case.call_and_validate(checks=[not_a_server_error, response_schema_conformance])
