"""The benchmark scripts, a package so that their shared modules import the same way from anywhere.

Each script runs as `python benchmarks/<name>.py` (it puts the repository root on `sys.path` first) or as
`python -m benchmarks.<name>` from the root, and imports its siblings as `benchmarks.<name>`; tests import them
as modules (`from benchmarks import study_report`). See README.md in this folder for what each one measures.
"""
