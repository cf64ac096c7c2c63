"""The network edge of the services: gRPC plumbing, protobuf conversion, client channels, security, flags.

Protobuf types stop here (wire.py); transport errors become domain errors here (rpc.py). The generated
code lives in edgespec/v1 (python scripts/gen_protos.py).
"""
