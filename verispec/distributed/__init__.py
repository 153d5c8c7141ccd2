"""verispec.distributed: a tensor-parallel target, asynchronous speculation (SSD) over torch.distributed as a
drafter of the engine, and an event-driven simulator of AR / SD / SSD rounds. See docs/distributed.md.

    simulator.py   step times + acceptance model -> tokens/s and the timeline of one round
    group.py       spawned local ranks, timeouts on every collective, clear errors
    tp.py          tensor-parallel target (sharded Transformer, one all-reduce per attention / MLP block)
    ssd.py         SSDDrafter: the target ranks' drafter, whose drafts come from the draft rank
    draft_rank.py  DraftServer: the draft rank (pre-speculation of the likely outcomes, the outcome cache)
    channel.py     messages between two ranks with a bounded wait on every receive

The launch that runs the engine on the target ranks is verispec/launch.py (``python -m verispec.distributed``).
"""
