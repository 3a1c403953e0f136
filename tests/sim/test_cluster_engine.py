"""`FleetEngine` keeps the engine model's state implicitly; its answers must be `EngineModel`'s."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from fleetwarden.fairness.gate import staggered_peak_tokens
from fleetwarden.fairness.request import Request
from fleetwarden.sim.engine import EngineModel, EngineProfile
from fleetwarden.sim.fleet_engine import FleetEngine, PeakIndex

PROFILE = EngineProfile(
    name="t",
    kv_budget_tokens=4000,
    admit_every_decode_steps=3,
    prefill_cap_tokens=2000,
    prefill_base_s=0.01,
    prefill_per_token_s=0.0001,
    decode_base_s=0.02,
    decode_per_request_s=0.001,
    decode_per_context_token_s=0.00001,
)


def _request(seq: int, inp: int, out: int) -> Request:
    return Request(seq=seq, tenant="a", arrival_s=0.0, input_tokens=inp, max_output_tokens=out)


def _drive(rng: random.Random) -> tuple[EngineModel, FleetEngine, list[Request]]:
    """Run both engines through the same random admissions and decode steps."""
    plain, fleet = EngineModel(PROFILE), FleetEngine(PROFILE)
    seq = 0
    for _ in range(rng.randint(1, 12)):
        batch = []
        for _ in range(rng.randint(0, 3)):
            inp, out = rng.randint(1, 600), rng.randint(1, 300)
            pair = (_request(seq, inp, out), _request(seq, inp, out))
            seq += 1
            if plain.fits([b[0] for b in batch] + [pair[0]]):
                assert fleet.fits_one(pair[1])
                fleet.stage(pair[1])
                batch.append(pair)
            else:
                assert not fleet.fits_one(pair[1])
        if batch:
            plain.prefill([b[0] for b in batch], 0.0, [b[0].max_output_tokens for b in batch])
            fleet.prefill([b[1] for b in batch], 0.0, [b[1].max_output_tokens for b in batch])
            for r in plain.running[-len(batch) :]:
                r.request.output_tokens += 1
            plain.finished()
            fleet.finished()
        for _ in range(rng.randint(0, 40)):
            finish = fleet.next_finish_step()
            if finish is not None and finish <= fleet.steps:
                break
            if plain.idle:
                break
            assert plain.decode_seconds() == fleet.decode_seconds()
            for r in plain.running:
                r.request.output_tokens += 1
            plain.after_decode_step()
            fleet.advance(1)
            assert sorted(r.request.seq for r in plain.finished()) == sorted(
                r.request.seq for r in fleet.finished()
            )
    probes = [_request(10_000 + i, rng.randint(1, 2000), rng.randint(1, 800)) for i in range(20)]
    return plain, fleet, probes


@given(st.integers(0, 10_000))
@settings(max_examples=150, deadline=None)
def test_fleet_engine_answers_as_the_engine_model(seed: int) -> None:
    plain, fleet, probes = _drive(random.Random(seed))
    assert plain.held_tokens() == fleet.held_tokens()
    assert sorted(r.request.seq for r in plain.running) == sorted(
        r.request.seq for r in fleet.running
    )
    entries = [
        (
            r.request.input_tokens + r.request.output_tokens,
            r.request.max_output_tokens - r.request.output_tokens,
        )
        for r in plain.running
    ]
    assert fleet.peak == staggered_peak_tokens(entries)
    for probe in probes:
        assert plain.fits([probe]) == fleet.fits_one(probe) == fleet.fits([probe])


@given(st.integers(0, 10_000))
@settings(max_examples=150, deadline=None)
def test_first_fit_is_the_first_step_a_probe_fits(seed: int) -> None:
    rng = random.Random(seed)
    index = PeakIndex()
    entries = sorted((-rng.randint(5, 80), rng.randint(-40, 400)) for _ in range(rng.randint(0, 8)))
    index.rebuild(entries)
    inp, out, budget = rng.randint(1, 400), rng.randint(1, 100), rng.randint(200, 2500)
    first, last = rng.randint(0, 10), rng.randint(10, 90)

    def fits(t: int) -> bool:
        return index.peak_with(t + out, inp - t) <= budget

    expected = next((t for t in range(first, last + 1) if fits(t)), None)
    assert index.first_fit(inp, out, first, last, budget) == expected


def test_peak_index_matches_the_staggered_check() -> None:
    rng = random.Random(3)
    for _ in range(300):
        t = rng.randint(0, 50)
        requests = [(rng.randint(1, 500), rng.randint(1, 200)) for _ in range(rng.randint(0, 10))]
        # (held now, remaining) at step t  <->  f = t + remaining, g = held - t
        index = PeakIndex()
        index.rebuild(sorted((-(t + rem), held - t) for held, rem in requests))
        assert index.peak == staggered_peak_tokens(requests)
        extra = (rng.randint(1, 500), rng.randint(1, 200))
        assert index.peak_with(t + extra[1], extra[0] - t) == staggered_peak_tokens(
            [*requests, extra]
        )
