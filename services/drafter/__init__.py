"""The drafter service (run with `python -m services.drafter`)."""
