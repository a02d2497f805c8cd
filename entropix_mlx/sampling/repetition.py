"""Repetition units: how often the n-gram a token would complete already occurred in
the answer, the measure Entropix's scores penalise; and loops, the back-to-back
repeats by which a finished answer is judged degenerate (open-text quality, deliberate)."""

from collections import Counter


def repeat_counts(history: list[int], n: int, loops_only: bool = False) -> Counter:
    """For each token: its repetition units if it came next, the number of
    earlier occurrences in `history` of the n-gram it would complete (the last
    n - 1 tokens + it), plus, for the longest such repeat, one unit for every
    token by which the repeated span is longer than n. So copying a phrase
    costs more with every token copied: the k-th token of a second copy of a
    phrase (k >= n) costs k - n + 1 units, and a loop cannot outlast the
    penalty however likely the model finds it (a count alone charged one unit
    per token of a second copy, which a confident model pays easily).

    `loops_only`: an occurrence counts only when the copy runs back to back
    from it (the repeated span is at least as long as the distance between the
    two), a loop under way: charged from the moment the copy is one unit long; a name, a
    docstring's restatement or a list of test calls, copied from further back
    in code on purpose, costs nothing."""
    counts = Counter()
    if n == 1:
        if not loops_only:
            counts.update(history)
        elif history:
            counts[history[-1]] += 1  # a token right after itself is a loop of one
        return counts
    if len(history) < n:
        return counts
    end = len(history)
    tail = history[end - (n - 1) :]
    first = tail[0]
    longest: dict[int, int] = {}
    for i in range(end - n + 1):
        if history[i] == first and history[i : i + n - 1] == tail:
            t = history[i + n - 1]
            extra = 0  # how much further back the match goes
            while i - extra - 1 >= 0 and history[i - extra - 1] == history[end - n - extra]:
                extra += 1
            if loops_only and n + extra < end - n + 1 - i:
                continue  # the copy does not reach back to where it is copied from
            counts[t] += 1
            longest[t] = max(longest.get(t, 0), extra)
    for t, extra in longest.items():
        counts[t] += extra
    return counts


LOOP_ALERT = 12  # tokens: a back-to-back loop this long is a visible failure


def longest_loop(tokens: list[int]) -> int:
    """Length in tokens of the longest span that is one unit repeated back to back
    (at least two whole copies); 0 when there is none.

    For each period p, a run of R consecutive positions m with tokens[m] ==
    tokens[m + p] is a stretch of R + p tokens with period p; it holds
    (R + p) // p whole copies of its first p tokens, and at least two when R >= p."""
    best = 0
    for p in range(1, len(tokens) // 2 + 1):
        run = 0
        for m in range(len(tokens) - p):
            if tokens[m] == tokens[m + p]:
                run += 1
                if run >= p:
                    best = max(best, (run + p) // p * p)
            else:
                run = 0
    return best


def _units_along(history: list[int], path: list[int], n: int, loops_only: bool = False):
    """Each token's repetition units (`repeat_counts`) after history + the path before it."""
    seq = list(history)
    for t in path:
        yield repeat_counts(seq, n, loops_only).get(t, 0)
        seq.append(t)


def first_repeat(history: list[int], path: list[int], n: int, loops_only: bool = False) -> int:
    """The index of the first token of `path` that has repetition units after
    history + the path before it; len(path) when none has."""
    return next((i for i, units in enumerate(_units_along(history, path, n, loops_only)) if units), len(path))


def path_repeats(history: list[int], path: list[int], n: int, loops_only: bool = False) -> int:
    """Repetition units a path of tokens adds: the sum over its tokens of their
    `repeat_counts` units after history + the path before them."""
    return sum(_units_along(history, path, n, loops_only))
