"""The documents that cite tests (SECURITY.md's promises above all) cite tests that exist."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
CITED = re.compile(r"(tests/[\w/]+\.py)(?:::(\w+))?")


@pytest.mark.parametrize("document", ["SECURITY.md", "README.md", "bench/README.md"])
def test_every_test_a_document_cites_exists(document: str) -> None:
    missing = []
    for path, name in sorted(set(CITED.findall((REPO / document).read_text("utf-8")))):
        source = REPO / path
        if not source.is_file():
            missing.append(path)
        elif name and not re.search(rf"^(async )?def {name}\b", source.read_text("utf-8"),
                                    re.MULTILINE):
            missing.append(f"{path}::{name}")
    assert not missing, f"{document} cites tests that do not exist: {missing}"
