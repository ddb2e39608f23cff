"""Training the tiny translator: schedule, loss, determinism, and the command line."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import asdict

import pytest
import torch

from mha.translator import (
    CHECKPOINT,
    TrainConfig,
    encode_examples,
    generate_corpus,
    noam_lr,
    read_metadata,
    sequence_loss,
    train,
)

TINY = TrainConfig(num_train=300, num_heldout=20, num_compositional=20, steps=12, batch_size=16)


@pytest.fixture(scope="module")
def tiny_corpus():
    return generate_corpus(0, num_train=300, num_heldout=20, num_compositional=20)


def test_noam_schedule_warms_up_linearly_then_decays_as_inverse_sqrt():
    d, warmup = 32, 100
    peak = noam_lr(warmup, d, warmup)
    assert peak == pytest.approx((d * warmup) ** -0.5)
    assert noam_lr(50, d, warmup) == pytest.approx(peak / 2)  # linear rise
    assert noam_lr(400, d, warmup) == pytest.approx(peak / 2)  # 1/sqrt(4) decay
    assert max(noam_lr(s, d, warmup) for s in range(1, 1000)) == pytest.approx(peak)
    assert noam_lr(400, d, warmup, scale=3.0) == pytest.approx(1.5 * peak)
    with pytest.raises(ValueError, match="step counts from 1"):
        noam_lr(0, d, warmup)


def test_teacher_forcing_tensors_are_shifted_by_one(tiny_corpus):
    c = tiny_corpus
    src, tgt_in, tgt_out = encode_examples(c.train[:40], c.src_vocab, c.tgt_vocab)
    assert tgt_in.shape == tgt_out.shape and src.shape[0] == tgt_in.shape[0] == 40
    assert (tgt_in[:, 0] == c.tgt_vocab.bos_id).all()
    assert torch.equal(tgt_in[:, 1:], tgt_out[:, :-1])
    for row, ex in zip(tgt_out, c.train[:40], strict=True):
        n = len(ex.target)
        assert row[n] == c.tgt_vocab.eos_id and (row[n + 1 :] == c.tgt_vocab.pad_id).all()
        assert c.tgt_vocab.decode(row.tolist()) == list(ex.target)


def test_loss_ignores_padding():
    torch.manual_seed(0)
    logits = torch.randn(2, 4, 7)
    tgt_out = torch.tensor([[3, 4, 2, 0], [5, 2, 0, 0]])  # 0 = padding
    loss = sequence_loss(logits, tgt_out, pad_id=0)
    changed = logits.clone()
    changed[0, 3] += 100.0  # scores at padded positions must not matter
    changed[1, 2:] = torch.randn(2, 7)
    assert sequence_loss(changed, tgt_out, pad_id=0) == loss
    real = tgt_out != 0
    expected = torch.nn.functional.cross_entropy(logits[real], tgt_out[real])
    torch.testing.assert_close(loss, expected)
    with pytest.raises(ValueError, match=r"logits \(B, T, V\) and tgt_out \(B, T\) disagree"):
        sequence_loss(logits, tgt_out[:, :3], pad_id=0)


def test_training_is_deterministic_and_restores_threads(tiny_corpus):
    threads = torch.get_num_threads()
    a = train(TINY, corpus=tiny_corpus)
    b = train(TINY, corpus=tiny_corpus)
    c = train(TrainConfig(**{**TINY.__dict__, "seed": 1}), corpus=tiny_corpus)
    assert torch.get_num_threads() == threads
    assert len(a.losses) == len(a.learning_rates) == TINY.steps
    # exact: the same computation repeated (same seed, threads and CPU) gives the same bits
    assert a.losses == b.losses
    for (name, x), (_, y) in zip(
        a.translator.model.state_dict().items(), b.translator.model.state_dict().items(),
        strict=True,
    ):
        assert torch.equal(x, y), name
    assert a.losses != c.losses
    assert a.losses[-1] < a.losses[0]
    assert a.learning_rates[:3] == [noam_lr(s, TINY.d_model, TINY.warmup) for s in (1, 2, 3)]


def test_progress_goes_to_stderr_only_when_asked(capsys, tiny_corpus):
    config = TrainConfig(**{**TINY.__dict__, "steps": 50})
    train(config, corpus=tiny_corpus)
    out, err = capsys.readouterr()
    assert out == "" and err == ""
    train(config, corpus=tiny_corpus, progress=True)
    out, err = capsys.readouterr()
    assert out == "" and "step 50/50" in err


def test_batch_larger_than_corpus_is_refused(tiny_corpus):
    with pytest.raises(ValueError, match="batch_size=4096 is larger than"):
        train(TrainConfig(batch_size=4096), corpus=tiny_corpus)


@pytest.mark.slow
def test_command_reproduces_the_shipped_checkpoint(tmp_path):
    """``python -m mha.translator`` from scratch gets the shipped checkpoint's scores."""
    shipped = read_metadata(CHECKPOINT)["extra"]
    # The shipped model was trained with today's defaults (JSON turns tuples into lists).
    assert shipped["train_config"] == asdict(TrainConfig()) | {"betas": [0.9, 0.98]}
    path = tmp_path / "fresh.npz"
    run = subprocess.run(
        [sys.executable, "-m", "mha.translator", "--save", str(path)],
        capture_output=True, text=True, check=True,
    )
    assert run.stderr == ""  # no progress display unless asked for
    lines = run.stdout.strip().splitlines()
    assert lines[-2].startswith("compositional exact match: ")
    assert lines[-1].startswith("held-out exact match: ")
    heldout = float(lines[-1].rsplit(" ", 1)[1])
    compositional = float(lines[-2].rsplit(" ", 1)[1])
    # Training numbers differ from CPU to CPU (see chapter 7): the margins held on
    # every simulated CPU (tools/simulated_cpu.py), where seed 0 scored >= 0.996.
    assert heldout == pytest.approx(shipped["scores"]["heldout"], abs=0.02)
    assert compositional == pytest.approx(shipped["scores"]["compositional"], abs=0.07)
    assert heldout >= 0.98 and compositional >= 0.93
    fresh = read_metadata(path)["extra"]
    assert fresh["scores"]["heldout"] == pytest.approx(heldout, abs=1e-4)
    assert fresh["train_config"] == shipped["train_config"]
