"""The multi-host test lab: a tool of the tests and benchmarks, not of the product wheel.

netns.py makes the nodes (network namespaces with sshd), slurm.py a Slurm cluster of them,
__main__.py is `python -m lab` (run from the repository root).
"""
