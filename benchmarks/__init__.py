"""The benchmark scripts (run each as ``python benchmarks/<name>.py``); shared helpers in common.py."""
