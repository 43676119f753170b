"""Shared pytest configuration: the protocol peers and the service under test."""

pytest_plugins = ["tests.harness.fixtures", "tests.harness.service", "tests.harness.browser"]
