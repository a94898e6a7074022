"""`kvevents conformance hash|stream|drive|render|storage`: the contract tests pointed at any engine.

Thin: parse, call kvevents.conformance, render a table (or `--json`). Exit 0 when every
applicable rule passes, 1 when one fails, 2 for a usage error (one line on stderr).
"""

from __future__ import annotations

import json
import sys

import typer

from kvevents.cli.app import user_error
from kvevents.cli.options import CURVE_CLIENT_CERT, CURVE_SERVER_KEY, check_endpoint, curve_client

conformance_app = typer.Typer(
    name="conformance",
    help="Check an engine against the contract: its hash function, its live stream, its API end to end.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

_PROFILE_HELP = "Hash profile: contract (kvevents / SGLang 0.5.20), vllm-sha256, vllm-sha256_cbor."


def _emit(report: object, as_json: bool) -> int:
    text = report.to_json() if as_json else report.table()  # type: ignore[attr-defined]
    sys.stdout.write(text + "\n")
    sys.stdout.flush()
    return int(report.exit_code)  # type: ignore[attr-defined]


@conformance_app.command("hash")
def hash_cmd(
    cmd: str = typer.Option(
        ..., "--cmd", help="Adapter command: reads one JSON request per line, writes one answer per line."
    ),
    seed: int = typer.Option(20, help="Seed of the generated property cases."),
    cases: int = typer.Option(120, min=0, help="Generated property cases (plus a chunked continuation of each)."),
    timeout: float = typer.Option(5.0, min=0.01, help="Seconds to wait for each answer."),
    golden: str | None = typer.Option(
        None, "--golden", help="The golden file (default: the profile's in schemas/golden of this checkout)."
    ),
    profile: str = typer.Option(
        "contract",
        "--profile",
        help="contract, or vllm-sha256 / vllm-sha256_cbor (vLLM 0.33's chain; "
        "requests then carry hash_algo, seed and tagged hash_extra_keys).",
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the report as JSON."),
) -> int:
    """Check a hash implementation through a JSON-lines adapter: golden vectors plus generated cases."""
    from kvevents.conformance.hashkit import GOLDEN_PATH, all_cases, run_adapter
    from kvevents.conformance.profiles import PROFILES

    if profile not in PROFILES:
        user_error(f"--profile must be one of {', '.join(PROFILES)}, got {profile!r}")
    try:
        if profile == "contract":
            chosen = all_cases(seed, cases, golden or GOLDEN_PATH)
        else:
            from kvevents.conformance.hashkit_vllm import VLLM_GOLDEN_PATH, vllm_cases

            chosen = vllm_cases(profile.removeprefix("vllm-"), seed, cases, golden or VLLM_GOLDEN_PATH)
        report = run_adapter(cmd, chosen, timeout=timeout)
    except ValueError as exc:
        user_error(str(exc))
    return _emit(report, as_json)


@conformance_app.command("stream")
def stream_cmd(
    endpoint: str = typer.Argument(..., help="The engine's live PUB endpoint, e.g. tcp://127.0.0.1:5557."),
    replay: str | None = typer.Option(
        None, "--replay", help="Its replay ROUTER endpoint (replay, DESCRIBE, SNAPSHOT)."
    ),
    page_size: int = typer.Option(..., "--page-size", min=1, help="The engine's page (block) size."),
    duration: float = typer.Option(10.0, min=0.0, help="Seconds to observe."),
    profile: str = typer.Option("contract", "--profile", help=_PROFILE_HELP),
    allow_epoch: bool = typer.Option(False, "--allow-epoch", help="Accept kvevents' opt-in 4th batch element (epoch)."),
    count: int | None = typer.Option(None, "--count", min=1, help="Stop after this many live batches."),
    reply_timeout: float = typer.Option(
        2.0, min=0.05, help="Seconds to wait for a replay / DESCRIBE / SNAPSHOT reply."
    ),
    hash_seed: str | None = typer.Option(None, "--hash-seed", help="vLLM profiles: the engine's PYTHONHASHSEED."),
    lora_path: str | None = typer.Option(
        None, "--lora-path", help="vLLM profiles: LoRA path template, {name} = lora name."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the report as JSON."),
    curve_server_key: str | None = CURVE_SERVER_KEY,
    curve_client_cert: str | None = CURVE_CLIENT_CERT,
) -> int:
    """Observe a live publisher and judge every named rule (pass / fail / not offered / not checkable)."""
    from kvevents.conformance.profiles import ProfileUnavailable
    from kvevents.conformance.stream import StreamOptions, observe
    from kvevents.zeromq.security import client_context

    check_endpoint("ENDPOINT", endpoint, empty_ok=True)
    check_endpoint("--replay", replay, empty_ok=True)
    curve = curve_client(curve_server_key, curve_client_cert)  # bad key files: one line, exit 2
    opts = StreamOptions(
        endpoint,
        replay,
        page_size,
        duration,
        profile,
        allow_epoch,
        reply_timeout,
        count,
        hash_seed=hash_seed,
        lora_path=lora_path,
    )
    try:
        report = observe(opts, client_context(curve) if curve is not None else None)
    except ProfileUnavailable as exc:
        user_error(str(exc))
    except ValueError as exc:
        user_error(str(exc))
    return _emit(report, as_json)


@conformance_app.command("drive")
def drive_cmd(
    http: str = typer.Option(
        ..., "--http", help="Base URL of an OpenAI-compatible server, e.g. http://127.0.0.1:8000."
    ),
    endpoint: str = typer.Option(..., "--endpoint", help="The live PUB endpoint that server's worker publishes on."),
    replay: str | None = typer.Option(None, "--replay", help="Its replay ROUTER endpoint."),
    page_size: int = typer.Option(..., "--page-size", min=1, help="The engine's page (block) size."),
    profile: str = typer.Option("contract", "--profile", help=_PROFILE_HELP),
    model: str | None = typer.Option(None, "--model", help="Base model name (default: the first of /v1/models)."),
    adapter: list[str] = typer.Option(["lora-a", "lora-b"], "--adapter", help="Two LoRA adapter (model) names."),
    salt: list[str] = typer.Option(["tenant-a", "tenant-b"], "--salt", help="Two cache salts."),
    pages: int = typer.Option(4, min=1, help="Pages per prompt."),
    seed: int = typer.Option(20, help="Prompt seed."),
    timeout: float = typer.Option(5.0, min=0.1, help="Seconds to wait for a response or a prompt's events."),
    body_extra: str | None = typer.Option(
        None, "--body-extra", help="JSON object merged into every request body, e.g. '{\"temperature\": 0}'."
    ),
    hash_seed: str | None = typer.Option(None, "--hash-seed", help="vLLM profiles: the engine's PYTHONHASHSEED."),
    lora_path: str | None = typer.Option(
        None, "--lora-path", help="vLLM profiles: LoRA path template, {name} = lora name."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the report as JSON."),
) -> int:
    """Send token-id prompts under two adapters and two salts; check the hashes the engine publishes."""
    from kvevents.conformance.drive import DriveOptions, drive
    from kvevents.conformance.profiles import ProfileUnavailable

    if len(adapter) != 2 or len(salt) != 2 or adapter[0] == adapter[1] or salt[0] == salt[1]:
        user_error("give exactly two different --adapter and two different --salt values")
    if not http.startswith(("http://", "https://")):
        user_error(f"--http must be a URL (http://HOST:PORT), got {http!r}")
    check_endpoint("--endpoint", endpoint, empty_ok=True)
    check_endpoint("--replay", replay, empty_ok=True)
    opts = DriveOptions(
        http,
        endpoint,
        replay,
        page_size,
        profile,
        model,
        (adapter[0], adapter[1]),
        (salt[0], salt[1]),
        pages,
        seed,
        timeout,
        hash_seed=hash_seed,
        lora_path=lora_path,
        extra_body=_body_extra(body_extra),
    )
    try:
        report = drive(opts)
    except ProfileUnavailable as exc:
        user_error(str(exc))
    except ValueError as exc:
        user_error(str(exc))
    return _emit(report, as_json)


def _body_extra(raw: str | None) -> dict:
    """--body-extra: a JSON object merged into every request body ({} when not given)."""
    if not raw:
        return {}
    try:
        extra = json.loads(raw)
    except ValueError as exc:
        user_error(f"--body-extra is not JSON: {exc}")
    if not isinstance(extra, dict):
        user_error("--body-extra must be a JSON object")
    return extra


@conformance_app.command("render")
def render_cmd(
    http: str = typer.Option(
        ..., "--http", help="Base URL of the engine (vLLM: its POST /tokenize), e.g. http://127.0.0.1:8000."
    ),
    tokenizer: str = typer.Option(..., "--tokenizer", metavar="DIR", help="The tokenizer directory route uses."),
    cases: int = typer.Option(24, min=1, help="Generated prompts and chats."),
    seed: int = typer.Option(20, help="Seed of the generated cases."),
    timeout: float = typer.Option(5.0, min=0.1, help="Seconds to wait for each answer."),
    as_json: bool = typer.Option(False, "--json", help="Print the report as JSON."),
) -> int:
    """Compare the engine's tokenization of prompts and chats with `route --tokenizer DIR`'s."""
    from kvevents.conformance.render import check_render, render_cases
    from kvevents.consumers.prompts import PromptRenderer

    if not http.startswith(("http://", "https://")):
        user_error(f"--http must be a URL (http://HOST:PORT), got {http!r}")
    try:
        renderer = PromptRenderer.from_dir(tokenizer)
    except ValueError as exc:
        user_error(f"--tokenizer: {exc}")
    try:
        report = check_render(http, renderer, render_cases(seed, cases), timeout)
    except ValueError as exc:
        user_error(str(exc))
    return _emit(report, as_json)


@conformance_app.command("storage")
def storage_cmd(
    module: str = typer.Option(..., "--module", help="The backend's module, e.g. kvevents.plugins.hicache."),
    class_name: str = typer.Option(
        ..., "--class", help="Its HiCacheStorage subclass, e.g. KVEventsHiCacheStorage (built as cls(config, kwargs))."
    ),
    config: str | None = typer.Option(
        None, "--config", help='JSON object merged into the backend\'s extra config, e.g. \'{"path": "/tmp/pages"}\'.'
    ),
    pages: int = typer.Option(5, min=1, help="Whole pages per prompt."),
    page_size: int = typer.Option(16, "--page-size", min=1, help="SGLang's page size for the run."),
    seed: int | None = typer.Option(None, "--seed", help="Prompt seed (default: a fresh prompt every run)."),
    device: str | None = typer.Option(None, "--device", help="cuda or cpu (default: cuda when torch has it)."),
    as_json: bool = typer.Option(False, "--json", help="Print the report as JSON."),
) -> int:
    """Run SGLang's own HiRadixCache over a HiCache storage backend: adapter, base and salted requests."""
    from kvevents.conformance.storage_engine import sglang_missing

    extra: object = {}
    if config:
        try:
            extra = json.loads(config)
        except ValueError as exc:
            user_error(f"--config is not JSON: {exc}")
    if not isinstance(extra, dict):
        user_error("--config must be a JSON object")
    why = sglang_missing()
    if why is not None:
        user_error(f"conformance storage runs SGLang's own cache: SGLang is needed in this environment ({why})")
    from kvevents.conformance.storage import EngineUnavailable, StorageOptions, run_storage

    try:
        opts = StorageOptions(module, class_name, extra, pages=pages, page_size=page_size, seed=seed, device=device)
        report = run_storage(opts)
    except (EngineUnavailable, ValueError) as exc:
        user_error(str(exc))
    return _emit(report, as_json)
