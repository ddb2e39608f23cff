"""Book maintenance: regenerate the chapter notebooks and check them against their sources.

Each chapter has two files:

* ``book/chapters/NN_slug.md`` -- the jupytext MyST source people edit and review;
* ``book/notebooks/NN_slug.ipynb`` -- the same cells with stored outputs, which the
  site renders and nbval re-runs.

``python -m tools.nbtools regen [NAME ...]`` (``make notebooks``) rebuilds notebooks
from their sources with fresh outputs (jupytext pairs the cells, nbclient runs them,
nbformat writes).
Cell ids are kept where a cell is unchanged, new ids are derived from the cell's
content, and no timestamps are written, so regenerating twice from unchanged
sources gives byte-identical files.

``python -m tools.nbtools check`` (``make check-notebooks``) lists every disagreement
between sources and notebooks (the same checks ``tests/test_notebooks.py`` runs) and
exits non-zero if there is any.

``python -m tools.nbtools compare NAME [--out DIR]`` regenerates one chapter into
``DIR`` (``_build/chapter-check``), leaving the stored notebook alone, and compares
the two as nbval would: the outputs nbval compares (after its sanitizers,
``tests/nbval_sanitize.cfg``), not those of cells tagged ``nbval-ignore-output``. It
names each cell that differs and exits non-zero if any does (``make chapter-check``
runs it).
"""

from __future__ import annotations

import difflib
import hashlib
import os
import sys
from pathlib import Path

import jupytext
import nbformat

from tools import CHAPTERS, NOTEBOOKS, ROOT, cell_source

# Cell metadata that execution adds; everything else must match the source.
EXECUTION_METADATA = {"execution", "collapsed", "scrolled"}
IMAGE_TYPES = ("image/svg+xml", "image/png", "image/jpeg", "image/gif")


def kernel_env() -> dict[str, str]:
    """Environment for the kernels that run chapters (here and under nbval)."""
    env = dict(os.environ)
    # Inline figures vanish under the Agg backend (see PITFALLS.md).
    env.pop("MPLBACKEND", None)
    # Silences the debugger's "frozen modules" warning, which would land in stderr.
    env["PYDEVD_DISABLE_FILE_VALIDATION"] = "1"
    return env


def sources(chapters: Path = CHAPTERS) -> dict[str, Path]:
    return {p.stem: p for p in sorted(chapters.glob("*.md"))}


def notebooks(folder: Path = NOTEBOOKS) -> dict[str, Path]:
    return {p.stem: p for p in sorted(folder.glob("*.ipynb"))}


def _comparable_metadata(cell) -> dict:
    return {k: v for k, v in cell.get("metadata", {}).items() if k not in EXECUTION_METADATA}


def _content_id(cell, taken: set[str]) -> str:
    digest = hashlib.sha1(
        (cell["cell_type"] + "\0" + cell_source(cell)).encode("utf-8")
    ).hexdigest()
    for start in range(0, len(digest) - 8):
        candidate = digest[start : start + 8]
        if candidate not in taken:
            return candidate
    raise RuntimeError("could not find a free cell id")  # pragma: no cover


def _stable_new_ids(nb, old_nb) -> None:
    """Give cells that no old cell matched an id derived from their content.

    jupytext hands every cell it reads a random id; a cell it matched to a stored one
    carries that cell's id instead (see :func:`regenerate`). Only the new cells need
    one that does not change from run to run.
    """
    old_ids = {c.get("id") for c in old_nb.cells} if old_nb is not None else set()
    taken = {c["id"] for c in nb.cells if c.get("id") in old_ids}
    for cell in nb.cells:
        if cell.get("id") not in old_ids:
            cell["id"] = _content_id(cell, taken)
            taken.add(cell["id"])


def regenerate(
    name: str, chapters: Path = CHAPTERS, folder: Path = NOTEBOOKS, timeout: int = 900,
    cwd: Path | None = None,
) -> Path:
    """Rebuild ``<folder>/<name>.ipynb`` from ``<chapters>/<name>.md``, with fresh outputs.

    The source's cells are matched with the stored notebook's by jupytext (the
    function behind ``jupytext --update``), so an unchanged cell keeps its id;
    nbclient runs them without writing timings and with consecutive prints merged
    (the kernel flushes in chunks whose boundaries depend on timing). The kernel runs
    in ``cwd`` (default: ``folder``, where the notebook lives).
    """
    from jupytext.combine import combine_inputs_with_outputs
    from nbclient import NotebookClient

    source = chapters / f"{name}.md"
    if not source.exists():
        raise FileNotFoundError(f"no chapter source {source}")
    target = folder / f"{name}.ipynb"
    nb = jupytext.read(source)
    folder.mkdir(parents=True, exist_ok=True)
    old = nbformat.read(target, as_version=4) if target.exists() else None
    if old is not None:
        nb = combine_inputs_with_outputs(nb, old, fmt="md:myst")
    _stable_new_ids(nb, old)
    client = NotebookClient(
        nb,
        timeout=timeout,
        kernel_name="python3",
        resources={"metadata": {"path": str(cwd or folder)}},
        record_timing=False,
        coalesce_streams=True,
    )
    # Keyword arguments of execute() reach the kernel manager: the kernel gets this env.
    client.execute(env=kernel_env())
    nb.metadata.get("language_info", {}).pop("version", None)  # the patch level varies
    # Describes the .md file; jupytext drops it from a paired notebook it updates.
    nb.metadata.get("jupytext", {}).pop("text_representation", None)
    nbformat.validate(nb)
    nbformat.write(nb, target)
    return target


def image_outputs(cell) -> list[str]:
    return [
        mime
        for out in cell.get("outputs", [])
        for mime in out.get("data", {})
        if mime in IMAGE_TYPES
    ]


def has_alt_text(cell) -> bool:
    opts = cell.get("metadata", {}).get("mystnb", {})
    alt = opts.get("image", {}).get("alt") or opts.get("figure", {}).get("caption")
    return bool(alt and str(alt).strip())


def problems(chapters: Path = CHAPTERS, folder: Path = NOTEBOOKS) -> list[str]:
    """Every way the sources and notebooks disagree, one readable line each."""
    found: list[str] = []
    srcs, nbs = sources(chapters), notebooks(folder)
    for name in sorted(set(srcs) - set(nbs)):
        found.append(f"{srcs[name].name}: source has no notebook {name}.ipynb (run make notebooks)")
    for name in sorted(set(nbs) - set(srcs)):
        found.append(f"{nbs[name].name}: notebook has no source {name}.md")
    for name in sorted(set(srcs) & set(nbs)):
        found.extend(pair_problems(srcs[name], nbs[name]))
    return found


def pair_problems(source: Path, notebook: Path) -> list[str]:
    where = notebook.name
    try:
        expected = jupytext.read(source).cells
        stored = nbformat.read(notebook, as_version=4).cells
    except Exception as exc:  # unreadable file: report, don't crash the whole check
        return [f"{where}: cannot be read ({exc})"]
    found = []
    if len(expected) != len(stored):
        found.append(
            f"{where}: {len(stored)} cells, but {source.name} has {len(expected)} "
            "(edited without regenerating? run make notebooks)"
        )
    for index, (want, have) in enumerate(zip(expected, stored, strict=False)):
        cell = f"{where} cell {index}"
        if want["cell_type"] != have["cell_type"]:
            found.append(
                f"{cell}: type {have['cell_type']} in notebook, {want['cell_type']} in source"
            )
            continue
        if cell_source(want) != cell_source(have):
            diff = difflib.unified_diff(
                cell_source(want).splitlines(), cell_source(have).splitlines(),
                "source", "notebook", lineterm="", n=0,
            )
            found.append(f"{cell}: source differs from {source.name}:\n  " + "\n  ".join(diff))
        if _comparable_metadata(want) != _comparable_metadata(have):
            found.append(
                f"{cell}: metadata (tags, options) {_comparable_metadata(have)} in notebook, "
                f"{_comparable_metadata(want)} in source"
            )
    for index, cell in enumerate(stored):
        found.extend(_output_problems(f"{where} cell {index}", cell))
    return found


def _output_problems(where: str, cell) -> list[str]:
    if cell["cell_type"] != "code" or not cell_source(cell).strip():
        return []
    found = []
    tags = cell.get("metadata", {}).get("tags", [])
    if cell.get("execution_count") is None:
        found.append(f"{where}: never executed, so nbval would silently skip it")
    for out in cell.get("outputs", []):
        if out.get("output_type") == "error" and "raises-exception" not in tags:
            found.append(f"{where}: stored error {out.get('ename')}: {out.get('evalue')}")
        if out.get("output_type") == "stream" and out.get("name") == "stderr":
            first = "".join(out.get("text", "")).strip().splitlines()[:1]
            found.append(f"{where}: stored stderr output {first}")
    images = image_outputs(cell)
    if any(mime != "image/svg+xml" for mime in images):
        found.append(
            f"{where}: raster image output {images}; figures must be SVG so nbval "
            "compares them (call mha.notebook.setup_figures())"
        )
    if images and not has_alt_text(cell):
        found.append(f"{where}: figure without alt text (mystnb: image: alt: or figure: caption:)")
    return found


# --- comparing a fresh run with the stored notebook, as nbval does ------------------

# What nbval 0.11 leaves out of a comparison (IPyNbFile.skip_compare, without --nbdime):
# output keys, and MIME types of an output's data.
NBVAL_SKIPPED = frozenset({
    "metadata", "traceback", "prompt_number", "output_type", "name", "execution_count",
    "application/vnd.jupyter.widget-view+json", "image/png", "image/jpeg",
})
SANITIZERS = ROOT / "tests" / "nbval_sanitize.cfg"


def sanitizers(path: Path = SANITIZERS) -> dict[str, str]:
    """The regex -> replacement pairs nbval applies before comparing
    (``--nbval-sanitize-with``), read by nbval's own parser."""
    from nbval.plugin import get_sanitize_patterns

    return dict(get_sanitize_patterns(path.read_text()))


def compared_outputs(outputs, patterns: dict[str, str]) -> dict[str, list]:
    """What nbval compares of one cell's outputs: for each key (a stream's name, an
    error's fields, each MIME type of the data), the values in order, sanitized."""
    import re

    from nbval.plugin import coalesce_streams

    def clean(value):
        if isinstance(value, str):
            for regex, replace in patterns.items():
                value = re.sub(regex, replace, value)
        return value

    found: dict[str, list] = {}
    for out in coalesce_streams(nbformat.from_dict(list(outputs))):
        if out.get("output_type") == "stream":  # keyed by the stream's name, as nbval does
            out = {out["name"]: out.get("text", "")}
        for key, value in out.items():
            if key in NBVAL_SKIPPED:
                continue
            if key == "data":
                for mime, data in value.items():
                    if mime not in NBVAL_SKIPPED:
                        found.setdefault(mime, []).append(clean(data))
            else:
                found.setdefault(key, []).append(clean(value))
    return found


def output_differences(stored, fresh, patterns: dict[str, str] | None = None) -> list[str]:
    """Each cell whose fresh outputs nbval would find different from the stored ones,
    with what differs; cells are paired by id (a regenerated notebook keeps them).

    As nbval: a cell tagged ``nbval-ignore-output`` is run but not compared, nor is
    one tagged ``nbval-skip`` or a stored cell that was never executed. A cell whose
    source changed, or that only one of the two has, is named too: the stored notebook
    is older than its source.
    """
    patterns = sanitizers() if patterns is None else patterns
    old = {cell.get("id"): (index, cell) for index, cell in enumerate(stored.cells)}
    found = []
    for index, cell in enumerate(fresh.cells):
        where = f"cell {index} (id {cell.get('id')})"
        if cell.get("id") not in old:
            found.append(f"{where}: not in the stored notebook (run make notebooks)")
            continue
        _, before = old.pop(cell.get("id"))
        if cell_source(cell) != cell_source(before):
            found.append(f"{where}: its source changed since the notebook was stored "
                         "(run make notebooks)")
            continue
        tags = cell.get("metadata", {}).get("tags", [])
        if (cell["cell_type"] != "code" or before.get("execution_count") is None
                or {"nbval-ignore-output", "nbval-skip"} & set(tags)):
            continue
        want = compared_outputs(before.get("outputs", []), patterns)
        got = compared_outputs(cell.get("outputs", []), patterns)
        first = cell_source(cell).strip().splitlines()[:1]
        for key in sorted(set(want) | set(got)):
            if want.get(key) == got.get(key):
                continue
            lines = difflib.unified_diff(
                _lines(want.get(key, [])), _lines(got.get(key, [])),
                "stored", "fresh", lineterm="", n=1,
            )
            diff = list(lines)[2:]
            shown = diff[:12] + ([f"... {len(diff) - 12} more lines"] if len(diff) > 12 else [])
            found.append(f"{where} {first}: {key} differs\n    " + "\n    ".join(shown))
    for index, cell in sorted(old.values(), key=lambda pair: pair[0]):
        found.append(f"cell {index} (id {cell.get('id')}) of the stored notebook: no longer "
                     "in the source (run make notebooks)")
    return found


def _lines(values: list) -> list[str]:
    """Values of one output key as text lines, for a readable diff."""
    import json

    text = "".join(v if isinstance(v, str) else json.dumps(v, sort_keys=True) for v in values)
    return text.splitlines()


def compare(name: str, out: Path, chapters: Path = CHAPTERS, folder: Path = NOTEBOOKS) -> list[str]:
    """Regenerate chapter ``name`` into ``out`` (the kernel in ``folder``, as nbval runs
    it) and return :func:`output_differences` against the stored notebook."""
    import shutil

    stored_path = folder / f"{name}.ipynb"
    if not stored_path.exists():
        return [f"{name}: no stored notebook {stored_path.name} (run make notebooks)"]
    out.mkdir(parents=True, exist_ok=True)
    fresh_path = out / f"{name}.ipynb"
    shutil.copyfile(stored_path, fresh_path)  # its ids and outputs to start from
    regenerate(name, chapters, out, cwd=folder)
    if fresh_path.read_bytes() == stored_path.read_bytes():
        return []
    return output_differences(nbformat.read(stored_path, as_version=4),
                              nbformat.read(fresh_path, as_version=4))


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in {"regen", "check", "compare"}:
        print(__doc__)
        return 2
    if argv[0] == "compare":
        import argparse

        parser = argparse.ArgumentParser(prog="python -m tools.nbtools compare")
        parser.add_argument("name")
        parser.add_argument("--out", type=Path, default=ROOT / "_build" / "chapter-check")
        args = parser.parse_args(argv[1:])
        found = compare(args.name, args.out)
        fresh = os.path.relpath(args.out / f"{args.name}.ipynb")
        for line in found:
            print(line)
        if found:
            print(f"{args.name}: {len(found)} cell(s) differ from the stored notebook as nbval "
                  f"would see them; the fresh run is {fresh} (make notebooks NB={args.name} "
                  "stores a fresh run)")
            return 1
        print(f"{args.name}: the source, run again, gives the stored outputs (as nbval "
              "compares them)")
        return 0
    if argv[0] == "regen":
        names = argv[1:] or sorted(sources())
        for name in names:
            path = regenerate(name)
            print(f"regenerated {path.relative_to(ROOT)}", flush=True)
        return 0
    found = problems()
    for line in found:
        print(line)
    print(f"{len(found)} problem(s) in {len(sources())} chapter(s)")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
