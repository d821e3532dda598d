#!/usr/bin/env python3
"""Write a tiny GGUF model (a few MB, random weights) that llama-server loads and runs.

For checking a llama.cpp build on a machine the real model cannot reach: the model has a
real architecture (``llama`` or ``qwen2``), a byte-level BPE vocabulary with a chat
template, and its matrices quantized (``q8_0`` or ``q4_0``), so the server runs the same
quantized matrix code (on a CPU with AMX, the AMX kernels of a build that has them) as on
a real model. Its answers are noise. Every matrix dimension is a multiple of 32, as
llama.cpp's AMX code requires of the matrices it takes.

It needs the ``gguf`` package (llama.cpp's GGUF writer, on PyPI) and numpy; keep them out
of refine's environment, in a throwaway one::

    python3 -m venv /tmp/gguf-venv && /tmp/gguf-venv/bin/pip install gguf
    /tmp/gguf-venv/bin/python scripts/tiny_gguf.py /tmp/tiny-q8_0.gguf
    /tmp/gguf-venv/bin/python scripts/tiny_gguf.py /tmp/tiny-q4_0.gguf --type q4_0 --arch qwen2

Then ``python3 scripts/smoke_server.py --bin FOLDER --model /tmp/tiny-q8_0.gguf``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{{ message['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
FREQUENT = "etaoinshrdl"  # letters whose pairs become merges: a vocabulary with real merges


def byte_symbols() -> list[str]:
    """The 256 symbols byte-level BPE writes bytes as (GPT-2's scheme): printable Latin-1
    bytes stand for themselves, the others for the code points from 256 on, in order."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
    symbols: dict[int, str] = {byte: chr(byte) for byte in printable}
    extra = 0
    for byte in range(256):
        if byte not in symbols:
            symbols[byte] = chr(256 + extra)
            extra += 1
    return [symbols[byte] for byte in range(256)]


def vocabulary(size_multiple: int = 32) -> tuple[list[str], list[str], list[int]]:
    """Tokens, merges and token types: bytes, letter pairs, specials, padding to a multiple."""
    tokens = byte_symbols()
    merges = [f"{a} {b}" for a in FREQUENT for b in FREQUENT]
    tokens += [pair.replace(" ", "") for pair in merges]
    types = [1] * len(tokens)  # normal
    tokens += list(SPECIALS)
    types += [3] * len(SPECIALS)  # control
    padding = -len(tokens) % size_multiple
    tokens += [f"<|unused_{index}|>" for index in range(padding)]
    types += [5] * padding  # unused
    return tokens, merges, types


def build(out: Path, arch: str, qtype_name: str, layers: int, dim: int, seed: int) -> int:
    """Write the model to ``out``; its size in bytes."""
    import gguf
    import numpy as np

    qtype = {"q8_0": gguf.GGMLQuantizationType.Q8_0, "q4_0": gguf.GGMLQuantizationType.Q4_0}[
        qtype_name
    ]
    heads, kv_heads = dim // 64, max(dim // 128, 1)
    head_dim, ff = 64, 3 * dim
    tokens, merges, types = vocabulary()
    rng = np.random.default_rng(seed)

    writer = gguf.GGUFWriter(str(out), arch)
    writer.add_name(f"tiny-{arch}-{qtype_name}")
    writer.add_file_type(
        {"q8_0": gguf.LlamaFileType.MOSTLY_Q8_0, "q4_0": gguf.LlamaFileType.MOSTLY_Q4_0}[qtype_name]
    )
    writer.add_context_length(2048)
    writer.add_embedding_length(dim)
    writer.add_block_count(layers)
    writer.add_feed_forward_length(ff)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_rope_dimension_count(head_dim)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_merges(merges)
    writer.add_token_types(types)
    writer.add_bos_token_id(tokens.index("<|endoftext|>"))
    writer.add_eos_token_id(tokens.index("<|im_end|>"))
    writer.add_add_bos_token(False)
    writer.add_chat_template(CHAT_TEMPLATE)

    def matrix(name: str, rows: int, cols: int) -> None:
        weights = (rng.standard_normal((rows, cols)) * 0.02).astype(np.float32)
        writer.add_tensor(name, gguf.quants.quantize(weights, qtype), raw_dtype=qtype)

    def vector(name: str, size: int, value: float | None = None) -> None:
        data: Any = (
            np.full(size, value, dtype=np.float32)
            if value is not None
            else (rng.standard_normal(size) * 0.02).astype(np.float32)
        )
        writer.add_tensor(name, data)

    vocab = len(tokens)
    matrix("token_embd.weight", vocab, dim)
    for layer in range(layers):
        block = f"blk.{layer}"
        vector(f"{block}.attn_norm.weight", dim, 1.0)
        matrix(f"{block}.attn_q.weight", heads * head_dim, dim)
        matrix(f"{block}.attn_k.weight", kv_heads * head_dim, dim)
        matrix(f"{block}.attn_v.weight", kv_heads * head_dim, dim)
        if arch == "qwen2":  # qwen2's attention projections carry biases
            vector(f"{block}.attn_q.bias", heads * head_dim)
            vector(f"{block}.attn_k.bias", kv_heads * head_dim)
            vector(f"{block}.attn_v.bias", kv_heads * head_dim)
        matrix(f"{block}.attn_output.weight", dim, heads * head_dim)
        vector(f"{block}.ffn_norm.weight", dim, 1.0)
        matrix(f"{block}.ffn_gate.weight", ff, dim)
        matrix(f"{block}.ffn_up.weight", ff, dim)
        matrix(f"{block}.ffn_down.weight", dim, ff)
    vector("output_norm.weight", dim, 1.0)
    matrix("output.weight", vocab, dim)

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out.stat().st_size


def main(argv: list[str] | None = None) -> int:
    """Parse the arguments and write the model."""
    parser = argparse.ArgumentParser(
        description="Write a tiny random-weight GGUF model (llama or qwen2, Q8_0 or Q4_0) "
        "for checking a llama.cpp build; needs `pip install gguf` (use a throwaway venv)."
    )
    parser.add_argument("out", type=Path, help="the .gguf file to write")
    parser.add_argument("--arch", choices=("llama", "qwen2"), default="llama")
    parser.add_argument(
        "--type",
        dest="qtype",
        choices=("q8_0", "q4_0"),
        default="q8_0",
        help="how the matrices are quantized (default: q8_0)",
    )
    parser.add_argument("--layers", type=int, default=2, help="transformer blocks (default: 2)")
    parser.add_argument(
        "--dim", type=int, default=256, help="embedding size, a multiple of 128 (default: 256)"
    )
    parser.add_argument("--seed", type=int, default=0, help="random seed of the weights")
    args = parser.parse_args(argv)
    if args.dim < 128 or args.dim % 128 or args.layers < 1:
        parser.error("--dim must be a positive multiple of 128 and --layers at least 1")
    try:
        import gguf  # noqa: F401
    except ImportError:
        print(
            "tiny_gguf: needs the gguf package; in a throwaway venv: python3 -m venv "
            "/tmp/gguf-venv && /tmp/gguf-venv/bin/pip install gguf, then run this script "
            "with /tmp/gguf-venv/bin/python",
            file=sys.stderr,
        )
        return 2
    size = build(args.out, args.arch, args.qtype, args.layers, args.dim, args.seed)
    print(f"wrote {args.out}: {args.arch}, {args.qtype}, {args.layers} layers, {size:,} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
