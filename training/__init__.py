"""Training of the shipped weights: AWC (learned window control) and the relaxed verifier's weight head."""
