"""Who may import whom among the top-level folders: the product (chat/, project/) imports
neither the tests' helpers (harness/) nor the measurement tools (bench/), and no test or helper
imports bench/, so bench/ can change or go without breaking a test."""

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parent.parent


def top_level_imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


@pytest.mark.parametrize(
    ("folders", "forbidden"),
    [
        (("chat", "project"), {"bench", "harness", "tests"}),
        (("tests", "harness"), {"bench"}),
    ],
)
def test_no_folder_imports_what_it_must_not(folders, forbidden):
    """A module of `folders` importing one of `forbidden` (at top level or inside a function)
    fails, naming the module."""
    for folder in folders:
        for path in (ROOT / folder).rglob("*.py"):
            wrong = top_level_imports(path) & forbidden
            assert not wrong, f"{path.relative_to(ROOT)} imports {sorted(wrong)}"
