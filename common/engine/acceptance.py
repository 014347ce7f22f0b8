"""Acceptance rules: which proposed tokens the target keeps, and which token it adds.

Pure functions on logits / probabilities (no model, no cache), and the pluggable rules built
on them (:class:`AcceptanceRule`, registered by name in :data:`RULES`; a decoder picks one by
configuration, a paper package registers its own with :func:`register_rule`):

* :func:`greedy_accept` - exact match against the target's argmax (lossless at temperature 0);
  works on a whole tree through its retrieve indices (Medusa's ``evaluate_posterior``).
* :func:`speculative_accept` - speculative sampling on a chain (Leviathan et al. 2023,
  Chen et al. 2023): the committed tokens are distributed exactly as the target samples them.
* :func:`target_sampling_walk` - sampling on any tree built before verification: the target
  draws each token, the walk follows a child carrying it (exact for any tree).
* :func:`tree_speculative_walk` - recursive rejection sampling without replacement on a tree
  whose children were drawn without replacement from the draft distribution (SpecInfer,
  EAGLE's multi-round; Jeon et al. 2024): exact.
* :func:`typical_accept` / :func:`typical_sample` - Medusa's typical acceptance for
  temperature > 0 (not lossless: it trades exactness for longer accepted paths).

Every distribution a rule samples from, and every draft distribution a proposer samples from,
goes through :func:`process` (temperature, then top-k, then top-p, as transformers orders them).
"""
from __future__ import annotations

import torch

# Medusa's defaults (paper section 2.3.1; ``medusa_generate``): hard threshold epsilon and
# entropy-scaled threshold delta.
POSTERIOR_THRESHOLD = 0.09
POSTERIOR_ALPHA = 0.3


def process(logits: torch.Tensor, temperature: float, top_p: float = 1.0, top_k: int = 0) -> torch.Tensor:
    """``[..., V]`` logits -> ``[..., V]`` sampling probabilities, the one processor every rule,
    proposer and ``vanilla`` use.

    transformers' order and definitions (``TemperatureLogitsWarper``, ``TopKLogitsWarper``,
    ``TopPLogitsWarper``), so ``vanilla`` and ``hf_generate`` sample the same distribution:
    divide by ``temperature``; keep the tokens scoring at least the ``top_k``-th (ties kept;
    0 = off); drop the tokens whose ascending cumulative probability is ``<= 1 - top_p`` (the
    most likely token always stays). Temperature 0 is the one-hot argmax (greedy is the limit
    of sampling; top-k and top-p cannot change the argmax).
    """
    if temperature == 0:
        return torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).to(logits.dtype)
    scores = logits.float() / temperature
    if top_k > 0:
        kth = scores.topk(min(top_k, scores.shape[-1]), dim=-1).values[..., -1:]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if top_p < 1.0:
        ordered, order = scores.sort(dim=-1)                      # ascending
        drop = ordered.softmax(-1).cumsum(-1) <= 1 - top_p
        drop[..., -1:] = False                                    # keep the most likely token
        scores = scores.masked_fill(drop.scatter(-1, order, drop), float("-inf"))
    return torch.softmax(scores, dim=-1)


def sample(p: torch.Tensor, generator: torch.Generator | None = None) -> int:
    """One token id drawn from ``[V]`` probabilities ``p``."""
    return int(torch.multinomial(p, 1, generator=generator))


def gumbel_topk(q: torch.Tensor, k: int, generator: torch.Generator | None = None) -> torch.Tensor:
    """``k`` tokens drawn without replacement from each ``[..., V]`` distribution ``q``, in draw
    order (``[..., k]`` long): the Gumbel-top-k trick, ``topk(log q + Gumbel noise)``, equals
    drawing one token, removing it, renormalising and drawing again (what
    :func:`tree_speculative_walk` assumes of a node's children). Tokens with ``q = 0`` come
    only after the support is used up."""
    u = torch.rand(q.shape, generator=generator, device=q.device).clamp_(min=1e-20)
    keys = torch.log(q.float()) - torch.log(-torch.log(u))
    return keys.topk(k, dim=-1).indices


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


def children_of(parents: list[int]) -> list[list[int]]:
    """``n`` parent indices (-1 for the root) -> each node's children, in node order (a
    tree's node order puts siblings in rank order: :func:`common.engine.tree.build_tree`)."""
    children: list[list[int]] = [[] for _ in parents]
    for i, p in enumerate(parents[1:], 1):
        children[p].append(i)
    return children


def parents_from_retrieve(retrieve: torch.Tensor, n: int) -> list[int]:
    """``[L, D+1]`` retrieve indices (-1 padded) of an ``n``-node tree -> its ``n`` parents."""
    parents = [-1] * n
    for row in retrieve.tolist():
        for a, b in zip(row, row[1:]):
            if b >= 0:
                parents[b] = a
    return parents


def target_sampling_walk(tree_tokens: list[int], parents: list[int], node_probs,
                         generator: torch.Generator | None = None) -> tuple[list[int], int]:
    """Sampling on any tree built before verification: the target draws, the tree is followed.

    At the root draw ``x ~ p(root)``; if a child carries ``x``, move to it and draw again there;
    else stop: ``x`` is the next token. Every committed token is drawn from the target's own
    processed distribution given the tokens before it (a child carrying ``x`` has exactly that
    prefix), so the output is distributed as ``vanilla``'s, whatever the tree holds and however
    it was made (deterministic candidates, a draft's top-k); the tree only decides how many
    draws one forward serves. Duplicate sibling tokens share a prefix, hence a distribution:
    the first is taken.

    Args:
        tree_tokens: ``n`` node tokens (node 0 = root); ``parents``: ``n`` parent indices.
        node_probs: ``(list of k node indices) -> [k, V]`` processed target probabilities
            (:func:`process`); called with a node and its children together, as
            :func:`greedy_walk` reads rows, so a lazy head computes only the walked nodes'.
    Returns:
        ``(path, next_token)``: accepted node indices, root first, and the last draw.
    """
    children = children_of(parents)
    rows: dict[int, torch.Tensor] = {}
    node, path = 0, [0]
    while True:
        if node not in rows:
            want = [node] + [c for c in children[node] if c not in rows]
            rows.update(zip(want, node_probs(want)))
        x = sample(rows[node], generator)
        node = next((c for c in children[node] if tree_tokens[c] == x), None)
        if node is None:
            return path, x
        path.append(node)


def ratio_accept(p_x: float, q_x: float) -> float:
    """Speculative sampling's acceptance probability ``min(1, p(x) / q(x))``."""
    return min(1.0, p_x / q_x)


def tree_speculative_walk(tree_tokens: list[int], parents: list[int], p: torch.Tensor, q: torch.Tensor,
                          generator: torch.Generator | None = None,
                          accept_probability=ratio_accept) -> tuple[list[int], int]:
    """Recursive rejection sampling without replacement on a draft tree (SpecInfer's and
    EAGLE's multi-round verification in the without-replacement form of Jeon et al. 2024).

    Valid when each node's children were drawn, in node order, without replacement from the
    draft distribution ``q`` their rows carry (Gumbel-top-k). At a node with target ``p``:
    child ``x`` is accepted with ``min(1, p(x) / q(x))``; on rejection ``p <- norm(max(p - q, 0))``
    and ``q <- q`` without ``x``, renormalised (the distribution the next sibling was drawn
    from); the first accepted child becomes the node; when all are rejected, the next token is
    drawn from the current ``p``. Each sibling round is one step of speculative sampling
    against the residual of the rounds before it, so the token leaving a node has the
    target's distribution exactly (Leviathan et al.'s theorem applied round by round; the
    without-replacement update keeps ``q`` the distribution the sibling was really drawn from).
    A child with ``q(x) = 0`` (drawn after ``q``'s support ran out: a tree wider than top-k or
    top-p leaves) is never accepted, as if it were absent.

    Args:
        tree_tokens: ``n`` node tokens; ``parents``: ``n`` parent indices (-1 root).
        p: ``[n, V]`` processed target probabilities at each node.
        q: ``[n-1, V]`` draft distribution node ``i + 1`` was drawn from (siblings share one).
        accept_probability: ``(p(x), q(x)) -> probability``; :func:`ratio_accept` (tests swap
            in wrong rules to show the distribution test rejects them).
    Returns:
        ``(path, next_token)``: accepted node indices, root first, and the next token.
    """
    children = children_of(parents)
    node, path = 0, [0]
    while True:
        target = p[node].float()
        kids = children[node]
        draft = q[kids[0] - 1].float().clone() if kids else None
        chosen = None
        for c in kids:
            x = tree_tokens[c]
            q_x = float(draft[x])
            if q_x <= 0:
                continue
            u = float(torch.rand((), generator=generator, device=target.device))
            if u < accept_probability(float(target[x]), q_x):
                chosen = c
                break
            residual = (target - draft).clamp_(min=0)
            # all-zero only by rounding (a rejection needs p(x) < q(x), hence mass elsewhere)
            target = residual / residual.sum() if float(residual.sum()) > 0 else target
            draft[x] = 0
            if float(draft.sum()) > 0:
                draft = draft / draft.sum()
        if chosen is None:
            return path, sample(target, generator)
        node = chosen
        path.append(node)


def typical_threshold(p: torch.Tensor, threshold: float = POSTERIOR_THRESHOLD,
                      alpha: float = POSTERIOR_ALPHA) -> torch.Tensor:
    """Medusa's per-position bar ``min(epsilon, delta * exp(-H(p)))`` for ``[..., V]`` -> ``[...]``."""
    entropy = -(p * torch.log(p + 1e-5)).sum(-1)
    return torch.clamp(alpha * torch.exp(-entropy), max=threshold)


def typical_accept(tree_tokens: torch.Tensor, logits: torch.Tensor, retrieve: torch.Tensor,
                   temperature: float, threshold: float = POSTERIOR_THRESHOLD,
                   alpha: float = POSTERIOR_ALPHA, top_p: float = 1.0, top_k: int = 0) -> tuple[int, int]:
    """Medusa's typical acceptance: a token is kept if its target probability exceeds
    :func:`typical_threshold` at its parent; the longest such path wins, ties broken by the
    highest likelihood of the accepted tokens.

    Args / Returns: as :func:`greedy_accept`; ``temperature``, ``top_p``, ``top_k`` process the
    logits (:func:`process`).
    """
    cand, valid = _path_tokens(tree_tokens, retrieve)                   # [L, D+1]
    p = process(logits, temperature, top_p, top_k)[retrieve.clamp(min=0)]  # [L, D+1, V]
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
                   threshold: float = POSTERIOR_THRESHOLD, alpha: float = POSTERIOR_ALPHA,
                   top_p: float = 1.0, top_k: int = 0) -> int:
    """Medusa's next-token draw: sample ``[V]`` logits with the tokens under the typical bar
    removed (the top token always survives: the bar is below ``max p``)."""
    p = process(logits, temperature, top_p, top_k)
    p = torch.where(p < typical_threshold(p, threshold, alpha), torch.zeros_like(p), p)
    return sample(p / p.sum(), generator)


# -- pluggable rules ---------------------------------------------------------------------------
class AcceptanceRule:
    """How a verifier turns the target's logits over a proposal into committed tokens.

    ``evaluate`` picks the accepted path and the token the target adds after it;
    ``next_token`` draws the token after a single position (the prefill, the bonus token).
    Both sample from :meth:`process` (the decoder's temperature, top-p and top-k).

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

    def __init__(self, temperature: float = 0.0, top_p: float = 1.0, top_k: int = 0, **options):
        self.temperature, self.top_p, self.top_k = temperature, top_p, top_k
        self.options = options

    def process(self, logits: torch.Tensor) -> torch.Tensor:
        """``[..., V]`` logits -> the probabilities this rule samples (:func:`process`)."""
        return process(logits, self.temperature, self.top_p, self.top_k)

    def evaluate(self, tree_tokens: torch.Tensor, logits: torch.Tensor, retrieve: torch.Tensor,
                 draft_tokens: torch.Tensor, draft_probs: torch.Tensor | None,
                 generator: torch.Generator | None) -> tuple[torch.Tensor, int]:
        """Args: ``[n]`` node tokens (root first), ``[n, V]`` target logits, ``[L, D+1]``
        retrieve indices, ``[n-1]`` proposed tokens, their ``[n-1, V]`` draft distributions.

        Returns: ``([a+1] accepted node indices, root first; the next token id)``.
        """
        raise NotImplementedError

    def next_token(self, logits: torch.Tensor, generator: torch.Generator | None) -> int:
        """The token after ``[V]`` logits outside a proposal (sampled from :meth:`process`)."""
        if self.temperature == 0:
            return int(logits.argmax())
        return sample(self.process(logits), generator)


RULES: dict[str, type[AcceptanceRule]] = {}


def register_rule(cls: type[AcceptanceRule]) -> type[AcceptanceRule]:
    """Class decorator: make a rule selectable by its ``name``."""
    RULES[cls.name] = cls
    return cls


def _path(nodes: list[int], like: torch.Tensor) -> torch.Tensor:
    return torch.as_tensor(nodes, dtype=torch.long, device=like.device)


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

    def evaluate_lazy(self, tree_tokens, parents, head_rows, retrieve, generator=None):
        """:meth:`evaluate` from ``head_rows(nodes) -> [k, V]`` logits (:func:`greedy_walk`)."""
        walked = greedy_walk(tree_tokens.tolist(), parents.tolist(), head_rows)
        if walked is None:  # duplicate sibling tokens: the full search decides
            every = head_rows(list(range(tree_tokens.numel())))
            return self.evaluate(tree_tokens, every, retrieve, None, None, None)
        path, nxt = walked
        return _path(path, tree_tokens), nxt


@register_rule
class TargetSampling(AcceptanceRule):
    """The target samples each token and the walk follows the tree (:func:`target_sampling_walk`):
    exact for any tree built before verification, since every committed token is a draw from
    the target's processed distribution at its own prefix; the tree's contents only change how
    many draws one forward serves. The rule for deterministic candidates (prompt lookup, REST,
    lookahead, recycling, the suffix automaton) and for any proposer's top-k tree."""

    name = "target_sampling"
    lossless = True
    lazy = True  # reads only the walked nodes' rows (and their children's)

    def evaluate(self, tree_tokens, logits, retrieve, draft_tokens, draft_probs, generator):
        parents = parents_from_retrieve(retrieve, tree_tokens.numel())
        path, nxt = target_sampling_walk(tree_tokens.tolist(), parents, lambda nodes: self.process(logits[nodes]),
                                         generator)
        return _path(path, tree_tokens), nxt

    def evaluate_lazy(self, tree_tokens, parents, head_rows, retrieve, generator=None):
        """:meth:`evaluate` from ``head_rows(nodes) -> [k, V]`` logits: the head runs on the
        walked nodes and their children only."""
        path, nxt = target_sampling_walk(tree_tokens.tolist(), parents.tolist(),
                                         lambda nodes: self.process(head_rows(nodes)), generator)
        return _path(path, tree_tokens), nxt


@register_rule
class TreeSpeculative(AcceptanceRule):
    """Recursive rejection sampling without replacement (:func:`tree_speculative_walk`): exact
    when each node's children were drawn without replacement (Gumbel-top-k) from the draft
    distribution the proposal reports, since every sibling round is speculative sampling
    against the residual left by the rounds before it. Longer accepted paths than
    ``target_sampling`` on a draft's tree: a child is kept with ``min(1, p/q)``, not only when
    the target happens to draw its token."""

    name = "tree_speculative"
    temperatures = ("positive",)
    needs_draft_probs = True
    lossless = True

    def accept_probability(self, p_x: float, q_x: float) -> float:
        """Probability of keeping a child ``x`` (target ``p(x)``, draft ``q(x)`` after removals)."""
        return ratio_accept(p_x, q_x)

    def evaluate(self, tree_tokens, logits, retrieve, draft_tokens, draft_probs, generator):
        if draft_probs is None and tree_tokens.numel() > 1:
            raise AssertionError("tree_speculative needs the proposal's draft_probs")
        parents = parents_from_retrieve(retrieve, tree_tokens.numel())
        path, nxt = tree_speculative_walk(tree_tokens.tolist(), parents, self.process(logits), draft_probs,
                                          generator, self.accept_probability)
        return _path(path, tree_tokens), nxt


@register_rule
class SpeculativeSampling(AcceptanceRule):
    """Speculative sampling on a chain: committed tokens follow the target exactly, when the
    draft's tokens were drawn from the ``q`` it reports, processed with the same top-p/top-k."""

    name = "speculative"
    temperatures = ("positive",)
    chain_only = True
    needs_draft_probs = True
    lossless = True

    def evaluate(self, tree_tokens, logits, retrieve, draft_tokens, draft_probs, generator):
        path = retrieve[0]
        a, nxt = speculative_accept(draft_tokens, self.process(logits[path]), draft_probs, generator)
        return path[: a + 1], nxt


@register_rule
class Typical(AcceptanceRule):
    """Medusa's typical acceptance: lossy by design (longer paths for a bounded deviation from
    the target's distribution), so never a default and never in a lossless column."""

    name = "typical"
    temperatures = ("positive",)
    lossless = False

    def evaluate(self, tree_tokens, logits, retrieve, draft_tokens, draft_probs, generator):
        row, a = typical_accept(tree_tokens, logits, retrieve, self.temperature, top_p=self.top_p, top_k=self.top_k)
        path = retrieve[row, : a + 1]
        return path, self.next_token(logits[path[-1]], generator)

    def next_token(self, logits, generator):
        return typical_sample(logits, self.temperature, generator, top_p=self.top_p, top_k=self.top_k)
