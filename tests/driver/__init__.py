"""Tests of the in-pod driver (driver/) and the loopback toy model server."""
