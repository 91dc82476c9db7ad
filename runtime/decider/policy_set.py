"""A policy set: one ONNX policy per workload, chosen when a deployment starts.

A serving deployment knows its workload (a code assistant, a chat service, a batch pipeline
beside a chat service); a policy trained on that workload alone fits it better than one policy
shared by all (docs/results.md). A policy set is a JSON file in the policy folder that names
the policy of each workload and the one every other workload gets::

    {"policy_set": 1,
     "default": "policy.onnx",
     "workloads": {"azure-code": "policy-azure-code.onnx"}}

Every name is a file in the same folder (no folder part, ends in ``.onnx``: no entry can lead
out of it). The server loads ``workloads[BATCHPILOT_WORKLOAD]`` (or the default) at start-up; the
arena's ``policy:policies.json`` gives each trace its workload's policy.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

POLICY_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,200}\.onnx$"
"""A policy file name: no folder part, no leading dot, ends in .onnx (so no path can leave the
policy folder)."""
WORKLOAD_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,100}$"
"""A workload's name: a trace alias (``azure-code``) or a trace file's stem"""
POLICY_SET_VERSION = 1
"""the format version a policy set declares in its ``policy_set`` field"""
POLICY_SET_FILE = "policies.json"
"""the shipped policy set's file name, beside the shipped policies"""


class PolicySetError(ValueError):
    """A policy set that cannot be used; the message names the file and the field."""


def _check_workload(workload: str, where: str = "") -> None:
    if not re.match(WORKLOAD_NAME_PATTERN, workload):
        raise PolicySetError(f"{where}workload name {workload!r} is not a trace alias or a file "
                             "stem (letters, digits, '.', '_' and '-')")


@dataclass(frozen=True)
class PolicySet:
    """The policies of a folder by workload."""

    path: Path
    """the policy set's JSON file"""
    default: str
    """the policy of every workload not listed"""
    workloads: dict[str, str] = field(default_factory=dict)
    """workload name (a trace alias such as ``azure-code``, or a trace file's stem) -> policy"""
    doc: str = ""
    """a line for people: where the policies came from"""

    @classmethod
    def load(cls, path: str | Path) -> PolicySet:
        """Read and check a policy set: every policy it names must exist beside it."""
        path = Path(path)
        try:
            raw = json.loads(path.read_text())
        except FileNotFoundError:
            raise PolicySetError(f"{path}: policy set not found") from None
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            raise PolicySetError(f"{path}: not a JSON policy set ({e})") from None
        if not isinstance(raw, dict):
            raise PolicySetError(f"{path}: expected a JSON object, got {type(raw).__name__}")
        unknown = sorted(set(raw) - {"policy_set", "default", "workloads", "doc"})
        if unknown:
            raise PolicySetError(f"{path}: unknown field(s) {unknown}; expected policy_set, "
                                 "default, workloads and an optional doc")
        if raw.get("policy_set") != POLICY_SET_VERSION:
            raise PolicySetError(f"{path}: field 'policy_set' is {raw.get('policy_set')!r}; "
                                 f"this runtime reads version {POLICY_SET_VERSION}")
        workloads = raw.get("workloads", {})
        if not isinstance(workloads, dict):
            raise PolicySetError(f"{path}: field 'workloads' must map workload names to "
                                 f"policy files, got {type(workloads).__name__}")
        for workload in workloads:
            _check_workload(workload, f"{path}: field 'workloads': ")
        entries = {"default": raw.get("default")}
        entries.update({f"workloads.{k}": v for k, v in workloads.items()})
        for name, file in entries.items():
            if not isinstance(file, str) or not re.match(POLICY_NAME_PATTERN, file):
                raise PolicySetError(f"{path}: field {name!r} is {file!r}; expected a policy "
                                     "file name in the same folder (no folder part, ends in "
                                     ".onnx)")
            if not (path.parent / file).is_file():
                raise PolicySetError(f"{path}: field {name!r} names {file}, which is not in "
                                     f"{path.parent}")
        doc = raw.get("doc", "")
        if not isinstance(doc, str):
            raise PolicySetError(f"{path}: field 'doc' must be a string, got "
                                 f"{type(doc).__name__}")
        return cls(path, raw["default"], dict(workloads), doc)

    def file_for(self, workload: str | None) -> Path:
        """The policy file of ``workload`` (the default when it is None or not listed)."""
        name = self.workloads.get(workload, self.default) if workload else self.default
        return self.path.parent / name

    def with_workload(self, workload: str, file: str) -> PolicySet:
        """This set with ``workload``'s policy set to ``file`` (a file beside the set)."""
        _check_workload(workload)
        if not re.match(POLICY_NAME_PATTERN, file):
            raise PolicySetError(f"policy file {file!r} must be a file name ending in .onnx")
        return PolicySet(self.path, self.default, {**self.workloads, workload: file}, self.doc)

    def save(self) -> None:
        """Write the set (through a temporary file and an atomic rename)."""
        body = {"policy_set": POLICY_SET_VERSION, "default": self.default,
                "workloads": dict(sorted(self.workloads.items()))}
        if self.doc:
            body["doc"] = self.doc
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(body, indent=1) + "\n")
        os.replace(tmp, self.path)
