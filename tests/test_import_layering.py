"""The package's layers hold: each imports only what sits below it.

Each layer is imported in a fresh process, and the test lists what that import loaded.
The NumPy specification must not load torch or matplotlib; the torch modules must not
load the specification (the tests compare the two, so neither may lean on the other);
only the layer above both, :mod:`mha.convert`, knows both.

Fresh, and cheap: one interpreter imports nothing but the standard library, another
only torch, and each statement runs in a child forked from the one its rule allows
(torch, 2.5 s to import, is then imported twice instead of nine times). A child starts
from its parent's modules, so what it loaded is all it holds: torch's own modules
included, which changes nothing, since torch imports neither matplotlib nor mha.
"""

from __future__ import annotations

import functools
import json
import subprocess
import sys

import pytest

SPECIFICATION = ("mha.attention", "mha.params", "mha.kv_cache", "mha.masks", "mha.tiled",
                 "mha.cost", "mha.mla", "mha.mla_params", "mha.paged_cache", "mha.quant_cache",
                 "mha.rope_scaling", "mha.backward", "mha.layer_backward", "mha.tiled_backward",
                 "mha.attention_cost")  # fmt: skip
TOP = ("mha.convert", "mha.gqa_pooling", "mha.draw", "mha.translator", "mha.bench",
       "mha.exercises")  # fmt: skip

# statement to run -> modules it must not load
RULES = {
    "import mha": ("torch", "matplotlib", *SPECIFICATION, "mha.positional"),
    "import mha; mha.multi_head_attention; mha.causal_mask; mha.sinusoidal_positional_encoding": (
        "torch", "matplotlib", *TOP,
    ),
    "import mha; mha.flash_attention; mha.peak_memory_bytes": ("torch", "matplotlib", *TOP),
    "import mha; mha.kv_cache_bytes; mha.PUBLISHED_MODELS": ("torch", "matplotlib", *TOP),
    "import mha.exercises": ("torch", "matplotlib"),
    "import mha.kv_cache_torch": ("matplotlib", *SPECIFICATION, "mha.positional", *TOP,
                                  "mha.modules", "mha.layers", "mha.transformer"),
    "import mha.positional_torch": ("matplotlib", *SPECIFICATION, "mha.positional", *TOP,
                                    "mha.modules", "mha.layers", "mha.transformer"),
    "import mha.modules": ("matplotlib", *SPECIFICATION, "mha.positional", *TOP,
                           "mha.layers", "mha.transformer"),
    "import mha.layers": ("matplotlib", *SPECIFICATION, "mha.positional", *TOP,
                          "mha.transformer"),
    "import mha.masks_torch": ("matplotlib", *SPECIFICATION, "mha.positional", *TOP,
                               "mha.modules"),
    # The Transformer reads the sinusoidal table from mha.positional: data, not the
    # attention under test (the one import of the specification by a torch layer).
    "import mha.transformer": ("matplotlib", *SPECIFICATION, *TOP),
    "import mha.convert": ("matplotlib", "mha.draw", "mha.translator", "mha.bench",
                           "mha.gqa_pooling"),
    "import mha.gqa_pooling": ("matplotlib", *SPECIFICATION, "mha.positional",
                               "mha.convert", "mha.draw", "mha.translator", "mha.bench"),
    "import mha.translator": ("matplotlib", "mha.draw", "mha.bench", "mha.exercises",
                              *SPECIFICATION),
    "import mha.draw": ("torch", "mha.translator", "mha.bench"),
    "import mha; mha.mla_steps; mha.PagedKVCache; mha.QuantizedKVCache": (
        "torch", "matplotlib", *TOP),
    # The compressed caches in torch: their own code, beside the torch KV cache and
    # module they plug into, never the specification's.
    "import mha.mla_torch": ("matplotlib", *SPECIFICATION, "mha.positional", *TOP,
                             "mha.modules", "mha.layers", "mha.transformer"),
    # RoPE past its training length: each layer computes its own frequencies.
    "import mha.rope_scaling": ("torch", "matplotlib", *TOP),
    "import mha.rope_scaling_torch": ("matplotlib", *SPECIFICATION, "mha.positional", *TOP,
                                      "mha.modules", "mha.layers", "mha.transformer"),
    # Attention's backward by hand: NumPy, beside the forward it differentiates.
    "import mha.backward": ("torch", "matplotlib", *TOP),
    "import mha.paged_cache_torch; import mha.quant_cache_torch": (
        "matplotlib", *SPECIFICATION, "mha.positional", *TOP, "mha.layers",
        "mha.transformer"),
}  # fmt: skip


# Reads statements on stdin, one a line; for each, forks a child that runs it and writes
# the sorted names of every module it then holds, as one JSON line.
_FORK_SERVER = """
import json, os, sys
{preload}
for statement in sys.stdin:
    read, write = os.pipe()
    if os.fork() == 0:
        os.close(read)
        exec(statement)
        os.write(write, (json.dumps(sorted(sys.modules)) + "\\n").encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as pipe:
        print(pipe.read(), end="", flush=True)
    os.wait()
"""


@functools.cache
def _loaded() -> dict[str, set[str]]:
    """What each statement of RULES loads, from a child of a bare interpreter, or of one
    that has imported torch when the rule allows torch."""
    found = {}
    for preload in ("", "import torch"):
        statements = [s for s in sorted(RULES) if ("torch" in RULES[s]) == (not preload)]
        out = subprocess.run(
            [sys.executable, "-c", _FORK_SERVER.format(preload=preload)],
            input="".join(f"{s}\n" for s in statements), capture_output=True, text=True,
            check=True,
        ).stdout.splitlines()
        assert len(out) == len(statements), out
        found |= {s: set(json.loads(line)) for s, line in zip(statements, out, strict=True)}
    return found


def loaded_by(statement: str) -> set[str]:
    return _loaded()[statement]


def forbidden(loaded: set[str], names: tuple[str, ...]) -> list[str]:
    return sorted(m for m in loaded for n in names if m == n or m.startswith(n + "."))


@pytest.mark.slow
@pytest.mark.parametrize("statement", sorted(RULES))
def test_layer_loads_nothing_above_it(statement):
    loaded = loaded_by(statement)
    assert statement.split(";")[0].split()[-1] in loaded
    assert not forbidden(loaded, RULES[statement]), (
        f"`{statement}` loaded {forbidden(loaded, RULES[statement])}"
    )


def test_the_check_matches_whole_module_names():
    """A forbidden package counts with its submodules, and only with them: "torch"
    catches torch.nn, not torchvision; "mha.draw" does not catch mha.drawing."""
    loaded = {"torch", "torch.nn", "torchvision", "mha.draw.style", "mha.drawing"}
    assert forbidden(loaded, ("torch",)) == ["torch", "torch.nn"]
    assert forbidden(loaded, ("mha.draw",)) == ["mha.draw.style"]
    assert forbidden(loaded, ("numpy",)) == []


def test_the_package_names_exactly_what_the_specification_exports():
    """``mha/__init__.py`` lists the names it loads lazily; they must not drift from
    the ``__all__`` of the modules that define them."""
    import importlib

    import mha

    for module, names in mha._SPECIFICATION.items():
        assert sorted(names) == sorted(importlib.import_module(module).__all__), module
    assert mha.__all__ == sorted(n for names in mha._SPECIFICATION.values() for n in names)


LONGEST_MODULE = 500  # lines: one idea per module, a few hundred lines at most


def too_long(root) -> list[str]:
    """The modules of the package longer than ``LONGEST_MODULE`` lines."""
    from pathlib import Path

    return sorted(f"{path.relative_to(root)}: {n} lines"
                  for path in Path(root).rglob("*.py")
                  if (n := len(path.read_text(encoding="utf-8").splitlines())) > LONGEST_MODULE)


def test_no_module_of_mha_is_longer_than_the_house_allows():
    """CONVENTIONS: one idea per module, a few hundred lines at most; a module that grows
    past it is split by idea (mha.mla_params from mha.mla, mha.tiled_backward from
    mha.backward, the checkers' registry from mha.exercises)."""
    from pathlib import Path

    import mha

    assert too_long(Path(mha.__file__).parent) == []


def test_the_length_rule_sees_a_long_module(tmp_path):
    (tmp_path / "short.py").write_text("x = 1\n")
    (tmp_path / "long.py").write_text("x = 1\n" * (LONGEST_MODULE + 1))
    assert too_long(tmp_path) == [f"long.py: {LONGEST_MODULE + 1} lines"]
