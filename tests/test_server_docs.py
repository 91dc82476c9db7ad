"""docs/rest.md quotes the settings and observation tables: they must be the code's."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from runtime.api.settings import settings_table
from runtime.observation import observation_table

DOC = Path(__file__).resolve().parents[1] / "docs" / "rest.md"


@pytest.mark.parametrize("marker, render", [("settings-table", settings_table),
                                            ("observation-table", observation_table)])
def test_the_rest_docs_quote_the_current_table(marker, render):
    text = DOC.read_text()
    found = re.search(rf"<!-- {marker}:start -->\n(.*?)\n<!-- {marker}:end -->", text, re.S)
    assert found, f"docs/rest.md has no {marker} block"
    assert found.group(1) == render(), (
        f"docs/rest.md's {marker} is stale: paste the output of {render.__module__}."
        f"{render.__name__}()")
