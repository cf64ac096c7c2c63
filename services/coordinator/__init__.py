"""The coordinator service (run with `python -m services.coordinator`)."""
