"""Write a parameterized notebook from a plain Python file with ``# %%`` cell markers.

The notebooks under notebooks/ are generated from notebooks/src/*.py so they stay reviewable
as plain code. The first cell is tagged ``parameters`` (papermill).

    python tools/make_notebook.py notebooks/src/cross.py notebooks/cross.ipynb
"""
import sys

import nbformat


def main(src: str, dst: str) -> None:
    text = open(src).read()
    cells = [c.strip("\n") for c in text.split("# %%")]
    cells = [c for c in cells if c.strip()]
    nb = nbformat.v4.new_notebook()
    nb.metadata = {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"},
                   "language_info": {"name": "python"}}
    for i, c in enumerate(cells):
        if c.startswith(" md\n") or c.startswith(" [markdown]\n"):
            body = c.split("\n", 1)[1]
            nb.cells.append(nbformat.v4.new_markdown_cell("\n".join(l[2:] if l.startswith("# ") else l.lstrip("#") for l in body.splitlines())))
        else:
            cell = nbformat.v4.new_code_cell(c.lstrip(" \n"))
            if i == 0 or c.startswith(" parameters"):
                cell.source = c.split("\n", 1)[1] if c.startswith(" parameters") else cell.source
                cell.metadata["tags"] = ["parameters"]
            nb.cells.append(cell)
    for i, c in enumerate(nb.cells):
        c["id"] = f"cell-{i}"  # stable ids: regenerating gives no spurious diff
    nbformat.write(nb, dst)


if __name__ == "__main__":
    main(*sys.argv[1:3])
