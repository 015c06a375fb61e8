"""Naive references written with explicit Python loops over floats, independent of the vectorised code."""

import math


def is_nan(x: float) -> bool:
    return isinstance(x, float) and math.isnan(x)


def mean(values):
    return sum(values) / len(values) if values else math.nan


def sample_std(values):
    """Unbiased std, or None when fewer than 2 values."""
    if len(values) < 2:
        return None
    m = mean(values)
    return math.sqrt(sum((v - m) ** 2 for v in values) / (len(values) - 1))


def normalise(x, m, std, norm, eps):
    """One value normalised against (m, std) as the house functions define it; undefined -> 0."""
    if is_nan(x):
        return 0.0
    if norm == "no_baseline":
        return x
    if norm == "mean_only":
        return x - m
    return 0.0 if std is None else (x - m) / (std + eps)


def groups(rows, group_size):
    """Consecutive groups of `group_size` rows, or of each size in a list of sizes (ragged groups)."""
    sizes = [group_size] * (len(rows) // group_size) if isinstance(group_size, int) else group_size
    starts = [sum(sizes[:i]) for i in range(len(sizes))]
    return [rows[start : start + size] for start, size in zip(starts, sizes, strict=True)]


def group_advantages(rewards, group_size, norm="mean_std", std_scope="group", eps=1e-4):
    batch_std = sample_std([x for x in rewards if not is_nan(x)])
    out = []
    for group in groups(rewards, group_size):
        valid = [x for x in group if not is_nan(x)]
        std = sample_std(valid) if std_scope == "group" else batch_std
        for x in group:
            out.append(normalise(x, mean(valid), std, norm, eps))
    return out


def return_to_go(row_rewards, row_mask, gamma):
    """Per step: sum over later valid steps of gamma^(t'-t) r_t'; 0 where masked."""
    out = []
    for t in range(len(row_rewards)):
        if not row_mask[t]:
            out.append(0.0)
            continue
        total = 0.0
        for later in range(t, len(row_rewards)):
            if row_mask[later]:
                total += gamma ** (later - t) * row_rewards[later]
        out.append(total)
    return out


def normalise_steps(values, mask, group_size, norm, eps):
    """values/mask: lists of rows; statistics over every valid step of each group."""
    out = []
    for start in range(0, len(values), group_size):
        rows = range(start, start + group_size)
        pool = [values[i][t] for i in rows for t in range(len(values[i])) if mask[i][t]]
        m, std = mean(pool), sample_std(pool)
        for i in rows:
            out.append(
                [
                    normalise(values[i][t], m, std, norm, eps) if mask[i][t] else 0.0
                    for t in range(len(values[i]))
                ]
            )
    return out
