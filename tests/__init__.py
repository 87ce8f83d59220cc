"""Tests of subres."""
