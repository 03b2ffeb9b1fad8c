"""Drives the `mcp_server` example with the official MCP Python SDK, over stdio and over
streamable HTTP, and checks what must hold, on the server's ledger rather than its replies:

- initialize; every listed tool validates against the MCP `Tool` definition of the vendored
  JSON Schema of the negotiated protocol version;
- every tool has an `outputSchema` (`customers`, a list, wrapped as `{"result": [...]}`), and
  the structured content of completed calls validates against it: the SDK itself checks it
  on every `call_tool` (and raises otherwise; shown not to be vacuous by handing it a
  result that breaks the schema), and so does this script;
- a write called twice (the client lost the first reply) is one charge; `idempotentHint` is
  listed on it exactly when the store outlives the process (IDEM_STORE_URL set);
- a write re-sent after reconnecting to a new server process on the same store (stdio), or
  on a new session and after a server restart (HTTP), is one charge, replayed;
- bad input gets a protocol answer and changes nothing: an unknown tool, arguments of the
  wrong type or shape, oversized arguments, malformed JSON-RPC, a call before `initialize`;
  and the server keeps serving afterwards;
- over HTTP: a sessionless client (protocol 2026-07-28) sending a write twice is charged
  once; a request from a foreign `Origin` is refused (403), nothing charged;
- over HTTP with bearer tokens (IDEM_MCP_TOKENS): two callers sending the same write under
  the same `_meta` idempotency key are two charges and never see each other's result; a
  caller's own repeat replays; a missing or wrong token is refused, nothing charged.

The steps share one store (and, the example serving one caller, one scope): each charges
customers of its own.

Usage: python3 check_server.py PATH/TO/mcp_server
Prints one line per check and a closing "N passed, N failed"; exits non-zero on a failure.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import tempfile
import traceback
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import httpx2
import jsonschema
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

HERE = Path(__file__).resolve().parent
SCHEMAS = {
    "2025-11-25": HERE / "schema" / "schema-2025-11-25.json",
    "2026-07-28": HERE / "schema" / "schema-2026-07-28.json",
}
# Generous bound for one step on a busy CI machine; only a hang runs into it.
STEP_TIMEOUT = 60.0
CHARGE = {"customer": "acme", "cents": 4900}
# Whether the servers' store outlives them (the example's in-memory store does not).
DURABLE = bool(os.environ.get("IDEM_STORE_URL"))


def charge_of(label: str) -> dict[str, Any]:
    """A charge no other step makes."""
    return {"customer": f"acme-{label}", "cents": 4900}


class Checks:
    def __init__(self) -> None:
        self.passed = 0
        self.failed = 0

    def check(self, name: str, ok: bool, detail: Any = "") -> None:
        if ok:
            self.passed += 1
            print(f"ok   {name}")
        else:
            self.failed += 1
            print(f"FAIL {name}: {detail}")


def tool_validator(version: str, definition: str = "Tool") -> jsonschema.protocols.Validator:
    """A validator for one definition (`Tool`, `CallToolResult`) of the vendored schema."""
    schema = json.loads(SCHEMAS[version].read_text())
    wrapper = {"$schema": schema["$schema"], "$defs": schema["$defs"], "$ref": f"#/$defs/{definition}"}
    cls = jsonschema.validators.validator_for(wrapper)
    cls.check_schema(wrapper)
    return cls(wrapper)


def wire(model: Any) -> dict[str, Any]:
    """A result as it was on the wire (camelCase, absent fields left out)."""
    return model.model_dump(mode="json", by_alias=True, exclude_none=True)


def server_env(**extra: str) -> dict[str, str]:
    """The environment of a server: this one's IDEM_* variables (how a test harness tells
    its binary to be the example) and `extra`."""
    env = {k: v for k, v in os.environ.items() if k.startswith("IDEM_")}
    env.update(extra)
    return env


def ledger_lines(path: Path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0


async def ledger_count(client: Client) -> int:
    result = await client.call_tool("ledger", {})
    return int(result.structured_content["count"])


def outcome(result: Any) -> str | None:
    meta = result.meta or {}
    return meta.get("idem/outcome")


async def common_checks(c: Checks, client: Client, ledger: Path, label: str, version: str) -> None:
    """What every transport must do: list, validate, charge twice, refuse bad input."""
    validator = tool_validator(version)
    tools = (await client.list_tools()).tools
    names = sorted(t.name for t in tools)
    c.check(f"{label}: tools/list has charge, customers and ledger", names == ["charge", "customers", "ledger"], names)
    for tool in tools:
        errors = [e.message for e in validator.iter_errors(wire(tool))]
        c.check(f"{label}: tool {tool.name} is a valid MCP {version} Tool", not errors, errors)
    hints = {t.name: t.annotations for t in tools}
    c.check(
        f"{label}: hints (charge idempotent exactly on a durable store, ledger read-only)",
        bool(hints["charge"].idempotent_hint) is DURABLE
        and hints["charge"].read_only_hint is False
        and hints["ledger"].read_only_hint is True,
        hints,
    )

    before = ledger_lines(ledger)
    charge = charge_of(label)
    first = await client.call_tool("charge", charge)
    again = await client.call_tool("charge", charge)
    c.check(
        f"{label}: the same call twice is one charge",
        ledger_lines(ledger) == before + 1 and await ledger_count(client) == 1,
        (ledger_lines(ledger) - before, wire(first), wire(again)),
    )
    results = tool_validator(version, "CallToolResult")
    errors = [e.message for r in (first, again) for e in results.iter_errors(wire(r))]
    c.check(f"{label}: the results are valid MCP {version} CallToolResults", not errors, errors)
    c.check(
        f"{label}: the repeat gets the saved charge",
        not again.is_error and again.structured_content == first.structured_content,
        wire(again),
    )

    await output_schema_checks(c, client, tools, first, label)

    # Bad input: each gets an answer, nothing is charged.
    try:
        reply = await client.call_tool("refund_everything", {})
        c.check(f"{label}: unknown tool is refused", False, wire(reply))
    except MCPError as e:
        c.check(f"{label}: unknown tool is a JSON-RPC invalid-params error", e.error.code == -32602, e.error)
    for bad in ({"customer": 42, "cents": 4900}, {"customer": "acme", "cents": "lots"}, {"customer": "acme"}):
        reply = await client.call_tool("charge", bad)
        c.check(
            f"{label}: wrong arguments {json.dumps(bad)} are a tool error",
            reply.is_error is True and outcome(reply) == "refused" and not list(results.iter_errors(wire(reply))),
            wire(reply),
        )
    huge = {"customer": "x" * (2 * 1024 * 1024), "cents": 4900}
    reply = await client.call_tool("charge", huge)
    c.check(f"{label}: 2 MiB of arguments are refused", reply.is_error is True, outcome(reply))
    c.check(f"{label}: bad input charged nothing", ledger_lines(ledger) == before + 1, ledger_lines(ledger) - before)

    other = await client.call_tool("charge", {"customer": f"globex-{label}", "cents": 100})
    c.check(
        f"{label}: still serving: a new charge runs once",
        not other.is_error and ledger_lines(ledger) == before + 2,
        wire(other),
    )


async def output_schema_checks(c: Checks, client: Client, tools: list[Any], charge: Any, label: str) -> None:
    """Structured content against the listed output schemas. `call_tool` has already passed
    each completed result through the SDK's own check (it raises on a mismatch); this
    validates again here, and shows that the SDK's check rejects a broken result."""
    schemas = {t.name: t.output_schema for t in tools}
    c.check(
        f"{label}: every tool has an object outputSchema",
        all(s is not None and s.get("type") == "object" for s in schemas.values()),
        schemas,
    )
    c.check(
        f"{label}: customers' list output is wrapped in result",
        (schemas.get("customers") or {}).get("properties", {}).get("result", {}).get("type") == "array",
        schemas.get("customers"),
    )
    customers = await client.call_tool("customers", {})
    ledger = await client.call_tool("ledger", {})
    for name, result in (("charge", charge), ("customers", customers), ("ledger", ledger)):
        validator = jsonschema.validators.validator_for(schemas[name])(schemas[name])
        errors = [e.message for e in validator.iter_errors(result.structured_content)]
        c.check(
            f"{label}: {name}'s structuredContent validates against its outputSchema",
            not result.is_error and result.structured_content is not None and not errors,
            (wire(result), errors),
        )
    c.check(
        f"{label}: customers lists who was charged",
        customers.structured_content == {"result": [charge.structured_content["customer"]]},
        wire(customers),
    )
    # The SDK's own check is live: the same result with its structured content broken, or
    # missing, is refused.
    for broken in ({"result": "acme"}, None):
        tampered = customers.model_copy(update={"structured_content": broken})
        try:
            await client.session.validate_tool_result("customers", tampered)
            c.check(f"{label}: the SDK refuses structuredContent {broken!r}", False, "accepted")
        except RuntimeError as e:
            c.check(f"{label}: the SDK refuses structuredContent {broken!r}", True, e)


async def raw_stdio_checks(c: Checks, server: str, ledger: Path) -> None:
    """Bytes no SDK client would send: a call before initialize, broken JSON, no JSON-RPC."""
    env = dict(os.environ, **server_env(IDEM_MCP_LEDGER=str(ledger)))
    proc = await asyncio.create_subprocess_exec(
        server, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env
    )
    assert proc.stdin and proc.stdout

    async def send(line: str) -> None:
        proc.stdin.write(line.encode() + b"\n")
        await proc.stdin.drain()

    async def recv() -> dict[str, Any]:
        line = await asyncio.wait_for(proc.stdout.readline(), STEP_TIMEOUT)
        return json.loads(line)

    try:
        before = ledger_lines(ledger)
        call = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "charge", "arguments": charge_of("raw")}}
        await send(json.dumps(call))
        reply = await recv()
        c.check("stdio raw: a call before initialize is a JSON-RPC error", reply.get("id") == 1 and "error" in reply, reply)
        init = {
            "jsonrpc": "2.0",
            "id": 2,
            "method": "initialize",
            "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "raw", "version": "0"}},
        }
        await send(json.dumps(init))
        reply = await recv()
        c.check("stdio raw: initialize still works after it", reply.get("id") == 2 and "result" in reply, reply)
        await send(json.dumps({"jsonrpc": "2.0", "method": "notifications/initialized"}))
        await send('{"jsonrpc": "2.0", "id": 3, "method": ')  # not JSON: no id to answer
        await send('{"hello": "world"}')  # JSON, not JSON-RPC
        reply = await recv()
        c.check("stdio raw: a non-JSON-RPC message gets Invalid Request", reply.get("error", {}).get("code") == -32600, reply)
        call["id"] = 4
        await send(json.dumps(call))
        reply = await recv()
        c.check(
            "stdio raw: still serving, and the early call had charged nothing",
            reply.get("id") == 4 and reply.get("result", {}).get("isError") is False and ledger_lines(ledger) == before + 1,
            (reply, ledger_lines(ledger) - before),
        )
    finally:
        proc.stdin.close()
        try:
            await asyncio.wait_for(proc.wait(), STEP_TIMEOUT)
        except asyncio.TimeoutError:
            proc.kill()


def post(url: str, body: bytes, content_type: str = "application/json", origin: str | None = None) -> int:
    headers = {"Content-Type": content_type, "Accept": "application/json, text/event-stream"}
    if origin:
        headers["Origin"] = origin
    request = urllib.request.Request(url, data=body, method="POST", headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=STEP_TIMEOUT) as response:
            return response.status
    except urllib.error.HTTPError as e:
        return e.code


def stop(proc: subprocess.Popen[str]) -> None:
    """Ends a server this script started: terminated, killed if it does not exit in time."""
    proc.terminate()
    try:
        proc.wait(timeout=STEP_TIMEOUT)
    except subprocess.TimeoutExpired:
        proc.kill()


async def http_checks(c: Checks, server: str, ledger: Path) -> None:
    env = dict(os.environ, **server_env(IDEM_MCP_LEDGER=str(ledger)))
    proc = subprocess.Popen([server, "--http", "127.0.0.1:0"], stderr=subprocess.PIPE, env=env, text=True)
    try:
        assert proc.stderr
        line = proc.stderr.readline().strip()
        c.check("http: the server says where it listens", line.startswith("listening on http://127.0.0.1:"), line)
        url = line.removeprefix("listening on ")

        async with Client(url, mode="legacy") as client:
            await common_checks(c, client, ledger, "http (session)", "2025-11-25")

        # Malformed requests straight to the endpoint: HTTP errors, nothing charged.
        before = ledger_lines(ledger)
        status = post(url, b'{"jsonrpc": "2.0", "id": 1, "method": ')
        c.check("http: malformed JSON is a 4xx", 400 <= status < 500, status)
        status = post(url, json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "charge", "arguments": CHARGE}}).encode())
        c.check("http: a call before initialize (no session) is a 4xx", 400 <= status < 500, status)
        status = post(url, b"customer=acme", "application/x-www-form-urlencoded")
        c.check("http: a body that is not JSON is a 4xx", 400 <= status < 500, status)
        c.check("http: none of it charged", ledger_lines(ledger) == before, ledger_lines(ledger) - before)

        # A foreign page's request: refused before any session, nothing charged.
        init = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "page", "version": "0"}}}
        status = post(url, json.dumps(init).encode(), origin="http://evil.example")
        c.check("http: a foreign Origin is a 403", status == 403, status)

        # Two sessions of one caller (the example declares a single caller), no _meta.
        args = {"customer": "initech", "cents": 700}
        before = ledger_lines(ledger)
        async with Client(url, mode="legacy") as one, Client(url, mode="legacy") as two:
            await one.call_tool("charge", args)
            again = await two.call_tool("charge", args)
        c.check(
            "http: two sessions, no _meta: one charge, replayed",
            ledger_lines(ledger) == before + 1 and (again.meta or {}).get("idem/replayed") is True,
            (ledger_lines(ledger) - before, wire(again)),
        )

        # The sessionless protocol revision: scoped by caller too.
        async with Client(url, mode="2026-07-28") as modern:
            tools = (await modern.list_tools()).tools
            validator = tool_validator("2026-07-28")
            errors = [e.message for t in tools for e in validator.iter_errors(wire(t))]
            c.check("http (2026-07-28): tools are valid MCP 2026-07-28 Tools", not errors, errors)
            before = ledger_lines(ledger)
            first = await modern.call_tool("charge", {"customer": "umbrella", "cents": 1})
            again = await modern.call_tool("charge", {"customer": "umbrella", "cents": 1})
            c.check(
                "http (2026-07-28): a write sent twice, no _meta: one charge",
                not first.is_error and not again.is_error and ledger_lines(ledger) == before + 1,
                (wire(first), wire(again)),
            )
        c.check("http: the server is still running", proc.poll() is None, proc.returncode)
    finally:
        stop(proc)


async def restart_checks(c: Checks, server: str, ledger: Path) -> None:
    """A write re-sent after the connection ended, to a new server process on the same store."""
    if not DURABLE:
        return
    charge = charge_of("restart")
    params = StdioServerParameters(command=server, env=server_env(IDEM_MCP_LEDGER=str(ledger)))
    async with Client(params, mode="legacy") as client:
        await client.call_tool("charge", charge)
    async with Client(params, mode="legacy") as client:
        again = await client.call_tool("charge", charge)
    c.check(
        "stdio: re-sent to a new process on the same store: one charge, replayed",
        ledger_lines(ledger) == 1 and (again.meta or {}).get("idem/replayed") is True,
        (ledger_lines(ledger), wire(again)),
    )
    http_charge = charge_of("restart-http")
    for attempt in range(2):
        env = dict(os.environ, **server_env(IDEM_MCP_LEDGER=str(ledger)))
        proc = subprocess.Popen([server, "--http", "127.0.0.1:0"], stderr=subprocess.PIPE, env=env, text=True)
        try:
            assert proc.stderr
            url = proc.stderr.readline().strip().removeprefix("listening on ")
            async with Client(url, mode="legacy") as client:
                again = await client.call_tool("charge", http_charge)
        finally:
            proc.terminate()
            proc.wait(timeout=STEP_TIMEOUT)
    c.check(
        "http: re-sent to a restarted server on the same store: one charge, replayed",
        ledger_lines(ledger) == 2 and (again.meta or {}).get("idem/replayed") is True,
        (ledger_lines(ledger), wire(again)),
    )


def http_server(server: str, ledger: Path, **extra: str) -> tuple[subprocess.Popen[str], str]:
    """Starts the example over HTTP on a free port; returns the process and its endpoint."""
    env = dict(os.environ, **server_env(IDEM_MCP_LEDGER=str(ledger), **extra))
    proc = subprocess.Popen([server, "--http", "127.0.0.1:0"], stderr=subprocess.PIPE, env=env, text=True)
    assert proc.stderr
    return proc, proc.stderr.readline().strip().removeprefix("listening on ")


def with_headers(url: str, headers: dict[str, str]) -> Any:
    """A streamable HTTP transport that sends `headers` on every request."""
    return streamable_http_client(url, http_client=httpx2.AsyncClient(headers=headers, timeout=STEP_TIMEOUT))


async def refused(url: str, headers: dict[str, str]) -> bool:
    """True when a client sending `headers` cannot get a charge through."""
    try:
        async with Client(with_headers(url, headers), mode="legacy") as client:
            result = await client.call_tool("charge", {"customer": "mallory", "cents": 1})
            return bool(result.is_error)
    except Exception:  # refused at the HTTP layer: the SDK raises
        return True


async def caller_checks(c: Checks, server: str, ledger: Path) -> None:
    """Callers told apart by their bearer tokens never share keys or results."""
    proc, url = http_server(server, ledger, IDEM_MCP_TOKENS="alice:token-a,bob:token-b")
    try:
        charge = charge_of("callers")
        alice = Client(with_headers(url, {"Authorization": "Bearer token-a"}), mode="legacy")
        bob = Client(with_headers(url, {"Authorization": "Bearer token-b"}), mode="legacy")
        async with alice, bob:
            hers = await alice.call_tool("charge", charge, meta={"idempotencyKey": "order-7"})
            his = await bob.call_tool("charge", charge, meta={"idempotencyKey": "order-7"})
            hers_again = await alice.call_tool("charge", charge, meta={"idempotencyKey": "order-7"})
        c.check(
            "http: two callers, the same write and key: two charges, neither replays the other's",
            ledger_lines(ledger) == 2
            and (his.meta or {}).get("idem/replayed") is not True
            and (his.meta or {}).get("idem/key") != (hers.meta or {}).get("idem/key"),
            (ledger_lines(ledger), wire(hers), wire(his)),
        )
        c.check(
            "http: a caller re-sending its own write: replayed, nothing charged",
            ledger_lines(ledger) == 2 and (hers_again.meta or {}).get("idem/replayed") is True,
            (ledger_lines(ledger), wire(hers_again)),
        )
        c.check("http: no token: refused", await refused(url, {}), "")
        c.check("http: a wrong token: refused", await refused(url, {"Authorization": "Bearer guess"}), "")
        c.check("http: none of the refused requests charged", ledger_lines(ledger) == 2, ledger_lines(ledger))
    finally:
        stop(proc)


async def main(server: str) -> int:
    c = Checks()
    with tempfile.TemporaryDirectory(prefix="idem-mcp-py-") as tmp:
        steps = [
            ("stdio", lambda: stdio_checks(c, server, Path(tmp) / "stdio.jsonl")),
            ("stdio raw", lambda: raw_stdio_checks(c, server, Path(tmp) / "raw.jsonl")),
            ("http", lambda: http_checks(c, server, Path(tmp) / "http.jsonl")),
            ("restart", lambda: restart_checks(c, server, Path(tmp) / "restart.jsonl")),
            ("callers", lambda: caller_checks(c, server, Path(tmp) / "callers.jsonl")),
        ]
        for name, step in steps:
            try:
                await asyncio.wait_for(step(), 10 * STEP_TIMEOUT)
            except Exception:  # a crash in one step is a failed check, not the end
                c.check(f"{name}: ran to the end", False, traceback.format_exc())
    print(f"{c.passed} passed, {c.failed} failed")
    return 1 if c.failed or not c.passed else 0


async def stdio_checks(c: Checks, server: str, ledger: Path) -> None:
    params = StdioServerParameters(command=server, env=server_env(IDEM_MCP_LEDGER=str(ledger)))
    async with Client(params, mode="legacy") as client:
        info = client.session.server_info if hasattr(client.session, "server_info") else None
        c.check("stdio: initialized", client.session is not None, info)
        await common_checks(c, client, ledger, "stdio", "2025-11-25")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    sys.exit(asyncio.run(main(sys.argv[1])))
