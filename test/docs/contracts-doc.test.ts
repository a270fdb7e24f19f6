import { expect, test } from "bun:test";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { ScalarType, type DescField, type DescFile } from "@bufbuild/protobuf";
import { file_tl_control_v1_control } from "../../src/gen/tl/control/v1/control_pb.ts";
import { file_tl_engine_v1_engine } from "../../src/gen/tl/engine/v1/engine_pb.ts";
import { file_tl_kv_v1_kv } from "../../src/gen/tl/kv/v1/kv_pb.ts";

// docs/grpc-services.md against the compiled contracts: every service, method, message
// and field there with its number and type, and nothing there the contracts lack.

const DOC = readFileSync(join(import.meta.dir, "..", "..", "docs", "grpc-services.md"), "utf8");
const FILES: DescFile[] = [file_tl_kv_v1_kv, file_tl_engine_v1_engine, file_tl_control_v1_control];

const scalarName = (t: ScalarType) => ScalarType[t].toLowerCase();

/** A field's type as a .proto file spells it. */
function protoType(f: DescField): string {
  switch (f.fieldKind) {
    case "scalar":
      return (f.proto.proto3Optional ? "optional " : "") + scalarName(f.scalar);
    case "enum":
      return (f.proto.proto3Optional ? "optional " : "") + f.enum.name;
    case "message":
      return f.message.name;
    case "list":
      return `repeated ${f.listKind === "scalar" ? scalarName(f.scalar) : f.listKind === "enum" ? f.enum.name : f.message.name}`;
    case "map":
      return `map<${scalarName(f.mapKey)}, ${f.mapKind === "scalar" ? scalarName(f.scalar) : f.mapKind === "enum" ? f.enum.name : f.message.name}>`;
  }
}

/** The text of the section under `### name`, up to the next heading. */
function section(heading: string): string | null {
  const at = DOC.indexOf(`\n${heading}\n`);
  if (at < 0) return null;
  const rest = DOC.slice(at + heading.length + 2);
  const next = rest.search(/\n#{2,3} /);
  return next < 0 ? rest : rest.slice(0, next);
}

const rows = (text: string) =>
  [...text.matchAll(/^\| (\d+) \| (\w+) \| ([^|]+?) \|/gm)].map((m) => ({ number: Number(m[1]), name: m[2]!, type: m[3]!.trim() }));

test("docs grpc services document every field with its number and type", () => {
  for (const file of FILES) {
    for (const msg of file.messages) {
      const text = section(`### ${msg.name}`);
      expect(text, `docs/grpc-services.md has a "### ${msg.name}" section`).not.toBeNull();
      const want = msg.fields.map((f) => ({ number: f.number, name: f.name, type: protoType(f) }));
      if (want.length === 0) expect(text!).toContain("No fields.");
      expect({ message: msg.typeName, fields: rows(text!) }).toEqual({ message: msg.typeName, fields: want });
    }
    for (const e of file.enums) {
      const text = section(`### ${e.name}`)!;
      for (const v of e.values) expect(text).toContain(`\`${v.name}\` ${v.number}`);
    }
  }
});

test("docs grpc services document every method", () => {
  for (const file of FILES) {
    for (const svc of file.services) {
      const text = section(`## ${svc.typeName.replace(/\.(\w+)$/, "")} · ${svc.name}`);
      expect(text, `a "## ${svc.typeName} section"`).not.toBeNull();
      const documented = [...text!.matchAll(/^\| (\w+) \| (stream )?(\w+) \| (stream )?(\w+) \|$/gm)]
        .filter((m) => m[1] !== "rpc")
        .map((m) => [m[1], `${m[2] ?? ""}${m[3]}`, `${m[4] ?? ""}${m[5]}`]);
      const want = svc.methods.map((m) => [
        m.name,
        `${m.methodKind === "client_streaming" || m.methodKind === "bidi_streaming" ? "stream " : ""}${m.input.name}`,
        `${m.methodKind === "server_streaming" || m.methodKind === "bidi_streaming" ? "stream " : ""}${m.output.name}`,
      ]);
      expect({ service: svc.typeName, methods: documented }).toEqual({ service: svc.typeName, methods: want });
    }
  }
});
