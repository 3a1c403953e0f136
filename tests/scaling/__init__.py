"""Tests of the pure scaling strategies and the NIW release rule."""
