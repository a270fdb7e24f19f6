import { afterAll, expect, test } from "bun:test";
import { createServer } from "node:net";
import { ConfigError, parseArgs } from "../../src/cli/options.ts";
import { Role } from "../../src/gen/tl/control/v1/control_pb.ts";
import { RoutingTransport } from "../../src/transfer/index.ts";
import { dataPlaneOf } from "../transfer/harness.ts";
import { startTestCluster, type TestCluster } from "../support/nodes.ts";

const clusters: TestCluster[] = [];
const transport = new RoutingTransport();
afterAll(async () => {
  await transport.close();
  await Promise.all(clusters.map((c) => c.stop()));
});

const portOf = (addr: string) => Number(addr.slice(addr.lastIndexOf(":") + 1));

async function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const s = createServer();
    s.once("error", reject);
    s.listen(0, "127.0.0.1", () => {
      const port = (s.address() as { port: number }).port;
      s.close(() => resolve(port));
    });
  });
}

test("advertise host reaches the registry and the data plane", async () => {
  // Bound on 127.0.0.1 but advertised as "localhost": every address others are told must
  // carry the advertised host (a pod IP in production), the binary data plane's included.
  // Beats every 500 ms: eviction after 3 missed must not race a loaded machine.
  const dataPort = await freePort();
  const c = await startTestCluster({ prefill: 1, decode: 1, intervalMs: 500, node: { advertiseHost: "localhost" } });
  clusters.push(c);
  const decode = c.decode[0]!;
  expect(decode.kvAddress).toMatch(/^127\.0\.0\.1:/);
  const live = c.gateway.registry.live();
  for (const w of live) {
    expect(w.status.httpAddress).toMatch(/^localhost:[1-9]\d*$/);
    expect(w.status.grpcAddress).toMatch(/^localhost:[1-9]\d*$/);
  }
  const d = live.find((w) => w.status.role === Role.DECODE)!.status;
  expect(d.kvAddress).toBe(`localhost:${portOf(decode.kvAddress)}`);
  expect(portOf(d.httpAddress)).toBe(portOf(decode.httpAddress));
  expect(live.find((w) => w.status.role === Role.PREFILL)!.status.kvAddress).toBe("");

  expect(await dataPlaneOf(transport, d.kvAddress)).toMatch(/^localhost:[1-9]\d*$/);

  // The advertised addresses carry real traffic: a request served across both engines.
  const res = await fetch(`http://${c.gateway.httpAddress}/v1/completions`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ prompt: "advertised addresses work", max_tokens: 8, seed: 3, temperature: 0.5 }),
  });
  expect({ status: res.status, body: res.status === 200 ? "" : await res.text() }).toEqual({ status: 200, body: "" });
  expect(res.headers.get("x-tl-served")).toBe("disaggregated");
  expect(Number(res.headers.get("x-tl-blocks-sent"))).toBeGreaterThan(0);

  // A fixed data-plane port (kv_data_listen) is the one advertised.
  const fixed = await startTestCluster({ decode: 1, intervalMs: 500, node: { advertiseHost: "localhost", kvDataPort: dataPort } });
  clusters.push(fixed);
  const fk = fixed.gateway.registry.live()[0]!.status.kvAddress;
  expect(await dataPlaneOf(transport, fk)).toBe(`localhost:${dataPort}`);
});

test("advertise host option values", () => {
  const host = (v: string) => parseArgs(["--role", "decode", "--advertise-host", v]).config.engine.advertise_host;
  expect(host("10.244.1.7")).toBe("10.244.1.7");
  expect(host("fd00::7")).toBe("fd00::7");
  expect(host("decode-0.decode.tl-engine.svc")).toBe("decode-0.decode.tl-engine.svc");
  // Unexpanded env references and "any" addresses are not something a peer can dial.
  for (const bad of ["$(POD_IP)", "0.0.0.0", "::", "10.0.0.1:80"]) {
    expect(() => host(bad)).toThrow(ConfigError);
    expect(() => host(bad)).toThrow(`engine.advertise_host`);
  }
  expect(parseArgs(["--kv-data-listen", "0.0.0.0:50062"]).config.engine.kv_data_listen).toBe("0.0.0.0:50062");
  expect(() => parseArgs(["--kv-data-listen", "50062"])).toThrow("engine.kv_data_listen");
});
