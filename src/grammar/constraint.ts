import { createHash } from "node:crypto";

/**
 * What a request constrains its output to, in one canonical form whatever API field it came
 * by (OpenAI's response_format, vLLM's structured_outputs / guided_*, llama-server's
 * json_schema / grammar, a forced tool call):
 *
 * - `json_schema`: `source` is the schema as canonical JSON (the request's key order kept:
 *   it is the order properties are generated in);
 * - `json_object`: any JSON object; `source` is "";
 * - `regex`: `source` is the pattern (the whole output matches it);
 * - `choice`: `source` is a JSON array of the allowed strings (the output is one of them);
 * - `grammar`: `source` is an EBNF grammar in xgrammar's dialect, which reads llama.cpp's GBNF,
 *   with `root` as its start rule.
 */
export type ConstraintKind = "json_schema" | "json_object" | "regex" | "choice" | "grammar";

export interface ConstraintSpec {
  readonly kind: ConstraintKind;
  readonly source: string;
}

const CONSTRAINT_KINDS: readonly ConstraintKind[] = ["json_schema", "json_object", "regex", "choice", "grammar"];

/**
 * How a spec becomes a grammar here: the backend and its settings. Part of every hash, so two
 * engines agree on a constraint's identity only when they would build the same token masks.
 * JSON is generated on one line with ", " and ": " separators, no free whitespace (a model
 * cannot pad its output forever), and a schema's objects take no properties it does not name.
 */
const CONSTRAINT_BACKEND = "xgrammar-0.1.27;json=compact,strict";

/** Bounds checked before anything is compiled. */
const CONSTRAINT_LIMITS = { sourceChars: 65536, regexChars: 4096, choices: 256, choiceChars: 1024, schemaDepth: 32 } as const;

/** A constraint that cannot be served: the message names the field or keyword. */
export class ConstraintError extends Error {}

/** Control and format characters (C0, DEL, C1, U+2028/9, and \p{Cf}) as \uXXXX: nothing a terminal obeys. */
export function escapeControls(s: string): string {
  let out = "";
  for (const c of s) {
    const n = c.codePointAt(0)!;
    const control = n < 0x20 || (n >= 0x7f && n <= 0x9f) || n === 0x2028 || n === 0x2029 || /\p{Cf}/u.test(c);
    out += !control ? c : n <= 0xffff ? `\\u${n.toString(16).padStart(4, "0")}` : `\\u{${n.toString(16)}}`;
  }
  return out;
}

/**
 * A value from the request as a message shows it: JSON-quoted, cut to 80 characters, with the
 * control and format characters JSON leaves alone escaped too (what src/codec's quote does;
 * this folder imports none of ours).
 */
export function show(v: unknown): string {
  const q = escapeControls(JSON.stringify(String(v)));
  return q.length > 80 ? `${q.slice(0, 80)}… (${q.length} characters)` : q;
}

/**
 * The canonical identity of a constraint: SHA-256 over the backend, the kind and the source,
 * as 32 hex digits (its first 128 bits). It travels with the KV handle so that the decode
 * engine continues under exactly the grammar the prefill engine sampled the first token with.
 */
export function constraintHash(spec: ConstraintSpec): string {
  return createHash("sha256").update(`${CONSTRAINT_BACKEND}\n${spec.kind}\n${spec.source}`).digest("hex").slice(0, 32);
}

/** Checks a spec's bounds (and, for a schema, that every keyword is enforced), or throws ConstraintError. */
export function checkConstraint(spec: ConstraintSpec): void {
  const { kind, source } = spec;
  if (!CONSTRAINT_KINDS.includes(kind)) throw new ConstraintError(`unknown constraint kind ${show(kind)}`);
  if (source.length > CONSTRAINT_LIMITS.sourceChars)
    throw new ConstraintError(`the ${kind} has ${source.length} characters; at most ${CONSTRAINT_LIMITS.sourceChars}`);
  switch (kind) {
    case "json_object":
      if (source !== "") throw new ConstraintError("json_object takes no source");
      return;
    case "json_schema": {
      let schema: unknown;
      try {
        schema = JSON.parse(source);
      } catch {
        throw new ConstraintError("the JSON schema is not valid JSON");
      }
      checkSchema(schema);
      return;
    }
    case "regex":
      if (source.length > CONSTRAINT_LIMITS.regexChars)
        throw new ConstraintError(`the regex has ${source.length} characters; at most ${CONSTRAINT_LIMITS.regexChars}`);
      return;
    case "choice": {
      const choices = parseChoices(source);
      if (choices === null) throw new ConstraintError("choice must be a non-empty array of non-empty strings");
      if (choices.length > CONSTRAINT_LIMITS.choices) throw new ConstraintError(`choice has ${choices.length} entries; at most ${CONSTRAINT_LIMITS.choices}`);
      if (choices.some((c) => c.length > CONSTRAINT_LIMITS.choiceChars))
        throw new ConstraintError(`a choice has more than ${CONSTRAINT_LIMITS.choiceChars} characters`);
      return;
    }
    case "grammar":
      if (source.trim() === "") throw new ConstraintError("the grammar is empty");
      return;
  }
}

export function parseChoices(source: string): string[] | null {
  let v: unknown;
  try {
    v = JSON.parse(source);
  } catch {
    return null;
  }
  return Array.isArray(v) && v.length > 0 && v.every((c) => typeof c === "string" && c.length > 0) ? (v as string[]) : null;
}

// JSON Schema keywords, by what the backend does with them. Enforced: the output cannot break
// them. Annotations: they constrain nothing. Anything else (not, if/then/else, oneOf, which
// the backend reads as anyOf, uniqueItems, multipleOf, patternProperties, ...) is refused with
// its name rather than silently relaxed.
const ENFORCED = new Set([
  "type",
  "enum",
  "const",
  "anyOf",
  "allOf",
  "$ref",
  "$defs",
  "definitions",
  "properties",
  "required",
  "additionalProperties",
  "items",
  "prefixItems",
  "minItems",
  "maxItems",
  "minLength",
  "maxLength",
  "pattern",
  "format",
  "minimum",
  "maximum",
  "exclusiveMinimum",
  "exclusiveMaximum",
]);
const ANNOTATIONS = new Set(["title", "description", "default", "examples", "$schema", "$id", "$comment", "deprecated", "readOnly", "writeOnly", "strict"]);
const FORMATS = new Set(["date", "time", "date-time", "email", "uuid", "ipv4", "ipv6", "hostname", "uri"]);
const TYPES = new Set(["string", "number", "integer", "boolean", "null", "object", "array"]);

/** Throws ConstraintError naming the first keyword (by its JSON pointer) this backend cannot enforce. */
export function checkSchema(schema: unknown, path = "#", depth = 0): void {
  if (depth > CONSTRAINT_LIMITS.schemaDepth) throw new ConstraintError(`the JSON schema nests deeper than ${CONSTRAINT_LIMITS.schemaDepth} at ${show(path)}`);
  if (typeof schema === "boolean") return;
  if (typeof schema !== "object" || schema === null || Array.isArray(schema))
    throw new ConstraintError(`the JSON schema at ${show(path)} must be an object or a boolean`);
  const s = schema as Record<string, unknown>;
  for (const [key, v] of Object.entries(s)) {
    const at = `${path}/${key}`;
    if (ANNOTATIONS.has(key)) continue;
    if (!ENFORCED.has(key))
      throw new ConstraintError(`JSON schema keyword ${show(key)} (at ${show(at)}) cannot be enforced by this engine's structured output`);
    switch (key) {
      case "type": {
        const types = Array.isArray(v) ? v : [v];
        if (types.length === 0 || types.some((t) => typeof t !== "string" || !TYPES.has(t)))
          throw new ConstraintError(`JSON schema "type" at ${show(at)} must name JSON types`);
        break;
      }
      case "format":
        if (typeof v !== "string" || !FORMATS.has(v))
          throw new ConstraintError(`JSON schema "format": ${show(v)} (at ${show(at)}) cannot be enforced; supported: ${[...FORMATS].join(", ")}`);
        break;
      case "$ref":
        if (typeof v !== "string" || !v.startsWith("#"))
          throw new ConstraintError(`JSON schema "$ref" (at ${show(at)}) must point inside the schema ("#/...")`);
        break;
      case "allOf":
        if (!Array.isArray(v) || v.length !== 1) throw new ConstraintError(`JSON schema "allOf" (at ${show(at)}) is enforced with one subschema only`);
        v.forEach((x, i) => checkSchema(x, `${at}/${i}`, depth + 1));
        break;
      case "anyOf":
      case "prefixItems":
        if (!Array.isArray(v) || v.length === 0) throw new ConstraintError(`JSON schema "${key}" (at ${show(at)}) must be a non-empty array`);
        v.forEach((x, i) => checkSchema(x, `${at}/${i}`, depth + 1));
        break;
      case "properties":
      case "$defs":
      case "definitions":
        if (typeof v !== "object" || v === null || Array.isArray(v)) throw new ConstraintError(`JSON schema "${key}" (at ${show(at)}) must be an object`);
        for (const [name, sub] of Object.entries(v)) checkSchema(sub, `${at}/${name}`, depth + 1);
        break;
      case "items":
      case "additionalProperties":
        checkSchema(v, at, depth + 1);
        break;
      case "required":
        if (!Array.isArray(v) || v.some((r) => typeof r !== "string"))
          throw new ConstraintError(`JSON schema "required" (at ${show(at)}) must be an array of strings`);
        break;
      case "enum":
        if (!Array.isArray(v) || v.length === 0) throw new ConstraintError(`JSON schema "enum" (at ${show(at)}) must be a non-empty array`);
        break;
      case "pattern":
        if (typeof v !== "string") throw new ConstraintError(`JSON schema "pattern" (at ${show(at)}) must be a string`);
        break;
      case "minLength":
      case "maxLength":
      case "minItems":
      case "maxItems":
        if (typeof v !== "number" || !Number.isInteger(v) || v < 0)
          throw new ConstraintError(`JSON schema "${key}" (at ${show(at)}) must be a non-negative integer`);
        break;
      case "minimum":
      case "maximum":
      case "exclusiveMinimum":
      case "exclusiveMaximum":
        if (typeof v !== "number" || !Number.isFinite(v)) throw new ConstraintError(`JSON schema "${key}" (at ${show(at)}) must be a number`);
        break;
    }
  }
}
