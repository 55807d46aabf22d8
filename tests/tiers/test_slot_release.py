"""When a staging slot's next copy may wait on the slot's "compute done" event, and when it must fork
from the compute stream: capture -> eager step -> replay -> eager copy must not trust the eager event."""
from gh200rt.transfer.slot_release import SlotReleases

EAGER = None


def test_never_released_slot_forks():
    assert not SlotReleases(2).can_wait_on_event(0, EAGER)


def test_event_is_waitable_only_in_the_context_that_recorded_it():
    r = SlotReleases(2)
    r.released(0, EAGER)
    assert r.can_wait_on_event(0, EAGER)
    assert not r.can_wait_on_event(0, 7)           # inside a capture: an eager event may not be waited on
    r.released(0, 7)
    assert r.can_wait_on_event(0, 7)
    assert not r.can_wait_on_event(0, 8) and not r.can_wait_on_event(0, EAGER)
    assert not r.can_wait_on_event(1, EAGER)


def test_replay_invalidates_the_eager_events():
    r = SlotReleases(3)
    r.released(0, 5)                                # capture
    r.released(0, EAGER)                            # eager step after capture
    r.released(1, EAGER)
    r.graph_replayed()                              # the replay reads slots 0 and 1 with no Python running
    assert not any(r.can_wait_on_event(s, EAGER) for s in range(3))
    r.released(1, EAGER)                            # the next eager reader of slot 1 is tracked again
    assert r.can_wait_on_event(1, EAGER) and not r.can_wait_on_event(0, EAGER)


def test_cpu_backend_replay_runs_the_step():
    import torch

    from gh200rt.transfer.backend import make_transfer_backend

    class Recorded:
        runs = 0

        def replay(self):
            Recorded.runs += 1
    backend = make_transfer_backend("cpu", 64, 2, poison=False)
    backend.replay(Recorded())
    assert Recorded.runs == 1 and backend.slots[0].dtype == torch.uint8
    backend.close()
