"""The tiny translator: a real encoder-decoder Transformer, trained in seconds on a CPU.

It sits on top of the rest of :mod:`mha` (it uses :class:`mha.transformer.Transformer`)
and has one module per job:

* :mod:`~mha.translator.lexicon`: the words, with their Spanish forms;
* :mod:`~mha.translator.grammar`: noun phrases, sentences and fixed phrases
  (:class:`Example`), and the random sentence sampler;
* :mod:`~mha.translator.vocab`: words <-> ids (:class:`Vocab`) and ``tokenize``;
* :mod:`~mha.translator.corpus`: the generated English -> Spanish corpus (no download),
  its train, held-out and compositional splits (:func:`generate_corpus`);
* :mod:`~mha.translator.length_split`: sentences longer than training
  (:func:`length_probes`), and the corpus split by length;
* :mod:`~mha.translator.training`: the recipe (:class:`Recipe`, :class:`TrainConfig`),
  the training loop (:func:`~mha.translator.training.fit`) and :func:`train`;
* :mod:`~mha.translator.decoding`: greedy decoding and the :class:`Translator`;
* :mod:`~mha.translator.evaluation`: whole-sentence exact match on the splits;
* :mod:`~mha.translator.checkpoint`: pickle-free ``.npz`` checkpoints, and the one
  shipped with the book (:func:`load_pretrained`).
* :mod:`~mha.translator.lengths`: ``python -m mha.translator.lengths``, the
  length-generalisation experiment of each position scheme on the length split;
* :mod:`~mha.translator.lm_data`, :mod:`~mha.translator.lm_model`,
  :mod:`~mha.translator.lm_training` and :mod:`~mha.translator.lm_lengths`:
  ``python -m mha.translator.lm_lengths``, the same question asked of a causal
  language model (its documents, its model, one run through the same training loop,
  the study); :mod:`~mha.translator.study`, what the two studies' command lines share.

``python -m mha.translator`` trains one from scratch and prints its scores.
The names below are the ones the chapters use, e.g. ``mha.translator.train(config)``.
"""

from mha.translator.checkpoint import (
    CHECKPOINT,
    load_checkpoint,
    load_pretrained,
    model_config,
    read_metadata,
    save_checkpoint,
)
from mha.translator.corpus import Corpus, generate_corpus
from mha.translator.decoding import Translator, greedy_decode, greedy_margins
from mha.translator.evaluation import closest_deciding_margin, evaluate, exact_match
from mha.translator.grammar import Example
from mha.translator.length_split import length_probes
from mha.translator.training import (
    Recipe,
    TrainConfig,
    TrainResult,
    build_model,
    encode_examples,
    noam_lr,
    sequence_loss,
    train,
)
from mha.translator.vocab import Vocab

__all__ = [
    "CHECKPOINT",
    "Corpus",
    "Example",
    "Recipe",
    "TrainConfig",
    "TrainResult",
    "Translator",
    "Vocab",
    "build_model",
    "closest_deciding_margin",
    "encode_examples",
    "evaluate",
    "exact_match",
    "generate_corpus",
    "greedy_decode",
    "greedy_margins",
    "length_probes",
    "load_checkpoint",
    "load_pretrained",
    "model_config",
    "noam_lr",
    "read_metadata",
    "save_checkpoint",
    "sequence_loss",
    "train",
]
