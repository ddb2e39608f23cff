"""What the two length studies share: their command lines' list arguments, and
writing a short arm into a results file.

``python -m mha.translator.lengths`` (the translator) and ``python -m
mha.translator.lm_lengths`` (the causal language model) both take comma-separated
schemes and seeds, and both can re-record their short arm alone (``--short-only``)
beside main runs measured before.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

__all__ = ["comma_list", "merge_into", "seed_list"]


def comma_list(text: str) -> list[str]:
    """An argparse type: ``"a, b"`` -> ``["a", "b"]``."""
    items = [t.strip() for t in text.split(",") if t.strip()]
    if not items:
        raise argparse.ArgumentTypeError(f"not a comma-separated list: {text!r}")
    return items


def seed_list(text: str) -> list[int]:
    """An argparse type: ``"0,1,2"`` -> ``[0, 1, 2]``."""
    try:
        return [int(t) for t in comma_list(text)]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a comma-separated list of seeds: {text!r}") from None


def merge_into(path: Path, block: dict[str, Any]) -> dict[str, Any]:
    """The results document at ``path`` (empty if there is none) with the entries of
    ``block`` put in, each in its old place if it had one: how ``--short-only``
    records a short arm beside main runs measured before."""
    document = json.loads(path.read_text()) if path.exists() else {}
    document.update(block)
    return document
