"""docs/architecture.md's module map and figures against the tree (harness/layout_check.py, run
by `make lint`): the real map passes, and a doctored one fails for each kind of drift."""

import pytest

from harness.import_graph import svg
from harness.layout_check import DOC, ROOT, arrows_up, figures, problems

pytestmark = pytest.mark.unit


def real_doc() -> str:
    return (ROOT / DOC).read_text()


def test_the_map_and_the_tree_agree():
    assert problems(real_doc(), ROOT) == []


def test_a_module_left_out_of_the_map_fails():
    doc = real_doc()
    line = "    refusals.py      TurnError: a turn refused before it started\n"
    assert line in doc
    assert problems(doc.replace(line, ""), ROOT) == ["chat/turns/refusals.py is not in the map"]


def test_a_module_the_map_names_that_is_not_there_fails():
    doc = real_doc()
    line = "    refusals.py      TurnError"
    doctored = doc.replace(line, "    outbox.py        the engine thread's events\n" + line)
    assert problems(doctored, ROOT) == ["the map names chat/turns/outbox.py, which does not exist"]


def test_a_wrong_figure_fails():
    doc = real_doc()
    count = figures(ROOT)["environment variables read"]
    cell = f"| {count}, all in `project/settings.py` |"
    assert cell in doc
    doctored = doc.replace(cell, f"| {count + 1}, all in `project/settings.py` |")
    assert problems(doctored, ROOT) == [
        f"the table says {count + 1} for 'environment variables read', the tree gives {count}"
    ]


def test_a_missing_map_fails():
    assert problems("# Architecture\n", ROOT) != []


def test_an_import_up_the_floors_is_an_arrow_back_up(tmp_path):
    (tmp_path / "chat" / "engine").mkdir(parents=True)
    (tmp_path / "chat" / "turns").mkdir()
    (tmp_path / "chat" / "engine" / "loop.py").write_text("from .. import turns\n")
    (tmp_path / "chat" / "turns" / "run.py").write_text("from ..engine import loop\n")
    assert arrows_up(tmp_path) == {("engine", "turns")}


def test_the_drawing_shows_each_folder_and_marks_an_arrow_back_up(tmp_path):
    """harness/import_graph.py draws from the same walk: a box per folder, an arrow per pair,
    red when it runs up the floors."""
    (tmp_path / "chat" / "engine").mkdir(parents=True)
    (tmp_path / "chat" / "turns").mkdir()
    (tmp_path / "chat" / "engine" / "loop.py").write_text("from .. import turns\n")
    (tmp_path / "chat" / "turns" / "run.py").write_text("from ..engine import loop\n\n")
    drawing = svg(tmp_path, "test")
    assert ">engine/<" in drawing and ">turns/<" in drawing
    assert "1 module, 2 lines" in drawing
    up = [line for line in drawing.splitlines() if "<title>engine -&gt; turns: 1</title>" in line]
    down = [line for line in drawing.splitlines() if "<title>turns -&gt; engine: 1</title>" in line]
    assert len(up) == 1 and 'stroke="#c22"' in up[0]
    assert len(down) == 1 and 'stroke="#c22"' not in down[0]
