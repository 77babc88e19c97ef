"""Timing and FLOP counting shared by the bench scripts that run beside PyTorch."""
import statistics

import torch


def attention_flops(batch, seqlen, heads, head_dim, causal):
    """The field's convention: 4·b·s²·h·d, halved when causal."""
    total = 4.0 * batch * seqlen * seqlen * heads * head_dim
    return total / 2 if causal else total


def cuda_event_median_ms(fn, warmup=5, repeats=30):
    """Median milliseconds of fn() timed with CUDA events after `warmup` untimed calls."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop))
    return statistics.median(times)
