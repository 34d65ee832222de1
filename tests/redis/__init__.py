"""Tests of the Redis backend beyond the conformance suite: scripts, faults, cluster, sentinel."""
