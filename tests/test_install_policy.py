"""batchpilot install-policy puts a trained run's policy into a policy set, after the runtime has
accepted it; a refused policy or a bad workload name installs nothing."""

from __future__ import annotations

from pathlib import Path

import pytest

from agents.install_policy import install
from agents.install_policy import main as install_main
from runtime.api.settings import Settings
from runtime.decider.policy_set import POLICY_SET_FILE, PolicySet
from runtime.server import decider_from_settings

FIXTURES = Path(__file__).resolve().parent / "fixtures"


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


def test_the_default_workload_installs_the_sets_default_and_keeps_the_others(policy_dir,
                                                                              tmp_path):
    run = run_folder(tmp_path, policy_dir / "policy-v2.onnx", "# shared card\n")
    install(run_folder(tmp_path / "code", FIXTURES / "policy-test-1.onnx"), "azure-code",
            policy_dir)
    assert install_main(["--run", str(run), "--workload", "default", "--lend-guard", "0.9:0.95",
                         "--folder", str(policy_dir)]) == 0
    policies = PolicySet.load(policy_dir / POLICY_SET_FILE)
    assert (policies.default, policies.workloads) == (
        "policy.onnx", {"azure-code": "policy-azure-code.onnx"})
    assert not (policy_dir / "policy-default.onnx").exists()
    card = (policy_dir / "card.md").read_text()
    assert card.startswith("# shared card\n") and "Installed as the set's default" in card
    # a workload the set does not name gets it; the named one keeps its own
    other = decider_from_settings(Settings(policy_dir=policy_dir, workload="mixed"))
    assert other.policy.policy_version == "test-2" and other.policy.lend_guard is not None
    code = decider_from_settings(Settings(policy_dir=policy_dir, workload="azure-code"))
    assert code.policy.policy_version == "test-1"
    # into an empty folder it starts the set
    fresh = tmp_path / "fresh"
    install(run, "default", fresh)
    assert PolicySet.load(fresh / POLICY_SET_FILE).default == "policy.onnx"
