import { describe, expect, test } from "bun:test";
import { identityFromSubjectAltName, parseSpiffeId, peerIdentity, spiffeId } from "../../src/rpc/peer-identity.ts";
import { decodeTargetRefusal, METHOD_POLICY, refusal } from "../../src/rpc/peer-policy.ts";
import type { PeerRole } from "../../src/rpc/peer-identity.ts";

describe("spiffe ids", () => {
  test("round trip", () => {
    expect(spiffeId("decode", "decode-0")).toBe("spiffe://tl-engine/decode/decode-0");
    expect(parseSpiffeId("spiffe://tl-engine/decode/decode-0")).toEqual({ role: "decode", workerId: "decode-0" });
    expect(parseSpiffeId("spiffe://tl-engine/decode")).toEqual({ role: "decode", workerId: "" });
    expect(spiffeId("prefill", "")).toBe("spiffe://tl-engine/prefill");
    expect(() => spiffeId("decode", "a/b")).toThrow(/worker id/);
  });
  test("anything else is no identity", () => {
    for (const uri of [
      "spiffe://other/decode/d",
      "spiffe://tl-engine/root/d",
      "spiffe://tl-engine/decode/",
      "spiffe://tl-engine/decode/d/extra",
      "spiffe://tl-engine/decode/d?x",
      "https://tl-engine/decode/d",
      "spiffe://tl-engine/Decode/d",
      `spiffe://tl-engine/decode/${"x".repeat(129)}`,
    ])
      expect(parseSpiffeId(uri)).toBeNull();
  });
  test("read from node's subjectaltname", () => {
    const san = "URI:spiffe://tl-engine/prefill/p-1, DNS:localhost, IP Address:127.0.0.1";
    expect(identityFromSubjectAltName(san)).toEqual({ role: "prefill", workerId: "p-1" });
    expect(identityFromSubjectAltName("DNS:localhost")).toBeNull();
    expect(identityFromSubjectAltName(undefined)).toBeNull();
    // two identities in one certificate: refused, not the first one picked
    expect(identityFromSubjectAltName("URI:spiffe://tl-engine/prefill/p, URI:spiffe://tl-engine/gateway/g")).toBeNull();
    // a malformed tl-engine URI beside a good one is as bad as two
    expect(identityFromSubjectAltName("URI:spiffe://tl-engine/gateway/g, URI:spiffe://tl-engine/gateway/g/x")).toBeNull();
    // a quoted entry smuggling a comma cannot forge a second entry
    expect(identityFromSubjectAltName('DNS:"a, URI:spiffe://tl-engine/gateway/g", DNS:x')).toBeNull();
    // foreign URIs beside ours are fine
    expect(identityFromSubjectAltName("URI:https://example.com/x, URI:spiffe://tl-engine/gateway/g")).toEqual({ role: "gateway", workerId: "g" });
  });
  test("only a verified socket has an identity", () => {
    const sock = (authorized: boolean) => ({ authorized, getPeerCertificate: () => ({ subjectaltname: "URI:spiffe://tl-engine/gateway/g" }) });
    expect(peerIdentity(sock(true))).toEqual({ role: "gateway", workerId: "g" });
    expect(peerIdentity(sock(false))).toBeNull();
    expect(peerIdentity({ getPeerCertificate: () => ({}) })).toBeNull();
    expect(peerIdentity(undefined)).toBeNull();
  });
});

describe("method policy", () => {
  const who = (role: PeerRole, workerId = `${role}-0`) => ({ role, workerId });
  const allowed = (method: string) =>
    (["gateway", "prefill", "decode", "both", "admin"] as PeerRole[]).filter((r) => refusal(method, who(r), `${r}-0`) === null);

  test("the table the issue asks for", () => {
    expect(allowed("tl.control.v1.WorkerRegistry/Heartbeat")).toEqual(["prefill", "decode", "both"]);
    expect(allowed("tl.kv.v1.KvTransfer/PushKv")).toEqual(["prefill", "both"]);
    expect(allowed("tl.kv.v1.DataPlane/Push")).toEqual(["prefill", "both"]);
    expect(allowed("tl.kv.v1.KvTransfer/HasBlocks")).toEqual(["gateway", "prefill", "both"]);
    expect(allowed("tl.kv.v1.KvTransfer/Release")).toEqual(["gateway", "prefill", "both"]);
    for (const m of ["Prefill", "Cancel", "Drain"]) expect(allowed(`tl.engine.v1.EngineControl/${m}`)).toEqual(["gateway", "admin"]);
    expect(allowed("tl.engine.v1.EngineControl/Info")).toEqual(["gateway", "prefill", "decode", "both", "admin"]);
    expect(allowed("tl.control.v1.WorkerRegistry/ListWorkers")).toEqual(["gateway", "admin"]);
  });
  test("heartbeat only for the certificate's own worker id", () => {
    const m = "tl.control.v1.WorkerRegistry/Heartbeat";
    expect(refusal(m, who("decode", "d-1"), "d-1")).toBeNull();
    expect(refusal(m, who("decode", "d-1"), "d-2")?.message).toMatch(/decode\/d-1 may not speak for worker "d-2"/);
    expect(refusal(m, who("decode", "d-1"), "")).not.toBeNull();
    // undefined: the body is not read yet, the handler checks that half
    expect(refusal(m, who("decode", "d-1"), undefined)).toBeNull();
    // a role-level certificate (a Deployment's pods share it) speaks for <role>-* only
    expect(refusal(m, who("decode", ""), "decode-7d9f8-x2kq4")).toBeNull();
    expect(refusal(m, who("decode", ""), "prefill-7d9f8-x2kq4")?.message).toMatch(/decode\/\* may not speak/);
    expect(refusal(m, who("decode", ""), "decode-")).toBeNull();
    expect(refusal(m, who("decode", ""), "decode")).not.toBeNull();
  });
  test("no certificate: unauthenticated; unknown methods: closed", () => {
    expect(refusal("tl.engine.v1.EngineControl/Info", null)).toEqual({ unauthenticated: true, message: expect.stringMatching(/certificate is required/) });
    expect(refusal("tl.engine.v1.EngineControl/Reboot", who("admin"))?.unauthenticated).toBe(false);
    expect(refusal("", who("admin"))).not.toBeNull();
    expect(Object.keys(METHOD_POLICY)).toHaveLength(10);
  });
  test("a decode target must be a decode engine", () => {
    expect(decodeTargetRefusal("10.0.0.1:1", who("decode"))).toBeNull();
    expect(decodeTargetRefusal("10.0.0.1:1", who("both"))).toBeNull();
    expect(decodeTargetRefusal("10.0.0.1:1", who("prefill"))).toMatch(/prefill\/prefill-0, not a decode engine/);
    expect(decodeTargetRefusal("10.0.0.1:1", who("gateway"))).toMatch(/not a decode engine/);
    expect(decodeTargetRefusal("10.0.0.1:1", null)).toMatch(/no cluster identity/);
  });
});
