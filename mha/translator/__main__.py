"""``python -m mha.translator``: train the tiny translator from scratch and print its scores.

It trains with the defaults of :class:`~mha.translator.training.TrainConfig`
(``--seed``, ``--steps``, ``--position-scheme``, ``--save PATH`` and ``--progress`` change
them), prints the exact match on the fixed phrases and on the compositional split
and, as its last line, ``held-out exact match: <fraction>``. ``--save`` writes a
checkpoint with the recipe, the scores, the loss of every step and the environment they
were measured in; the shipped one, ``mha/translator/checkpoints/translator.npz``, was
written this way (see :mod:`mha.translator.checkpoint` for its ``short_run``).
"""

from __future__ import annotations

import argparse
from dataclasses import asdict

from mha.transformer import POSITION_SCHEMES
from mha.translator.checkpoint import save_checkpoint
from mha.translator.evaluation import evaluate
from mha.translator.training import TrainConfig, environment, train


def main(argv: list[str] | None = None) -> int:
    """Command line: train, optionally save, print the scores (held-out last)."""
    parser = argparse.ArgumentParser(
        prog="python -m mha.translator", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--seed", type=int, default=TrainConfig.seed, help="seed (default 0)")
    parser.add_argument("--steps", type=int, default=TrainConfig.steps, help="optimizer steps")
    parser.add_argument(
        "--position-scheme", choices=POSITION_SCHEMES, default=TrainConfig.position_scheme,
        help="position scheme (default sinusoidal, as the shipped checkpoint)",
    )
    parser.add_argument(
        "--save", metavar="PATH", help="write the trained model to this .npz checkpoint"
    )
    parser.add_argument("--progress", action="store_true", help="progress display on stderr")
    args = parser.parse_args(argv)
    config = TrainConfig(
        seed=args.seed, steps=args.steps, position_scheme=args.position_scheme
    )
    result = train(config, progress=args.progress)
    scores = evaluate(result.translator, result.corpus)
    print(f"trained {config.steps} steps in {result.seconds:.1f} s, seed {config.seed}")
    if args.save:
        extra = {"train_config": asdict(config), "scores": scores, "losses": result.losses,
                 "environment": environment(config.num_threads)}  # fmt: skip
        save_checkpoint(args.save, result.translator, extra=extra)
        print(f"saved {args.save}")
    print(f"fixed phrases exact match: {scores['phrases']:.4f}")
    print(f"compositional exact match: {scores['compositional']:.4f}")
    print(f"held-out exact match: {scores['heldout']:.4f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
