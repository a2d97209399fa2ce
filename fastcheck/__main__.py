"""python -m fastcheck: the command line (``fastcheck demo``, ``fastcheck check``, ``fastcheck bench``)."""

from fastcheck.integrations.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
