"""The ``backend="triton"`` verification kernels: greedy.py (split-V argmax + ragged acceptance scan) and
rejection.py (rejection sampling). Each file holds its kernels beside their launcher."""
