"""A small run of the load script: many sockets, cancels, then every stored answer checked."""

from chat import loadtest


def test_a_small_load_run_stores_exactly_what_each_client_assembled(tmp_path):
    """20 sockets for 10 s against a real daphne: no lost, duplicated or reordered chunk, no server error.

    The same code as `manage.py loadtest` (200 x 60 s); speed and memory are printed there, not asserted.
    """
    report = loadtest.run_load(tmp_path, sockets=20, seconds=10, max_new_tokens=8, warmup_seconds=0,
                               settle_seconds=0.5, cancel_share=0.4, progress=lambda line: None)
    turns = report.turns
    assert all(not c.connect_error for c in report.clients)
    # The run really exercised what it checks: answers ended both ways, cancels were sent.
    finishes = {t.done["finish_reason"] for t in turns if t.done}
    assert "cancelled" in finishes and finishes - {"cancelled"}, finishes
    assert sum(len(t.chunks) for t in turns) > 20
    checked = [t for t in turns if t.message is not None]
    assert len(checked) == len(turns) and set(report.stored) >= {t.message for t in checked}
    assert report.problems == [], loadtest.figures(report)
