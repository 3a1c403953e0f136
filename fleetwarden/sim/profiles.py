"""Built-in engine profiles, so `fleetwarden replay` works without any file.

`VTC_A10G` is `examples/engines/vtc-a10g.yaml` (a test keeps the two equal): Llama-2-7B on one A10G
with the VTC paper's 10,000-token KV pool; its throughput matches the paper's Table 5.
"""

from __future__ import annotations

from fleetwarden.sim.engine import EngineProfile

VTC_A10G = EngineProfile(
    name="vtc-a10g",
    kv_budget_tokens=10_000,
    admit_every_decode_steps=10,
    prefill_cap_tokens=3072,
    prefill_base_s=0.012,
    prefill_per_token_s=0.00015,
    decode_base_s=0.0235,
    decode_per_request_s=0.0005,
    decode_per_context_token_s=0.000001,
)
