"""Load generators and benchmarks; run by hand, never by the test suite."""
