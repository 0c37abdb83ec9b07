"""The record of the service's probes between rollouts (core/answering.py)."""

from __future__ import annotations

from reconciler.core.answering import HEAL_LIMIT, Answering, after_probe, after_reload

DEAD = "Stub process 'echo_0_0' is not healthy."


def test_a_version_that_answered_then_fails_in_a_row_has_stopped_answering() -> None:
    record = after_probe(Answering(), 0.0, None)
    assert record.answered and not record.stopped(3)
    for at in (10.0, 20.0):
        record = after_probe(record, at, DEAD)
        assert not record.stopped(3)
    record = after_probe(record, 30.0, DEAD)
    assert record.stopped(3) and record.reload_wanted(3) and record.last_error == DEAD
    # One answer in between starts the count again.
    assert not after_probe(after_probe(record, 40.0, None), 50.0, DEAD).stopped(3)


def test_a_version_that_never_answered_is_not_judged() -> None:
    record = Answering()
    for at in range(10):
        record = after_probe(record, float(at), "INVALID_ARG: zeros rejected")
    assert record.failures == 10 and not record.stopped(3)


def test_a_probe_is_due_once_per_interval() -> None:
    assert Answering().due(0.0, 10.0)
    record = after_probe(Answering(), 100.0, None)
    assert not record.due(105.0, 10.0) and record.due(110.0, 10.0)
    # After a failure of a version that answered, the next probe confirms it at once...
    assert after_probe(record, 110.0, "timeout").due(111.0, 10.0)
    # ...but one that never answered is not hurried.
    assert not after_probe(Answering(), 110.0, "rejected").due(111.0, 10.0)


def test_reloads_in_vain_stop_at_the_limit_until_it_answers() -> None:
    record = after_probe(Answering(), 0.0, None)
    for reload in range(HEAL_LIMIT):
        for at in range(3):
            record = after_probe(record, float(at), DEAD)
        assert record.reload_wanted(3), reload
        record = after_reload(record)
        assert not record.stopped(3)  # judged afresh after the reload
    for at in range(3):
        record = after_probe(record, float(at), DEAD)
    assert record.stopped(3) and not record.reload_wanted(3)  # out of service, not reloaded
    assert after_probe(record, 9.0, None) == Answering(answered=True, last_probe=9.0)
