"""``scripts/services/llama_server.py``'s ``gemma3`` chat format: Gemma 3's own template, the system text kept."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "services" / "llama_server.py"


def _script() -> ModuleType:
    import llama_cpp  # noqa: F401 - the script needs it: scripts/test.sh installs the server (QUARRY_SETUP_LLM_SERVER=1)
    spec = importlib.util.spec_from_file_location("llama_server", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # defines; the server runs only as __main__
    return module


def test_the_system_text_opens_the_first_user_turn() -> None:
    out = _script().gemma3([
        {"role": "system", "content": "Answer from the sources."},
        {"role": "user", "content": "Question: A?"},
        {"role": "assistant", "content": "Yes [1]."},
        {"role": "user", "content": "Question: B?"},
    ])
    assert out.prompt == (
        "<start_of_turn>user\nAnswer from the sources.\n\nQuestion: A?<end_of_turn>\n"
        "<start_of_turn>model\nYes [1].<end_of_turn>\n"
        "<start_of_turn>user\nQuestion: B?<end_of_turn>\n"
        "<start_of_turn>model\n"
    )
    assert out.stop == "<end_of_turn>"


def test_without_a_system_message_the_turns_are_as_given() -> None:
    out = _script().gemma3([{"role": "user", "content": "Hi"}])
    assert out.prompt == "<start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n"
