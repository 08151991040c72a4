"""The batch cost model of the decoding loop's ``"auto"``: milliseconds until the last row is
done, at ``K = 0 .. max_k`` drafts a step. The specification of ``specdec::native_finish_ms``
(the same float64 operations in the same order: the same bits) and the fallback where the
extension is not built; :meth:`specdec_kernels.tuning.PassCosts.finish_ms` runs one of the two
through the routing table (:func:`specdec_kernels._dispatch.native_kernel`).
"""

from __future__ import annotations

import math


def finish_ms(
    alpha: list[float],
    left: list[float],
    quantiles: tuple[float, ...],
    stretch_costs: tuple[float, ...],
    max_k: int,
) -> list[float]:
    """Milliseconds until the last of the rows is done, at ``K = 0 .. max_k`` (host floats).

    Each row (acceptance ``alpha[b]`` in ``[0, 1]``, ``left[b] >= 1`` tokens to go) needs
    ``left / mu`` steps with the spread ``sqrt(left * var / mu**3)`` of a renewal process
    (``mu``, ``var``: the mean and variance of the tokens a step gives it), stood for by the
    ``Q`` normal ``quantiles``; the ``B * Q`` sorted ends split the run into stretches, each
    priced by ``stretch_costs`` (``[max_k + 1][B * Q]`` flattened row by row: the step cost
    while that stretch's rows run).

    >>> finish_ms([0.5, 0.5], [4.0, 4.0], (0.0,), (1.0, 0.5, 1.0, 0.5), 1)
    [4.0, 2.6666666666666665]
    """
    n = len(alpha) * len(quantiles)  # stretches
    power = [1.0] * len(alpha)  # a**k
    mean = [0.0] * len(alpha)  # E[A] at this k (A: the accepted drafts)
    square = [0.0] * len(alpha)  # E[A^2]
    out = []
    for k in range(max_k + 1):
        if k:
            power = [p * x for p, x in zip(power, alpha)]
            mean = [m + p for m, p in zip(mean, power)]
            square = [q + (2 * k - 1) * p for q, p in zip(square, power)]
        ends = []
        for left_i, m, q in zip(left, mean, square):
            mu = 1.0 + m
            steps = left_i / mu
            sd = math.sqrt(left_i * max(q - m * m, 0.0) / (mu * mu * mu))
            ends += [steps + sd * z for z in quantiles]
        ends.sort()
        ms, before = 0.0, 0.0
        for end, cost in zip(ends, stretch_costs[k * n : (k + 1) * n]):
            end = max(end, 1.0)
            ms += (end - before) * cost
            before = end
        out.append(ms)
    return out
