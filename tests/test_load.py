"""A small run of the load script: many sockets, cancels, then every stored answer checked."""

import pytest

from harness import loadtest

pytestmark = pytest.mark.integration


def test_a_small_load_run_stores_exactly_what_each_client_assembled(tmp_path):
    """20 sockets for 10 s against a real daphne: no lost, duplicated or reordered chunk, no server error.

    The same code as `manage.py loadtest` (200 x 60 s); speed and memory are printed there, not asserted.
    """
    report = loadtest.run_load(
        tmp_path,
        sockets=20,
        seconds=10,
        max_new_tokens=8,
        warmup_seconds=0,
        settle_seconds=0.5,
        cancel_share=0.4,
        progress=lambda line: None,
    )
    turns = report.turns
    assert all(not c.connect_error for c in report.clients)
    # The run really exercised what it checks: answers ended both ways, cancels were sent.
    finishes = {t.done["finish_reason"] for t in turns if t.done}
    assert "cancelled" in finishes and finishes - {"cancelled"}, finishes
    assert sum(len(t.chunks) for t in turns) > 20
    checked = [t for t in turns if t.message is not None]
    assert len(checked) == len(turns) and set(report.stored) >= {t.message for t in checked}
    assert report.problems == [], loadtest.figures(report)


def test_the_checker_reports_lost_reordered_or_unstored_chunks():
    """The load run's verdict is not vacuous: a stored text that differs from the chunks, a wrong status,
    a message never stored, a row left streaming and a traceback in the log are each reported."""

    def turn(request_id, message, chunks, finish):
        t = loadtest.Turn(request_id=request_id, sent_at=0.0, message=message, chunks=chunks)
        t.done = {
            "type": "done",
            "text": "".join(chunks),
            "finish_reason": finish,
            "message": message,
        }
        return t

    report = loadtest.Report(sockets=1, seconds=1, max_new_tokens=8, server_env={})
    report.clients = [
        loadtest.ClientLog(
            turns=[
                turn("ok", 1, ["Hel", "lo"], "eos"),
                turn("reordered", 2, ["lo", "Hel"], "eos"),
                turn("status", 3, ["Hi"], "cancelled"),
                turn("lost", 4, ["Hi"], "eos"),
            ]
        )
    ]
    report.stored = {
        1: {"text": "Hello", "status": "done", "finish_reason": "eos"},
        2: {"text": "Hello", "status": "done", "finish_reason": "eos"},
        3: {"text": "Hi", "status": "done", "finish_reason": "eos"},
        5: {"text": "", "status": "streaming", "finish_reason": ""},
    }
    loadtest.check(report)
    report.tracebacks = loadtest.scan_log("x\nTraceback (most recent call last):\n  boom\n")[0]
    problems = "\n".join(report.problems)
    assert "ok:" not in problems
    assert "reordered: stored text" in problems and "status: stored done/eos" in problems
    assert "lost: message 4 was never stored" in problems
    assert (
        "1 message(s) still streaming" in problems
        and "1 stored answer(s) no client asked for" in problems
    )
    assert "1 traceback(s)" in problems
