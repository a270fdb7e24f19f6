import { checkConstraint, ConstraintError, type ConstraintSpec } from "../grammar/index.ts";
import { quote } from "../codec/index.ts";
import { HttpError } from "./errors.ts";

/**
 * The structured-output fields of every API this engine speaks, each turned into one
 * ConstraintSpec or refused with a 400 naming it (never served without effect):
 *
 * | field | API | becomes |
 * |---|---|---|
 * | `response_format: {type: "json_object"}` | OpenAI | json_object |
 * | `response_format: {type: "json_schema", json_schema: {name, schema, strict}}` | OpenAI | json_schema |
 * | `structured_outputs: {json \| regex \| choice \| grammar \| json_object}` | vLLM | that kind |
 * | `guided_json`, `guided_regex`, `guided_choice`, `guided_grammar` | vLLM (older) | that kind |
 * | `guided_decoding_backend` | vLLM (older) | "xgrammar" or "auto" accepted, others refused |
 * | `json_schema`, `grammar` (GBNF) | llama-server | json_schema, grammar |
 *
 * At most one of them per request. The spec's bounds and schema keywords are checked here,
 * before any work; whether it compiles is checked next (the caller compiles it before prefill).
 */
export const STRUCTURED_FIELDS = [
  "response_format",
  "structured_outputs",
  "guided_json",
  "guided_regex",
  "guided_choice",
  "guided_grammar",
  "guided_decoding_backend",
  "guided_whitespace_pattern",
  "json_schema",
  "grammar",
] as const;

function bad(message: string, param: string): HttpError {
  return new HttpError(400, message, "invalid_request_error", param);
}

/** A schema given as an object or as JSON text (vLLM takes both), as canonical JSON. */
function schemaSource(v: unknown, param: string): string {
  let schema = v;
  if (typeof v === "string") {
    try {
      schema = JSON.parse(v);
    } catch {
      throw bad(`${param} is not valid JSON`, param);
    }
  }
  if (typeof schema !== "object" || schema === null || Array.isArray(schema)) throw bad(`${param} must be a JSON schema object`, param);
  return JSON.stringify(schema);
}

function stringField(v: unknown, param: string): string {
  if (typeof v !== "string" || v.length === 0) throw bad(`${param} must be a non-empty string`, param);
  return v;
}

function choiceSource(v: unknown, param: string): string {
  if (!Array.isArray(v) || v.length === 0 || v.some((c) => typeof c !== "string" || c.length === 0))
    throw bad(`${param} must be a non-empty array of non-empty strings`, param);
  return JSON.stringify(v);
}

function fromResponseFormat(v: unknown): ConstraintSpec | null {
  const rf = v as Record<string, unknown>;
  if (typeof v !== "object" || v === null || Array.isArray(v)) throw bad("response_format must be an object", "response_format");
  switch (rf.type) {
    case "text":
      return null;
    case "json_object":
      return { kind: "json_object", source: "" };
    case "json_schema": {
      const js = rf.json_schema as Record<string, unknown> | undefined;
      if (typeof js !== "object" || js === null) throw bad("response_format.json_schema must be an object with a schema", "response_format");
      if (js.name !== undefined && (typeof js.name !== "string" || !/^[A-Za-z0-9_-]{1,64}$/.test(js.name)))
        throw bad("response_format.json_schema.name must be 1-64 letters, digits, _ or -", "response_format");
      if (js.strict !== undefined && js.strict !== null && typeof js.strict !== "boolean")
        throw bad("response_format.json_schema.strict must be a boolean", "response_format");
      if (js.schema === undefined) throw bad("response_format.json_schema.schema is required", "response_format");
      return { kind: "json_schema", source: schemaSource(js.schema, "response_format.json_schema.schema") };
    }
    default:
      throw bad(`response_format type ${quote(rf.type)} is not supported; "text", "json_object" or "json_schema"`, "response_format");
  }
}

const SO_KINDS = ["json", "regex", "choice", "grammar", "json_object"] as const;
/** vLLM structured_outputs keys that change nothing here (this backend never falls back, and generates no free whitespace). */
const SO_NEUTRAL: Record<string, (v: unknown) => boolean> = {
  disable_fallback: (v) => typeof v === "boolean",
  disable_any_whitespace: (v) => typeof v === "boolean",
  disable_additional_properties: (v) => v === true,
};

function fromStructuredOutputs(v: unknown): ConstraintSpec {
  const p = "structured_outputs";
  if (typeof v !== "object" || v === null || Array.isArray(v)) throw bad(`${p} must be an object`, p);
  const so = v as Record<string, unknown>;
  const kinds = SO_KINDS.filter((k) => so[k] !== undefined && so[k] !== null && so[k] !== false);
  for (const [k, x] of Object.entries(so)) {
    if (x === undefined || x === null || (SO_KINDS as readonly string[]).includes(k)) continue;
    const ok = SO_NEUTRAL[k];
    if (!ok) throw bad(`${p}.${quote(k)} is not supported; one of ${SO_KINDS.join(", ")}`, p);
    if (!ok(x)) throw bad(`${p}.${k}: ${quote(x)} is not supported`, p);
  }
  if (kinds.length !== 1) throw bad(`${p} must name exactly one of ${SO_KINDS.join(", ")}`, p);
  const k = kinds[0]!;
  switch (k) {
    case "json":
      return { kind: "json_schema", source: schemaSource(so.json, `${p}.json`) };
    case "regex":
      return { kind: "regex", source: stringField(so.regex, `${p}.regex`) };
    case "choice":
      return { kind: "choice", source: choiceSource(so.choice, `${p}.choice`) };
    case "grammar":
      return { kind: "grammar", source: stringField(so.grammar, `${p}.grammar`) };
    case "json_object":
      if (so.json_object !== true) throw bad(`${p}.json_object must be true`, p);
      return { kind: "json_object", source: "" };
  }
}

/** The request's structured output, or null; throws a 400 naming the field for anything it cannot enforce. */
export function parseStructuredOutput(body: Record<string, unknown>): ConstraintSpec | null {
  const given = (k: string) => body[k] !== undefined && body[k] !== null;
  const backend = body.guided_decoding_backend;
  if (given("guided_decoding_backend") && !(typeof backend === "string" && /^(auto|xgrammar)(:.*)?$/.test(backend)))
    throw bad(`guided_decoding_backend ${quote(backend)} is not available; this engine uses "xgrammar"`, "guided_decoding_backend");
  if (given("guided_whitespace_pattern"))
    throw bad("guided_whitespace_pattern is not supported: JSON is generated without free whitespace", "guided_whitespace_pattern");
  const specs: [string, ConstraintSpec | null][] = [];
  if (given("response_format")) specs.push(["response_format", fromResponseFormat(body.response_format)]);
  if (given("structured_outputs")) specs.push(["structured_outputs", fromStructuredOutputs(body.structured_outputs)]);
  if (given("guided_json")) specs.push(["guided_json", { kind: "json_schema", source: schemaSource(body.guided_json, "guided_json") }]);
  if (given("guided_regex")) specs.push(["guided_regex", { kind: "regex", source: stringField(body.guided_regex, "guided_regex") }]);
  if (given("guided_choice")) specs.push(["guided_choice", { kind: "choice", source: choiceSource(body.guided_choice, "guided_choice") }]);
  if (given("guided_grammar")) specs.push(["guided_grammar", { kind: "grammar", source: stringField(body.guided_grammar, "guided_grammar") }]);
  if (given("json_schema")) specs.push(["json_schema", { kind: "json_schema", source: schemaSource(body.json_schema, "json_schema") }]);
  if (given("grammar")) specs.push(["grammar", { kind: "grammar", source: stringField(body.grammar, "grammar") }]);
  const real = specs.filter(([, s]) => s !== null);
  if (real.length > 1) throw bad(`only one structured output per request; got ${real.map(([k]) => k).join(" and ")}`, real[1]![0]);
  if (real.length === 0) return null;
  const [field, spec] = real[0]!;
  checkSpec(spec!, field);
  return spec;
}

/** A spec's bounds and schema keywords, as a 400 naming `field`. */
function checkSpec(spec: ConstraintSpec, field: string): void {
  try {
    checkConstraint(spec);
  } catch (e) {
    if (e instanceof ConstraintError) throw bad(`${field}: ${e.message}`, field);
    throw e;
  }
}

/** The spec as vLLM's structured_outputs spells it: how a resume carries its constraint to the decode engine. */
export function structuredOutputsField(spec: ConstraintSpec): Record<string, unknown> {
  switch (spec.kind) {
    case "json_schema":
      return { json: JSON.parse(spec.source) };
    case "json_object":
      return { json_object: true };
    case "choice":
      return { choice: JSON.parse(spec.source) };
    case "regex":
      return { regex: spec.source };
    case "grammar":
      return { grammar: spec.source };
  }
}
