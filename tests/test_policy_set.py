"""A policy set gives each workload its own policy: in the server (BATCHPILOT_WORKLOAD) and
through batchpilot install-policy (test_install_policy.py; the arena's side is in
test_arena_figures.py); a broken set is
refused with the file and the field named. Runtime only: these run on the runtime-only install."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from runtime.api.settings import Settings
from runtime.decider.guard import GuardedDecider
from runtime.decider.policy_set import POLICY_SET_FILE, PolicySet, PolicySetError
from runtime.server import decider_from_settings

FIXTURES = Path(__file__).resolve().parent / "fixtures"


def write_set(folder: Path, **fields) -> Path:
    body = {"policy_set": 1, "default": "policy.onnx",
            "workloads": {"azure-code": "policy-v2.onnx"}} | fields
    path = folder / POLICY_SET_FILE
    path.write_text(json.dumps(body))
    return path


def test_a_listed_workload_gets_its_policy_and_any_other_the_default(policy_dir):
    policies = PolicySet.load(write_set(policy_dir))
    assert policies.file_for("azure-code") == policy_dir / "policy-v2.onnx"
    assert policies.file_for("azure-conv") == policy_dir / "policy.onnx"
    assert policies.file_for(None) == policy_dir / "policy.onnx"


def test_the_server_loads_the_policy_its_workload_names(policy_dir):
    write_set(policy_dir)
    code = decider_from_settings(Settings(policy_dir=policy_dir, workload="azure-code"))
    conv = decider_from_settings(Settings(policy_dir=policy_dir, workload="azure-conv"))
    plain = decider_from_settings(Settings(policy_dir=policy_dir, policy_file="policy-v2.onnx"))
    assert code.policy.policy_version == "test-2"
    assert conv.policy.policy_version == "test-1"  # not listed: the set's default
    assert plain.policy.policy_version == "test-2"  # no workload: policy_file, as before


def test_a_server_whose_set_is_missing_decides_with_the_pid_and_says_why(policy_dir):
    decider = decider_from_settings(Settings(policy_dir=policy_dir, workload="azure-code"))
    assert decider.policy is None
    assert decider.last_error == (f"workload 'azure-code': {policy_dir / POLICY_SET_FILE}: "
                                  "policy set not found")


@pytest.mark.parametrize("fields, message", [
    ({"policy_set": 2}, "field 'policy_set' is 2; this runtime reads version 1"),
    ({"default": "../policy.onnx"}, "field 'default' is '../policy.onnx'; expected a policy "
     "file name in the same folder (no folder part, ends in .onnx)"),
    ({"workloads": {"azure-code": "gone.onnx"}}, "field 'workloads.azure-code' names gone.onnx, "
     "which is not in "),
    ({"workloads": {"../x": "policy.onnx"}}, "field 'workloads': workload name '../x' is not a "
     "trace alias or a file stem"),
    ({"workloads": ["policy.onnx"]}, "field 'workloads' must map workload names to policy "
     "files, got list"),
    ({"defualt": "policy.onnx"}, "unknown field(s) ['defualt']; expected policy_set, default, "
     "workloads and an optional doc"),
])
def test_a_broken_set_is_refused_naming_the_file_and_the_field(policy_dir, fields, message):
    path = write_set(policy_dir, **fields)
    with pytest.raises(PolicySetError) as e:
        PolicySet.load(path)
    assert str(e.value).startswith(f"{path}: {message}")


def test_a_set_that_is_not_json_is_refused(policy_dir):
    path = policy_dir / POLICY_SET_FILE
    path.write_text("{not json")
    with pytest.raises(PolicySetError, match=r"policies.json: not a JSON policy set \("):
        PolicySet.load(path)


def test_every_shipped_policy_is_one_the_runtime_serves_and_has_its_card():
    shipped = Path(__file__).resolve().parents[1] / "checkpoints" / "shipped"
    policies = PolicySet.load(shipped / POLICY_SET_FILE)
    assert policies.default == "policy.onnx" and (shipped / "card.md").is_file()
    for workload, name in policies.workloads.items():
        decider = GuardedDecider(shipped / name)
        assert decider.policy is not None, decider.last_error
        assert (shipped / f"card-{workload}.md").is_file()
    assert GuardedDecider(shipped / policies.default).policy is not None


def test_a_workload_name_that_could_lead_out_of_the_folder_is_refused_by_the_settings():
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="workload"):
        Settings(workload="../azure-code")
