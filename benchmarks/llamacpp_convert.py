"""Convert an HF-format model directory (e.g. a `random:` model) to an F32 GGUF for llama.cpp.

Uses the converter that llama-cpp-python 0.3.36's sdist ships (`convert_hf_to_gguf.py`'s `conversion`
package and its `gguf-py`), unpacked by scripts/install_llamacpp.sh into
`<venv>/share/radixflow-llamacpp/`. Its tensor mapping is used as it is; only the vocabulary step is
replaced, from here: the converter identifies a BPE pre-tokenizer by hashing how the tokenizer splits a
test string and refuses an unknown one (our byte-level tokenizer is unknown to it), and some families
read a sentencepiece model. The GGUF gets no tokenizer instead (`tokenizer.ggml.model = "none"` with
`<arch>.vocab_size` = the embedding's rows, so llama.cpp makes that many placeholder tokens) plus the
eos/pad ids: the benchmark feeds llama.cpp token ids, never text. Qwen3.5 is converted without MTP
(the random checkpoints hold none).

    python benchmarks/llamacpp_convert.py MODEL_DIR OUT.gguf
    python benchmarks/llamacpp_convert.py --placeholder-vocab MODEL_DIR OUT.gguf   # for llama-server

`--placeholder-vocab` writes a vocabulary instead of none: llama-server turns every sampled token into
text (`token_to_piece`), which aborts on a vocabulary of type none, and a stream holds back a token whose
text is an incomplete UTF-8 character. So each id gets an ASCII piece of its own (`<t123>`, SentencePiece
type `llama`, all normal tokens but eos / pad, which are control tokens; no BOS or EOS added): llama-server
still gets token ids and gives them back, benchmarks/serve_peers.py reads ids, never text.

Run in a process of its own (the benchmark does): it imports the sdist's `gguf` ahead of any other.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def converter_dir() -> Path:
    """Where install_llamacpp.sh unpacked the sdist's converter for this interpreter's venv."""
    return Path(sys.prefix) / "share" / "radixflow-llamacpp"


def convert(model_dir: Path, out: Path, placeholder_vocab: bool = False) -> None:
    share = converter_dir()
    if not (share / "conversion" / "__init__.py").is_file():
        raise SystemExit(f"no llama.cpp converter under {share}: run scripts/install_llamacpp.sh {sys.prefix}")
    sys.path.insert(0, str(share))
    sys.path.insert(1, str(share / "gguf-py"))
    import gguf
    import torch
    from conversion import ModelBase, ModelType, get_model_architecture, get_model_class

    hparams = ModelBase.load_hparams(model_dir, False)
    arch = get_model_architecture(hparams, ModelType.TEXT)
    base = get_model_class(arch, mmproj=False)
    config = json.loads((model_dir / "config.json").read_text())
    vocab_size = int(config["vocab_size"])

    class ByteIdsModel(base):  # type: ignore[misc, valid-type]
        model_arch = base.model_arch
        no_mtp = bool(getattr(base, "supports_mtp_export", False))

        def set_vocab(self) -> None:
            specials = {config.get(k) for k in ("eos_token_id", "pad_token_id")}
            if placeholder_vocab:
                self.gguf_writer.add_tokenizer_model("llama")
                self.gguf_writer.add_tokenizer_pre("default")
                self.gguf_writer.add_token_list([f"<t{i}>".encode() for i in range(vocab_size)])
                self.gguf_writer.add_token_scores([0.0] * vocab_size)
                self.gguf_writer.add_token_types([gguf.TokenType.CONTROL if i in specials else gguf.TokenType.NORMAL
                                                  for i in range(vocab_size)])
                self.gguf_writer.add_add_bos_token(False)
                self.gguf_writer.add_add_eos_token(False)
            else:
                self.gguf_writer.add_tokenizer_model("none")
                self.gguf_writer.add_vocab_size(vocab_size)
            for key, add in (("eos_token_id", self.gguf_writer.add_eos_token_id),
                             ("pad_token_id", self.gguf_writer.add_pad_token_id)):
                if isinstance(config.get(key), int):
                    add(config[key])

    kwargs = {}
    if config.get("model_type") == "nemotron_h" and "layers_block_type" in config:
        # The converter counts MLP blocks only in the pattern-string form (a list form marks only
        # `moe` blocks, as in the MoE checkpoints), and transformers' config defaults would add
        # `num_experts_per_tok`, which makes it convert to the MoE architecture: give it the raw
        # config with the 9B-v2 checkpoint's pattern string.
        code = {"mamba": "M", "linear_attention": "M", "attention": "*", "full_attention": "*", "mlp": "-"}
        blocks = config["layers_block_type"]
        kwargs["hparams"] = {**{k: v for k, v in config.items() if k != "layers_block_type"},
                             "hybrid_override_pattern": "".join(code[b] for b in blocks),
                             "num_hidden_layers": len(blocks)}
    tmp = out.with_name(out.name + ".part")
    with torch.inference_mode():
        model = ByteIdsModel(model_dir, gguf.LlamaFileType.ALL_F32, tmp, **kwargs)
        model.write()
    tmp.rename(out)


if __name__ == "__main__":
    argv = sys.argv[1:]
    placeholder = "--placeholder-vocab" in argv
    argv = [a for a in argv if a != "--placeholder-vocab"]
    if len(argv) != 2:
        raise SystemExit("usage: python benchmarks/llamacpp_convert.py [--placeholder-vocab] MODEL_DIR OUT.gguf")
    convert(Path(argv[0]), Path(argv[1]), placeholder)
