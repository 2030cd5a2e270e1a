"""Workloads that run under torchrun on every rank; the launch role ships these files."""
