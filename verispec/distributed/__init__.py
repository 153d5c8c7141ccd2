"""verispec.distributed: a tensor-parallel target, asynchronous speculation (SSD) over torch.distributed,
and an event-driven simulator of AR / SD / SSD rounds. See docs/distributed.md.

    simulator.py   step times + acceptance model -> tokens/s and the timeline of one round
    group.py       spawned local ranks, timeouts on every collective, clear errors
    tp.py          tensor-parallel target (sharded Transformer, one all-reduce per attention / MLP block)
    ssd.py         the SSD protocol: target ranks + one draft rank with a speculation cache
"""
