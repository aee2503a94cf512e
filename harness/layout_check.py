"""docs/architecture.md checked against the tree (`python -m harness.layout_check`, run by
`make lint`): every module the map in "Every module in a line" names exists, every module of
chat/, project/ and bench/ is in the map, and the figures its table quotes are the computed ones.

A folder the map names without listing what is in it (migrations/, management/) stands for
everything under it; a package's __init__.py need not be named. Not imported by the product."""

import ast
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOC = Path("docs") / "architecture.md"
COVERED = ("chat", "project", "bench")
LINE_LIMIT = 450
# A map entry: a name at the start of a line, indented by two spaces a level. Descriptions
# that run on to the next line are indented much deeper, and are not entries.
ENTRY = re.compile(r"^( {0,8})(\S+?(?:\.py|/))(?:\s|$)")
# The house's floors, top down (the doc's "The house, floor by floor"): an import from a lower
# floor to a higher one is an arrow back up. The entry points share the transports' floor;
# the engine, plain Python imported by all and importing none of them, is the ground. The pages,
# accounts and health endpoints are ways in too, on the transports' floor.
FLOORS = {
    **dict.fromkeys(
        ("transports", "pages", "accounts", "health", "admin", "management", "apps"), 4
    ),
    "turns": 3,
    **dict.fromkeys(("stores", "policy"), 2),
    **dict.fromkeys(("protocol", "infra", "models"), 1),
    "engine": 0,
}
# The settings' helpers that read one variable each (project/env.py; tests/test_configuration.py
# counts with this), and the modules the settings are written in: a read is counted wherever
# among them it is made.
ENV_HELPERS = {"env", "envbool", "envint", "envfloat", "envlist", "envspec"}
SETTINGS_MODULES = ("settings.py", "env.py", "settings_parsers.py")


def map_block(doc: str) -> list[str]:
    """The lines of the code block under the "Every module in a line" heading."""
    after = doc.split("## Every module in a line", 1)
    if len(after) < 2:
        return []
    block = after[1].split("```", 2)
    return block[1].splitlines() if len(block) > 2 else []


def map_entries(doc: str) -> tuple[set[str], set[str]]:
    """The paths the map names (folders end with /), and the folders it names without children."""
    named: set[str] = set()
    parents: set[str] = set()
    stack: list[tuple[int, str]] = []
    for line in map_block(doc):
        match = ENTRY.match(line)
        if not match:
            continue
        indent, name = len(match.group(1)), match.group(2)
        while stack and stack[-1][0] >= indent:
            stack.pop()
        path = (stack[-1][1] if stack else "") + name
        named.add(path)
        if stack:
            parents.add(stack[-1][1])
        if name.endswith("/"):
            stack.append((indent, path))
    summarised = {path for path in named if path.endswith("/") and path not in parents}
    return named, summarised


def modules(root: Path) -> list[str]:
    return sorted(
        path.relative_to(root).as_posix()
        for top in COVERED
        for path in (root / top).rglob("*.py")
        if not any(part.startswith(".") for part in path.relative_to(root).parts)
    )


def long_modules(root: Path, tops: tuple[str, ...]) -> list[tuple[str, int]]:
    found = []
    for module in modules(root):
        if module.split("/", 1)[0] in tops:
            lines = len((root / module).read_text().splitlines())
            if lines > LINE_LIMIT:
                found.append((module, lines))
    return found


def variables_read(root: Path) -> set[str]:
    return {
        node.args[0].value
        for module in SETTINGS_MODULES
        for node in ast.walk(ast.parse((root / "project" / module).read_text()))
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id in ENV_HELPERS
        and node.args
        and isinstance(node.args[0], ast.Constant)
    }


def imported(path: Path, root: Path) -> set[str]:
    """The chat modules or packages `path` imports (TYPE_CHECKING and in-function imports too)."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    package = parts if parts[-1] == "__init__" else parts[:-1]
    package = [part for part in package if part != "__init__"]
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            module = [*base, *(node.module.split(".") if node.module else [])]
            if node.module:
                names.add(".".join(module))
            else:
                names.update(".".join([*module, alias.name]) for alias in node.names)
    return {name for name in names if name.startswith("chat.")}


def arrows_up(root: Path) -> set[tuple[str, str]]:
    """(from, to) between chat's parts where `from` is on a lower floor than `to`."""
    found = set()
    for path in (root / "chat").rglob("*.py"):
        parts = path.relative_to(root).parts
        if len(parts) < 2 or parts[1] in {"migrations", "__init__.py"}:
            continue
        source = parts[1].removesuffix(".py")
        for name in imported(path, root):
            target = name.split(".")[1]
            if FLOORS.get(source, 0) < FLOORS.get(target, 0):
                found.add((source, target))
    return found


def figures(root: Path) -> dict[str, int]:
    """The table's rows this checks, by their first cell, and their "after" figure."""
    return {
        "`chat/`, `project/` and `bench/` modules over 450 lines": len(long_modules(root, COVERED)),
        "environment variables read": len(variables_read(root)),
        "arrows back up, part to part": len(arrows_up(root)),
    }


def quoted(doc: str, row: str) -> int | None:
    """The leading number of the last cell of the table row whose first cell is `row`."""
    for line in doc.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) >= 2 and cells[0] == row:
            number = re.match(r"\d+", cells[-1])
            return int(number.group()) if number else None
    return None


def problems(doc: str, root: Path) -> list[str]:
    named, summarised = map_entries(doc)
    if not named:
        return [f"{DOC}: no module map under '## Every module in a line'"]
    found = []
    for path in sorted(named):
        if "*" not in path and not (root / path).exists():
            found.append(f"the map names {path}, which does not exist")
    for module in modules(root):
        inside = any(module.startswith(folder) for folder in summarised)
        if module not in named and not inside and not module.endswith("/__init__.py"):
            found.append(f"{module} is not in the map")
    for row, figure in figures(root).items():
        said = quoted(doc, row)
        if said is None:
            found.append(f"the table has no row '{row}' with a figure")
        elif said != figure:
            found.append(f"the table says {said} for '{row}', the tree gives {figure}")
    return found


def main() -> int:
    for module, lines in long_modules(ROOT, COVERED):
        print(f"over {LINE_LIMIT} lines: {module} ({lines})")
    for source, target in sorted(arrows_up(ROOT)):
        print(f"arrow back up: chat/{source}/ -> chat/{target}/")
    for row, figure in figures(ROOT).items():
        print(f"{row}: {figure}")
    found = problems((ROOT / DOC).read_text(), ROOT)
    for problem in found:
        print(f"{DOC}: {problem}", file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
