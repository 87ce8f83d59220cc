"""Shared fixtures: the Go peers built from the module proxy."""

from tests.gotools import kubectl_bin, kubepeer_bin

__all__ = ["kubectl_bin", "kubepeer_bin"]
