"""The package as a user installs it: the wheel's contents, its commands, and a server started
from a fresh virtual environment, away from the source tree, that decides with the shipped policy.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import tomllib
import urllib.request
import zipfile
from pathlib import Path

import pytest

from runtime.decider.onnx_policy import OnnxPolicy
from runtime.locations import CHECKPOINTS_DIR_ENV, checkpoints_dir, shipped_policy_dir
from tests.conftest import raw_fields

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_the_package_list_names_every_package_folder_in_the_tree():
    found = {str(p.parent.relative_to(ROOT)).replace("/", ".")
             for top in ("runtime", "env", "agents") for p in (ROOT / top).rglob("__init__.py")}
    mapped = PYPROJECT["tool"]["setuptools"]["package-dir"]
    data = {f"runtime.checkpoints.{d.name}" for d in (ROOT / "checkpoints").iterdir()
            if d.is_dir()}
    assert set(PYPROJECT["tool"]["setuptools"]["packages"]) == found | set(mapped) | data


def test_the_one_console_command_is_batchpilot():
    assert PYPROJECT["project"]["scripts"] == {"batchpilot": "batchpilot_scripts.cli:main"}


def test_every_console_command_points_at_a_main_that_exists():
    # read, not imported: the training commands' modules need the training stack
    for command, target in PYPROJECT["project"]["scripts"].items():
        module, _, attr = target.partition(":")
        top, _, rest = module.partition(".")
        folder = PYPROJECT["tool"]["setuptools"]["package-dir"].get(top, top)
        source = ROOT / folder / (rest.replace(".", "/") + ".py") if rest else ROOT / f"{top}.py"
        assert source.is_file(), (command, source)
        assert f"\ndef {attr}(" in source.read_text(), command


def test_the_onnx_runtime_comes_from_exactly_one_extra():
    deps = PYPROJECT["project"]["dependencies"]
    extras = PYPROJECT["project"]["optional-dependencies"]
    assert not any(d.startswith("onnxruntime") for d in deps)
    assert extras["cpu"] == ["onnxruntime>=1.18"] and extras["gpu"] == ["onnxruntime-gpu>=1.18"]


def test_the_locations_variable_moves_every_shipped_file(monkeypatch, tmp_path):
    from runtime.api.settings import Settings
    from runtime.engine.profile import default_profile_path

    assert checkpoints_dir() == ROOT / "checkpoints"
    monkeypatch.setenv(CHECKPOINTS_DIR_ENV, str(tmp_path))
    assert Settings().policy_dir == shipped_policy_dir() == tmp_path / "shipped"
    assert default_profile_path() == tmp_path / "profiles" / "h200-llama2-7b-40gib-roofline.json"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post_json(url: str, body: dict) -> dict:
    req = urllib.request.Request(url, data=json.dumps(body).encode(),
                                 headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=5) as response:
        return json.loads(response.read())


@pytest.mark.slow
def test_a_server_installed_from_the_wheel_decides_with_the_shipped_policy(tmp_path):
    wheels = tmp_path / "wheels"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps",
                    "--wheel-dir", str(wheels), str(ROOT)],
                   check=True, capture_output=True, timeout=120)
    wheel = next(wheels.glob("batchpilot-*.whl"))
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {"runtime/checkpoints/shipped/policy.onnx", "runtime/checkpoints/shipped/policies.json",
            "runtime/locations.py", "train.py",
            "batchpilot_scripts/replay.py"} <= names
    assert not any(n.startswith(("scripts/", "tests/")) for n in names)

    # a fresh environment with the runtime only (base + cpu), away from the source tree; the
    # outer pip installs into it (pip's cache serves the dependencies after the first run)
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True,
                   timeout=120)
    python = venv / "bin" / "python"
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet",
                    f"{wheel}[cpu]"], check=True, capture_output=True, timeout=600)
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", CHECKPOINTS_DIR_ENV) and not k.startswith("BATCHPILOT_")}
    where = subprocess.run(
        [str(python), "-c", "import json, sys, runtime.locations as l; "
         "print(json.dumps([sys.path, l.checkpoints_dir().as_posix()]))"],
        cwd=tmp_path, env=env, capture_output=True, text=True, check=True, timeout=60)
    path, found = json.loads(where.stdout)
    assert not any(p.startswith(str(ROOT)) for p in path if p), path
    assert found == (venv / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}"
                     / "site-packages" / "runtime" / "checkpoints").as_posix()

    port = free_port()
    server = subprocess.Popen([str(venv / "bin" / "batchpilot"), "serve", "--port", str(port)],
                              cwd=tmp_path, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            assert server.poll() is None, server.communicate()[0]
            try:
                urllib.request.urlopen(url + "/healthz", timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < deadline, "the installed server did not come up"
                time.sleep(0.1)
        decision = post_json(url + "/v1/decide", raw_fields())
        assert decision["source"] == "policy", decision
        shipped = OnnxPolicy.load(ROOT / "checkpoints" / "shipped" / "policy.onnx")
        assert decision["policy_version"] == shipped.policy_version
    finally:
        server.terminate()
        server.wait(timeout=10)
