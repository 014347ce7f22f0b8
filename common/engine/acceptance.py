"""Acceptance rules: which proposed tokens the target keeps, and which token it adds.

Pure functions on logits / probabilities (no model, no cache), and the pluggable rules built
on them (:class:`AcceptanceRule`, registered by name in :data:`RULES`; a decoder picks one by
configuration, a paper package registers its own with :func:`register_rule`):

* :func:`greedy_accept` - exact match against the target's argmax (lossless at temperature 0);
  works on a whole tree through its retrieve indices (Medusa's ``evaluate_posterior``).
* :func:`speculative_accept` - speculative sampling on a chain (Leviathan et al. 2023,
  Chen et al. 2023): the committed tokens are distributed exactly as the target samples them.
* :func:`typical_accept` / :func:`typical_sample` - Medusa's typical acceptance for
  temperature > 0 (not lossless: it trades exactness for longer accepted paths).
"""
from __future__ import annotations

import torch

# Medusa's defaults (paper section 2.3.1; ``medusa_generate``): hard threshold epsilon and
# entropy-scaled threshold delta.
POSTERIOR_THRESHOLD = 0.09
POSTERIOR_ALPHA = 0.3


def probs(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """``[..., V]`` logits -> ``[..., V]`` sampling probabilities; temperature 0 gives the
    one-hot argmax (so greedy is the limit of sampling)."""
    if temperature == 0:
        return torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).to(logits.dtype)
    return torch.softmax(logits.float() / temperature, dim=-1)


def sample(p: torch.Tensor, generator: torch.Generator | None = None) -> int:
    """One token id drawn from ``[V]`` probabilities ``p``."""
    return int(torch.multinomial(p, 1, generator=generator))


def _path_tokens(tree_tokens: torch.Tensor, retrieve: torch.Tensor):
    """Gather per-path tokens; returns ``([L, D+1] tokens, [L, D+1] valid)`` (pads -> node 0)."""
    valid = retrieve >= 0
    return tree_tokens[retrieve.clamp(min=0)], valid


def greedy_accept(tree_tokens: torch.Tensor, logits: torch.Tensor,
                  retrieve: torch.Tensor) -> tuple[int, int]:
    """Longest root-to-leaf path whose tokens equal the target's argmax at their parent.

    Args:
        tree_tokens: ``[n]`` node tokens, node 0 = root (already committed).
        logits: ``[n, V]`` target logits at each node (node i predicts its children).
        retrieve: ``[L, D+1]`` node indices of each root-to-leaf path, -1 padded.
    Returns:
        ``(row, accepted)``: the chosen row of ``retrieve`` and how many non-root tokens of it
        are accepted (0..D). Ties go to the first row, so the result is deterministic.
    """
    cand, valid = _path_tokens(tree_tokens, retrieve)        # [L, D+1]
    post = logits.argmax(-1)[retrieve.clamp(min=0)]          # [L, D+1] target's choice after each node
    match = (cand[:, 1:] == post[:, :-1]) & valid[:, 1:]     # [L, D]
    accepted = match.long().cumprod(dim=1).sum(dim=1)        # [L] matches stop at the first miss
    row = int(accepted.argmax())
    return row, int(accepted[row])


def greedy_walk(tree_tokens: list[int], parents: list[int], head_rows) -> tuple[list[int], int] | None:
    """:func:`greedy_accept` computing LM-head rows only where the walk needs them.

    From the root, follow the child whose token is the target's argmax at the current node.
    Each head call computes a node and its children together (a weight-bound product costs
    about the same for 1 row as for a dozen), so one call advances the walk two levels. On
    a 63-node tree that accepts ~1 token, 1-2 calls of <= 11 rows replace a 63-row product.

    Args:
        tree_tokens: ``n`` node tokens (node 0 = root); ``parents``: ``n`` parent indices (-1 root).
        head_rows: ``(list of node indices) -> [k, V]`` logits of those nodes.
    Returns:
        ``(path, next_token)`` as the full rule gives them, or None when a node has two
        children with its argmax token (then the longest of the paths must be searched:
        call :func:`greedy_accept` with every node's logits).
    """
    children: list[list[int]] = [[] for _ in tree_tokens]
    for i, p in enumerate(parents[1:], 1):
        children[p].append(i)
    best: dict[int, int] = {}
    node, path = 0, [0]
    while True:
        if node not in best:
            want = [node] + [c for c in children[node] if c not in best]
            best.update(zip(want, head_rows(want).argmax(-1).tolist()))
        a = best[node]
        match = [c for c in children[node] if tree_tokens[c] == a]
        if not match:
            return path, a
        if len(match) > 1:
            return None
        node = match[0]
        path.append(node)


def speculative_accept(draft_tokens: torch.Tensor, p: torch.Tensor, q: torch.Tensor,
                       generator: torch.Generator | None = None) -> tuple[int, int]:
    """Speculative sampling over a chain of ``g`` draft tokens.

    Draft token ``x_i`` is kept with probability ``min(1, p_i(x_i) / q_i(x_i))``; at the first
    rejection the next token is drawn from ``norm(max(0, p_i - q_i))``; if all ``g`` are kept,
    a bonus token is drawn from ``p_g``. Each committed token then has the target's
    distribution ``p`` exactly (Leviathan et al. 2023, theorem 3.5).

    Args:
        draft_tokens: ``[g]`` long, drafted tokens (``x_i`` drawn from ``q[i]``).
        p: ``[g+1, V]`` target probabilities; ``p[i]`` is the distribution of token ``i``
            (row 0 follows the root, row ``g`` follows the last draft token).
        q: ``[g, V]`` draft probabilities the tokens were drawn from.
    Returns:
        ``(accepted, next_token)``: kept draft tokens (0..g) and the resampled or bonus token.
    """
    g = draft_tokens.numel()
    draft_tokens = draft_tokens.to(p.device)
    idx = torch.arange(g, device=p.device)
    ratio = p[idx, draft_tokens] / q[idx, draft_tokens]      # [g]; q(x) > 0 since x ~ q
    u = torch.rand(g, generator=generator, dtype=ratio.dtype, device=p.device)
    accepted = int((u < ratio).long().cumprod(0).sum())      # u in [0, 1): u < ratio <=> u < min(1, ratio)
    if accepted == g:
        return g, sample(p[g], generator)
    residual = (p[accepted] - q[accepted]).clamp_(min=0)
    # A rejection has probability sum(max(0, q - p)) = sum(max(0, p - q)), so the residual
    # is non-zero whenever we get here; the fallback only guards against rounding.
    if float(residual.sum()) <= 0:
        residual = p[accepted]
    return accepted, sample(residual / residual.sum(), generator)


def typical_threshold(p: torch.Tensor, threshold: float = POSTERIOR_THRESHOLD,
                      alpha: float = POSTERIOR_ALPHA) -> torch.Tensor:
    """Medusa's per-position bar ``min(epsilon, delta * exp(-H(p)))`` for ``[..., V]`` -> ``[...]``."""
    entropy = -(p * torch.log(p + 1e-5)).sum(-1)
    return torch.clamp(alpha * torch.exp(-entropy), max=threshold)


def typical_accept(tree_tokens: torch.Tensor, logits: torch.Tensor, retrieve: torch.Tensor,
                   temperature: float, threshold: float = POSTERIOR_THRESHOLD,
                   alpha: float = POSTERIOR_ALPHA) -> tuple[int, int]:
    """Medusa's typical acceptance: a token is kept if its target probability exceeds
    :func:`typical_threshold` at its parent; the longest such path wins, ties broken by the
    highest likelihood of the accepted tokens.

    Args / Returns: as :func:`greedy_accept`; ``temperature`` > 0 scales the logits.
    """
    cand, valid = _path_tokens(tree_tokens, retrieve)                   # [L, D+1]
    p = probs(logits, temperature)[retrieve.clamp(min=0)]               # [L, D+1, V]
    cand_p = p[:, :-1].gather(-1, cand[:, 1:, None]).squeeze(-1)        # [L, D]
    ok = (cand_p > typical_threshold(p[:, :-1], threshold, alpha)) & valid[:, 1:]
    accepted = ok.long().cumprod(dim=1).sum(dim=1)                      # [L]
    best = int(accepted.max())
    if best == 0:
        return 0, 0
    rows = torch.nonzero(accepted == best).flatten()
    loglik = torch.log(cand_p[rows, :best]).sum(-1)
    return int(rows[loglik.argmax()]), best


def typical_sample(logits: torch.Tensor, temperature: float, generator: torch.Generator | None = None,
                   threshold: float = POSTERIOR_THRESHOLD, alpha: float = POSTERIOR_ALPHA) -> int:
    """Medusa's next-token draw: sample ``[V]`` logits with the tokens under the typical bar
    removed (the top token always survives: the bar is below ``max p``)."""
    p = probs(logits, temperature)
    p = torch.where(p < typical_threshold(p, threshold, alpha), torch.zeros_like(p), p)
    return sample(p / p.sum(), generator)


# -- pluggable rules ---------------------------------------------------------------------------
class AcceptanceRule:
    """How a verifier turns the target's logits over a proposal into committed tokens.

    ``evaluate`` picks the accepted path and the token the target adds after it;
    ``next_token`` draws the token after a single position (the prefill, the bonus token).

    Class attributes say what a rule needs, so a decoder can refuse a rule it cannot feed:
    ``temperatures`` ("zero", "positive" or both), ``chain_only`` (no branching trees),
    ``needs_draft_probs`` (proposals carry the distributions their tokens were drawn from),
    ``lossless`` (greedy output equals vanilla's, or samples follow the target exactly),
    ``lazy`` (``evaluate_lazy`` works from LM-head rows computed on demand, so the verifier
    can skip the head on nodes the rule never reads).
    """

    name = "base"
    temperatures: tuple[str, ...] = ("zero", "positive")
    chain_only = False
    needs_draft_probs = False
    lossless = False
    lazy = False

    def __init__(self, temperature: float = 0.0, **options):
        self.temperature = temperature
        self.options = options

    def evaluate(self, tree_tokens: torch.Tensor, logits: torch.Tensor, retrieve: torch.Tensor,
                 draft_tokens: torch.Tensor, draft_probs: torch.Tensor | None,
                 generator: torch.Generator | None) -> tuple[torch.Tensor, int]:
        """Args: ``[n]`` node tokens (root first), ``[n, V]`` target logits, ``[L, D+1]``
        retrieve indices, ``[n-1]`` proposed tokens, their ``[n-1, V]`` draft distributions.

        Returns: ``([a+1] accepted node indices, root first; the next token id)``.
        """
        raise NotImplementedError

    def next_token(self, logits: torch.Tensor, generator: torch.Generator | None) -> int:
        """The token after ``[V]`` logits outside a proposal (sampled at ``temperature``)."""
        if self.temperature == 0:
            return int(logits.argmax())
        return sample(probs(logits, self.temperature), generator)


RULES: dict[str, type[AcceptanceRule]] = {}


def register_rule(cls: type[AcceptanceRule]) -> type[AcceptanceRule]:
    """Class decorator: make a rule selectable by its ``name``."""
    RULES[cls.name] = cls
    return cls


@register_rule
class Greedy(AcceptanceRule):
    """Exact match against the target's argmax: lossless at temperature 0."""

    name = "greedy"
    temperatures = ("zero",)
    lossless = True

    lazy = True  # can work from LM-head rows computed on demand (evaluate_lazy)

    def evaluate(self, tree_tokens, logits, retrieve, draft_tokens, draft_probs, generator):
        row, a = greedy_accept(tree_tokens, logits, retrieve)
        path = retrieve[row, : a + 1]
        return path, int(logits[path[-1]].argmax())

    def evaluate_lazy(self, tree_tokens, parents, head_rows, retrieve):
        """:meth:`evaluate` from ``head_rows(nodes) -> [k, V]`` logits (:func:`greedy_walk`)."""
        walked = greedy_walk(tree_tokens.tolist(), parents.tolist(), head_rows)
        if walked is None:  # duplicate sibling tokens: the full search decides
            every = head_rows(list(range(tree_tokens.numel())))
            return self.evaluate(tree_tokens, every, retrieve, None, None, None)
        path, nxt = walked
        return torch.as_tensor(path, dtype=torch.long, device=tree_tokens.device), nxt


@register_rule
class SpeculativeSampling(AcceptanceRule):
    """Speculative sampling on a chain: committed tokens follow the target exactly."""

    name = "speculative"
    temperatures = ("positive",)
    chain_only = True
    needs_draft_probs = True
    lossless = True

    def evaluate(self, tree_tokens, logits, retrieve, draft_tokens, draft_probs, generator):
        path = retrieve[0]
        a, nxt = speculative_accept(draft_tokens, probs(logits[path], self.temperature), draft_probs, generator)
        return path[: a + 1], nxt


@register_rule
class Typical(AcceptanceRule):
    """Medusa's typical acceptance (not exact: longer paths for a bounded deviation)."""

    name = "typical"
    temperatures = ("positive",)

    def evaluate(self, tree_tokens, logits, retrieve, draft_tokens, draft_probs, generator):
        row, a = typical_accept(tree_tokens, logits, retrieve, self.temperature)
        path = retrieve[row, : a + 1]
        return path, self.next_token(logits[path[-1]], generator)

    def next_token(self, logits, generator):
        return typical_sample(logits, self.temperature, generator)
