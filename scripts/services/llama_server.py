"""Run llama-cpp-python's OpenAI-compatible server without ggml's extra CPU buffer types.

``python scripts/services/llama_server.py --model X.gguf ...`` takes ``llama_cpp.server``'s
arguments. A wheel built from source on a CPU with AMX (``GGML_NATIVE``, the default) puts the
weights in ggml's AMX buffer type, whose matrix multiply crashed here (SIGSEGV in
``ggml_backend_amx_mul_mat`` on the first decode, llama-cpp-python 0.3.36 on a Sapphire Rapids
class CPU); ``use_extra_bufts = False`` (llama.cpp's ``--no-repack``) keeps plain CPU buffers,
which the server does not expose as an option. ``QUARRY_LLAMA_EXTRA_BUFTS=1`` keeps them.
"""

from __future__ import annotations

import os
import runpy

import llama_cpp.llama_cpp as lib  # the ctypes bindings Llama() reads its defaults from

if os.environ.get("QUARRY_LLAMA_EXTRA_BUFTS", "0") != "1":
    _default_params = lib.llama_model_default_params

    def _no_extra_bufts() -> lib.llama_model_params:
        params = _default_params()
        params.use_extra_bufts = False
        return params

    lib.llama_model_default_params = _no_extra_bufts

runpy.run_module("llama_cpp.server", run_name="__main__", alter_sys=True)
