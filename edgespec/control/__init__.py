"""Control: what the coordinator decides each round from measurements.

Window policies (fixed, heuristic, goodput, the learned AWC), the per-round telemetry they read, and the
drafter router with the prompt-category signal it uses. Pure: numpy at most.
"""
