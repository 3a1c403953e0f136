"""Test suite package (lets tests import shared helpers as ``tests.support``)."""
