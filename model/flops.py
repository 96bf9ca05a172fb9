"""Training FLOPs per token of a decoder-only transformer, the one formula every model of model/ reports MFU by."""


def training_flops_per_token(matmul_params: int, n_layer: int, n_embd: int, seq_len: int) -> float:
    """Forward + backward FLOPs per token, PaLM appendix B: 6N + 12 L H Q T (H Q = n_embd).

    ``matmul_params`` is N, the parameters a token multiplies by: every weight but the tables only looked up.
    """
    return 6 * matmul_params + 12 * n_layer * n_embd * seq_len
