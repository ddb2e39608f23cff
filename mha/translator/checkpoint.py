"""Pickle-free checkpoints for the tiny translator.

A checkpoint is one ``.npz`` file (NumPy's zip of arrays): every tensor of the
model's ``state_dict`` as a float32 array, plus one string array ``__meta__`` holding
JSON: the model's constructor arguments (its ``config``, all of them), both
vocabularies and free-form notes. It is read with ``np.load(..., allow_pickle=False)``,
so loading a checkpoint can never run code.

The shipped one's notes (``read_metadata(CHECKPOINT)["extra"]``) hold its training
recipe and scores, and a ``short_run``: what ``python -m mha.translator --steps 100
--save PATH`` recorded (the loss of each step, the scores, the environment they were
measured in), which the tests re-run in seconds. Neither the Noam schedule nor the batch
order depends on the number of steps, so those are the first 100 steps of the shipped
recipe.
"""

from __future__ import annotations

import inspect
import json
import os
from pathlib import Path

import numpy as np
import torch

from mha.transformer import Transformer
from mha.translator.decoding import Translator
from mha.translator.vocab import Vocab

__all__ = [
    "CHECKPOINT",
    "load_checkpoint",
    "load_pretrained",
    "model_config",
    "read_metadata",
    "save_checkpoint",
]

#: The checkpoint shipped with the package (written by ``python -m mha.translator --save``).
CHECKPOINT = Path(__file__).with_name("checkpoints") / "translator.npz"

_META_KEY = "__meta__"

#: Constructor arguments that ``Transformer`` gained after checkpoints were first
#: written, each with the value that every checkpoint written before it had (there was
#: no other): a stored config without one of these is read with that value.
_ADDED_LATER = {"position_scheme": "sinusoidal"}
#: Constructor arguments that ``Transformer`` renamed, old name -> new: a stored config
#: with the old name is read under the new one.
_RENAMED = {"positions": "position_scheme"}


def model_config(model: Transformer) -> dict[str, object]:
    """The constructor arguments ``model`` was built with (a copy of ``model.config``).

    ``Transformer(**model_config(model))`` rebuilds the same architecture. The dict is
    the model's own record, not a reading of its submodules, so no argument (such as
    ``layer_norm_eps``) can be forgotten.
    """
    return dict(model.config)


def save_checkpoint(
    path: str | os.PathLike[str], translator: Translator, extra: dict[str, object] | None = None
) -> None:
    """Save model weights, architecture and vocabularies to one ``.npz`` without pickle.

    Parameters
    ----------
    path : path-like
        Destination; ``.npz`` is appended by NumPy if missing.
    translator : Translator
    extra : dict, optional
        JSON-serialisable notes stored with the metadata (e.g. training settings and
        scores).
    """
    meta = {
        "model": model_config(translator.model),
        "src_vocab": translator.src_vocab.tokens,
        "tgt_vocab": translator.tgt_vocab.tokens,
        "extra": extra or {},
    }
    arrays = {
        name: t.detach().to(torch.float32).cpu().numpy()
        for name, t in translator.model.state_dict().items()
    }
    if _META_KEY in arrays:
        raise ValueError(f"a state_dict entry is called {_META_KEY!r}")
    arrays[_META_KEY] = np.array(json.dumps(meta, ensure_ascii=False))  # unicode, not object
    np.savez_compressed(path, **arrays)


def read_metadata(path: str | os.PathLike[str]) -> dict[str, object]:
    """The JSON metadata of a checkpoint (architecture, vocabularies, extra notes)."""
    with np.load(path, allow_pickle=False) as data:
        return json.loads(str(data[_META_KEY]))


def load_checkpoint(path: str | os.PathLike[str]) -> Translator:
    """Rebuild a :class:`Translator` from a checkpoint, never unpickling anything.

    The model is ``Transformer(**config)`` with the stored config, which must name
    every constructor argument: nothing is filled in with a default. The one
    exceptions: an argument added after checkpoints existed (``position_scheme``) is
    read, where a config written before it has none, with the only value there was
    then (``"sinusoidal"``); and a renamed argument (``positions``, now
    ``position_scheme``) is read under its new name.

    Raises
    ------
    ValueError
        If the file lacks the metadata, its config misses an argument of
        ``Transformer`` or names one it does not have, or its tensors do not match
        the architecture.
    """
    with np.load(path, allow_pickle=False) as data:
        if _META_KEY not in data.files:
            raise ValueError(f"{path} is not a translator checkpoint: no {_META_KEY!r} entry")
        meta = json.loads(str(data[_META_KEY]))
        state = {k: torch.from_numpy(data[k]) for k in data.files if k != _META_KEY}
    config = _ADDED_LATER | {_RENAMED.get(k, k): v for k, v in meta["model"].items()}
    expected = set(inspect.signature(Transformer).parameters)
    unknown, missing = sorted(set(config) - expected), sorted(expected - set(config))
    if unknown or missing:
        raise ValueError(
            f"{path} does not describe a Transformer of this version of mha: unknown "
            f"argument(s) {unknown}, missing {missing} (re-save it with save_checkpoint)"
        )
    model = Transformer(**config)
    missing, unexpected = model.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise ValueError(
            f"{path} does not match Transformer({config}): missing {missing}, "
            f"unexpected {unexpected}"
        )
    model.eval()
    src_vocab = Vocab.from_json(json.dumps(meta["src_vocab"]))
    tgt_vocab = Vocab.from_json(json.dumps(meta["tgt_vocab"]))
    return Translator(model, src_vocab, tgt_vocab)


def load_pretrained() -> Translator:
    """Load the checkpoint shipped in ``mha/translator/checkpoints/`` (about a second)."""
    return load_checkpoint(CHECKPOINT)
