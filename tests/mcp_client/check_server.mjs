// Drives the `mcp_server` example with the official MCP TypeScript SDK
// (@modelcontextprotocol/sdk, pinned in package.json), over stdio and streamable HTTP, on
// the store IDEM_STORE_URL names, and checks on the server's ledger file (not its replies):
//
// - stdio: a write re-sent after reconnecting to a fresh server process on the same store
//   is one charge, answered with the saved result (idem/replayed: true);
// - http: the same after a new session and after a server restart;
// - http with tokens (IDEM_MCP_TOKENS): two callers sending the same write are two charges;
//   a caller sending the other's idempotency key gets nothing of theirs; a client-named run
//   (off in the example) is refused, nothing run; a missing token and a foreign Origin are
//   refused before any session, nothing run.
//
// Usage: node check_server.mjs PATH/TO/mcp_server NODE_MODULES_DIR
// Prints one line per check and a closing "N passed, N failed"; exits non-zero on a failure.

import { spawn } from "node:child_process";
import { mkdtempSync, readFileSync, existsSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { pathToFileURL } from "node:url";

const [server, modules] = process.argv.slice(2);
if (!server || !modules) {
  console.error("usage: node check_server.mjs PATH/TO/mcp_server NODE_MODULES_DIR");
  process.exit(2);
}
const sdk = (p) => import(pathToFileURL(join(modules, "@modelcontextprotocol/sdk/dist/esm", p)).href);
const { Client } = await sdk("client/index.js");
const { StdioClientTransport } = await sdk("client/stdio.js");
const { StreamableHTTPClientTransport } = await sdk("client/streamableHttp.js");

// Each step charges a customer of its own: the steps share one store and one caller, so
// the same charge in two steps would rightly be one.
const CHARGE = { customer: "cus_42", cents: 4900 };
const HTTP_CHARGE = { customer: "cus_43", cents: 4900 };
const CALLERS_CHARGE = { customer: "cus_44", cents: 4900 };
let passed = 0;
let failed = 0;
function check(name, ok, detail = "") {
  if (ok) {
    passed += 1;
    console.log(`ok   ${name}`);
  } else {
    failed += 1;
    console.log(`FAIL ${name}: ${typeof detail === "string" ? detail : JSON.stringify(detail)}`);
  }
}

const dir = mkdtempSync(join(tmpdir(), "idem-mcp-ts-"));
const lines = (ledger) => (existsSync(ledger) ? readFileSync(ledger, "utf8").split("\n").filter(Boolean).length : 0);
const idemEnv = (extra) => {
  const env = {};
  for (const [k, v] of Object.entries(process.env)) if (k.startsWith("IDEM_") || k === "PATH") env[k] = v;
  return { ...env, ...extra };
};
const replayed = (result) => result?._meta?.["idem/replayed"] === true;

async function stdioClient(ledger) {
  const client = new Client({ name: "idem-ts-checks", version: "0" });
  await client.connect(new StdioClientTransport({ command: server, env: idemEnv({ IDEM_MCP_LEDGER: ledger }), stderr: "inherit" }));
  return client;
}

async function stdioChecks() {
  const ledger = join(dir, "stdio.jsonl");
  const first = await stdioClient(ledger);
  const tools = (await first.listTools()).tools;
  const charge = tools.find((t) => t.name === "charge");
  check("stdio: charge is listed idempotent on a durable store", charge?.annotations?.idempotentHint === true, charge?.annotations);
  const one = await first.callTool({ name: "charge", arguments: CHARGE });
  check("stdio: the first call charges", !one.isError && lines(ledger) === 1, one);
  await first.close();
  // A new server process on the same store, as after a crash or a client restart.
  const second = await stdioClient(ledger);
  const again = await second.callTool({ name: "charge", arguments: CHARGE });
  check("stdio: re-sent after reconnecting to a new process: one charge, replayed", lines(ledger) === 1 && replayed(again), again);
  await second.close();
}

function startHttp(ledger, extra = {}) {
  return new Promise((resolve, reject) => {
    const child = spawn(server, ["--http", "127.0.0.1:0"], { env: idemEnv({ IDEM_MCP_LEDGER: ledger, ...extra }), stdio: ["ignore", "ignore", "pipe"] });
    let seen = "";
    child.stderr.on("data", (chunk) => {
      seen += chunk;
      const m = seen.match(/listening on (http:\/\/\S+)\n/);
      if (m) resolve({ child, url: m[1] });
    });
    child.on("exit", (code) => reject(new Error(`server exited (${code}): ${seen}`)));
  });
}

async function httpClient(url, headers = {}) {
  const client = new Client({ name: "idem-ts-checks", version: "0" });
  await client.connect(new StreamableHTTPClientTransport(new URL(url), { requestInit: { headers } }));
  return client;
}

async function refused(url, headers) {
  try {
    const client = await httpClient(url, headers);
    await client.callTool({ name: "charge", arguments: { customer: "mallory", cents: 1 } });
    await client.close();
    return false;
  } catch {
    return true;
  }
}

async function httpChecks() {
  const ledger = join(dir, "http.jsonl");
  let { child, url } = await startHttp(ledger);
  const a = await httpClient(url);
  const one = await a.callTool({ name: "charge", arguments: HTTP_CHARGE });
  await a.close();
  const b = await httpClient(url);
  const two = await b.callTool({ name: "charge", arguments: HTTP_CHARGE });
  await b.close();
  check("http: a new session re-sending the write: one charge, replayed", !one.isError && lines(ledger) === 1 && replayed(two), two);
  child.kill();
  ({ child, url } = await startHttp(ledger));
  const c = await httpClient(url);
  const three = await c.callTool({ name: "charge", arguments: HTTP_CHARGE });
  await c.close();
  check("http: re-sent to a restarted server on the same store: one charge, replayed", lines(ledger) === 1 && replayed(three), three);
  child.kill();
}

async function callerChecks() {
  const ledger = join(dir, "callers.jsonl");
  const { child, url } = await startHttp(ledger, { IDEM_MCP_TOKENS: "alice:token-a,bob:token-b" });
  try {
    const alice = await httpClient(url, { Authorization: "Bearer token-a" });
    const bob = await httpClient(url, { Authorization: "Bearer token-b" });
    const hers = await alice.callTool({ name: "charge", arguments: CALLERS_CHARGE, _meta: { idempotencyKey: "order-7" } });
    const his = await bob.callTool({ name: "charge", arguments: CALLERS_CHARGE, _meta: { idempotencyKey: "order-7" } });
    check(
      "http: two callers, the same write and key: two charges, neither replayed",
      lines(ledger) === 2 && !replayed(his) && his._meta?.["idem/key"] !== hers._meta?.["idem/key"],
      { hers, his },
    );
    let runRefused = false;
    try {
      await bob.callTool({ name: "charge", arguments: CALLERS_CHARGE, _meta: { "idem/run": "mcp/caller" } });
    } catch {
      runRefused = true;
    }
    check("http: a forged run is refused, nothing charged", runRefused && lines(ledger) === 2, lines(ledger));
    await alice.close();
    await bob.close();
    check("http: no token: refused", await refused(url, {}), "");
    check("http: a wrong token: refused", await refused(url, { Authorization: "Bearer guess" }), "");
    check("http: a foreign Origin: refused", await refused(url, { Authorization: "Bearer token-a", Origin: "http://evil.example" }), "");
    check("http: none of the refused requests charged", lines(ledger) === 2, lines(ledger));
  } finally {
    child.kill();
  }
}

for (const [name, step] of [["stdio", stdioChecks], ["http", httpChecks], ["callers", callerChecks]]) {
  try {
    await step();
  } catch (e) {
    check(`${name}: ran to the end`, false, String(e?.stack ?? e));
  }
}
rmSync(dir, { recursive: true, force: true });
console.log(`${passed} passed, ${failed} failed`);
process.exit(failed || !passed ? 1 : 0);
