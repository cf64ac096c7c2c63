"""Operator commands that ship with the package: prepare-models, export-onnx, dev-certs."""
