"""Packaged suites (packaged as certify._suites)."""
