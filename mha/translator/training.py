"""Train the tiny English -> Spanish translator from scratch, in seconds on a CPU.

Recipe: teacher forcing (the decoder reads the reference shifted right by ``<s>``),
label-smoothed cross-entropy that ignores padding, Adam with the paper's warm-up
schedule ``lr = scale * d_model**-0.5 * min(step**-0.5, step * warmup**-1.5)``
(Vaswani et al., 2017) plus a small decoupled weight decay (AdamW). Label smoothing
and weight decay are what made the compositional score steady across seeds; dropout
did too, but cost a third more time per step.

Determinism: the corpus generator, torch's initialiser and the batch shuffler are all
seeded from ``TrainConfig.seed`` and training runs on a fixed number of threads
(``TrainConfig.num_threads``, 1 by default: on these tiny matrices a second thread only
adds synchronisation), so the same seed gives bit-identical weights on the same kind of
machine. (1 and 2 threads give different bits: the order of floating-point sums
changes.)
"""

from __future__ import annotations

import platform
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from mha.threads import num_threads
from mha.transformer import Transformer
from mha.translator.corpus import Corpus, generate_corpus
from mha.translator.decoding import Translator
from mha.translator.grammar import Example
from mha.translator.vocab import Vocab

__all__ = [
    "Fit",
    "Recipe",
    "TrainConfig",
    "TrainResult",
    "build_model",
    "encode_examples",
    "environment",
    "fit",
    "noam_lr",
    "sequence_loss",
    "train",
]


@dataclass(frozen=True)
class Recipe:
    """How a model is trained here: the seed, the optimisation and the threads.

    The translator (:class:`TrainConfig`) and the language-model length study
    (``mha.translator.lm_training.LMConfig``) both extend it, and :func:`fit` reads it.
    """

    seed: int = 0
    steps: int = 500
    batch_size: int = 64
    warmup: int = 100
    lr_scale: float = 1.0
    betas: tuple[float, float] = (0.9, 0.98)
    eps: float = 1e-9
    label_smoothing: float = 0.1
    weight_decay: float = 0.1  # > 0: AdamW (decoupled decay) instead of Adam
    num_threads: int = 1


@dataclass(frozen=True)
class TrainConfig(Recipe):
    """Everything that determines a training run: the :class:`Recipe`, the corpus and
    the model.

    The defaults are tuned to reach >= 0.99 exact match on the random held-out split
    and >= 0.95 on the compositional split in well under 10 s on a 2-core CPU.
    """

    # corpus (see mha.translator.corpus.generate_corpus)
    num_train: int = 10000
    num_heldout: int = 1000
    num_compositional: int = 1000
    # model (see mha.transformer.Transformer)
    d_model: int = 32
    num_heads: int = 2
    num_encoder_layers: int = 1
    num_decoder_layers: int = 1
    d_ff: int = 64
    dropout: float = 0.0
    max_len: int = 32
    norm_first: bool = False
    position_scheme: str = "sinusoidal"  # or "none", "rope", "alibi", ...: see Transformer
    embedding_std: float | None = None  # None: keep Transformer's N(0, d_model**-0.5)


@dataclass
class TrainResult:
    """What :func:`train` returns.

    Attributes
    ----------
    translator : Translator
        The trained model (in eval mode) and its vocabularies.
    corpus : Corpus
        The corpus it was trained on (with the held-out splits).
    config : TrainConfig
    losses : list of float
        Mean label-smoothed training cross-entropy (nats per target token) of every
        step; it cannot fall below the entropy of the smoothed target.
    learning_rates : list of float
        Learning rate used at every step.
    seconds : float
        Wall time of the optimisation loop (machine-dependent: do not print it in a
        stored notebook output).
    """

    translator: Translator
    corpus: Corpus
    config: TrainConfig
    losses: list[float] = field(default_factory=list)
    learning_rates: list[float] = field(default_factory=list)
    seconds: float = 0.0


def noam_lr(step: int, d_model: int, warmup: int, scale: float = 1.0) -> float:
    """The paper's schedule: linear warm-up for ``warmup`` steps, then ``step**-0.5`` decay.

    ``step`` counts from 1. The peak, at ``step == warmup``, is
    ``scale * (d_model * warmup)**-0.5``.
    """
    if step < 1:
        raise ValueError(f"step counts from 1, got {step}")
    return scale * d_model**-0.5 * min(step**-0.5, step * warmup**-1.5)


def sequence_loss(
    logits: Tensor, tgt_out: Tensor, pad_id: int, label_smoothing: float = 0.0
) -> Tensor:
    """Mean cross-entropy over the real target tokens; padded positions count for nothing.

    Parameters
    ----------
    logits : Tensor
        ``(B, T, V)`` decoder outputs.
    tgt_out : Tensor
        ``(B, T)`` the tokens to predict, ``pad_id`` after each sentence's ``</s>``.
    pad_id : int
    label_smoothing : float
        Mix this much of the uniform distribution into each target (the paper uses 0.1).

    Returns
    -------
    Tensor
        Scalar: nats per (non-padding) target token.
    """
    if logits.ndim != 3 or logits.shape[:2] != tgt_out.shape:
        raise ValueError(
            f"logits (B, T, V) and tgt_out (B, T) disagree: logits {tuple(logits.shape)}, "
            f"tgt_out {tuple(tgt_out.shape)}"
        )
    return F.cross_entropy(
        logits.flatten(0, 1),  # (B, T, V) -> (B*T, V)
        tgt_out.flatten(),  # (B, T) -> (B*T,)
        ignore_index=pad_id,
        label_smoothing=label_smoothing,
    )


def encode_examples(
    examples: list[Example], src_vocab: Vocab, tgt_vocab: Vocab
) -> tuple[Tensor, Tensor, Tensor]:
    """Pad a list of examples into the three tensors of teacher forcing.

    Returns
    -------
    src : Tensor
        ``(N, S)`` source ids.
    tgt_in : Tensor
        ``(N, T)`` ``<s> y_1 ... y_n`` — what the decoder reads.
    tgt_out : Tensor
        ``(N, T)`` ``y_1 ... y_n </s>`` — what it must predict at each position.
    """
    if not examples:
        raise ValueError("examples is empty")
    src_rows = [src_vocab.encode(e.source) for e in examples]
    tgt_rows = [tgt_vocab.encode(e.target, add_bos=True, add_eos=True) for e in examples]
    S = max(len(r) for r in src_rows)
    T = max(len(r) for r in tgt_rows) - 1
    # Pad in Python and convert once: one tensor per row would cost 10x more.
    src = torch.tensor([r + [src_vocab.pad_id] * (S - len(r)) for r in src_rows])  # (N, S)
    tgt = torch.tensor([r + [tgt_vocab.pad_id] * (T + 1 - len(r)) for r in tgt_rows])  # (N, T+1)
    return src, tgt[:, :-1], tgt[:, 1:]  # shift by one: input <s>..y_n, output y_1..</s>


def environment(num_threads: int) -> dict[str, object]:
    """Where a training run's numbers come from: the torch version, the CPU capability
    its kernels were chosen for, the thread count and Python (results files and
    checkpoints record it, since training results differ from CPU to CPU)."""
    return {
        "torch": torch.__version__,
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "num_threads": num_threads,
        "python": platform.python_version(),
    }


def build_model(config: TrainConfig, src_vocab_size: int, tgt_vocab_size: int) -> Transformer:
    """A freshly initialised Transformer for ``config`` (seeded by the caller)."""
    model = Transformer(
        src_vocab_size,
        tgt_vocab_size,
        d_model=config.d_model,
        num_heads=config.num_heads,
        num_encoder_layers=config.num_encoder_layers,
        num_decoder_layers=config.num_decoder_layers,
        d_ff=config.d_ff,
        dropout=config.dropout,
        max_len=config.max_len,
        pad_id=Vocab.pad_id,
        norm_first=config.norm_first,
        position_scheme=config.position_scheme,
    )
    if config.embedding_std is not None:  # to demonstrate the initialisation trap
        for embedding in (model.src_embedding, model.tgt_embedding):
            nn.init.normal_(embedding.weight, mean=0.0, std=config.embedding_std)
    return model


M = TypeVar("M", bound=nn.Module)


@dataclass
class Fit(Generic[M]):
    """What :func:`fit` returns: the model (in eval mode), the mean loss and the
    learning rate of every step, and the loop's wall time (machine-dependent)."""

    model: M
    losses: list[float]
    learning_rates: list[float]
    seconds: float


def fit(
    config: Recipe,
    d_model: int,
    build: Callable[[], M],
    num_examples: int,
    batch_loss: Callable[[M, Tensor], Tensor],
    after_step: Callable[[int, M, list[float]], None] | None = None,
) -> Fit[M]:
    """The training loop of the translator and of the LM study: one recipe, one order.

    Inside ``num_threads(config.num_threads)``, in this order (each seeded draw comes
    after the one before it, so the order is part of the result): ``torch.manual_seed``,
    then ``build()`` (the initial weights), a batch shuffler seeded with the same seed,
    Adam (AdamW when ``weight_decay > 0``, fused) under the warm-up schedule
    :func:`noam_lr`, then ``config.steps`` steps over batches of ``config.batch_size``
    examples drawn without replacement (a new permutation each epoch, the remainder
    dropped).

    Parameters
    ----------
    config : Recipe
    d_model : int
        The model's width, which scales the learning rate (:func:`noam_lr`).
    build : callable
        Returns a freshly initialised model (seeded here, just before the call).
    num_examples : int
        N: the examples are ``0 .. N - 1``; ``batch_loss`` gets their indices.
    batch_loss : callable
        ``batch_loss(model, idx)`` -> scalar loss of the examples ``idx`` ``(B,)``.
    after_step : callable, optional
        ``after_step(step, model, losses)`` after each optimizer step (``step`` counts
        from 1): progress, evaluation. It must leave the model in training mode.

    Returns
    -------
    Fit
    """
    if config.batch_size > num_examples:
        raise ValueError(
            f"batch_size={config.batch_size} is larger than the {num_examples} examples"
        )
    with num_threads(config.num_threads):  # the thread count changes the bits: fix it
        torch.manual_seed(config.seed)  # initial weights
        model = build()
        shuffler = torch.Generator().manual_seed(config.seed)  # batch order
        adam = torch.optim.AdamW if config.weight_decay > 0 else torch.optim.Adam
        optimizer = adam(
            model.parameters(),
            lr=1.0,  # the scheduler's factor *is* the learning rate
            betas=config.betas,
            eps=config.eps,
            weight_decay=config.weight_decay,
            fused=True,  # one kernel per step instead of one per parameter tensor
        )
        scheduler = torch.optim.lr_scheduler.LambdaLR(
            optimizer, lambda i: noam_lr(i + 1, d_model, config.warmup, config.lr_scale)
        )
        model.train()
        losses: list[float] = []
        lrs: list[float] = []
        order = torch.randperm(num_examples, generator=shuffler)
        cursor = 0
        start = time.perf_counter()
        for step in range(1, config.steps + 1):
            if cursor + config.batch_size > num_examples:  # new epoch: reshuffle, drop the rest
                order = torch.randperm(num_examples, generator=shuffler)
                cursor = 0
            idx = order[cursor : cursor + config.batch_size]  # (B,)
            cursor += config.batch_size
            loss = batch_loss(model, idx)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            lrs.append(optimizer.param_groups[0]["lr"])
            optimizer.step()
            scheduler.step()
            losses.append(loss.item())
            if after_step is not None:
                after_step(step, model, losses)
        seconds = time.perf_counter() - start
        model.eval()
    return Fit(model, losses, lrs, seconds)


def train(
    config: TrainConfig | None = None, *, corpus: Corpus | None = None, progress: bool = False
) -> TrainResult:
    """Train a translator from scratch (teacher forcing, through :func:`fit`).

    Parameters
    ----------
    config : TrainConfig, optional
        Defaults to ``TrainConfig()``.
    corpus : Corpus, optional
        Defaults to ``generate_corpus(config.seed, ...)`` with the config's sizes.
    progress : bool
        Write a one-line progress display to stderr (off by default so that notebook
        outputs stay byte-reproducible).

    Returns
    -------
    TrainResult
        The trained translator, the corpus, the per-step losses and learning rates.
    """
    config = config or TrainConfig()
    if corpus is None:
        corpus = generate_corpus(
            config.seed,
            num_train=config.num_train,
            num_heldout=config.num_heldout,
            num_compositional=config.num_compositional,
        )
    src, tgt_in, tgt_out = encode_examples(corpus.train, corpus.src_vocab, corpus.tgt_vocab)
    pad_id = corpus.tgt_vocab.pad_id

    def batch_loss(model: Transformer, idx: Tensor) -> Tensor:
        logits = model(src[idx], tgt_in[idx])  # (B, S), (B, T) -> (B, T, V)
        return sequence_loss(logits, tgt_out[idx], pad_id, config.label_smoothing)

    def show_progress(step: int, _model: Transformer, losses: list[float]) -> None:
        if step % 50 == 0 or step == config.steps:
            print(
                f"\rstep {step}/{config.steps}  loss {losses[-1]:.3f}",
                end="" if step < config.steps else "\n",
                file=sys.stderr,
                flush=True,
            )

    done = fit(
        config,
        config.d_model,
        lambda: build_model(config, len(corpus.src_vocab), len(corpus.tgt_vocab)),
        src.shape[0],
        batch_loss,
        show_progress if progress else None,
    )
    translator = Translator(done.model, corpus.src_vocab, corpus.tgt_vocab)
    return TrainResult(
        translator, corpus, config, done.losses, done.learning_rates, done.seconds
    )
