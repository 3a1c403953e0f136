"""Self-tests of tests/support (the emulator and its runners)."""
