def main(argv=None):
    raise SystemExit("verispec CLI: not built yet")
