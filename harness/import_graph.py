"""The import structure of chat/'s folders as an SVG drawing, from the same AST walk and the same
floors as the layout check (harness/layout_check.py): a box per folder, on its floor, with its
modules and lines; an arrow per pair of folders one imports from, thicker for more imports, red
when it runs back up the floors. Plain SVG text, no graphviz.

    python -m harness.import_graph docs/img/imports-after.svg
    python -m harness.import_graph --root /path/to/an/older/checkout docs/img/imports-before.svg

Not imported by the product."""

import argparse
import math
from collections import Counter
from html import escape
from pathlib import Path

from harness.layout_check import FLOORS, ROOT, imported

BOX_W, BOX_H = 150, 46
GAP_X, ROW_H, MARGIN = 24, 120, 30
FLOOR_NAMES = {
    4: "ways in",
    3: "one turn",
    2: "what is kept, the rules",
    1: "wire, runtime, models",
    0: "the engine",
}


def parts(root: Path) -> dict[str, tuple[int, int]]:
    """Each of chat/'s folders (and top modules), with its module count and lines."""
    found: dict[str, list[int]] = {}
    for path in sorted((root / "chat").rglob("*.py")):
        relative = path.relative_to(root / "chat").parts
        if relative[0] in {"migrations", "__init__.py"}:
            continue
        name = relative[0].removesuffix(".py")
        entry = found.setdefault(name, [0, 0])
        entry[0] += 1
        entry[1] += len(path.read_text().splitlines())
    return {name: (count, lines) for name, (count, lines) in found.items()}


def arrows(root: Path) -> Counter[tuple[str, str]]:
    """(from, to) folder pairs with how many import statements' targets lead there."""
    counted: Counter[tuple[str, str]] = Counter()
    for path in (root / "chat").rglob("*.py"):
        relative = path.relative_to(root / "chat").parts
        if relative[0] in {"migrations", "__init__.py"}:
            continue
        source = relative[0].removesuffix(".py")
        for name in imported(path, root):
            target = name.split(".")[1]
            if target != source:
                counted[(source, target)] += 1
    return counted


def layout(names: list[str]) -> dict[str, tuple[float, float]]:
    """Top-left corner of each box: one row per floor, highest floor on top."""
    rows: dict[int, list[str]] = {}
    for name in sorted(names):
        rows.setdefault(FLOORS.get(name, 0), []).append(name)
    widest = max(len(row) for row in rows.values())
    width = widest * (BOX_W + GAP_X)
    places: dict[str, tuple[float, float]] = {}
    for floor, row in rows.items():
        used = len(row) * (BOX_W + GAP_X) - GAP_X
        left = MARGIN + 120 + (width - used) / 2
        top = MARGIN + (max(FLOORS.values()) - floor) * ROW_H
        for index, name in enumerate(row):
            places[name] = (left + index * (BOX_W + GAP_X), top)
    return places


def svg(root: Path, title: str) -> str:
    found = parts(root)
    places = layout(list(found))
    width = max(x for x, _ in places.values()) + BOX_W + MARGIN
    height = MARGIN * 2 + (max(FLOORS.values()) + 1) * ROW_H
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0f}" height="{height:.0f}" '
        f'viewBox="0 0 {width:.0f} {height:.0f}" font-family="sans-serif" font-size="12">',
        "<defs>",
        '<marker id="down" viewBox="0 0 10 10" refX="10" refY="5" markerUnits="userSpaceOnUse" markerWidth="9" '
        'markerHeight="9" orient="auto"><path d="M0,0 L10,5 L0,10 z" fill="#667"/></marker>',
        '<marker id="up" viewBox="0 0 10 10" refX="10" refY="5" markerUnits="userSpaceOnUse" markerWidth="9" '
        'markerHeight="9" orient="auto"><path d="M0,0 L10,5 L0,10 z" fill="#c22"/></marker>',
        "</defs>",
        f'<rect width="100%" height="100%" fill="#fff"/><text x="{MARGIN}" y="18" '
        f'font-size="14" font-weight="bold">{escape(title)}</text>',
    ]
    for floor, label in FLOOR_NAMES.items():
        y = MARGIN + (max(FLOORS.values()) - floor) * ROW_H + BOX_H / 2 + 4
        out.append(f'<text x="{MARGIN}" y="{y:.0f}" fill="#889">{floor}: {escape(label)}</text>')
    for (source, target), count in sorted(arrows(root).items()):
        if source not in places or target not in places:
            continue
        up = FLOORS.get(source, 0) < FLOORS.get(target, 0)
        (sx, sy), (tx, ty) = places[source], places[target]
        start, end = _ends(sx, sy, tx, ty)
        colour, marker, opacity = ("#c22", "up", 0.9) if up else ("#667", "down", 0.45)
        stroke = 0.8 + math.log2(count)
        out.append(
            f'<line x1="{start[0]:.1f}" y1="{start[1]:.1f}" x2="{end[0]:.1f}" y2="{end[1]:.1f}" '
            f'stroke="{colour}" stroke-opacity="{opacity}" stroke-width="{stroke:.1f}" '
            f'marker-end="url(#{marker})"><title>{source} -&gt; {target}: {count}</title></line>'
        )
    for name, (x, y) in sorted(places.items()):
        count, lines = found[name]
        folder = (root / "chat" / name).is_dir()
        label = f"{name}/" if folder else f"{name}.py"
        out.append(
            f'<rect x="{x:.1f}" y="{y:.1f}" width="{BOX_W}" height="{BOX_H}" rx="6" '
            f'fill="{"#eef3fb" if folder else "#f6f6f6"}" stroke="#557"/>'
            f'<text x="{x + BOX_W / 2:.1f}" y="{y + 19:.1f}" text-anchor="middle" '
            f'font-weight="bold">{escape(label)}</text>'
            f'<text x="{x + BOX_W / 2:.1f}" y="{y + 36:.1f}" text-anchor="middle" fill="#445">'
            f"{count} module{'s' if count != 1 else ''}, {lines:,} lines</text>"
        )
    out.append("</svg>")
    return "\n".join(out) + "\n"


def _ends(sx: float, sy: float, tx: float, ty: float):
    """Where an arrow leaves the source box and meets the target's: bottom to top going down,
    top to bottom going up, side to side on one floor."""
    if ty > sy:
        return (sx + BOX_W / 2, sy + BOX_H), (tx + BOX_W / 2, ty)
    if ty < sy:
        return (sx + BOX_W / 2, sy), (tx + BOX_W / 2, ty + BOX_H)
    if tx > sx:
        return (sx + BOX_W, sy + BOX_H / 2), (tx, ty + BOX_H / 2)
    return (sx, sy + BOX_H / 2), (tx + BOX_W, ty + BOX_H / 2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path, help="the SVG file to write")
    parser.add_argument("--root", type=Path, default=ROOT, help="the checkout to draw")
    parser.add_argument("--title", default="chat/: folders and their imports")
    args = parser.parse_args()
    args.out.write_text(svg(args.root.resolve(), args.title))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
