"""verispec.distributed: a tensor-parallel target, asynchronous speculation (SSD) over torch.distributed,
and an event-driven simulator of AR / SD / SSD rounds. See docs/distributed.md.

    simulator.py   step times + acceptance model -> tokens/s and the timeline of one round
"""
