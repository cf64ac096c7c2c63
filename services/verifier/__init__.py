"""The verifier service (run with `python -m services.verifier`)."""
