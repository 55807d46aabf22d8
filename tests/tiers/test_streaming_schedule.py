"""The staging ring's schedule against a backend that checks every slot's life cycle: a copy only into a
free slot, a wait only on an issued copy, a layer only reads its own bytes. Prefetch wraps across steps
for every ring shape, including orders whose length is not a multiple of K."""
import pytest

from gh200rt.weights.schedule import StreamingSchedule
from gh200rt.weights.tiers import slot_of


class CheckingBackend:
    """Slots go free -> copying (copy) -> ready (wait_copy) -> free (compute_done), nothing else."""

    def __init__(self, num_slots: int):
        self.slots = [None] * num_slots
        self.state = ["free"] * num_slots
        self.content = [None] * num_slots
        self.events: list[tuple] = []

    def copy(self, slot, src):
        assert self.state[slot] == "free", f"copy of {src} into slot {slot} while it is {self.state[slot]}"
        self.state[slot], self.content[slot] = "copying", src
        self.events.append(("copy", slot, src))

    def wait_copy(self, slot):
        assert self.state[slot] == "copying", f"wait on slot {slot} while it is {self.state[slot]}"
        self.state[slot] = "ready"
        self.events.append(("wait", slot))

    def compute_done(self, slot):
        assert self.state[slot] == "ready", f"compute done on slot {slot} while it is {self.state[slot]}"
        self.state[slot] = "free"
        self.events.append(("done", slot))


def make(num_slots: int, distance: int, order: list[int], wrap: bool = True, large=None, tokens=None):
    backend = CheckingBackend(num_slots)
    bound = []
    schedule = StreamingSchedule(backend, distance, lambda layer: layer, bound.append, wrap_steps=wrap)
    schedule.set_orders(order, large, tokens)
    return backend, schedule, bound


def run_step(backend, schedule, num_layers: int, num_tokens: int = 1):
    """One forward pass; every ring layer must find its own bytes, landed, in its slot."""
    schedule.begin_step(num_tokens)
    for layer in range(num_layers):
        schedule.before_layer(layer)
        p = schedule.position.get(layer)
        if p is not None:
            slot = slot_of(p, schedule.num_slots)
            assert backend.content[slot] == layer and backend.state[slot] == "ready"
        schedule.after_layer(layer)


SHAPES = [(1, 0), (2, 1), (2, 0), (3, 1), (3, 2), (4, 3)]


@pytest.mark.parametrize("order", [[0], [1, 3], [0, 2, 4], [0, 1, 2, 3, 4, 5], [1, 2, 3, 4, 5]],
                         ids=lambda o: f"L{len(o)}")
@pytest.mark.parametrize("slots,distance", SHAPES, ids=[f"K{k}-d{d}" for k, d in SHAPES])
def test_every_layer_reads_its_own_copy_across_steps(order, slots, distance):
    backend, schedule, _ = make(slots, distance, order)
    for _ in range(4):
        run_step(backend, schedule, 6)
    copies = [e for e in backend.events if e[0] == "copy"]
    # four steps' copies, plus the next step's first positions already issued in the last tail
    assert [src for _, _, src in copies[:4 * len(order)]] == order * 4
    assert len(copies) - 4 * len(order) == sum(backend.state[s] == "copying" for s in range(slots))


@pytest.mark.parametrize("order,slots,distance", [([0, 1, 2, 3], 2, 1), ([0, 2, 4], 2, 1), ([3], 2, 1),
                                                  ([0, 1, 2, 3, 4, 5], 3, 2)])
def test_next_steps_first_layers_copy_in_the_tail(order, slots, distance):
    backend, schedule, _ = make(slots, distance, order)
    run_step(backend, schedule, 6)
    issued = [e[2] for e in backend.events if e[0] == "copy"]
    tail = issued[len(order):]
    assert tail and tail == order[:len(tail)], "the first layers of the next step are copied during this one"
    before = len(backend.events)
    schedule.begin_step(1)
    schedule.before_layer(order[0])
    # at the next step's first ring layer nothing had to be issued for it: it was copied in the tail
    assert ("copy", slot_of(0, slots), order[0]) not in backend.events[before:]


def test_without_wrapping_a_step_is_self_contained():
    backend, schedule, _ = make(2, 1, [0, 1, 2, 3], wrap=False)
    run_step(backend, schedule, 4)
    assert backend.state == ["free", "free"]
    assert [e[2] for e in backend.events if e[0] == "copy"] == [0, 1, 2, 3]


def test_switching_orders_drains_copies_issued_for_the_old_one():
    backend, schedule, bound = make(2, 1, [1, 4], large=[0, 1, 3, 4], tokens=8)
    run_step(backend, schedule, 6)                   # decode: its tail copies layer 1 for the next decode
    assert backend.state.count("copying") == 1
    run_step(backend, schedule, 6, num_tokens=32)    # a long step takes the large order
    assert bound[-1] == [0, 1, 3, 4] and schedule.order == [0, 1, 3, 4]
    run_step(backend, schedule, 6, num_tokens=1)     # and back
    assert bound[-1] == [1, 4]
    run_step(backend, schedule, 6, num_tokens=1)
    assert len(bound) == 3                           # set_orders, then two switches: none while the order holds


def test_drain_releases_every_slot():
    backend, schedule, _ = make(3, 2, [0, 1, 2, 3, 4])
    run_step(backend, schedule, 5)
    assert "copying" in backend.state
    schedule.drain()
    assert backend.state == ["free"] * 3
    run_step(backend, schedule, 5)                   # starts over from position 0
