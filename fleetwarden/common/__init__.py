"""Small helpers shared across layers (the simulator and the forecasting core both read CSV).

Modules here import nothing from the rest of fleetwarden, so any layer may use them.
"""
