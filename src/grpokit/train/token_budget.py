"""How much a micro-batch may hold: rows cut by a row count and a token budget, and the budget
itself, from the memory the activations kept for backward may take (train.activation_memory_mb).

``memory_plan.apply_memory_plan`` sets the run's budget once at start; ``accumulate``
(train/update.py) cuts every slice with ``micro_batches``.
"""

from __future__ import annotations

import torch


def micro_batches(row_tokens: list[int], max_rows: int = 0, max_tokens: int = 0) -> list[slice]:
    """Cut rows ``0 .. N-1``, in order, into consecutive slices of at most ``max_rows`` rows and at
    most ``max_tokens`` tokens (``row_tokens[i]``: real tokens of row i; 0 = no limit). A row longer
    than the budget gets a slice of its own. Rows stay in order, so the G completions of a prompt
    stay together and share its forward (logprobs.py).

    Balanced: the fewest slices the limits allow, and among those the smallest largest slice, so a
    batch just over the budget becomes two halves, not a full slice and a sliver.
    Example: tokens [4] * 6, max_tokens 20 -> two slices are needed; a budget of 12 still gives two,
    11 would give three -> [0:3], [3:6] (12 tokens each) rather than [0:5], [5:6].
    """

    def cut(budget: int) -> list[slice]:
        out, start, tokens = [], 0, 0
        for i, n in enumerate(row_tokens):
            if (max_rows and i - start >= max_rows) or (budget and i > start and tokens + n > budget):
                out.append(slice(start, i))
                start, tokens = i, 0
            tokens += n
        return out + [slice(start, len(row_tokens))] if row_tokens else out

    best = cut(max_tokens)
    if not max_tokens or len(best) == len(cut(0)):  # the token budget does not bind: rows alone decide
        return best
    lo, hi = max(row_tokens), max_tokens  # the slice count only grows as the budget shrinks
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if len(cut(mid)) == len(best) else (mid + 1, hi)
    return cut(lo)


CPU_ACTIVATION_MB = 512  # train.activation_memory_mb=-1 on CPU when the host's free memory cannot be read


def host_available_bytes() -> int:
    """Memory the host can still give (psutil's ``available``, else /proc/meminfo's MemAvailable);
    0 when neither can be read."""
    try:
        import psutil

        return int(psutil.virtual_memory().available)
    except ImportError:
        pass
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def activation_memory_mb(setting: int, device: torch.device) -> int:
    """Resolve ``train.activation_memory_mb``: -1 (auto) is a quarter of the memory the device has
    free now (``torch.cuda.mem_get_info`` on CUDA, the host's available memory on CPU: 24 GB free ->
    6 GB), never less than 512 MB on CPU; other values are returned as they are (0 = no budget).
    Free memory, not the total: the weights already loaded, a colocated vLLM engine and the other
    processes of a shared machine are not the activations' to take."""
    if setting != -1:
        return setting
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return free // 4 // 2**20
    return max(CPU_ACTIVATION_MB, host_available_bytes() // 4 // 2**20)


def per_token_bytes(model_config, bytes_per_value: int, checkpointed: bool = False) -> int:
    """Activation bytes one token keeps for backward (0: an unknown shape).

    A Llama-style layer keeps about 10 x hidden + 4 x intermediate values per token (norm inputs and
    outputs, q/k/v, attention output, residuals, gate, up, activation, product). Checkpointed, each
    layer keeps only its input (hidden values) and one layer at a time is recomputed in full.
    """
    hidden = getattr(model_config, "hidden_size", None) or getattr(model_config, "n_embd", 0)
    layers = getattr(model_config, "num_hidden_layers", None) or getattr(model_config, "n_layer", 0)
    if not hidden or not layers:
        return 0
    inter = getattr(model_config, "intermediate_size", None) or 4 * hidden
    layer = 10 * hidden + 4 * inter
    return (hidden * layers + layer if checkpointed else layer * layers) * bytes_per_value


def token_budget(
    model_config, memory_mb: int, bytes_per_value: int, max_tokens: int = 0, checkpointed: bool = False
) -> int:
    """Tokens per micro-batch: ``max_tokens``, lowered so the activations kept for backward fit in
    ``memory_mb`` (0 for either: no limit from it; 0 returned: no limit at all).

    Example: hidden 512, intermediate 1536, 8 layers, float32 -> 11,264 values x 8 x 4 B = 352 KiB a
    token, so 512 MB holds 1,489 tokens (``per_token_bytes``; ``checkpointed``: its smaller figure).
    """
    if not memory_mb:
        return max_tokens
    per_token = per_token_bytes(model_config, bytes_per_value, checkpointed)
    if not per_token:
        return max_tokens  # an unknown shape: no estimate
    fit = max(1, memory_mb * 2**20 // per_token)
    return min(max_tokens, fit) if max_tokens else fit
