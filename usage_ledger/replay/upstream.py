"""Before a replay sends anything: is `--upstream` an OpenAI-compatible server that answers?

`GET /v1/models` must answer 200 with a model list (vLLM, the emulator and OpenAI-compatible
proxies all serve it) within `timeout_s`. Otherwise a
`ConfigError` (exit 2) says what the upstream did, and nothing is sent or recorded: without this
check a dead port, a wrong URL or a server that never answers became a permanent run of failed calls.
Without `--model`, the models the recorded requests name must be among those listed (`check_models`):
vLLM answers 404 to any other name, and a replay of 60 such calls was 60 failures recorded for good.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import httpx
import msgspec

from usage_ledger.ledger import ConfigError

__all__ = ("MODELS_PATH", "check_models", "check_upstream")

MODELS_PATH = "/v1/models"


class _Model(msgspec.Struct):
    id: str


class _ModelList(msgspec.Struct):
    data: list[_Model]


async def check_upstream(upstream: str, *, timeout_s: float) -> list[str]:
    """The model names `upstream` lists; ConfigError when it cannot answer as a model server."""
    where = f"--upstream {upstream}"
    nothing = "nothing was sent or recorded"
    try:
        async with httpx.AsyncClient(timeout=timeout_s, trust_env=False) as http:
            response = await http.get(upstream + MODELS_PATH)
    except httpx.TimeoutException:
        raise ConfigError(
            f"{where}: no answer to GET {MODELS_PATH} within {timeout_s:.1f} s (the least of 30 s, --call-timeout-s "
            f"and what was left of --deadline-s); is the server up and not stuck? {nothing}"
        ) from None
    except httpx.HTTPError as exc:
        reason = str(exc) or type(exc).__name__
        raise ConfigError(f"{where}: cannot reach it ({reason}); is the server running there? {nothing}") from None
    if response.status_code != 200:
        raise ConfigError(
            f"{where}: GET {MODELS_PATH} answered {response.status_code}, not the model list an OpenAI-compatible "
            f"server (vLLM) answers; give the server's base URL, without /v1. {nothing}"
        )
    try:
        served = [m.id for m in msgspec.json.decode(response.content, type=_ModelList).data]
    except msgspec.DecodeError:
        raise ConfigError(f"{where}: GET {MODELS_PATH} answered 200 but not a model list. {nothing}") from None
    return served


def check_models(upstream: str, served: Sequence[str], recorded: Iterable[str | None]) -> None:
    """ConfigError when a recorded model is not among those `upstream` lists (an empty list proves nothing).

    Only without `--model`: a name given explicitly is sent as given (a proxy may route names it does not
    list), so `--model NAME` is also how to send a recorded name anyway."""
    unserved = sorted({model for model in recorded if model is not None} - set(served))
    if not served or not unserved:
        return
    raise ConfigError(
        f"--upstream {upstream} serves {', '.join(map(repr, served))}, not {', '.join(map(repr, unserved))} that "
        f"the run's requests name: every call would be answered 404. Give --model NAME (e.g. --model {served[0]}) "
        "to send a served name instead; nothing was sent or recorded"
    )
