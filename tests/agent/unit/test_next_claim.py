"""The agent's next claims without a server (docs/leases.md, "The next claim"): a completing runner
offers its slot in the completion, starts what the answer claimed, takes a refusal as a claim's,
and against an older control plane (400 naming ``next``) completes without it from then on."""

from __future__ import annotations

import time

import pytest

from agent import claims as claims_module
from agent.attempts import AttemptRunner
from agent.client import ApiError, TransportError
from agent.runtime import Agent
from protocol import wire
from tests.agent.unit.test_long_poll import FakeClient, make_agent, session_answer

ATTEMPT = "0190a0a0-0000-7000-8000-000000000001"


def offer(attempt_id: str = ATTEMPT, offer_id: str = "o-1") -> dict:
    return {
        "status": "claimed",
        "execution": {"env": {}},
        "lease": {
            "attemptId": attempt_id,
            "leaseGeneration": 1,
            "leaseVersion": 0,
            "offerId": offer_id,
            "renewIntervalSeconds": 2,
        },
    }


def completion_body(**extra) -> dict:
    return {"sessionId": "s-1", "generation": 1, "attemptId": ATTEMPT, "sequence": 1, "outcome": "succeeded",
            "exitCode": 0, **extra}  # fmt: skip


def answer(**extra) -> dict:
    return {"attemptId": ATTEMPT, "leaseGeneration": 1, "sequence": 1, "outcome": "succeeded", **extra}


def test_an_online_agent_offers_one_slot_and_none_while_draining_or_stopping(tmp_path):
    agent, _ = make_agent(tmp_path, {}, max_concurrent=4)
    [offered] = agent.claims.next_offers()
    assert offered["offerId"] and len(offered["leaseToken"]) >= 22
    agent.session.mark_draining()
    assert agent.claims.next_offers() == []
    agent2, _ = make_agent(tmp_path / "b", {})
    agent2.shutdown_requested.set()
    assert agent2.claims.next_offers() == []


def test_what_the_next_claim_answered_is_started(tmp_path):
    agent, _ = make_agent(tmp_path, {})
    started: list[AttemptRunner] = []
    agent.start_runner = started.append  # type: ignore[method-assign]
    offers = agent.claims.next_offers()
    claimed = offer(offer_id=offers[0]["offerId"])
    began = time.monotonic()
    assert agent.claims.take_next({"offers": [claimed]}, offers) == 1
    [runner] = started
    assert runner.lease == claimed["lease"] and runner._token == offers[0]["leaseToken"]
    assert time.monotonic() - began < 5  # bounded wait for the (never sent) starting ACK


def test_a_refused_next_claim_is_taken_as_a_claims_refusal(tmp_path):
    agent, _ = make_agent(tmp_path, {})
    offers = agent.claims.next_offers()
    refused = {"offers": [], "refused": {"code": "session_draining", "message": "draining"}}
    assert agent.claims.take_next(refused, offers) == 0
    assert agent.session.state == "draining"
    assert agent.claims.take_next({"offers": []}, offers) == 0
    assert agent.claims.take_next(None, offers) == 0


def test_an_older_control_plane_gets_the_completion_again_without_next_and_no_next_claims_after(tmp_path):
    older = ApiError(400, "validation_failed", "unknown field", "next")
    agent, client = make_agent(tmp_path, {wire.LEASE_COMPLETE: [older, answer()]})
    runner = AttemptRunner(agent, offer(), "t" * 43)  # type: ignore[arg-type]
    body = completion_body(next={"offers": agent.claims.next_offers()})
    assert runner._complete(body, time.monotonic() + 30) == answer()  # type: ignore[arg-type]
    [(_, first, _), (_, second, _)] = client.calls
    assert "next" not in second and {k: v for k, v in first.items() if k != "next"} == second
    assert agent.claims.next_claims is False and agent.claims.next_offers() == []


def test_any_other_refusal_of_a_completion_is_raised_as_it_was(tmp_path):
    refused = ApiError(400, "validation_failed", "bad", "next.offers[0].offerId")
    agent, client = make_agent(tmp_path, {wire.LEASE_COMPLETE: [refused]})
    runner = AttemptRunner(agent, offer(), "t" * 43)  # type: ignore[arg-type]
    body = completion_body(next={"offers": agent.claims.next_offers()})
    try:
        runner._complete(body, time.monotonic() + 30)  # type: ignore[arg-type]
    except ApiError as exc:
        assert exc is refused
    else:
        raise AssertionError("the refusal was not raised")
    assert len(client.calls) == 1 and agent.claims.next_claims is True


def test_what_a_next_claim_brought_after_shutdown_began_is_released_not_started(tmp_path):
    """Review finding 1: the completion was sent before SIGTERM; its answer must not start a job."""
    released = {"status": "released", "lease": {}, "cancelRequested": False}
    agent, client = make_agent(tmp_path, {wire.LEASE_RELEASE: [released]})
    started: list[AttemptRunner] = []
    agent.start_runner = started.append  # type: ignore[method-assign]
    offers = agent.claims.next_offers()
    agent.request_shutdown()
    assert agent.claims.take_next({"offers": [offer(offer_id=offers[0]["offerId"])]}, offers) == 0
    assert started == []
    [(path, body, _)] = client.calls
    assert path == wire.LEASE_RELEASE
    assert (body["attemptId"], body["leaseToken"], body["leaseVersion"]) == (
        ATTEMPT,
        offers[0]["leaseToken"],
        0,
    )


def test_a_fenced_refusal_of_the_next_claim_stops_the_agent_as_any_call_would(tmp_path):
    """Review finding 2: a claim refused with a fence code ends the agent (exit 3), so must this."""
    agent, _ = make_agent(tmp_path, {})
    offers = agent.claims.next_offers()
    fenced = {"offers": [], "refused": {"code": "session_superseded", "message": "a newer session"}}
    assert agent.claims.take_next(fenced, offers) == 0
    assert agent._fatal is not None and agent._fatal.exit_code == wire.EXIT_FENCED


class StopsWhileClaiming(FakeClient):
    """A control plane that claims the first offer of a claim or waiting claim, while SIGTERM
    reaches the agent before the answer does."""

    def __init__(self, script: dict[str, list]) -> None:
        super().__init__(script)
        self.agent: Agent | None = None

    def post(self, path, body, **kwargs):
        if path not in (wire.CLAIM, wire.CLAIM_WAIT):
            return super().post(path, body, **kwargs)
        self.calls.append((path, body, kwargs))
        assert self.agent is not None
        self.agent.request_shutdown()  # the signal lands while the claim is in flight
        claimed = [offer(offer_id=body["offers"][0]["offerId"])]
        return {"offers": claimed, "cancelRequested": [], "waitSeconds": 25.0, "session": session_answer()}


@pytest.mark.parametrize("call", ["once", "wait_once"])
def test_what_a_claim_answered_after_shutdown_began_is_released_not_started(tmp_path, call):
    released = {"status": "released", "lease": {}, "cancelRequested": False}
    client = StopsWhileClaiming({wire.LEASE_RELEASE: [released]})
    agent, _ = make_agent(tmp_path, {})
    agent.client = client  # type: ignore[assignment]
    client.agent = agent
    started: list[AttemptRunner] = []
    agent.start_runner = started.append  # type: ignore[method-assign]
    assert getattr(agent.claims, call)() == 0
    assert started == []
    [(claim_path, claim, _), (path, body, _)] = client.calls
    assert claim_path in (wire.CLAIM, wire.CLAIM_WAIT) and path == wire.LEASE_RELEASE
    assert (body["attemptId"], body["leaseToken"]) == (ATTEMPT, claim["offers"][0]["leaseToken"])


def test_what_a_claim_answered_once_the_session_began_draining_is_released_not_started(tmp_path):
    released = {"status": "released", "lease": {}, "cancelRequested": False}
    agent, client = make_agent(tmp_path, {wire.LEASE_RELEASE: [released]})
    started: list[AttemptRunner] = []
    agent.start_runner = started.append  # type: ignore[method-assign]
    offers = agent.claims._offers(1)
    agent.session.mark_draining()  # a heartbeat answered draining while the claim was in flight
    assert agent.claims._start([offer(offer_id=offers[0]["offerId"])], offers) == 0  # type: ignore[list-item]
    assert started == [] and [path for path, _, _ in client.calls] == [wire.LEASE_RELEASE]


def test_a_release_the_control_plane_does_not_answer_starts_that_attempt_and_the_rest_instead(
    tmp_path, monkeypatch
):
    """Review of the hand-back: a control plane that does not answer the release (here 503 for
    longer than the agent's patience) would leave the lease to lapse and the session unable to
    go offline cleanly (``session_has_active_leases``, exit 5). The first attempt is released;
    the second's release is not answered, so it and the third are started, as before the stop."""
    monkeypatch.setattr(claims_module, "HAND_BACK_PATIENCE_SECONDS", 0.3)
    released = {"status": "released", "lease": {}, "cancelRequested": False}
    unavailable = ApiError(503, "database_unavailable", "the database is unavailable")
    agent, client = make_agent(tmp_path, {wire.LEASE_RELEASE: [released] + [unavailable] * 1000})
    started: list[AttemptRunner] = []
    agent.start_runner = started.append  # type: ignore[method-assign]
    offers = agent.claims._offers(3)
    ids = [f"0190a0a0-0000-7000-8000-00000000000{n}" for n in range(3)]
    answered = [offer(attempt_id=ids[n], offer_id=o["offerId"]) for n, o in enumerate(offers)]
    agent.request_shutdown()
    began = time.monotonic()
    assert agent.claims._start(answered, offers) == 2  # type: ignore[arg-type]
    assert time.monotonic() - began < 5  # one patience for the lot, not one per offer
    assert [runner.lease["attemptId"] for runner in started] == ids[1:]
    releases = [body["attemptId"] for path, body, _ in client.calls if path == wire.LEASE_RELEASE]
    assert set(releases) == set(ids[:2])  # the third is never tried: the control plane is away


def test_a_release_refused_because_the_lease_already_ended_starts_nothing(tmp_path):
    """A resend whose first release was answered but lost (``lease_released``), or a lease the
    control plane ended meanwhile: nothing to start, nothing more to send."""
    ended = ApiError(409, "lease_released", "the lease was released")
    agent, client = make_agent(tmp_path, {wire.LEASE_RELEASE: [ended]})
    started: list[AttemptRunner] = []
    agent.start_runner = started.append  # type: ignore[method-assign]
    offers = agent.claims._offers(1)
    agent.request_shutdown()
    assert agent.claims._start([offer(offer_id=offers[0]["offerId"])], offers) == 0  # type: ignore[list-item]
    assert started == [] and len(client.calls) == 1


def test_a_waiting_claim_cut_short_by_sigterm_has_what_it_claimed_learnt_and_released(tmp_path):
    """SIGTERM interrupts the waiting claim (its answer is lost with the connection). Once the
    session is draining, each of its offers is sent again alone: the one that had claimed an
    attempt is answered as a replay and released; the other is refused ``session_draining``."""
    released = {"status": "released", "lease": {}, "cancelRequested": False}
    draining = ApiError(409, "session_draining", "the session is draining")
    agent, client = make_agent(tmp_path, {wire.LEASE_RELEASE: [released]}, max_concurrent=2)
    started: list[AttemptRunner] = []
    agent.start_runner = started.append  # type: ignore[method-assign]

    def wait(path, body, **kwargs):  # the wait is cut short by SIGTERM
        client.calls.append((path, body, kwargs))
        agent.request_shutdown()
        raise TransportError("interrupted")

    plain = client.post
    client.post = lambda path, body, **kw: (  # type: ignore[method-assign]
        wait(path, body, **kw) if path == wire.CLAIM_WAIT else plain(path, body, **kw)
    )
    assert agent.claims.wait_once() is None
    [(_, waited, _)] = client.calls
    first, second = waited["offers"]
    assert agent.claims.cut_short == [first, second]
    client.script[wire.CLAIM] = [{"offers": [offer(offer_id=first["offerId"])]}, draining]
    agent.session.mark_draining()
    assert agent.claims.recover_cut_short() == 0
    assert started == [] and agent.claims.cut_short == []
    sent = [(path, body) for path, body, _ in client.calls[1:]]
    assert [path for path, _ in sent] == [wire.CLAIM, wire.LEASE_RELEASE, wire.CLAIM]
    assert sent[0][1]["offers"] == [first] and sent[2][1]["offers"] == [second]
    assert sent[1][1]["leaseToken"] == first["leaseToken"]
