"""verispec.serve: an OpenAI-compatible HTTP server over the engine's continuous-batching scheduler.

    cli.py        ``verispec serve`` arguments and main (no web framework imported until it runs)
    server.py     assembling it: model, drafter, k policy, engine thread, uvicorn, signals
    engine.py     the engine thread: the only thread touching the model; an inbox in, callbacks out
    engine_process.py  --engine-process: that engine loop in a child process, a proxy with its interface here
    app.py        the FastAPI endpoints
    protocol.py   request checking (400s naming the field), error bodies, the stats of a choice
    text.py       streamed text (the engine's incremental detokenizer, stop strings held back)
    metrics.py    the Prometheus metrics (prometheus-client): histograms, counters, gauges

Needs the ``serve`` extra (fastapi, uvicorn, prometheus-client). See docs/serving.md.
"""
