"""``python -m mha.bench``: run :func:`mha.bench.cli.main`."""

from mha.bench.cli import main

if __name__ == "__main__":
    main()
