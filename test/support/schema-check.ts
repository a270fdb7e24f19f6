/**
 * A small JSON Schema checker for the keywords the structured-output tests use (type, enum,
 * const, properties, required, additionalProperties, items, minItems, maxItems, minLength,
 * maxLength, pattern, minimum, maximum, anyOf): the first violation's JSON pointer, or null.
 * Written out here so the tests do not lean on a library the project does not depend on.
 */
export function schemaViolation(schema: unknown, v: unknown, at = "#"): string | null {
  if (schema === true) return null;
  if (schema === false) return `${at}: nothing allowed`;
  const s = schema as Record<string, unknown>;
  const typeOf = (x: unknown) => (x === null ? "null" : Array.isArray(x) ? "array" : Number.isInteger(x) ? "integer" : typeof x);
  if (s.type !== undefined) {
    const types = Array.isArray(s.type) ? s.type : [s.type];
    const t = typeOf(v);
    if (!types.includes(t) && !(t === "integer" && types.includes("number"))) return `${at}: ${t} is not ${types.join("|")}`;
  }
  if (s.enum && !(s.enum as unknown[]).some((e) => JSON.stringify(e) === JSON.stringify(v))) return `${at}: not in enum`;
  if ("const" in s && JSON.stringify(s.const) !== JSON.stringify(v)) return `${at}: not the const`;
  if (s.anyOf && (s.anyOf as unknown[]).every((sub) => schemaViolation(sub, v, at) !== null)) return `${at}: no anyOf branch`;
  if (typeof v === "string") {
    if (typeof s.minLength === "number" && [...v].length < s.minLength) return `${at}: shorter than minLength`;
    if (typeof s.maxLength === "number" && [...v].length > s.maxLength) return `${at}: longer than maxLength`;
    if (typeof s.pattern === "string" && !new RegExp(s.pattern, "u").test(v)) return `${at}: does not match pattern`;
  }
  if (typeof v === "number") {
    if (typeof s.minimum === "number" && v < s.minimum) return `${at}: below minimum`;
    if (typeof s.maximum === "number" && v > s.maximum) return `${at}: above maximum`;
  }
  if (Array.isArray(v)) {
    if (typeof s.minItems === "number" && v.length < s.minItems) return `${at}: fewer than minItems`;
    if (typeof s.maxItems === "number" && v.length > s.maxItems) return `${at}: more than maxItems`;
    if (s.items !== undefined)
      for (const [i, x] of v.entries()) {
        const e = schemaViolation(s.items, x, `${at}/${i}`);
        if (e) return e;
      }
  }
  if (typeof v === "object" && v !== null && !Array.isArray(v)) {
    const o = v as Record<string, unknown>;
    for (const r of (s.required as string[] | undefined) ?? []) if (!(r in o)) return `${at}: missing ${r}`;
    const props = (s.properties as Record<string, unknown> | undefined) ?? {};
    for (const [k, x] of Object.entries(o)) {
      if (k in props) {
        const e = schemaViolation(props[k], x, `${at}/${k}`);
        if (e) return e;
      } else if (s.additionalProperties === false) return `${at}: unexpected property ${k}`;
    }
  }
  return null;
}
