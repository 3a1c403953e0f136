"""One reconciler per kind: level-based, idempotent, writing only differences."""
