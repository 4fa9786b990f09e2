"""Helpers shared by the test suites: multi-process gloo runs and Megatron parallel state on CPU."""
