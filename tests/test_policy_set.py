"""A policy set gives each workload its own policy: in the server (BATCHPILOT_WORKLOAD) and in
the arena (policy:policies.json); a broken set is refused with the file and the field named."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agents.install_policy import install
from agents.install_policy import main as install_main
from agents.registry import policy_file
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


def test_the_arena_gives_each_trace_its_workloads_policy(policy_dir):
    path = str(write_set(policy_dir))
    assert policy_file(path, "azure-code") == str(policy_dir / "policy-v2.onnx")
    assert policy_file(path, "mixed") == str(policy_dir / "policy.onnx")
    # a trace file is named by its stem
    write_set(policy_dir, workloads={"my_trace": "policy-v2.onnx"})
    assert policy_file(path, "/data/traces/my_trace.csv") == str(policy_dir / "policy-v2.onnx")
    # a plain ONNX file runs on every trace
    assert policy_file("x/policy.onnx", "azure-code") == "x/policy.onnx"


def run_folder(tmp_path: Path, policy: Path, card: str = "# card\n") -> Path:
    run = tmp_path / "runs" / "r"
    run.mkdir(parents=True)
    (run / "policy.onnx").write_bytes(policy.read_bytes())
    (run / "card.md").write_text(card)
    return run


def test_installing_a_run_adds_its_policy_and_card_for_the_workload(policy_dir, tmp_path):
    run = run_folder(tmp_path, policy_dir / "policy-v2.onnx", "# code card\n")
    assert install_main(["--run", str(run), "--workload", "azure-code",
                         "--folder", str(policy_dir)]) == 0
    policies = PolicySet.load(policy_dir / POLICY_SET_FILE)
    assert (policies.default, policies.workloads) == (
        "policy.onnx", {"azure-code": "policy-azure-code.onnx"})
    assert (policy_dir / "policy-azure-code.onnx").read_bytes() == (
        policy_dir / "policy-v2.onnx").read_bytes()
    assert (policy_dir / "card-azure-code.md").read_text() == "# code card\n"
    server = decider_from_settings(Settings(policy_dir=policy_dir, workload="azure-code"))
    assert server.policy.policy_version == "test-2"
    # a second workload keeps the first
    install(run, "mixed", policy_dir)
    assert set(PolicySet.load(policy_dir / POLICY_SET_FILE).workloads) == {"azure-code", "mixed"}


@pytest.mark.parametrize("fixture, workload, message", [
    ("policy-old-spec.onnx", "azure-code", "the runtime refuses this policy: spec mismatch"),
    ("policy-test-1.onnx", "../up", "workload name '../up' is not a trace alias"),
])
def test_a_policy_the_runtime_refuses_or_a_bad_name_installs_nothing(tmp_path, fixture, workload,
                                                                     message, capsys):
    run = run_folder(tmp_path, FIXTURES / fixture)
    folder = tmp_path / "shipped"
    code = install_main(["--run", str(run), "--workload", workload, "--folder", str(folder)])
    assert code == 2 and message in capsys.readouterr().err
    assert not folder.exists() or not any(folder.iterdir())


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
