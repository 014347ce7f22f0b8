"""A suffix automaton over token ids, grown one token at a time (SAM-Decoding's data structure).

The automaton of a text ``t[0..n-1]`` recognises every substring of ``t`` with at most ``2n - 1``
states; :meth:`SuffixAutomaton.extend` appends one token in O(1) amortised time (Blumer et al.'s
online construction). Each state also keeps the end position of its substrings' **first**
occurrence (set when the state is made, copied by a clone), so a match's continuation is read
straight from the text: ``t[first + 1:]``. Hu et al. (2025, SAM-Decoding) keep the same field
(``min_endpos``) for the same reason.

Matching a second text against it (:meth:`SuffixAutomaton.step`) keeps ``(state, length)``: the
longest suffix of what was fed that occurs in the automaton's text, updated in O(1) amortised per
token (follow suffix links until a transition exists). Two uses:

* **dynamic** (prompt + generated text): feed each new token to :meth:`step` *before*
  :meth:`extend`; the match is then the longest suffix that also occurs ending earlier, so its
  first occurrence has at least one token after it (:meth:`DynamicMatcher`);
* **static** (a corpus): build once, then only :meth:`step` over the decoded text.
"""
from __future__ import annotations


class SuffixAutomaton:
    """The suffix automaton of ``self.tokens``.

    Attributes:
        tokens: the text so far (token ids).
        trans: per state, ``{token: next state}``; ``link``: suffix link (-1 for the root);
        length: the longest substring a state stands for; ``first``: the end index in ``tokens``
            of that substring's first occurrence (-1 for the root).
    """

    def __init__(self, tokens=()):
        self.tokens: list[int] = []
        self.trans: list[dict[int, int]] = [{}]
        self.link, self.length, self.first = [-1], [0], [-1]
        self.last = 0  # the state of the whole text
        for t in tokens:
            self.extend(int(t))

    @property
    def states(self) -> int:
        return len(self.link)

    def _new(self, length: int, first: int, trans: dict, link: int) -> int:
        self.trans.append(trans)
        self.length.append(length)
        self.first.append(first)
        self.link.append(link)
        return len(self.link) - 1

    def extend(self, token: int) -> None:
        """Append ``token`` to the text (the online construction)."""
        self.tokens.append(token)
        cur = self._new(self.length[self.last] + 1, len(self.tokens) - 1, {}, -1)
        p = self.last
        while p != -1 and token not in self.trans[p]:
            self.trans[p][token] = cur
            p = self.link[p]
        if p == -1:
            self.link[cur] = 0
        else:
            q = self.trans[p][token]
            if self.length[p] + 1 == self.length[q]:
                self.link[cur] = q
            else:  # split q: the clone keeps q's first occurrence (it ends at the same place)
                clone = self._new(self.length[p] + 1, self.first[q], dict(self.trans[q]), self.link[q])
                while p != -1 and self.trans[p].get(token) == q:
                    self.trans[p][token] = clone
                    p = self.link[p]
                self.link[q] = self.link[cur] = clone
        self.last = cur

    def step(self, state: int, length: int, token: int) -> tuple[int, int]:
        """The match after feeding ``token``: from ``(state, length)``, the longest suffix of the
        fed text that occurs, to the longest suffix of fed text + ``token`` that occurs."""
        while state != 0 and token not in self.trans[state]:
            state = self.link[state]
            length = self.length[state]
        if token in self.trans[state]:
            return self.trans[state][token], length + 1
        return 0, 0

    def continuation(self, state: int, n: int, stop: int | None = None) -> list[int]:
        """Up to ``n`` tokens after the first occurrence of ``state``'s substrings, cut before
        ``stop`` (a separator between a corpus's sequences)."""
        if state == 0 or n <= 0:
            return []
        start = self.first[state] + 1
        out = self.tokens[start:start + n]
        if stop is not None and stop in out:
            out = out[:out.index(stop)]
        return out

    def nbytes(self) -> int:
        """An estimate of the memory held: 8 bytes a transition and four ints a state (the
        Python objects themselves take several times more)."""
        return 8 * sum(len(t) for t in self.trans) + 32 * self.states + 8 * len(self.tokens)


class DynamicMatcher:
    """A suffix automaton over a growing text and the text's own longest earlier match.

    After :meth:`add` of ``t[0..n-1]``, ``(state, length)`` is the longest suffix of ``t`` that
    also occurs ending before ``n - 1``; its continuation (at least one token) is a guess of
    what follows, as SAM-Decoding's dynamic automaton gives it.
    """

    def __init__(self, tokens=()):
        self.sam = SuffixAutomaton()
        self.state, self.length = 0, 0
        self.add(tokens)

    def add(self, tokens) -> None:
        for t in tokens:
            t = int(t)
            self.state, self.length = self.sam.step(self.state, self.length, t)  # before the text holds t
            self.sam.extend(t)
            # extending may split the matched state: the clone (its suffix link) now holds the
            # shorter strings, and a match of that length belongs there
            while self.state and self.length <= self.sam.length[self.sam.link[self.state]]:
                self.state = self.sam.link[self.state]

    def continuation(self, n: int) -> list[int]:
        return self.sam.continuation(self.state, n)
