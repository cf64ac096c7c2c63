"""The round loop: draft -> verify -> commit, blocking or pipelined, over any drafter and verifier port.

The session log, the loop's shared round state, the verifier pool and failover (re-homing sessions), and
the routed drafter. Transport-free: ports are gRPC clients in the coordinator, engines in tests, modelled
links in the simulator.
"""
