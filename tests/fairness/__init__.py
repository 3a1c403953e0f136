"""Tests of the pure fairness core."""
