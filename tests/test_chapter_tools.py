"""An author's loop (issue 31): the one-chapter check and the chapter scaffold.

* ``tools.nbtools compare`` finds what nbval would find, and only that.
"""

from __future__ import annotations

import json

import nbformat
import pytest

from tools import nbtools

pytestmark = pytest.mark.no_cover  # tools only: no mha code runs in this process


# --- comparing a fresh run with the stored notebook ------------------------------------


def _notebook(*cells):
    nb = nbformat.v4.new_notebook()
    for index, (source, outputs, tags) in enumerate(cells):
        cell = nbformat.v4.new_code_cell(source, execution_count=index + 1,
                                         metadata={"tags": tags} if tags else {})
        cell.id = f"c{index}"
        cell.outputs = [nbformat.from_dict(out) for out in outputs]
        nb.cells.append(cell)
    return nb


def _stream(text):
    return {"output_type": "stream", "name": "stdout", "text": text}


def _data(**data):
    return {"output_type": "display_data", "data": data, "metadata": {}}


def test_the_comparison_sees_what_nbval_sees_and_nothing_else():
    stored = _notebook(
        ("print(x)", [_stream("[0.5 0.25]\n")], []),
        ("fig", [_data(**{"image/svg+xml": "<svg>a</svg>", "image/png": "AAA",
                          "text/plain": "<Figure>"})], []),
        ("train()", [_stream("loss 0.31\n")], ["nbval-ignore-output"]),
        ("obj", [_data(**{"text/plain": "<A at 0x7f00aa11bb22>"})], []),
        ("print(y)", [_stream("a\n"), _stream("b\n")], []),
    )
    fresh = nbformat.from_dict(json.loads(json.dumps(stored)))
    fresh.cells[1].outputs[0]["data"]["image/png"] = "BBB"  # nbval skips PNG
    fresh.cells[2].outputs[0]["text"] = "loss 0.29\n"  # ignored by its tag
    fresh.cells[3].outputs[0]["data"]["text/plain"] = "<A at 0x7f00cc33dd44>"  # sanitized
    fresh.cells[4].outputs = [nbformat.from_dict(_stream("a\nb\n"))]  # streams coalesced
    patterns = nbtools.sanitizers()
    assert nbtools.output_differences(stored, fresh, patterns) == []

    fresh.cells[0].outputs[0]["text"] = "[0.5 0.26]\n"
    fresh.cells[1].outputs[0]["data"]["image/svg+xml"] = "<svg>b</svg>"
    found = nbtools.output_differences(stored, fresh, patterns)
    assert [line.split(":")[0] for line in found] == [
        "cell 0 (id c0) ['print(x)']", "cell 1 (id c1) ['fig']"]
    assert "stdout differs" in found[0] and "-[0.5 0.25]" in found[0]
    assert "+[0.5 0.26]" in found[0]
    assert "image/svg+xml differs" in found[1]


def test_the_comparison_names_a_stale_notebook():
    stored = _notebook(("a = 1", [], []), ("print(a)", [_stream("1\n")], []))
    fresh = _notebook(("a = 2", [], []), ("print(a)", [_stream("1\n")], []),
                      ("b = 3", [], []))
    found = nbtools.output_differences(stored, fresh, {})
    assert found == [
        "cell 0 (id c0): its source changed since the notebook was stored (run make "
        "notebooks)",
        "cell 2 (id c2): not in the stored notebook (run make notebooks)",
    ]
    del fresh.cells[1]
    assert nbtools.output_differences(stored, fresh, {})[-1].startswith(
        "cell 1 (id c1) of the stored notebook: no longer in the source")
