"""A bounded fuzz run over the OpenAPI schema: whatever schemathesis sends, no 5xx."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import schemathesis
from hypothesis import HealthCheck, settings

from runtime.api.settings import Settings
from runtime.server import create_app
from tests.conftest import FIXTURES

_folder = Path(tempfile.mkdtemp(prefix="batchpilot-fuzz-"))
(_folder / "policy.onnx").write_bytes((FIXTURES / "policy-test-1.onnx").read_bytes())
(_folder / "corrupt.onnx").write_bytes(b"not a model")
app = create_app(Settings(policy_dir=_folder, reload_token="fuzz-token", max_body_bytes=64 * 1024))
schema = schemathesis.openapi.from_asgi("/openapi.json", app)


def teardown_module() -> None:
    shutil.rmtree(_folder, ignore_errors=True)


@schema.parametrize()
@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much,
                                 HealthCheck.data_too_large])
def test_no_input_makes_the_server_fail(case):
    response = case.call(headers={"Authorization": "Bearer fuzz-token"})
    assert response.status_code < 500, (case.method, case.path, response.status_code,
                                        response.text[:500])
