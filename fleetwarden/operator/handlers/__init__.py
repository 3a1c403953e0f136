"""Kopf handlers: one module per kind, each only turning events into reconcile requests."""
