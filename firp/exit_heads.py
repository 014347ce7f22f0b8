"""FIRP's early-exit baseline (section 4.2.1, Figure 3): LM heads on intermediate layers.

"Early exiting trains independent lm-heads in several intermediate transformer layers to
directly predict the draft tokens" (the paper maps ``h_n^j`` to ``X_{n+2}``). Here step ``i``'s
head reads the anchor's real state entering FIRP's step-``i`` prediction layer ``t_i`` (the state
FIRP's map ``i`` reads), after the model's final norm, and guesses the token ``i + 2`` places
ahead at once, where FIRP instead runs a pseudo state through the layers above ``t_i``.

The heads are :mod:`common.components.medusa_heads`'s (a zero-initialized residual SiLU block, then a vocabulary
projection), trained by its trainer (:func:`common.components.medusa_heads.train_heads` with ``layers``) on the
same teacher cache, labels, loss, optimizer and stopping rule as the Medusa heads, which read
the last layer's state: the two baselines differ only in the layer they read.

* ``--share-lm-head`` (embedded): every head projects through the model's frozen LM head, so a
  step trains only its block, ``H*H + H`` parameters: as many as one FIRP map.
* without it (paper profile): each head has its own LM head initialized from the model's,
  the paper's "independent lm-heads" (plus the block).

Entry point (writes ``heads.pt``, ``curve.jsonl``, ``stats.json`` with the held-out top-k
accuracy per step on the Medusa heads' held-out positions; :mod:`firp.accuracy` measures
all three methods on the same split points)::

    python -m firp.exit_heads --model smollm2-135m-instruct --out .cache/components/embedded/firp_early_exit \\
        --teacher .cache/components/embedded/teacher.pt --heldout-corpus .cache/components/embedded/corpus.pt \\
        --steps-k 3 --share-lm-head --labels greedy
"""
from __future__ import annotations

from common.errors import check_layers, cli_main


def _main(argv=None) -> None:
    from common.components import medusa_heads as medusa
    from common.training import teacher
    from common.engine.forward import num_layers
    from common.training.cli import component_main

    from .decoding import default_layers
    from .train import check_steps, parse_layers

    def add_args(ap):
        ap.add_argument("--layers", default=None,
                        help="comma-separated input layer per step (default: FIRP's prediction layers for --steps-k)")
        ap.add_argument("--steps-k", type=int, default=None, help="steps K (default: one per --layers entry, else 3)")
        ap.add_argument("--share-lm-head", action="store_true",
                        help="project every head through the model's frozen LM head (train the blocks only)")
        ap.add_argument("--labels", choices=medusa.LABELS, default="teacher")
        ap.add_argument("--train-vocab", choices=("labels", "full"), default="labels")

    def check_args(a):
        a.layers = parse_layers(a.layers)
        a.steps_k = check_steps(a.layers, a.steps_k)

    def check_model(a, model):
        a.layers = a.layers or default_layers(model, a.steps_k)
        check_layers(a.layers, num_layers(model), "early-exit layer")  # before the teacher cache is read

    def run(a, model, tok, data, cfg, stop):
        stats = medusa.train_heads(model, data, a.out, len(a.layers), cfg, a.share_lm_head, stop, a.labels,
                                   a.train_vocab, a.curve_out, layers=a.layers)
        print("held-out top-1 per step:", stats["heldout_top1"])
        return stats

    component_main("train FIRP's early-exit baseline: LM heads on intermediate layers", add_args, run,
                   (teacher.add_args, teacher.from_args, teacher.check_args), argv, batch_size=256, check_args=check_args,
                   check_model=check_model)


if __name__ == "__main__":
    cli_main(_main)
