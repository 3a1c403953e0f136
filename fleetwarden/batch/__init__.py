"""fleetwarden batch: the non-interactive work (NIW) service.

It accepts work through an OpenAI-compatible Batch API, keeps every accepted item in a durable
store, and releases items to serving regions only when they have spare capacity (SageServe 6.2),
or to spot Deployments that exist for NIW alone.

Layout (pure decision logic is kept apart from I/O so it can be tested with a fake clock):

- pure: `validation` (input files), `policy` (release plan, tier, retry backoff, settlement),
  `results` (output and error lines), `spot` (spot replica count), `shapes` (OpenAI objects),
  `clock`, `records` (the data types), `config` (the service's file), `errors`, `ids`
- I/O: `store` (SQLite and Redis behind one protocol), `runner` (the store's thread),
  `utilisation` (capacity signals), `engine` (HTTP to targets), `dispatcher`, `maintenance`,
  `metrics`, `api` (aiohttp routes), `service` (wiring), `__main__` (the process)

See docs/batch.md for the flow, the knobs and the durability guarantees.
"""
