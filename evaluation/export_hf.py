"""Export a train.py checkpoint as a Hugging Face ``transformers`` GPT-2 or LLaMA, tokenizer included, without a
network.

    python -m evaluation.export_hf --checkpoint outputs/my-run --out hf/my-run   # hf/: ignored by git

``--checkpoint`` is a checkpoint file or a run directory (its newest loadable checkpoint). ``--out`` receives a
``GPT2LMHeadModel`` (``config.json``, ``model.safetensors``, ``generation_config.json``) and GPT-2's tokenizer
(``tokenizer.json``, ``tokenizer_config.json``), so that ``AutoModelForCausalLM.from_pretrained(out)``,
``AutoTokenizer.from_pretrained(out)`` and the lm-evaluation-harness (``--model hf --model_args pretrained=out``)
load it offline. The exported model computes our GPT's logits (tested to 1e-5 on random weights of every option,
both HF attention implementations, and on a checkpoint written by train.py).

How each option of ``model.GPTConfig`` maps (transformers' ``models/gpt2/modeling_gpt2.py``):

- Weights keep their names: nanoGPT kept GPT-2's (``transformer.h.0.attn.c_attn.weight``, ...). HF's blocks use
  ``Conv1D``, which stores a projection as (in, out) where ``nn.Linear`` stores (out, in): the four block
  projections (``attn.c_attn``, ``attn.c_proj``, ``mlp.c_fc``, ``mlp.c_proj``) are transposed. ``lm_head`` stays
  tied to ``wte`` (``tie_word_embeddings``), so the file holds the matrix once.
- ``bias=False``: HF's GPT-2 always has biases (Conv1D and LayerNorm); they are exported as zeros, which adds
  nothing. ``bias=True`` exports ours.
- LayerNorm eps: ours is ``F.layer_norm``'s 1e-5 (``model/gpt.py``, ``LayerNorm.forward``) -> ``layer_norm_epsilon``.
- Attention scale: HF's ``GPT2Attention`` multiplies the scores by ``head_dim ** -0.5`` (``scale_attn_weights``)
  and, with ``scale_attn_by_inverse_layer_idx``, divides by ``layer_idx + 1`` with ``layer_idx`` counted from 0
  (``GPT2Model`` builds ``GPT2Block(config, layer_idx=i) for i in range(n_layer)``): ours exactly.
  ``reorder_and_upcast_attn`` stays off (it only changes rounding, and only under autocast).
- Activation: ``gelu`` (exact, erf) -> HF ``"gelu"`` (``GELUActivation``: ``nn.functional.gelu``);
  ``gelu_tanh`` -> HF ``"gelu_pytorch_tanh"`` (``GELUTanh``: ``nn.functional.gelu(approximate="tanh")``, the very
  function our MLP calls). GPT-2's own config names ``"gelu_new"``, the same tanh formula written out in Python
  (``NewGELUActivation``); it differs from torch's kernel by rounding (up to 5e-7 on activations of size 10).
- ``dropout`` -> ``embd_pdrop`` (after the embeddings), ``attn_pdrop`` (on the attention probabilities, as our
  ``scaled_dot_product_attention(dropout_p=...)``) and ``resid_pdrop`` (after both residual projections).
- ``block_size`` -> ``n_positions``; the MLP's width is 4 x ``n_embd`` in both (``n_inner=None``).
- ``vocab_size`` is kept, padding included (50304 for GPT-2's 50257 tokens): the tokenizer never produces ids
  50257 and up, but the model still computes a logit for them and every softmax includes them, as our training
  loss did, so HF log-likelihoods equal ours. Training lowers those logits (the softmax's gradient pushes down
  every id but the target), yet sampling could in principle pick one; the tokenizer decodes such an id to nothing.
- ``bos_token_id`` and ``eos_token_id`` are GPT-2's ``<|endoftext|>``, 50256; nothing is prepended to a text.

A LLaMA-style model (``model.Llama``) is exported as a ``LlamaForCausalLM`` (transformers'
``models/llama/modeling_llama.py``), which computes its logits to float32 rounding (tested on random weights, tied
and untied, and on a checkpoint written by train.py):

- Weights keep their names, under ``model.`` but for ``lm_head``: ours are transformers' (``model/llama.py``), and
  both store ``nn.Linear`` weights. ``tie_embeddings`` -> ``tie_word_embeddings``.
- ``n_embd``, ``intermediate_size``, ``n_layer``, ``n_head`` -> ``hidden_size``, ``intermediate_size``,
  ``num_hidden_layers``, ``num_attention_heads`` (and as many key-value heads: no grouped-query attention);
  ``rms_norm_eps`` as is; ``rope_theta`` -> ``rope_parameters`` of the default (unscaled) rotary type, whose
  rotation of the two halves of each head is ours; ``block_size`` -> ``max_position_embeddings``.
- SiLU gating (``hidden_act="silu"``), no biases (``attention_bias``, ``mlp_bias`` false), attention at
  1/sqrt(head_dim), no dropout: as ours. ``bos_token_id``, ``eos_token_id``: GPT-2's, as for GPT-2 below.

The tokenizer is GPT-2's byte-level BPE, built from the rank file that ships with ``data/`` (``data/tokenizer.py``):
the vocabulary is the ranks, and the merge that makes each token is the last step of tiktoken's own merging of
its bytes over the lower ranks, which yields GPT-2's 50,000 merges in their order; ``<|endoftext|>`` is a special
token. It encodes every text to tiktoken's ids, with ``<|endoftext|>`` in a text read as the special token
(tiktoken's ``encode(text, allowed_special="all")``).

A model trained on other tokens (data=c4: t5-base's, as its checkpoint records from the corpus's manifest) ships
with the tokenizer its corpus was prepared with instead, named by ``--tokenizer`` (``t5-base`` from the local
Hugging Face cache, where preparing C4 left it, or a saved copy's directory) and refused unless its vocabulary is
the one the manifest fingerprinted; without ``--tokenizer`` the export is refused rather than shipping GPT-2's,
which would turn text into other ids. The config's special ids are then that tokenizer's (t5-base: no bos,
``</s>`` 1, ``<pad>`` 0). t5-base has 32,100 ids and GaLore's LLaMA embeds 32,000: the 100 above it are the
``<extra_id_N>`` sentinels, which a text yields only by spelling them out.

The weights are written as they are stored in the checkpoint (float32), whatever precision the run trained in.
``training_source.json`` beside them says where they come from: the checkpoint, its step, and the launches of
the run that trained it (each with its git commit and the patch of any uncommitted change, as train.py logged).
"""
import json
import shutil
from pathlib import Path

import torch
from tiktoken.load import load_tiktoken_bpe
from transformers import GPT2Config, GPT2LMHeadModel, GPT2Tokenizer, LlamaForCausalLM
from transformers import LlamaConfig as HFLlamaConfig
from transformers.convert_slow_tokenizer import bytes_to_unicode
from transformers.utils.logging import disable_progress_bar

from data.tokenizer import GPT2_EOT_TOKEN, GPT2_RANKS_FILE
from data.c4 import load_tokenizer, tokenizer_fingerprint
from data.shards import reads_gpt2_tokens
from evaluation.checkpoints import checkpoint_source, load_model_and_tokenizer
from model import GPT, GPTConfig, Llama, LlamaConfig
from reporting import arguments
from training.atomic import atomic_directory

LAYER_NORM_EPS = 1e-5  # model/gpt.py LayerNorm.forward
HF_ACTIVATIONS = {"gelu": "gelu", "gelu_tanh": "gelu_pytorch_tanh"}  # GPTConfig.activation -> activation_function
# Block projections that HF's Conv1D stores as (in, out), the transpose of nn.Linear's (out, in).
CONV1D_WEIGHTS = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")
EOT_TEXT = "<|endoftext|>"
SOURCE_FILE = "training_source.json"  # which checkpoint, step and code the exported weights come from
GPT2_SPECIAL_IDS = {"bos_token_id": GPT2_EOT_TOKEN, "eos_token_id": GPT2_EOT_TOKEN}  # nothing is prepended to a text


def hf_config(config: GPTConfig, special_ids: dict = GPT2_SPECIAL_IDS) -> GPT2Config:
    """The ``GPT2Config`` of a ``GPTConfig``: the same network, option by option (see the module docstring), and
    the special tokens' ids (``special_ids``) of the tokenizer it is shipped with."""
    if config.activation not in HF_ACTIVATIONS:
        raise ValueError(f"activation {config.activation!r} has no Hugging Face GPT-2 equivalent here "
                         f"(known: {', '.join(HF_ACTIVATIONS)}): add it to HF_ACTIVATIONS in {__name__}")
    return GPT2Config(
        vocab_size=config.vocab_size,
        n_positions=config.block_size,
        n_embd=config.n_embd,
        n_layer=config.n_layer,
        n_head=config.n_head,
        n_inner=None,
        activation_function=HF_ACTIVATIONS[config.activation],
        resid_pdrop=config.dropout,
        embd_pdrop=config.dropout,
        attn_pdrop=config.dropout,
        layer_norm_epsilon=LAYER_NORM_EPS,
        scale_attn_weights=True,
        scale_attn_by_inverse_layer_idx=config.scale_attn_by_inverse_layer_idx,
        reorder_and_upcast_attn=False,
        tie_word_embeddings=True,
        **special_ids,
    )


def hf_llama_config(config: LlamaConfig, special_ids: dict = GPT2_SPECIAL_IDS) -> HFLlamaConfig:
    """The ``LlamaConfig`` of transformers of our ``model.LlamaConfig``: the same network (see the module docstring),
    and the special tokens' ids (``special_ids``)."""
    return HFLlamaConfig(
        vocab_size=config.vocab_size,
        hidden_size=config.n_embd,
        intermediate_size=config.intermediate_size,
        num_hidden_layers=config.n_layer,
        num_attention_heads=config.n_head,
        num_key_value_heads=config.n_head,
        hidden_act="silu",
        max_position_embeddings=config.block_size,
        rms_norm_eps=config.rms_norm_eps,
        rope_parameters={"rope_type": "default", "rope_theta": config.rope_theta},
        attention_bias=False,
        mlp_bias=False,
        attention_dropout=0.0,
        tie_word_embeddings=config.tie_embeddings,
        **special_ids,
    )


def hf_llama_model(model: Llama, special_ids: dict = GPT2_SPECIAL_IDS) -> LlamaForCausalLM:
    """A ``LlamaForCausalLM`` with ``model``'s weights, in eval mode."""
    exported = LlamaForCausalLM(hf_llama_config(model.config, special_ids))
    exported.load_state_dict({name if name.startswith("lm_head.") else f"model.{name}": tensor
                              for name, tensor in model.state_dict().items()}, strict=True)
    if model.config.tie_embeddings:
        exported.tie_weights()
    return exported.eval()


def hf_model(model: GPT | Llama, special_ids: dict = GPT2_SPECIAL_IDS) -> GPT2LMHeadModel | LlamaForCausalLM:
    """A ``GPT2LMHeadModel`` with ``model``'s weights (Conv1D ones transposed, absent biases as zeros), in eval mode;
    a ``LlamaForCausalLM`` of a ``model.Llama``."""
    if isinstance(model, Llama):
        return hf_llama_model(model, special_ids)
    config = hf_config(model.config, special_ids)
    exported = GPT2LMHeadModel(config)
    weights = {name: tensor.t() if name.endswith(CONV1D_WEIGHTS) else tensor
               for name, tensor in model.state_dict().items()}
    for name, tensor in exported.state_dict().items():
        if name not in weights and name.endswith(".bias") and not model.config.bias:
            weights[name] = torch.zeros_like(tensor)
    exported.load_state_dict(weights, strict=True)
    exported.tie_weights()
    return exported.eval()


def gpt2_merges(ranks: dict[bytes, int]) -> list[tuple[bytes, bytes]]:
    """The BPE merges, in rank order, under which HF's BPE merges as tiktoken does with ``ranks``.

    tiktoken repeatedly joins the adjacent pair whose join has the lowest rank. The token of rank r is made by
    that process run on its own bytes with ranks below r alone, which must end in two parts: its merge.
    """
    merges = []
    for token, rank in sorted(ranks.items(), key=lambda item: item[1]):
        if len(token) == 1:
            continue
        parts = [bytes([byte]) for byte in token]
        while len(parts) > 2:
            joins = [(ranks.get(left + right, rank), i) for i, (left, right) in enumerate(zip(parts, parts[1:]))]
            lowest, i = min(joins)
            if lowest >= rank:
                break
            parts[i : i + 2] = [parts[i] + parts[i + 1]]
        if len(parts) != 2 or ranks.get(parts[0] + parts[1]) != rank:
            raise ValueError(f"{GPT2_RANKS_FILE}: token {token!r} (rank {rank}) is not the merge of two lower-ranked "
                             "tokens: not a byte-level BPE rank file")
        merges.append((parts[0], parts[1]))
    return merges


def gpt2_tokenizer(model_max_length: int) -> GPT2Tokenizer:
    """GPT-2's tokenizer as ``transformers`` holds it, built from the bundled rank file."""
    ranks = load_tiktoken_bpe(str(GPT2_RANKS_FILE))
    byte_to_char = bytes_to_unicode()  # byte-level BPE writes each byte as a printable character

    def text_of(token: bytes) -> str:
        return "".join(byte_to_char[byte] for byte in token)

    vocab = {text_of(token): rank for token, rank in ranks.items()}
    merges = [(text_of(left), text_of(right)) for left, right in gpt2_merges(ranks)]
    tokenizer = GPT2Tokenizer(vocab=vocab, merges=merges, unk_token=EOT_TEXT, bos_token=EOT_TEXT,
                              eos_token=EOT_TEXT, add_prefix_space=False, model_max_length=model_max_length)
    if tokenizer.convert_tokens_to_ids(EOT_TEXT) != GPT2_EOT_TOKEN:
        raise ValueError(f"{GPT2_RANKS_FILE} holds {len(ranks)} tokens: {EOT_TEXT} would not get id {GPT2_EOT_TOKEN}")
    return tokenizer


def save_hf(model: GPT | Llama, out: Path, source: dict | None = None, overwrite: bool = False,
            tokenizer=None) -> Path:
    """Write ``model`` and its tokenizer (``tokenizer``, a ``transformers`` one; None: GPT-2's) to the directory
    ``out`` (created if needed) in Hugging Face format, and ``source``
    (:func:`evaluation.checkpoints.checkpoint_source`) as ``SOURCE_FILE`` beside them. A directory that holds
    anything is refused unless ``overwrite``: its files would be replaced or mixed with the export's.

    The files are written aside and moved into ``out`` once all are (``training.atomic.atomic_directory``): an
    export interrupted or failed on the way (Ctrl-C, a full disk) leaves ``out`` as it was, never a model without
    its tokenizer or its source."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {out} is a file: pass a directory (it is created if it does not exist)")
    held = sorted(out.iterdir()) if out.is_dir() else []
    if held and not overwrite:
        raise ValueError(f"--out {out} is not empty (it holds {held[0].name}"
                         f"{f' and {len(held) - 1} more' if len(held) > 1 else ''}): pass a new or empty directory, "
                         "or --overwrite to write the export over what it holds")
    special_ids = GPT2_SPECIAL_IDS if tokenizer is None else {
        "bos_token_id": tokenizer.bos_token_id, "eos_token_id": tokenizer.eos_token_id,
        "pad_token_id": tokenizer.pad_token_id}
    exported = hf_model(model, special_ids)  # before writing anything: a config HF cannot express leaves no half export
    with atomic_directory(out) as staging:
        exported.save_pretrained(staging)
        (tokenizer or gpt2_tokenizer(model.config.block_size)).save_pretrained(staging)
        for weights in staging.glob("*.safetensors"):  # safetensors creates its files 0600, whatever the umask
            shutil.copymode(staging / "config.json", weights)
        if source is not None:
            (staging / SOURCE_FILE).write_text(json.dumps(source, indent=2) + "\n")
    return out


def export(checkpoint: Path, out: Path, overwrite: bool = False, tokenizer: str | None = None) -> Path:
    """Export a train.py checkpoint file, or a run directory's newest checkpoint, to ``out``; returns ``out``.
    ``tokenizer``: for a model of other tokens than GPT-2's, the tokenizer its corpus was prepared with
    (``shipped_tokenizer``)."""
    return export_checkpoint(checkpoint, out, overwrite, tokenizer)[0]


def export_checkpoint(checkpoint: Path, out: Path, overwrite: bool, tokenizer: str | None) -> tuple[Path, Path]:
    """``export``'s, returning ``out`` and the checkpoint file exported (a run directory's newest)."""
    model, checkpoint, trained = load_model_and_tokenizer(checkpoint)
    shipped = shipped_tokenizer(trained, tokenizer, checkpoint, model.config.block_size)
    return save_hf(model, out, checkpoint_source(checkpoint), overwrite, shipped), checkpoint


def shipped_tokenizer(trained: dict | None, name: str | None, checkpoint: Path, block_size: int):
    """The tokenizer to ship with a model that read ``trained``'s tokens
    (:func:`evaluation.checkpoints.trained_tokenizer`): None for GPT-2's, which is built here; otherwise ``name``
    (a Hub id in the local cache, or a saved tokenizer's directory), refused unless its vocabulary is the one the
    corpus was prepared with (the manifest's fingerprint)."""
    if reads_gpt2_tokens(trained):
        if name is not None:
            raise ValueError(f"{checkpoint} was trained on GPT-2's tokens, whose tokenizer the export builds itself: "
                             f"drop --tokenizer {name}")
        return None
    if name is None:
        raise ValueError(f"{checkpoint} was trained on the tokens of {trained['name']}, not GPT-2's: pass "
                         f"--tokenizer {trained['name']} (or a saved copy's directory) for the export to ship it")
    tokenizer = load_tokenizer(name)
    found = tokenizer_fingerprint(tokenizer)
    if trained["fingerprint"] not in (None, found):
        raise ValueError(f"--tokenizer {name} is not the one {checkpoint}'s corpus was prepared with (its vocabulary's "
                         f"fingerprint is {found}, the corpus's {trained['fingerprint']}): pass that one, "
                         f"{trained['name']}")
    tokenizer.model_max_length = block_size
    return tokenizer


def _parser() -> arguments.OneLineParser:
    parser = arguments.OneLineParser(prog="python -m evaluation.export_hf", description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", type=Path, required=True,
                        help="a checkpoint written by train.py, or a run directory (its newest checkpoint)")
    parser.add_argument("--out", type=Path, required=True, help="directory to write the Hugging Face model to")
    parser.add_argument("--overwrite", action="store_true", help="write into --out even if it holds files")
    parser.add_argument("--tokenizer", help="for a model trained on other tokens than GPT-2's (data=c4): the "
                        "tokenizer its corpus was prepared with, by name (t5-base, from the local Hugging Face "
                        "cache) or a saved copy's directory; checked against the corpus's manifest")
    return parser


def main(argv: list[str] | None = None) -> None:
    args = _parser().parse_args(argv)
    disable_progress_bar()  # the command prints one line: what it wrote, or why it could not
    try:
        out, checkpoint = export_checkpoint(args.checkpoint, args.out, args.overwrite, args.tokenizer)
    except (ValueError, FileNotFoundError) as err:
        raise SystemExit(f"error: {err}") from None
    except OSError as err:  # a read-only or full --out
        raise SystemExit(f"error: could not write {err.filename or args.out} ({err.strerror or err}): pass a "
                         "writable --out with space for the model") from None
    except KeyboardInterrupt:
        raise SystemExit(f"error: interrupted: nothing was written to {args.out} (an export appears whole or not "
                         "at all); run the command again to export") from None
    print(json.dumps({"checkpoint": str(checkpoint), "out": str(out)}))


if __name__ == "__main__":
    main()
