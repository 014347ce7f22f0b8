"""The panel every BiLD quality figure draws: quality (the task's metric) against a cost axis,
with the reference model's quality and the one-point band below it (Table 1's "within ~1
point")."""
from __future__ import annotations


def quality_panel(ax, task: str, task_cfg, xlabel: str, reference: float | None = None,
                  title: str | None = None) -> None:
    """Label ``ax`` for ``task`` (a :class:`bild.config.TaskConfig`) and draw the reference
    quality and the reference minus one point (when ``reference`` is given)."""
    if reference is not None:
        ax.axhline(reference, color="grey", lw=0.8)
        ax.axhline(reference - 1, color="grey", lw=0.8, ls="--")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(task_cfg.metric)
    ax.set_title(title if title is not None else f"{task}: {task_cfg.dataset}", fontsize=9)
    ax.legend(fontsize=7)
