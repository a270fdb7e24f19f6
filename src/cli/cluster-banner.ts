import { SYNTHETIC_MODEL_NAME } from "../model/index.ts";

/** What `engine cluster` tells its user once every process is up: each process, and a request to try. */
export function printClusterUp(
  print: (s: string) => void,
  c: {
    ready: readonly Record<string, unknown>[];
    pki: string | null;
    front: string | null;
    gateways: number;
    note: string | null;
    base: string;
    auth: Record<string, string>;
  },
): void {
  const { ready, pki, base } = c;
  const synthetic = ready[0]!.model === SYNTHETIC_MODEL_NAME;
  print(`tl-engine cluster is up (model ${String(ready[0]!.model)}${synthetic ? "; its random weights make meaningless text" : ""})`);
  print(pki === null ? "internal ports: plaintext (--plaintext)" : `internal ports: mutual TLS, an ephemeral CA and certificates in ${pki} (removed on exit)`);
  if (c.front !== null) print(`  front    ${c.front}: round-robin over ${c.gateways} gateway replicas (a TCP proxy, as a Service would be)`);
  for (const r of ready)
    print(
      `  ${String(r.role).padEnd(8)} ${String(r.worker_id ?? r.gateway_id ?? "gateway").padEnd(10)} pid ${String(r.pid).padEnd(8)} http ${String(r.http)}${r.grpc ? `  grpc ${String(r.grpc)}` : ""}${r.kv ? `  kv ${String(r.kv)}` : ""}${r.registry ? `  registry ${String(r.registry)}` : ""}`,
    );
  if (c.note) print(`  (${c.note})`);
  print("");
  print("try:");
  const authFlag = c.auth.authorization ? ` -H 'authorization: ${c.auth.authorization}'` : "";
  print(`  curl -N ${base}/v1/chat/completions -H 'content-type: application/json'${authFlag} \\`);
  print(`    -d '{"messages":[{"role":"user","content":"In the beginning God created the heaven and the earth."}],"max_tokens":32,"stream":true}'`);
  print(`  curl ${base}/metrics`);
}
