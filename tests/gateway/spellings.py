"""Spellings of inference paths a client can put in a request target (issue #52, point 1): sent byte for byte
through the gateway to the emulator (tests/gateway/test_paths.py) and to real vLLM (tests/realvllm)."""

from __future__ import annotations

__all__ = ("SPELLINGS",)

SPELLINGS: list[bytes] = [
    b"/v1/chat/%63ompletions",
    b"/v1/chat/completion%73",
    b"/v1/chat/completions#frag",
    b"/v1/chat%2Fcompletions",
    b"/v1/chat%2fcompletions",
    b"/v1%2Fchat%2Fcompletions",
    b"/v1/chat/completions/",
    b"/v1//chat/completions",
    b"//v1/chat/completions",
    b"/v1/./chat/completions",
    b"/v1/chat/../chat/completions",
    b"/v1/chat/completions;x",
    b"/v1/Chat/completions",
    b"/v1/chat/completions%2523",
    b"/v1/%63hat/%63ompletions",
    b"/v1/completion%73",
    b"/v1/completions#x",
    b"/v1/%2e/completions",
    b"/V1/chat/completions",
    b"/v1/chat/completions%20",
    b"/v1/chat/completions%23x",
    b"/v1/chat/completions%3Fx",
    b"/v1/chat/completions?x=1#y",
]
