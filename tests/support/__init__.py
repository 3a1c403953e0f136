"""Shared test infrastructure: the Kubernetes API emulator, the Kopf runner, Helm helpers."""
