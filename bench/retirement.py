"""Cost of retiring one finished row from a batch of 16, both caches of the bundled pair.

``select_rows`` (the decoding loop's way: move the one tail row into the freed slot, in place)
against the previous approach (a new cache per model holding the 15 staying rows, copied layer by
layer). Prints the medians; run ``python bench/retirement.py``.
"""

import statistics
import time

import torch

import specdec_kernels as sk


def filled_cache(model, batch, length, capacity):
    cache = model.new_cache(batch, capacity)
    c = model.config
    for layer in range(c.n_layer):
        kv = torch.randn(batch, c.n_head, length, c.head_dim, dtype=cache.dtype)
        cache.write(layer, kv, kv)
    cache.advance(length)
    return cache


def copy_into_new_cache(model, cache, rows, kv_len):
    """The previous retirement: a new cache with ``rows`` copied through the public write."""
    new = model.new_cache(len(rows), cache.key(0).shape[2])
    for layer in range(model.config.n_layer):
        new.write(layer, cache.key(layer)[rows, :, :kv_len], cache.value(layer)[rows, :, :kv_len])
    new.advance(cache.lengths[rows])
    return new


def main(batch=16, length=128, repeats=30):
    torch.set_num_threads(1)
    target, draft = sk.models.load_bundled()
    capacity = target.max_seq_len + 10
    results = {}
    for name in ("new cache (before)", "select_rows (now)"):
        times = []
        for _ in range(repeats):
            caches = [filled_cache(m, batch, length, capacity) for m in (target, draft)]
            t0 = time.perf_counter()
            for model, cache in zip((target, draft), caches):
                if name.startswith("new"):
                    copy_into_new_cache(model, cache, torch.arange(1, batch), length)
                else:  # retire row 0: the last row moves into its slot
                    cache.select_rows(torch.tensor([batch - 1] + list(range(1, batch - 1))), length)
            times.append(time.perf_counter() - t0)
        results[name] = statistics.median(times) * 1e6
        print(
            f"B={batch}, {length} cached tokens, target+draft: {name}: "
            f"{results[name]:.0f} us per retirement"
        )
    return results


if __name__ == "__main__":
    main()
