"""Admission without a server: the bound, the 503 and its Retry-After (from the measured drain rate,
on a fake clock), the 400 for a request that can never fit, and the flags that set the bound."""
import pytest

from gh200rt.serve.admission import MAX_RETRY_AFTER_SECONDS, RATE_WINDOW_SECONDS, Admission
from gh200rt.serve.args import ServerConfig, parse_args
from gh200rt.serve.errors import APIError


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def full_admission(clock, limit=20, running=4):
    admission = Admission(limit, running, f"--max-num-seqs {running} + --max-queued-requests {limit - running}",
                          "--max-queued-requests", clock=clock)
    return admission, [admission.admit(1) for _ in range(limit)]


def refusal(admission, slots=1) -> APIError:
    with pytest.raises(APIError) as e:
        admission.admit(slots)
    return e.value


def test_the_bound_refuses_with_503_naming_the_limit_and_the_flags():
    admission, tickets = full_admission(Clock())
    error = refusal(admission)
    assert error.status == 503 and error.code == "server_overloaded"
    assert error.headers == {"Retry-After": "1"}                    # nothing released yet: nothing measured
    for words in ("20 sequences", "limit is 20", "--max-num-seqs 4 + --max-queued-requests 16",
                  "raise --max-queued-requests", "retry after 1 s"):
        assert words in error.message, (words, error.message)
    assert error.body()["error"]["type"] == "service_unavailable"
    assert admission.refused == 1 and admission.held == 20
    tickets[0].release()
    tickets[0].release()                                            # idempotent
    assert admission.held == 19
    admission.admit(1)
    assert admission.held == 20


def test_a_request_that_can_never_fit_is_a_400_and_refusals_name_the_flag_that_set_the_limit():
    admission = Admission(8, 4, "--max-num-queued-reqs 8", "--max-num-queued-reqs")
    error = refusal(admission, slots=9)
    assert error.status == 400 and error.param == "n" and "at most 8" in error.message
    assert admission.refused == 0 and admission.held == 0
    admission.admit(8)
    assert refusal(admission).message.endswith("or raise --max-num-queued-reqs")   # the flag that set it


def test_retry_after_is_the_backlog_over_the_measured_drain_rate():
    clock = Clock()
    admission, tickets = full_admission(clock)                      # 4 running, 16 waiting
    clock.now += 2.0
    for ticket in tickets[:4]:                                      # 4 sequences left in 2 s: 2 per second
        ticket.release()
    tickets += [admission.admit(1) for _ in range(4)]
    assert admission.drain_rate() == pytest.approx(2.0)
    error = refusal(admission)
    assert error.headers == {"Retry-After": "8"}                    # 16 waiting / 2 per second
    assert "sequences leave at 2.00/s" in error.message
    assert refusal(admission, slots=18).headers == {"Retry-After": "9"}    # needs 18 slots freed, not 16
    clock.now += RATE_WINDOW_SECONDS + 1                            # the window forgets: nothing measured
    assert admission.drain_rate() is None and admission.retry_after() == 1


def test_retry_after_is_capped_and_a_new_busy_period_measures_afresh():
    clock = Clock()
    admission, tickets = full_admission(clock, limit=400, running=4)
    clock.now += 20.0
    tickets.pop().release()                                         # one sequence in 20 s
    tickets.append(admission.admit(1))
    assert admission.retry_after() == MAX_RETRY_AFTER_SECONDS
    for ticket in tickets:
        ticket.release()
    assert admission.held == 0
    admission.admit(1)                                              # busy again: the old releases say nothing
    assert admission.drain_rate() is None


def test_the_bound_comes_from_sglangs_or_vllms_flag():
    server, engine = parse_args(["--max-num-seqs", "4", "--max-queued-requests", "16"])
    assert server.admission_limit(engine.scheduler.max_num_seqs) == (
        20, "--max-num-seqs 4 + --max-queued-requests 16", "--max-queued-requests")
    server, engine = parse_args(["--max-num-seqs", "4", "--max-num-queued-reqs", "10"])
    assert server.admission_limit(engine.scheduler.max_num_seqs) == (10, "--max-num-queued-reqs 10",
                                                                     "--max-num-queued-reqs")
    assert ServerConfig().admission_limit(256)[:2] == (512, "--max-num-seqs 256 + --max-queued-requests 256")
    with pytest.raises(SystemExit) as e:
        parse_args(["--max-num-queued-reqs", "0"])
    assert e.value.code == 2
