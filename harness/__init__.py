"""What the tests, the benchmarks and the demo share: local clusters of the real services as processes on
loopback (cluster.py), an emulated edge-cloud link on real sockets (link.py), and the engines as the round
loop's ports in one process (inprocess.py). Neither is a benchmark:
tests import this package, never `bench`."""
