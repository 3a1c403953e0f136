"""The capacity gate's memory arithmetic: will a request still fit when everything runs to the end?

A request that is admitted keeps growing by one KV-cache token per generated token, so checking
only today's usage over-admits and the engine later preempts. The check here is the "staggered"
one from the VTC artifact's router (inherited from S-LoRA/LightLLM): sort the requests by tokens
still to generate, longest first; when the i-th of them finishes, the i+1 longest are all still
running and have each grown by its remaining length, so usage then is the tokens they hold now plus
(i+1) times that remaining length. The peak over all those moments is the memory the batch needs.
"""

from __future__ import annotations

from collections.abc import Iterable


def staggered_peak_tokens(entries: Iterable[tuple[int, int]]) -> int:
    """Peak KV tokens of a batch; `entries` are (tokens held now, tokens still to generate)."""
    ordered = sorted(entries, key=lambda entry: entry[1], reverse=True)
    peak = 0
    held = 0
    for index, (tokens_held, remaining) in enumerate(ordered):
        held += tokens_held
        peak = max(peak, held + (index + 1) * remaining)
    return peak
